package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
)

// Many callers of the daemon's Envoy API at once, each request of
// several descriptors of two domains' limits with its own hits, some of
// an unknown domain, some refused mid-request (an empty key): the
// sluice_envoy_hits_total counts of every domain and key are exactly the
// hits of the requests answered, never another's, and 300 unknown
// domains take at most 256 series of their own. Run with -race.
func TestAttackEnvoyHitsUnderConcurrency(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	cfg := testConfig("attack-envoy")
	cfg.EnvoyConfigDir = envoyDir(t)
	cfg.EnvoyDynamicMetadata = true
	d := start(t, cfg, WithClock(clk.Now))
	client := rlsClient(t, d.GRPCAddr())

	const callers, calls = 12, 40
	var mu sync.Mutex
	want := map[string]float64{} // series of total_hits -> hits
	var wg sync.WaitGroup
	errs := make(chan error, callers*calls)
	for g := range callers {
		wg.Go(func() {
			for i := range calls {
				hits := uint64(1 + (g+i)%3)
				desc := func(kv ...string) *rlcommon.RateLimitDescriptor {
					d := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(hits)}
					for j := 0; j < len(kv); j += 2 {
						d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[j], Value: kv[j+1]})
					}
					return d
				}
				var req *rlsv3.RateLimitRequest
				var keys []string
				wantCode := codes.OK
				switch (g + i) % 5 {
				case 0, 1:
					client := fmt.Sprintf("c%d", i%4)
					req = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{
						desc("user", fmt.Sprintf("u%d-%d", g, i)), desc("client", client)}}
					keys = []string{`domain="api",key="api.user"`, `domain="api",key="api.client_` + client + `"`}
				case 2:
					req = &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlcommon.RateLimitDescriptor{
						desc("message_type", "marketing", "to_number", fmt.Sprint(g)), desc("to_number", fmt.Sprint(g))}}
					keys = []string{`domain="messaging",key="messaging.message_type_marketing.to_number"`, `domain="messaging",key="messaging.to_number"`}
				case 3:
					req = &rlsv3.RateLimitRequest{Domain: fmt.Sprintf("unknown-%d-%d", g, i), Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "u")}}
				case 4:
					// Refused at its second descriptor, after the first
					// was resolved: nothing is counted.
					req = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{
						desc("user", "refused"), {Entries: make([]*rlcommon.RateLimitDescriptor_Entry, 33)}}}
					for k := range req.Descriptors[1].Entries {
						req.Descriptors[1].Entries[k] = &rlcommon.RateLimitDescriptor_Entry{Key: "k", Value: "v"}
					}
					wantCode = codes.InvalidArgument
				}
				resp, err := client.ShouldRateLimit(context.Background(), req)
				if status.Code(err) != wantCode {
					errs <- fmt.Errorf("caller %d call %d: %v, want %v", g, i, err, wantCode)
					continue
				}
				if err != nil {
					continue
				}
				if got := resp.DynamicMetadata.GetFields()["domain"].GetStringValue(); got != req.Domain || len(resp.Statuses) != len(req.Descriptors) {
					errs <- fmt.Errorf("caller %d call %d: the response of domain %q with %d statuses, for %q with %d", g, i, got, len(resp.Statuses), req.Domain, len(req.Descriptors))
				}
				mu.Lock()
				for _, k := range keys {
					want[`sluice_envoy_hits_total{`+k+`,stat="total_hits"}`] += float64(hits)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	m := scrape(t, "http://"+d.HTTPAddr())
	for series, n := range want {
		if m[series] != n {
			t.Errorf("%s = %v, want %v", series, m[series], n)
		}
	}
	unknownSeries, unknownSum := 0, 0.0
	for series, v := range m {
		switch {
		case strings.HasPrefix(series, "sluice_envoy_unknown_domain_total{"):
			unknownSeries++
			unknownSum += v
		case strings.HasPrefix(series, "sluice_envoy_hits_total{") && strings.HasSuffix(series, `stat="total_hits"}`) && want[series] == 0:
			t.Errorf("%s = %v: hits of no request answered", series, v)
		}
	}
	if unknownSum != callers*calls/5 || unknownSeries > 257 {
		t.Errorf("unknown domains: %v requests in %d series, want %d in at most 257", unknownSum, unknownSeries, callers*calls/5)
	}
}

