package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/ruletest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/testcluster"
)

const waitTimeout = 10 * time.Second

// env is a real node, the middleware, and a real server in front of a
// handler that counts its calls.
type env struct {
	node   *cluster.Node
	clk    *fakeclock.Clock
	mw     *Middleware
	src    *rules.Source
	srv    *httptest.Server
	calls  atomic.Int64
	events chan Event
}

// start serves yaml's rules through a single real node whose clock starts
// 40s into a minute.
func start(t *testing.T, yaml string, opts ...Option) *env {
	t.Helper()
	return startWith(t, yaml, rules.GuardConfig{}, opts...)
}

// startWith is start with g as the guard's configuration; its clock is
// the node's.
func startWith(t *testing.T, yaml string, g rules.GuardConfig, opts ...Option) *env {
	t.Helper()
	b := ruletest.New(t, yaml)
	e := &env{clk: b.Clock, node: b.Node, src: b.Source, events: make(chan Event, 256)}
	g.Now = e.clk.Now
	opts = append([]Option{Guard(g), OnDecision(func(ev Event) { e.events <- ev })}, opts...)
	var err error
	if e.mw, err = New(e.node, e.src, opts...); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		io.WriteString(w, "ok")
	})))
	t.Cleanup(e.srv.Close)
	return e
}

type resp struct {
	status int
	header http.Header
	body   string
}

// do sends a real request; hdr are header name/value pairs.
func (e *env) do(t *testing.T, method, path string, hdr ...string) resp {
	t.Helper()
	return e.doCtx(t, context.Background(), method, path, hdr...)
}

func (e *env) doCtx(t *testing.T, ctx context.Context, method, path string, hdr ...string) resp {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		return resp{status: -1, body: err.Error()}
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: string(body)}
}

func (e *env) event(t *testing.T) Event {
	t.Helper()
	return ruletest.Next(t, e.events)
}

// wantHeaders checks header values exactly; "" means absent.
func wantHeaders(t *testing.T, r resp, kv ...string) {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		if got := r.header.Get(kv[i]); got != kv[i+1] || got == "" && len(r.header.Values(kv[i])) > 0 {
			t.Errorf("%s: %q, want %q", kv[i], got, kv[i+1])
		}
	}
}

// perIPRule is a rule set of one fixed-window limit per client IP.
func perIPRule(limit int) string {
	return fmt.Sprintf("rules:\n  - name: per_ip\n    key: [ip]\n    algorithm: fixed_window\n    limit: %d\n    period: 1m\n", limit)
}

const perIP = `rules:
  - name: per_ip
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1m
`

func TestHeadersAndRejection(t *testing.T) {
	e := start(t, perIP)
	r := e.do(t, "GET", "/a")
	if r.status != 200 || r.body != "ok" {
		t.Fatalf("first: %d %q", r.status, r.body)
	}
	wantHeaders(t, r,
		"X-RateLimit-Limit", "2", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "20",
		"RateLimit-Policy", `"per_ip";q=2;w=60`, "RateLimit", `"per_ip";r=1;t=20`, "Retry-After", "")
	r = e.do(t, "GET", "/b")
	if r.status != 200 {
		t.Fatalf("second: %d", r.status)
	}
	wantHeaders(t, r, "X-RateLimit-Remaining", "0", "RateLimit", `"per_ip";r=0;t=20`)

	e.clk.Advance(5 * time.Second)
	r = e.do(t, "POST", "/c")
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("third: %d", r.status)
	}
	wantHeaders(t, r,
		"X-RateLimit-Limit", "2", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "15",
		"RateLimit-Policy", `"per_ip";q=2;w=60`, "RateLimit", `"per_ip";r=0;t=15`,
		"Retry-After", "15", "Content-Type", "application/problem+json")
	const body = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Rate limit exceeded","status":429,` +
		`"detail":"Too many requests for limit \"per_ip\"; retry in 15 s.","retry_after":15,"violated-policies":["per_ip"]}` + "\n"
	if r.body != body {
		t.Errorf("body\n%s\nwant\n%s", r.body, body)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatal(err)
	}
	if e.calls.Load() != 2 {
		t.Fatalf("handler called %d times, want 2", e.calls.Load())
	}
	// A new window admits again.
	e.clk.Advance(15 * time.Second)
	if r := e.do(t, "GET", "/"); r.status != 200 || r.header.Get("X-RateLimit-Reset") != "60" {
		t.Fatalf("next window: %d, reset %q", r.status, r.header.Get("X-RateLimit-Reset"))
	}
	if st := e.mw.Stats(); st.Allowed != 3 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

