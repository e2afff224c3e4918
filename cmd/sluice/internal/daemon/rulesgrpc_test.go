package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// rulesClient is a client of the Rules service at addr.
func rulesClient(t testing.TB, addr string) pb.RulesClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRulesClient(conn)
}

// rulesRequest is the RulesCheckRequest of body, a POST /v1/rules/check
// body, with its headers and descriptors in their order.
func rulesRequest(body string) (*pb.RulesCheckRequest, error) {
	in, ierr := decodeRulesCheck([]byte(body))
	if ierr != nil {
		return nil, ierr
	}
	req := &pb.RulesCheckRequest{Route: in.Route, Method: in.Method, Ip: in.IP, User: in.User, Hits: in.Hits}
	for _, e := range in.Headers {
		req.Headers = append(req.Headers, &pb.RulesEntry{Name: e.Name, Value: e.Value})
	}
	for _, e := range in.Descriptors {
		req.Descriptors = append(req.Descriptors, &pb.RulesEntry{Name: e.Name, Value: e.Value})
	}
	return req, nil
}

// callRules sends body as a RulesCheckRequest and returns the answer in
// the form of POST /v1/rules/check's, reset_after_ms counted from now;
// it returns an error rather than failing, for use from several
// goroutines.
func callRules(c pb.RulesClient, body string, now time.Time) (RulesDecision, error) {
	req, err := rulesRequest(body)
	if err != nil {
		return RulesDecision{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		return RulesDecision{}, err
	}
	if resp.Truncated {
		return RulesDecision{}, fmt.Errorf("truncated: %v", resp)
	}
	out := RulesDecision{Allowed: resp.Allowed, RetryAfterMs: ceilMillis(time.Duration(resp.RetryAfterNanos)),
		DelayMs: ceilMillis(time.Duration(resp.DelayNanos)), Rules: []RuleDecision{}}
	for _, r := range resp.Rules {
		dec := Decision{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
			RetryAfterMs: ceilMillis(time.Duration(r.RetryAfterNanos)), DelayMs: ceilMillis(time.Duration(r.DelayNanos)),
			Owner: r.Owner, WithoutOwner: r.WithoutOwner}
		if r.ResetAtUnixNano != 0 {
			at := time.Unix(0, r.ResetAtUnixNano)
			dec.ResetAt, dec.ResetAfterMs = at.UTC().Format(time.RFC3339Nano), ceilMillis(at.Sub(now))
		}
		out.Rules = append(out.Rules, RuleDecision{Name: r.Name, Key: r.Key, Shadow: r.Shadow, Decision: dec})
	}
	return out, nil
}

// A rulesTransport sends a descriptor check, written as a POST
// /v1/rules/check body, to a daemon: the same table runs through both.
type rulesTransport struct {
	name string
	// dial returns the function that sends checks to d, whose clock
	// reads now.
	dial func(t *testing.T, d *Daemon, now func() time.Time) func(body string) (RulesDecision, error)
}

var rulesTransports = []rulesTransport{
	{"http", func(t *testing.T, d *Daemon, _ func() time.Time) func(string) (RulesDecision, error) {
		base := "http://" + d.HTTPAddr()
		return func(body string) (RulesDecision, error) { return postRules(base, body) }
	}},
	{"grpc", func(t *testing.T, d *Daemon, now func() time.Time) func(string) (RulesDecision, error) {
		c := rulesClient(t, d.GRPCAddr())
		return func(body string) (RulesDecision, error) { return callRules(c, body, now()) }
	}},
}

// Invalid input to the Rules service is InvalidArgument, naming the field
// as the HTTP endpoint does, in the message and in a BadRequest detail;
// more than 64 descriptors or headers are refused before the message is
// decoded.
func TestRulesGRPCInvalidInput(t *testing.T) {
	d := start(t, rulesConfig(t, "rules-grpc-invalid", checkRules))
	c := rulesClient(t, d.GRPCAddr())
	entries := func(n int) []*pb.RulesEntry {
		es := make([]*pb.RulesEntry, n)
		for i := range es {
			es[i] = &pb.RulesEntry{Name: fmt.Sprintf("d%d", i), Value: "v"}
		}
		return es
	}
	long := strings.Repeat("x", 1025)
	neg := int64(-1)
	for _, tt := range []struct {
		name   string
		req    *pb.RulesCheckRequest
		field  string // "" for a refusal of the count guard, before decoding
		inText string
	}{
		{"route too long", &pb.RulesCheckRequest{Route: long}, "route", "1025 bytes, more than 1024"},
		{"user too long", &pb.RulesCheckRequest{User: long}, "user", "1025 bytes"},
		{"method not a token", &pb.RulesCheckRequest{Method: "GE T"}, "method", "not an HTTP token"},
		{"bad ip", &pb.RulesCheckRequest{Ip: "999.0.0.1"}, "ip", "not an IPv4 or IPv6 address"},
		{"negative hits", &pb.RulesCheckRequest{Hits: &neg}, "hits", "negative"},
		{"descriptor given twice", &pb.RulesCheckRequest{Descriptors: []*pb.RulesEntry{{Name: "plan", Value: "free"}, {Name: "plan", Value: "pro"}}},
			"descriptors.plan", "given twice"},
		{"empty descriptor name", &pb.RulesCheckRequest{Descriptors: []*pb.RulesEntry{{Value: "x"}}}, "descriptors", "empty"},
		{"descriptor value too long", &pb.RulesCheckRequest{Descriptors: []*pb.RulesEntry{{Name: "plan", Value: long}}}, "descriptors.plan", "1025 bytes"},
		{"header not a token", &pb.RulesCheckRequest{Headers: []*pb.RulesEntry{{Name: "X A", Value: "1"}}}, "headers", "not an HTTP header name"},
		{"header given twice in another case", &pb.RulesCheckRequest{Headers: []*pb.RulesEntry{{Name: "x-a", Value: "1"}, {Name: "X-A", Value: "2"}}},
			"headers.X-A", "given twice"},
		{"65 descriptors", &pb.RulesCheckRequest{Descriptors: entries(MaxRulesDescriptors + 1)}, "", "RulesCheckRequest.descriptors has 65 entries, more than the maximum 64"},
		{"65 headers", &pb.RulesCheckRequest{Headers: entries(MaxRulesHeaders + 1)}, "", "RulesCheckRequest.headers has 65 entries"},
	} {
		_, err := c.Check(context.Background(), tt.req)
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.inText) || !strings.Contains(st.Message(), tt.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %q and saying %q", tt.name, err, tt.field, tt.inText)
			continue
		}
		var field string
		for _, det := range st.Details() {
			if br, ok := det.(*errdetails.BadRequest); ok && len(br.FieldViolations) == 1 {
				field = br.FieldViolations[0].Field
			}
		}
		if field != tt.field {
			t.Errorf("%s: BadRequest names field %q, want %q", tt.name, field, tt.field)
		}
	}
	// The largest valid request is served.
	resp, err := c.Check(context.Background(), &pb.RulesCheckRequest{Descriptors: entries(MaxRulesDescriptors), Headers: entries(MaxRulesHeaders)})
	if err != nil || !resp.Allowed {
		t.Errorf("64 descriptors and headers: %v, %v", resp, err)
	}
}