// Requests the HTTP API's routes never planned for (unknown paths and
// methods, every route with the wrong method, odd bodies and headers)
// from many callers at once: sluice_http_requests_total keeps to the
// routes' patterns and "other", a few status codes each, and every
// response's Content-Type and nosniff header are its own (the shared
// header values are never written to). Run with -race.
func TestAttackHTTPSeriesBounded(t *testing.T) {
	cfg := testConfig("attack-http")
	cfg.MaxBodyBytes = 1 << 10 // the big body is refused for its size, and read whole by the server
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	routes := []string{"/v1/check", "/v1/check/batch", "/v1/rules/check", "/v1/admin/keys", "/v1/admin/keys/reset", "/json", "/healthcheck", "/healthz", "/readyz", "/metrics"}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "BREW", "X-Y"}
	bodies := []string{"", "{", `{"name":"n","key":"k","limit":1,"period":"1s"}`, `[]`, strings.Repeat("x", 4<<10), "\x00\xff"}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 8 {
		wg.Go(func() {
			for i := range 60 {
				path := routes[(g+i)%len(routes)]
				switch i % 4 {
				case 1:
					path = fmt.Sprintf("/nowhere/%d/%d", g, i)
				case 2:
					path += fmt.Sprintf("/../%d%%2f?x=%d", i, g)
				}
				req, err := http.NewRequest(methods[(g*7+i)%len(methods)], base+path, strings.NewReader(bodies[(g+i)%len(bodies)]))
				if err != nil {
					errs <- err
					return
				}
				req.Header.Set("Content-Type", []string{"application/json", "text/plain", ""}[i%3])
				resp, err := probe.Do(req)
				if err != nil {
					errs <- err
					continue
				}
				resp.Body.Close()
				ct := resp.Header.Get("Content-Type")
				if strings.HasSuffix(ct, "json") && resp.Header.Get("X-Content-Type-Options") != "nosniff" {
					errs <- fmt.Errorf("%s %s: JSON without nosniff", req.Method, path)
				}
				if vs := resp.Header.Values("Content-Type"); len(vs) > 1 {
					errs <- fmt.Errorf("%s %s: Content-Type %v", req.Method, path, vs)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if jsonType[0] != "application/json" || problemType[0] != "application/problem+json" || noSniff[0] != "nosniff" || len(jsonType) != 1 {
		t.Errorf("shared header values changed: %v %v %v", jsonType, problemType, noSniff)
	}
	allowed := map[string]bool{"other": true}
	for _, r := range routes {
		allowed[r] = true
	}
	series := 0
	for s := range scrape(t, base) {
		rest, ok := strings.CutPrefix(s, "sluice_http_requests_total{")
		if !ok {
			continue
		}
		series++
		_, ep, _ := strings.Cut(rest, `endpoint="`)
		ep, _, _ = strings.Cut(ep, `"`)
		if !allowed[ep] {
			t.Errorf("series of an endpoint no route has: %s", s)
		}
	}
	if series > 40 {
		t.Errorf("%d series of sluice_http_requests_total after 480 odd requests", series)
	}
	t.Logf("%d series", series)
}

// An xDS server sends the daemon a response over 64 MiB, which cannot be
// read (so cannot be NACKed) however often it is sent again: it counts
// once in sluice_envoy_config_reload_errors_total, the configuration
// before it stays in force and the daemon ready, and the next valid one
// is taken.
func TestAttackEnvoyXDSOversizedResponses(t *testing.T) {
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	addr, _ := serveXDS(t, cache, "127.0.0.1:0")
	cfg := testConfig("xds-oversized")
	cfg.EnvoyXDSAddr, cfg.EnvoyXDSNodeID = addr, "sluice-xds"
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now), WithEnvoyXDS(func(c *envoyrls.XDSConfig) {
		c.MinBackoff, c.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}))
	base := "http://" + d.HTTPAddr()
	snapshotOf(t, cache, "1", 2)
	testwait.For(t, "the daemon to be ready", d.Ready)
	client := rlsClient(t, d.GRPCAddr())
	call := func() string {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), rlsRequest("api", []string{"user=u"}))
		if err != nil {
			t.Fatal(err)
		}
		return rlsSummary(resp)
	}
	set := func(version string, conf *rlconfv3.RateLimitConfig) {
		t.Helper()
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {conf}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.SetSnapshot(context.Background(), "sluice-xds", snap); err != nil {
			t.Fatal(err)
		}
	}
	errorsTotal := func() float64 { return scrape(t, base)["sluice_envoy_config_reload_errors_total"] }

	set("2", &rlconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "user", Value: strings.Repeat("v", envoyrls.MaxXDSMessageBytes)}}})
	testwait.For(t, "the oversized response counted", func() bool { return errorsTotal() == 1 })
	if got := call(); got != "OK; OK r=1" || !d.Ready() {
		t.Errorf("after the oversized response: %s, ready %v", got, d.Ready())
	}

	snapshotOf(t, cache, "3", 5)
	testwait.For(t, "version 3", func() bool { return d.envoyXDS.Stats().Version == "3" })
	if got := call(); got != "OK; OK r=3" || errorsTotal() != 1 {
		t.Errorf("after version 3: %s, %v errors", got, errorsTotal())
	}
}