const twoLimits = `rules:
  - name: per_user
    key: [user]
    algorithm: fixed_window
    limit: 5
    period: 1m
  - name: writes
    match: {methods: [POST, PUT]}
    key: [user]
    algorithm: fixed_window
    limit: 1
    period: 1m
`

func userFromHeader(r *http.Request) (string, bool) {
	u := r.Header.Get("X-User")
	return u, u != ""
}

// One limit exhausted rejects the request, and the other limit keeps
// what it had.
func TestAllOrNothing(t *testing.T) {
	e := start(t, twoLimits, UserFunc(userFromHeader))
	r := e.do(t, "POST", "/items", "X-User", "alice")
	if r.status != 200 {
		t.Fatalf("first POST: %d", r.status)
	}
	// The most restrictive limit is writes; both are listed, it first.
	wantHeaders(t, r, "X-RateLimit-Limit", "1", "X-RateLimit-Remaining", "0",
		"RateLimit-Policy", `"writes";q=1;w=60, "per_user";q=5;w=60`,
		"RateLimit", `"writes";r=0;t=20, "per_user";r=4;t=20`)
	r = e.do(t, "PUT", "/items/1", "X-User", "alice")
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second write: %d", r.status)
	}
	wantHeaders(t, r, "RateLimit", `"writes";r=0;t=20, "per_user";r=4;t=20`, "Retry-After", "20")
	// per_user still has 4: this GET leaves 3.
	r = e.do(t, "GET", "/items", "X-User", "alice")
	if r.status != 200 {
		t.Fatalf("GET: %d", r.status)
	}
	wantHeaders(t, r, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "3", "RateLimit", `"per_user";r=3;t=20`)
	// Another user is counted apart; an anonymous request matches no rule
	// (the key part is missing) and has no headers.
	if r := e.do(t, "PUT", "/items/1", "X-User", "bob"); r.status != 200 {
		t.Fatalf("bob: %d", r.status)
	}
	r = e.do(t, "PUT", "/items/1")
	if r.status != 200 {
		t.Fatalf("anonymous: %d", r.status)
	}
	wantHeaders(t, r, "X-RateLimit-Limit", "", "RateLimit", "")
}