// A daemon without rules_file answers the Rules service
// FailedPrecondition, naming why.
func TestRulesGRPCWithoutRulesFile(t *testing.T) {
	d := start(t, testConfig("no-rules-grpc"))
	_, err := rulesClient(t, d.GRPCAddr()).Check(context.Background(), &pb.RulesCheckRequest{User: "u1"})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "no rules_file is configured") {
		t.Errorf("Check = %v, want FailedPrecondition naming rules_file", err)
	}
}

// A verdict of more rules than a response may list is answered with the
// first transport.MaxRulesResults and truncated set, within
// transport.MaxMessageSize.
func TestRulesGRPCTruncates(t *testing.T) {
	long := strings.Repeat("k", 1024)
	v := &rules.Verdict{Allowed: false, RetryAfter: time.Second}
	for i := range transport.MaxRulesResults + 1 {
		r := &rules.Rule{Name: fmt.Sprintf("%0128d", i)}
		v.Limits = append(v.Limits, rules.Limit{Rule: r, Request: limiter.Request{Key: long, Limit: 5}})
	}
	out := encodeVerdictProto(v)
	if !out.Truncated || len(out.Rules) != transport.MaxRulesResults || out.Rules[0].Name != v.Limits[0].Rule.Name || out.Allowed {
		t.Errorf("truncated %v with %d rules, allowed %v", out.Truncated, len(out.Rules), out.Allowed)
	}
	if size := proto.Size(out); size > transport.MaxMessageSize {
		t.Errorf("%d bytes, more than MaxMessageSize %d", size, transport.MaxMessageSize)
	}
	v.Limits = v.Limits[:transport.MaxRulesResults]
	if out := encodeVerdictProto(v); out.Truncated || len(out.Rules) != transport.MaxRulesResults {
		t.Errorf("%d rules: truncated %v with %d", len(v.Limits), out.Truncated, len(out.Rules))
	}
}
