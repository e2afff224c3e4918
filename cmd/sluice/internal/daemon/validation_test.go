package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// rawMessage is a request already encoded, sent as it is: proto3 strings
// of invalid UTF-8 cannot be marshaled, but a client can send their bytes.
type rawMessage []byte

// rawCodec sends rawMessages as they are and everything else as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// encodeRequest encodes r as a RateLimitRequest, its name and key as the
// bytes they are, valid UTF-8 or not.
func encodeRequest(t *testing.T, r limiter.Request) []byte {
	t.Helper()
	m := transport.RequestToProto(r)
	m.Name, m.Key = "", ""
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.Name)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendString(b, r.Key)
}

// jsonText quotes s for JSON, escaping only what JSON requires, so that
// bytes of invalid UTF-8 stay as they are.
func jsonText(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// checkBody is r as the HTTP API's JSON; keyJSON, when set, is the key's
// JSON text as it is sent, escapes and all.
func checkBody(r limiter.Request, keyJSON string) string {
	key := jsonText(r.Key)
	if keyJSON != "" {
		key = `"` + keyJSON + `"`
	}
	return fmt.Sprintf(`{"name":%s,"key":%s,"hits":%d,"limit":%d,"period":%d,"algorithm":%s}`,
		jsonText(r.Name), key, r.Hits, r.Limit, int64(r.Period), jsonText(r.Algorithm.String()))
}

// apiRefusal is how one API refused a request: the field it named (the
// JSON name), its error code (the wire code, in snake case), and the text.
type apiRefusal struct {
	refused bool
	field   string
	code    string
	text    string
}

// The same invalid requests, sent through every API, are refused by every
// API naming the same field: the library (limiter.Request.Validate), the
// daemon's HTTP JSON API (one check and a batch) and the public gRPC API
// (Check and CheckBatch).
//
// One difference remains: a gRPC request whose name or key is not valid
// UTF-8 cannot be decoded by protobuf, so the whole call fails with
// InvalidArgument and protobuf's "string field contains invalid UTF-8",
// which names no field, where the other APIs name it.
func TestInvalidRequestsOnEveryAPI(t *testing.T) {
	d := start(t, testConfig("validation"))
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := "http://" + d.HTTPAddr()

	valid := limiter.Request{Name: "api", Key: "k", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: limiter.TokenBucket}
	const loneHigh = "\xed\xa0\x80" // U+D800 as if UTF-8: no character
	tests := []struct {
		name    string
		change  func(r *limiter.Request)
		keyJSON string // the key as the HTTP API receives it, when not jsonText(Key)
		field   string // the JSON field every API names
		goField string // the Request field the library names
		err     error  // the library's sentinel
		code    string // the wire error code
		// grpcUndecodable: the gRPC request cannot be decoded (see above).
		grpcUndecodable bool
	}{
		{"empty name", func(r *limiter.Request) { r.Name = "" }, "", "name", "Name", limiter.ErrInvalidName, "invalid_name", false},
		{"empty key", func(r *limiter.Request) { r.Key = "" }, "", "key", "Key", limiter.ErrInvalidKey, "invalid_key", false},
		{"name of invalid UTF-8", func(r *limiter.Request) { r.Name = "api\xff" }, "", "name", "Name", limiter.ErrInvalidName, "invalid_name", true},
		{"key of invalid UTF-8", func(r *limiter.Request) { r.Key = "k\xc3\x28" }, "", "key", "Key", limiter.ErrInvalidKey, "invalid_key", true},
		{"key of a lone surrogate", func(r *limiter.Request) { r.Key = "k" + loneHigh }, `k\ud800`, "key", "Key", limiter.ErrInvalidKey, "invalid_key", true},
		{"over-long key", func(r *limiter.Request) { r.Key = strings.Repeat("k", limiter.MaxKeyLen+1) }, "", "key", "Key", limiter.ErrInvalidKey, "invalid_key", false},
		{"over-long name", func(r *limiter.Request) { r.Name = strings.Repeat("n", limiter.MaxNameLen+1) }, "", "name", "Name", limiter.ErrInvalidName, "invalid_name", false},
		{"limit 0", func(r *limiter.Request) { r.Limit = 0 }, "", "limit", "Limit", limiter.ErrInvalidLimit, "invalid_limit", false},
		{"negative hits", func(r *limiter.Request) { r.Hits = -1 }, "", "hits", "Hits", limiter.ErrInvalidHits, "invalid_hits", false},
		{"period 0", func(r *limiter.Request) { r.Period = 0 }, "", "period", "Period", limiter.ErrInvalidPeriod, "invalid_period", false},
		{"unknown algorithm", func(r *limiter.Request) { r.Algorithm = 99 }, "", "algorithm", "Algorithm", limiter.ErrUnknownAlgorithm, "unknown_algorithm", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := valid
			tt.change(&r)
			body := checkBody(r, tt.keyJSON)
			msg := encodeRequest(t, r)

			// The library.
			err := r.Validate()
			lib := apiRefusal{refused: err != nil}
			if err != nil {
				lib.text = err.Error()
				if errors.Is(err, tt.err) {
					lib.field, lib.code = tt.field, tt.code
				}
			}
			got := map[string]apiRefusal{
				"library":         lib,
				"HTTP check":      httpCheck(t, base, body),
				"HTTP batch":      httpBatch(t, base, body),
				"gRPC Check":      grpcCheck(ctx, t, conn, msg, false),
				"gRPC CheckBatch": grpcCheck(ctx, t, conn, msg, true),
			}
			for api, g := range got {
				switch {
				case !g.refused:
					t.Errorf("%s admitted it", api)
				case tt.grpcUndecodable && strings.HasPrefix(api, "gRPC"):
					if g.code != "invalidargument" || !strings.Contains(g.text, "invalid UTF-8") {
						t.Errorf("%s: %+v, want the call to fail as undecodable", api, g)
					}
				case g.field != tt.field && !strings.HasSuffix(g.field, "."+tt.field) || g.code != tt.code:
					t.Errorf("%s: field %q code %q (%s), want field %q code %q", api, g.field, g.code, g.text, tt.field, tt.code)
				case api == "library" && !strings.Contains(g.text, tt.goField):
					t.Errorf("%s: %q does not name %s", api, g.text, tt.goField)
				}
			}
		})
	}
}