// Under concurrency, a rejected request consumes nothing: the wide limit
// counts exactly the requests admitted.
func TestAllOrNothingConcurrent(t *testing.T) {
	e := start(t, `rules:
  - name: narrow
    algorithm: fixed_window
    limit: 7
    period: 1m
  - name: wide
    algorithm: fixed_window
    limit: 1000
    period: 1m
`)
	var wg sync.WaitGroup
	var ok, limited atomic.Int64
	for range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch r := e.do(t, "GET", "/"); r.status {
			case 200:
				ok.Add(1)
			case 429:
				limited.Add(1)
			default:
				t.Errorf("status %d: %s", r.status, r.body)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 7 || limited.Load() != 53 {
		t.Fatalf("%d admitted, %d limited; want 7 and 53", ok.Load(), limited.Load())
	}
	set := e.src.Current()
	wide, _ := set.Rule("wide")
	req, _ := wide.Request(&rules.Descriptor{}, 0)
	d, err := e.node.Check(context.Background(), req)
	if err != nil || d.Remaining != 1000-7 {
		t.Fatalf("wide remaining %d (%v), want %d", d.Remaining, err, 1000-7)
	}
}

// A client cannot choose its IP with X-Forwarded-For unless its peer is a
// trusted proxy.
func TestTrustedProxies(t *testing.T) {
	yaml := perIPRule(1)
	t.Run("untrusted peer", func(t *testing.T) {
		e := start(t, yaml, TrustedProxies("10.0.0.0/8"))
		if r := e.do(t, "GET", "/", "X-Forwarded-For", "203.0.113.1"); r.status != 200 {
			t.Fatalf("first: %d", r.status)
		}
		if ip := e.event(t).Descriptor.IP; ip != netip.MustParseAddr("127.0.0.1") {
			t.Fatalf("client IP %v, want the peer", ip)
		}
		// A different spoofed address is the same client.
		if r := e.do(t, "GET", "/", "X-Forwarded-For", "203.0.113.2", "Forwarded", "for=203.0.113.3"); r.status != 429 {
			t.Fatalf("spoofed: %d", r.status)
		}
		if ip := e.event(t).Descriptor.IP; ip != netip.MustParseAddr("127.0.0.1") {
			t.Fatalf("client IP %v, want the peer", ip)
		}
	})
	t.Run("trusted peer", func(t *testing.T) {
		e := start(t, yaml, TrustedProxies("127.0.0.1/32", "10.0.0.0/8"))
		tests := []struct {
			hdr    []string
			wantIP string
		}{
			{[]string{"X-Forwarded-For", "203.0.113.1"}, "203.0.113.1"},
			// Right to left: the client-supplied leftmost entry is ignored.
			{[]string{"X-Forwarded-For", "198.51.100.66, 203.0.113.2"}, "203.0.113.2"},
			// Trusted hops are skipped.
			{[]string{"X-Forwarded-For", "198.51.100.66, 203.0.113.3, 10.1.1.1", "X-Forwarded-For", "10.2.2.2"}, "203.0.113.3"},
			// Only X-Forwarded-For is read: a client's own Forwarded
			// names nobody.
			{[]string{"Forwarded", `for=198.51.100.66, for="[2001:db8::7]:4711";proto=https`, "X-Forwarded-For", "203.0.113.9"}, "203.0.113.9"},
			// No header: the peer.
			{nil, "127.0.0.1"},
		}
		for _, tt := range tests {
			if r := e.do(t, "GET", "/", tt.hdr...); r.status != 200 {
				t.Errorf("%v: status %d", tt.hdr, r.status)
			}
			if ip := e.event(t).Descriptor.IP; ip != netip.MustParseAddr(tt.wantIP) {
				t.Errorf("%v: client IP %v, want %s", tt.hdr, ip, tt.wantIP)
			}
		}
		// Each address had its own counter: the first one is now spent.
		if r := e.do(t, "GET", "/", "X-Forwarded-For", "203.0.113.1"); r.status != 429 {
			t.Fatalf("repeat: %d", r.status)
		}
	})
	t.Run("ForwardedHeader(Forwarded)", func(t *testing.T) {
		e := start(t, yaml, TrustedProxies("127.0.0.1/32"), ForwardedHeader("Forwarded"))
		for _, tt := range []struct {
			hdr    []string
			wantIP string
		}{
			{[]string{"Forwarded", `for=198.51.100.66, for="[2001:db8::7]:4711";proto=https`, "X-Forwarded-For", "203.0.113.9"}, "2001:db8::7"},
			// An obfuscated hop stops the walk at the nearest known one.
			{[]string{"Forwarded", "for=198.51.100.66, for=_hidden, for=10.3.3.3"}, "10.3.3.3"},
			{[]string{"X-Forwarded-For", "203.0.113.10"}, "127.0.0.1"},
		} {
			if r := e.do(t, "GET", "/", tt.hdr...); r.status != 200 {
				t.Errorf("%v: status %d", tt.hdr, r.status)
			}
			if ip := e.event(t).Descriptor.IP; ip != netip.MustParseAddr(tt.wantIP) {
				t.Errorf("%v: client IP %v, want %s", tt.hdr, ip, tt.wantIP)
			}
		}
	})
}

// randomForwarded returns a Forwarded value a client might send to name
// itself or a trusted proxy: one or more elements, quoted or not, with
// other parameters.
func randomForwarded(rng *rand.Rand) string {
	addr := func() string {
		switch rng.IntN(4) {
		case 0:
			return fmt.Sprintf("198.51.100.%d", rng.IntN(256))
		case 1:
			return fmt.Sprintf(`"[2001:db8::%x]:%d"`, rng.IntN(1<<16), rng.IntN(1<<16))
		case 2:
			return "127.0.0.1" // the trusted proxy itself
		default:
			return fmt.Sprintf(`"203.0.113.%d:443"`, rng.IntN(256))
		}
	}
	elems := make([]string, 1+rng.IntN(3))
	for i := range elems {
		elems[i] = "for=" + addr()
		if rng.IntN(2) == 0 {
			elems[i] = "proto=https;" + elems[i] + ";by=" + addr()
		}
	}
	return strings.Join(elems, ", ")
}

// A client behind a trusted proxy cannot choose its counter through a
// header other than the one the proxy sets: 50 requests from one client,
// each with a fresh spoofed header, share the per-IP limit of 5.
func TestSpoofedHeadersIgnored(t *testing.T) {
	yaml := perIPRule(5)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	spoofXFF := func() string { return fmt.Sprintf("198.51.100.%d, 127.0.0.1", rng.IntN(256)) }
	tests := []struct {
		name   string
		opts   []Option
		real   []string        // what the proxy sets: the client is 203.0.113.50
		spoof  func() []string // what the client adds
		wantIP string
	}{
		{"Forwarded behind an X-Forwarded-For proxy", nil,
			[]string{"X-Forwarded-For", "203.0.113.50"},
			func() []string { return []string{"Forwarded", randomForwarded(rng)} }, "203.0.113.50"},
		{"X-Forwarded-For entries before the proxy's", nil,
			nil,
			func() []string { return []string{"X-Forwarded-For", spoofXFF() + ", 203.0.113.50"} }, "203.0.113.50"},
		{"Forwarded elements before the proxy's", []Option{ForwardedHeader("Forwarded")},
			nil,
			func() []string { return []string{"Forwarded", randomForwarded(rng) + `, for="203.0.113.50:1234"`} }, "203.0.113.50"},
		{"X-Forwarded-For behind a Forwarded proxy", []Option{ForwardedHeader("Forwarded")},
			[]string{"Forwarded", "for=203.0.113.50;proto=https"},
			func() []string { return []string{"X-Forwarded-For", spoofXFF()} }, "203.0.113.50"},
		{"both behind a single-address proxy", []Option{ClientIPHeader("CF-Connecting-IP")},
			[]string{"CF-Connecting-IP", "203.0.113.50"},
			func() []string {
				return []string{"X-Forwarded-For", spoofXFF(), "Forwarded", randomForwarded(rng), "X-Real-IP", spoofXFF()}
			}, "203.0.113.50"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := start(t, yaml, append([]Option{TrustedProxies("127.0.0.1/32")}, tt.opts...)...)
			admitted := 0
			for i := range 50 {
				spoof := tt.spoof()
				r := e.do(t, "GET", "/", append(spoof, tt.real...)...)
				switch r.status {
				case 200:
					admitted++
				case 429:
				default:
					t.Fatalf("request %d: status %d %s", i, r.status, r.body)
				}
				if ip := e.event(t).Descriptor.IP; ip != netip.MustParseAddr(tt.wantIP) {
					t.Fatalf("request %d with %q: client IP %v, want %s", i, spoof, ip, tt.wantIP)
				}
			}
			if admitted != 5 {
				t.Fatalf("admitted %d of 50 with a fresh spoofed header each, limit 5 per IP", admitted)
			}
		})
	}
}