// POST /json takes any body a caller sends: each is answered as
// envoyproxy/ratelimit's service would answer the request it holds (429
// once over), or refused with 400 when it is no valid RateLimitRequest
// (or the service refuses it: too many descriptors or entries, a unit it
// does not count), 413 beyond max_body_bytes; never a 200 for a request
// over, never a 5xx.
func TestAttackEnvoyJSONBodies(t *testing.T) {
	cfg := testConfig("json-attack")
	cfg.EnvoyConfigDir = envoyDir(t)
	cfg.MaxBodyBytes = 64 << 10
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	url := "http://" + d.HTTPAddr() + "/json"
	user := func(v, extra string) string {
		return `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + v + `"}]` + extra + `}]}`
	}
	many := func(n int, one string) string {
		return strings.TrimSuffix(strings.Repeat(one+",", n), ",")
	}
	for i, s := range []struct {
		body       string
		wantStatus int
		wantBody   string // a part of the body
	}{
		{user("a", ""), http.StatusOK, `"overallCode":"OK"`},
		{user("a", `,"hitsAddend":"18446744073709551615"`), http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{user("a", `,"hitsAddend":"0"`), http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{user("c", `,"hitsAddend":18446744073709551616`), http.StatusBadRequest, ""},
		{user("c", `,"hitsAddend":-1`), http.StatusBadRequest, ""},
		{user("c", `,"hitsAddend":1.5`), http.StatusBadRequest, ""},
		{`{"domain":"api","hitsAddend":4294967296,"descriptors":[{"entries":[{"key":"user","value":"c"}]}]}`, http.StatusBadRequest, ""},
		{`{"domain":"api","hitsAddend":4294967295,"descriptors":[{"entries":[{"key":"user","value":"c"}]}]}`, http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{user("z", `,"limit":{"requestsPerUnit":0,"unit":"MINUTE"}`), http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{user("z", `,"limit":{"requestsPerUnit":0,"unit":"MINUTE"},"hitsAddend":"0"`), http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{user("w", `,"limit":{"requestsPerUnit":5,"unit":99}`), http.StatusBadRequest, "unit"},
		{user("w", `,"limit":{"requestsPerUnit":5,"unit":"WEEK"}`), http.StatusBadRequest, "unit"},
		{user("w", `,"limit":{"requestsPerUnit":5,"unit":"FORTNIGHT"}`), http.StatusBadRequest, ""},
		{user("\xff\xfe", ""), http.StatusBadRequest, ""},
		{user(`\ud800`, ""), http.StatusBadRequest, ""},
		{`{"domain":"\xc3","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}`, http.StatusBadRequest, ""},
		{user(strings.Repeat("v", 60<<10), ""), http.StatusOK, `"overallCode":"OK"`},
		{user(strings.Repeat("v", 70<<10), ""), http.StatusRequestEntityTooLarge, ""},
		// 64 descriptors of one key: each is charged its hit in turn, the
		// sixth of 5 a minute is over, as upstream's INCRBY pipeline.
		{`{"domain":"api","descriptors":[` + many(64, `{"entries":[{"key":"user","value":"m"}]}`) + `]}`, http.StatusTooManyRequests, `"overallCode":"OVER_LIMIT"`},
		{`{"domain":"api","descriptors":[` + many(65, `{"entries":[{"key":"user","value":"m"}]}`) + `]}`, http.StatusBadRequest, "65 descriptors"},
		{`{"domain":"api","descriptors":[{"entries":[` + many(33, `{"key":"k","value":"v"}`) + `]}]}`, http.StatusBadRequest, "33 entries"},
		{`{"domain":"api","descriptors":[null]}`, http.StatusBadRequest, ""},
		{`{"domain":"api","descriptors":[{}]}`, http.StatusOK, `"overallCode":"OK"`},
		{`{"domain":"api","domain":"api","descriptors":[{}]}`, http.StatusBadRequest, ""},
		{user("t", "") + `{}`, http.StatusBadRequest, ""},
		{user("t", "") + `   `, http.StatusOK, `"overallCode":"OK"`},
		{`{"domain":"","descriptors":[{}]}`, http.StatusBadRequest, "domain"},
		{`{"domain":"api","descriptors":{}}`, http.StatusBadRequest, ""},
		{`{"domain":1,"descriptors":[{}]}`, http.StatusBadRequest, ""},
		{`null`, http.StatusBadRequest, ""},
		{`"x"`, http.StatusBadRequest, ""},
		{strings.Repeat("[", 10000), http.StatusBadRequest, ""},
		{`{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}`, http.StatusOK, `"overallCode":"OK"`},
	} {
		r := do(t, http.MethodPost, url, s.body)
		if r.status != s.wantStatus || !strings.Contains(string(r.body), s.wantBody) {
			b := s.body
			if len(b) > 120 {
				b = b[:120] + "..."
			}
			t.Errorf("body %d %q: %d %.300s, want %d with %q", i, b, r.status, r.body, s.wantStatus, s.wantBody)
		}
	}
}

// rawRLSRequest is the wire form of a RateLimitRequest of domain with one
// descriptor of the entry key=value, as Envoy's C++ protobuf writes it
// whatever bytes the value holds.
func rawRLSRequest(domain, key, value string) []byte {
	entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), key)
	entry = protowire.AppendString(protowire.AppendTag(entry, 2, protowire.BytesType), value)
	desc := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
	req := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), domain)
	return protowire.AppendBytes(protowire.AppendTag(req, 2, protowire.BytesType), desc)
}

// A descriptor value that is not UTF-8 (a request header's bytes: HTTP
// allows any byte above 0x7f in a value, and Envoy's protobuf sends them
// as they are) is counted like any other, under a key of its own: the
// request is not refused. Refused, it would be a failure of the rate
// limit service, which Envoy answers by letting the request through
// unless failure_mode_deny is set: any client could skip every limit of
// a request by adding one such byte to a header a descriptor reads.
// Two such values do not share a counter, nor does either with its
// UTF-8 lookalike, nor do values of a megabyte; dynamic metadata echoes
// the values made valid. A request past the gRPC message bound fails.
func TestAttackEnvoyValueNotUTF8(t *testing.T) {
	cfg := testConfig("envoy-utf8")
	cfg.EnvoyConfigDir = envoyDir(t)
	cfg.EnvoyDynamicMetadata = true
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(value string) (*rlsv3.RateLimitResponse, error) {
		var resp rlsv3.RateLimitResponse
		err := conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawMessage(rawRLSRequest("api", "user", value)), &resp)
		return &resp, err
	}
	mb := strings.Repeat("v", 1<<20)
	for _, v := range []string{"\xff", "\xfe", "a\xffb", "\xef\xbf\xbd", mb, mb + "\xff"} { // the 4th is U+FFFD itself
		for i := range 7 {
			resp, err := call(v)
			if err != nil {
				t.Fatalf("value %.20q, request %d: %v", v, i, err)
			}
			want := fmt.Sprintf("OK; OK r=%d", 4-i)
			if i >= 5 {
				want = "OVER_LIMIT; OVER_LIMIT r=0"
			}
			if got := rlsSummary(resp); got != want {
				t.Errorf("value %.20q, request %d: %s, want %s", v, i, got, want)
			}
			md := resp.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues()
			if len(md) != 1 || !utf8.ValidString(md[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue()) {
				t.Errorf("value %.20q: dynamic metadata of %d descriptors", v, len(md))
			}
		}
	}
	// Past the gRPC message bound of grpc_addr (transport.MaxMessageSize),
	// the call fails before the service sees it.
	if _, err := call(strings.Repeat("v", 3<<19)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a value of 1.5 MiB: %v, want ResourceExhausted", err)
	}
}