// httpCheck POSTs body to /v1/check and returns the refusal.
func httpCheck(t *testing.T, base, body string) apiRefusal {
	t.Helper()
	res := do(t, http.MethodPost, base+"/v1/check", body)
	if res.status == http.StatusOK {
		return apiRefusal{}
	}
	var p problem
	if err := json.Unmarshal(res.body, &p); err != nil {
		t.Fatalf("check %d: %v: %s", res.status, err, res.body)
	}
	if res.status != http.StatusBadRequest {
		t.Errorf("check: status %d, want 400: %s", res.status, res.body)
	}
	return apiRefusal{refused: true, field: p.Field, code: p.Code, text: p.Detail}
}

// httpBatch POSTs body as the one item of a batch and returns the item's
// refusal, or the whole batch's.
func httpBatch(t *testing.T, base, body string) apiRefusal {
	t.Helper()
	res := do(t, http.MethodPost, base+"/v1/check/batch", `{"requests":[`+body+`]}`)
	if res.status != http.StatusOK {
		var p problem
		if err := json.Unmarshal(res.body, &p); err != nil {
			t.Fatalf("batch %d: %v: %s", res.status, err, res.body)
		}
		return apiRefusal{refused: true, field: p.Field, code: p.Code, text: p.Detail}
	}
	var out struct {
		Responses []struct {
			Error *itemError `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(res.body, &out); err != nil || len(out.Responses) != 1 {
		t.Fatalf("batch: %v: %s", err, res.body)
	}
	if e := out.Responses[0].Error; e != nil {
		return apiRefusal{refused: true, field: e.Field, code: e.Code, text: e.Message}
	}
	return apiRefusal{}
}

// grpcCheck sends the encoded request through the public gRPC API, alone
// or as the one item of a batch, and returns the refusal: the per-item
// error, whose code names the field, or the call's.
func grpcCheck(ctx context.Context, t *testing.T, conn *grpc.ClientConn, req []byte, batch bool) apiRefusal {
	t.Helper()
	// CheckRequest and BatchCheckRequest both hold the request as field 1.
	in := protowire.AppendTag(nil, 1, protowire.BytesType)
	in = protowire.AppendBytes(in, req)
	var item *pb.RateLimitResponse
	if batch {
		var out pb.BatchCheckResponse
		if err := conn.Invoke(ctx, pb.Sluice_CheckBatch_FullMethodName, rawMessage(in), &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
			return callRefusal(err)
		}
		if len(out.Responses) != 1 {
			t.Fatalf("CheckBatch: %d responses", len(out.Responses))
		}
		item = out.Responses[0]
	} else {
		var out pb.CheckResponse
		if err := conn.Invoke(ctx, pb.Sluice_Check_FullMethodName, rawMessage(in), &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
			return callRefusal(err)
		}
		item = out.Response
	}
	if item.ErrorCode == pb.ErrorCode_ERROR_CODE_NONE {
		return apiRefusal{}
	}
	code := codeName(item.ErrorCode)
	return apiRefusal{refused: true, field: fieldOfCode[code], code: code, text: item.ErrorMessage}
}

// fieldOfCode is the JSON field each wire error code of validation names.
var fieldOfCode = map[string]string{
	"invalid_name": "name", "invalid_key": "key", "invalid_hits": "hits", "hits_exceed_limit": "hits",
	"invalid_limit": "limit", "invalid_period": "period", "invalid_burst": "burst",
	"unknown_algorithm": "algorithm", "invalid_calendar": "calendar",
}

func callRefusal(err error) apiRefusal {
	s := status.Convert(err)
	return apiRefusal{refused: true, code: strings.ToLower(s.Code().String()), text: s.Message()}
}