func TestShadow(t *testing.T) {
	t.Run("global", func(t *testing.T) {
		e := startWith(t, perIP, rules.GuardConfig{Shadow: true})
		for i, want := range []string{"1", "0", "0"} {
			r := e.do(t, "GET", "/")
			if r.status != 200 {
				t.Fatalf("request %d: %d", i, r.status)
			}
			wantHeaders(t, r, "X-RateLimit-Remaining", want, "Retry-After", "")
		}
		if st := e.mw.Stats(); st.Allowed != 2 || st.Shadowed != 1 {
			// The second request used the last hit; only the third
			// would have been rejected.
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("per rule", func(t *testing.T) {
		e := start(t, `rules:
  - name: trial
    algorithm: fixed_window
    limit: 1
    period: 1m
    shadow: true
  - name: real
    algorithm: fixed_window
    limit: 2
    period: 1m
`)
		codes := []int{200, 200, 429}
		for i, want := range codes {
			if r := e.do(t, "GET", "/"); r.status != want {
				t.Fatalf("request %d: %d, want %d", i, r.status, want)
			}
		}
		if st := e.mw.Stats(); st.Allowed != 1 || st.Shadowed != 1 || st.Rejected != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

const paced = `rules:
  - name: paced
    algorithm: leaky_bucket
    limit: 10
    period: 1s
    burst: 5
`

// A leaky-bucket delay is waited for up to MaxWait, through the injected
// timer; longer delays reject.
func TestLeakyBucketWait(t *testing.T) {
	asked := make(chan time.Duration, 4)
	fire := make(chan time.Time)
	e := startWith(t, paced, rules.GuardConfig{MaxWait: 150 * time.Millisecond, After: func(d time.Duration) <-chan time.Time {
		asked <- d
		return fire
	}})
	if r := e.do(t, "GET", "/"); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	e.event(t)
	done := make(chan resp, 1)
	go func() { done <- e.do(t, "GET", "/") }()
	select {
	case d := <-asked:
		if d != 100*time.Millisecond {
			t.Fatalf("waits %v, want 100ms", d)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the second request did not wait")
	}
	if e.calls.Load() != 1 {
		t.Fatal("the handler ran before the wait ended")
	}
	fire <- time.Time{}
	if r := <-done; r.status != 200 || e.calls.Load() != 2 {
		t.Fatalf("after the wait: %d, %d calls", r.status, e.calls.Load())
	}
	e.event(t)
	// 200ms > 150ms: rejected, for 50ms, rounded up to 1s.
	r := e.do(t, "GET", "/")
	if r.status != 429 {
		t.Fatalf("third: %d", r.status)
	}
	wantHeaders(t, r, "Retry-After", "1", "X-RateLimit-Remaining", "3")
	e.event(t)
	if st := e.mw.Stats(); st.Waited != 1 || st.Allowed != 2 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A request whose client goes away while it waits gives its hit back.
func TestLeakyBucketWaitAbandoned(t *testing.T) {
	asked := make(chan time.Duration, 4)
	e := startWith(t, paced, rules.GuardConfig{MaxWait: time.Second, After: func(d time.Duration) <-chan time.Time {
		asked <- d
		return make(chan time.Time) // never fires
	}})
	e.do(t, "GET", "/")
	e.event(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan resp, 1)
	go func() { done <- e.doCtx(t, ctx, "GET", "/") }()
	select {
	case <-asked:
	case <-time.After(waitTimeout):
		t.Fatal("no wait")
	}
	cancel()
	if ev := e.event(t); ev.Outcome != rules.Abandoned || !ev.Verdict.Refunded {
		t.Fatalf("outcome %v, verdict %+v", ev.Outcome, ev.Verdict)
	}
	<-done
	rule, _ := e.src.Current().Rule("paced")
	req, _ := rule.Request(&rules.Descriptor{}, 0)
	if d, err := e.node.Check(context.Background(), req); err != nil || d.Remaining != 4 {
		t.Fatalf("remaining %d (%v) after the abandoned wait, want 4", d.Remaining, err)
	}
	if e.calls.Load() != 1 {
		t.Fatalf("handler called %d times", e.calls.Load())
	}
}

func TestLimiterFailure(t *testing.T) {
	t.Run("fail open", func(t *testing.T) {
		e := start(t, perIP)
		e.node.Close()
		r := e.do(t, "GET", "/")
		if r.status != 200 || r.body != "ok" {
			t.Fatalf("%d %q", r.status, r.body)
		}
		wantHeaders(t, r, "X-RateLimit-Limit", "", "Retry-After", "")
		if ev := e.event(t); ev.Outcome != rules.FailedOpen || !errors.Is(ev.Verdict.Err, cluster.ErrClosed) {
			t.Fatalf("event %v %v", ev.Outcome, ev.Verdict.Err)
		}
		if st := e.mw.Stats(); st.FailedOpen != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("fail closed", func(t *testing.T) {
		e := startWith(t, perIP, rules.GuardConfig{FailClosed: true})
		e.node.Close()
		r := e.do(t, "GET", "/")
		if r.status != 503 || e.calls.Load() != 0 {
			t.Fatalf("%d, %d calls", r.status, e.calls.Load())
		}
		wantHeaders(t, r, "Retry-After", "1", "Content-Type", "application/problem+json")
		if !strings.Contains(r.body, `"status":503`) {
			t.Fatalf("body %s", r.body)
		}
	})
}

func TestMuxPatternRoute(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {})
	e := start(t, `rules:
  - name: per_route
    match: {routes: ["GET /items/{id}"]}
    key: [route]
    algorithm: fixed_window
    limit: 1
    period: 1m
`, RouteFunc(MuxPattern(mux)))
	if r := e.do(t, "GET", "/items/1"); r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("first: %d", r.status)
	}
	// Another id is the same route pattern: it shares the counter.
	if r := e.do(t, "GET", "/items/2"); r.status != 429 {
		t.Fatalf("second: %d", r.status)
	}
	if r := e.do(t, "GET", "/other"); r.status != 200 || r.header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("unmatched: %d", r.status)
	}
}

func TestDescriptorFunc(t *testing.T) {
	e := start(t, `rules:
  - name: free
    match: {descriptors: {plan: free}}
    key: [descriptor:org]
    algorithm: fixed_window
    limit: 1
    period: 1m
`, DescriptorFunc(func(r *http.Request) map[string]string {
		return map[string]string{"plan": r.URL.Query().Get("plan"), "org": r.URL.Query().Get("org")}
	}))
	for _, tt := range []struct {
		q    string
		want int
	}{{"plan=free&org=a", 200}, {"plan=free&org=a", 429}, {"plan=free&org=b", 200}, {"plan=pro&org=a", 200}} {
		if r := e.do(t, "GET", "/?"+tt.q); r.status != tt.want {
			t.Errorf("%s: %d, want %d", tt.q, r.status, tt.want)
		}
	}
}

func TestNew(t *testing.T) {
	c := testcluster.New(t, 1)
	src, _ := rules.NewStatic()
	if _, err := New(c.Node(0), src, TrustedProxies("not-a-cidr")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("bad proxy: %v", err)
	}
	for _, opts := range [][]Option{
		{ForwardedHeader("X-Real-IP")},
		{ClientIPHeader("X-Forwarded-For")},
		{ClientIPHeader("forwarded")},
		{ClientIPHeader("CF Connecting IP")},
		{ClientIPHeader("X-Real-IP"), ForwardedHeader("Forwarded")},
		{ClientIPHeader("X-Real-IP"), ForwardedHeader("X-Forwarded-For")},
	} {
		if _, err := New(c.Node(0), src, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%d options: %v, want ErrInvalidOption", len(opts), err)
		}
	}
	if _, err := New(c.Node(0), src, ClientIPHeader("x-real-ip"), TrustedProxies("10.0.0.0/8")); err != nil {
		t.Errorf("ClientIPHeader(x-real-ip): %v", err)
	}
	if _, err := New(c.Node(0), src, Guard(rules.GuardConfig{MaxWait: -time.Second})); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("negative wait: %v", err)
	}
	if _, err := New(nil, src); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("no limiter: %v", err)
	}
	// No rules: requests pass without headers.
	m, err := New(c.Node(0), src)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("RateLimit") != "" {
		t.Fatalf("%d %v", res.StatusCode, res.Header)
	}
}

// TestCost charges each request the hits its X-Cost header names: a cost
// counts that many hits, a cost above what the rule can ever admit is
// rejected with 429 and counts nothing (it does not fail open), and a
// negative cost is a limiter failure.
func TestCost(t *testing.T) {
	const fiveAMinute = `rules:
  - name: per_ip
    key: [ip]
    algorithm: fixed_window
    limit: 5
    period: 1m
`
	cost := Cost(func(r *http.Request) int64 {
		n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
		if err != nil {
			return 1
		}
		return n
	})
	e := start(t, fiveAMinute, cost)
	for _, step := range []struct {
		cost      string
		status    int
		remaining string
		outcome   rules.Outcome
	}{
		{"3", 200, "2", rules.Allowed},
		{"6", 429, "2", rules.Rejected}, // never admissible: not counted
		{"", 200, "1", rules.Allowed},   // the default cost, 1
		{"2", 429, "1", rules.Rejected},
		{"0", 200, "1", rules.Allowed}, // a peek
		{"1", 200, "0", rules.Allowed},
		{"-1", 200, "", rules.FailedOpen},
	} {
		var hdr []string
		if step.cost != "" {
			hdr = []string{"X-Cost", step.cost}
		}
		r := e.do(t, "GET", "/", hdr...)
		if r.status != step.status {
			t.Fatalf("cost %q: status %d, want %d (%s)", step.cost, r.status, step.status, r.body)
		}
		wantHeaders(t, r, "X-RateLimit-Remaining", step.remaining)
		if ev := e.event(t); ev.Outcome != step.outcome {
			t.Fatalf("cost %q: outcome %v, want %v", step.cost, ev.Outcome, step.outcome)
		}
	}
	if st := e.mw.Stats(); st.Allowed != 4 || st.Rejected != 2 || st.FailedOpen != 1 {
		t.Errorf("stats %+v", st)
	}
}

// anonStep is a request of a user ("" for none) and the status it gets.
type anonStep struct {
	user string
	want int
}

// Anonymous requests under a rule keyed on user do what the rule's
// missing setting says, through the middleware: skip lets them through
// unlimited, deny rejects them with 429 and calls no handler, shared puts
// them all on one counter apart from every user's.
func TestAnonymousUnderPerUserRules(t *testing.T) {
	rule := func(missing string) string {
		return "rules:\n  - name: per_user\n    key: [user]\n    algorithm: fixed_window\n    limit: 1\n    period: 1m\n    missing: " + missing + "\n"
	}
	for _, tc := range []struct {
		missing string
		steps   []anonStep
	}{
		{"skip", []anonStep{{"", 200}, {"", 200}, {"", 200}, {"alice", 200}, {"alice", 429}}},
		{"deny", []anonStep{{"", 429}, {"", 429}, {"alice", 200}, {"alice", 429}}},
		{"shared", []anonStep{{"", 200}, {"", 429}, {"alice", 200}, {"alice", 429}}},
	} {
		t.Run(tc.missing, func(t *testing.T) {
			e := start(t, rule(tc.missing), UserFunc(userFromHeader))
			var handled int64
			for i, st := range tc.steps {
				var hdr []string
				if st.user != "" {
					hdr = []string{"X-User", st.user}
				}
				r := e.do(t, "GET", "/items", hdr...)
				if r.status != st.want {
					t.Fatalf("step %d (user %q): %d, want %d: %s", i, st.user, r.status, st.want, r.body)
				}
				if r.status == 200 {
					handled++
				}
			}
			if got := e.calls.Load(); got != handled {
				t.Fatalf("handler called %d times, want %d", got, handled)
			}
		})
	}
}
