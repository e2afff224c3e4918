package daemon

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/testcluster"
)

// backendRules are the rules of TestHTTPLimitOnEveryBackend: a token
// bucket per client IP everywhere, and under /api/ a fixed window shared
// by every client, so that a request to /api/ takes the multi-limit path
// (a peek at both limits, then the consume, then a refund when the second
// limit rejects what the first admitted).
const backendRules = `rules:
  - name: per_ip
    key: [ip]
    algorithm: token_bucket
    limit: 3
    period: 1h
  - name: api_total
    match: {routes: ["/api/*"]}
    algorithm: fixed_window
    limit: 5
    period: 1h
`

// backendStart is the instant every backend's clock stands at: 800s into
// an hour since the epoch, so that api_total's window ends in 2800s. The
// clocks never move, so every header value, X-RateLimit-Reset included,
// is the same on every run and every backend.
var backendStart = time.Unix(1_700_000_000, 0)

// backendStep is one HTTP request of the scenario and the response every
// backend must give. Header values are exact; "" means absent.
type backendStep struct {
	name   string
	client string // "A" to "D": which client IP sends it
	path   string
	cost   string // the X-Cost header; "" sends none (cost 1)
	status int
	// refunded: the hits one limit admitted were given back because
	// another rejected them after the peek (rules.Verdict.Refunded).
	refunded bool
	// The rate-limit fields: X-RateLimit-Limit, -Remaining, -Reset,
	// RateLimit-Policy, RateLimit and Retry-After.
	limit, remaining, reset, policy, rateLimit, retryAfter string
}

// backendHeaders are the headers compared, in backendStep's order.
var backendHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After"}

func (s *backendStep) want() backendResult {
	return backendResult{s.status, [6]string{s.limit, s.remaining, s.reset, s.policy, s.rateLimit, s.retryAfter}, s.refunded}
}

// backendResult is what one response carried, and whether the guard
// refunded.
type backendResult struct {
	status   int
	headers  [6]string // backendHeaders' values
	refunded bool
}

func (r backendResult) String() string {
	s := strconv.Itoa(r.status)
	if r.refunded {
		s += " refunded"
	}
	for i, h := range backendHeaders {
		if r.headers[i] != "" {
			s += fmt.Sprintf(" %s=%q", h, r.headers[i])
		}
	}
	return s
}

const (
	bothPolicies = `"per_ip";q=3;w=3600, "api_total";q=5;w=3600`
	apiFirst     = `"api_total";q=5;w=3600, "per_ip";q=3;w=3600`
	ipPolicy     = `"per_ip";q=3;w=3600`
)

// backendSteps is the scenario. per_ip admits 3 per hour, a token every
// 1200s; api_total admits 5 in the hour-long window that ends in 2800s.
var backendSteps = []backendStep{
	{name: "first hit", client: "A", path: "/api/x", status: 200,
		limit: "3", remaining: "2", reset: "1200", policy: bothPolicies, rateLimit: `"per_ip";r=2;t=1200, "api_total";r=4;t=2800`},
	{name: "cost 2 empties A's bucket", client: "A", path: "/api/x", cost: "2", status: 200,
		limit: "3", remaining: "0", reset: "3600", policy: bothPolicies, rateLimit: `"per_ip";r=0;t=3600, "api_total";r=2;t=2800`},
	{name: "A is limited by the peek", client: "A", path: "/api/x", status: 429,
		limit: "3", remaining: "0", reset: "1200", policy: bothPolicies, rateLimit: `"per_ip";r=0;t=1200, "api_total";r=2;t=2800`, retryAfter: "1200"},
	{name: "cost 4 is more than per_ip's capacity", client: "B", path: "/api/x", cost: "4", status: 429,
		limit: "3", remaining: "3", reset: "1", policy: bothPolicies, rateLimit: `"per_ip";r=3;t=1, "api_total";r=2;t=2800`, retryAfter: "1"},
	{name: "cost 3 fits per_ip, not api_total: consumed, then refunded", client: "B", path: "/api/x", cost: "3", status: 429, refunded: true,
		limit: "5", remaining: "2", reset: "2800", policy: apiFirst, rateLimit: `"api_total";r=2;t=2800, "per_ip";r=3;t=0`, retryAfter: "2800"},
	{name: "cost 2 fits both, and per_ip got its 3 back", client: "B", path: "/api/x", cost: "2", status: 200,
		limit: "5", remaining: "0", reset: "2800", policy: apiFirst, rateLimit: `"api_total";r=0;t=2800, "per_ip";r=1;t=2400`},
	{name: "one limit outside /api/", client: "C", path: "/other", status: 200,
		limit: "3", remaining: "2", reset: "1200", policy: ipPolicy, rateLimit: `"per_ip";r=2;t=1200`},
	{name: "api_total is spent for C too", client: "C", path: "/api/x", status: 429,
		limit: "5", remaining: "0", reset: "2800", policy: apiFirst, rateLimit: `"api_total";r=0;t=2800, "per_ip";r=2;t=1200`, retryAfter: "2800"},
	{name: "B's last token", client: "B", path: "/other", status: 200,
		limit: "3", remaining: "0", reset: "3600", policy: ipPolicy, rateLimit: `"per_ip";r=0;t=3600`},
	{name: "B is limited by one limit", client: "B", path: "/other", status: 429,
		limit: "3", remaining: "0", reset: "1200", policy: ipPolicy, rateLimit: `"per_ip";r=0;t=1200`, retryAfter: "1200"},
	{name: "cost 9 on one limit is rejected, not passed", client: "D", path: "/other", cost: "9", status: 429,
		limit: "3", remaining: "3", reset: "1", policy: ipPolicy, rateLimit: `"per_ip";r=3;t=1`, retryAfter: "1"},
	{name: "cost 0 peeks: the cost 9 was not counted", client: "D", path: "/other", cost: "0", status: 200,
		limit: "3", remaining: "3", reset: "0", policy: ipPolicy, rateLimit: `"per_ip";r=3;t=0`},
	{name: "cost 3, the whole capacity, is admitted", client: "D", path: "/other", cost: "3", status: 200,
		limit: "3", remaining: "0", reset: "3600", policy: ipPolicy, rateLimit: `"per_ip";r=0;t=3600`},
}

// backend is a sluice.Limiter behind the middleware, and who must have
// decided each of its checks.
type backend struct {
	name string
	lim  sluice.Limiter
	// owner returns the Owner a decision of (name, key) must carry.
	owner func(name, key string) string
}

// The same scenario of real HTTP requests through httplimit gives the same
// statuses and rate-limit headers whether the middleware's limiter is a
// sluice.Local, a node of a 3-node cluster that owns only some of the keys
// (the others are forwarded to their owners), or a client of a daemon. All
// clocks stand still at backendStart, the guard's too, so
// X-RateLimit-Reset is compared with the rest.
func TestHTTPLimitOnEveryBackend(t *testing.T) {
	clk := fakeclock.New(backendStart)
	set, err := rules.Parse("backends.yaml", []byte(backendRules))
	if err != nil {
		t.Fatal(err)
	}

	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) { cfg.Clock = cluster.ClockFunc(clk.Now) }))
	front := c.Node(0) // the middleware's node
	// The clients' IPs: A's and B's buckets live on the two other nodes,
	// C's on the middleware's own.
	ips := map[string]string{}
	var remote []string // the owners of A's and B's buckets
	for i := 1; i < 255 && len(ips) < 4; i++ {
		ip := fmt.Sprintf("198.51.100.%d", i)
		owner := c.Owner("per_ip", "ip="+ip).Name()
		switch {
		case ips["A"] == "" && owner != front.Name():
			ips["A"], remote = ip, append(remote, owner)
		case ips["B"] == "" && owner != front.Name() && owner != remote[0]:
			ips["B"], remote = ip, append(remote, owner)
		case ips["C"] == "" && owner == front.Name():
			ips["C"] = ip
		case ips["D"] == "" && ips["A"] != "" && ips["B"] != "" && ips["C"] != "":
			ips["D"] = ip
		}
	}
	if len(ips) < 4 {
		t.Fatalf("no IPs owned as wanted: %v", ips)
	}
	t.Logf("clients %v; api_total's owner is %s, the middleware's node %s", ips, c.Owner("api_total", "*").Name(), front.Name())

	d := start(t, testConfig("backends"), WithClock(clk.Now))
	cl, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })

	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	backends := []backend{
		{"sluice.Local", sluice.NewLocal(store, clk.Now), func(string, string) string { return "" }},
		{"cluster.Node", front, func(name, key string) string { return c.Owner(name, key).Name() }},
		{"client.Client", cl, func(string, string) string { return "backends" }},
	}
	got := make([][]backendResult, len(backends))
	for i, b := range backends {
		got[i] = runBackend(t, b, set, clk, ips)
		for j, s := range backendSteps {
			if w := s.want(); got[i][j] != w {
				t.Errorf("%s: step %d (%s): got %v\nwant %v", b.name, j, s.name, got[i][j], w)
			}
		}
	}
	for i := 1; i < len(backends); i++ {
		for j, s := range backendSteps {
			if got[i][j] != got[0][j] {
				t.Errorf("step %d (%s): %s answered %v, %s %v", j, s.name, backends[i].name, got[i][j], backends[0].name, got[0][j])
			}
		}
	}
}

// runBackend sends backendSteps through httplimit on b.lim behind a real
// server and returns each response. It checks that every decision came
// from the owner b names and none from an unreachable policy, and that the
// handler ran for the admitted requests only.
func runBackend(t *testing.T, b backend, set *rules.Set, clk *fakeclock.Clock, ips map[string]string) []backendResult {
	t.Helper()
	var (
		mu       sync.Mutex // guards limits and refunded
		limits   []rules.Limit
		refunded int // requests whose verdict was refunded
	)
	mw, err := httplimit.New(b.lim, rules.NewSource(set),
		httplimit.Guard(rules.GuardConfig{Now: clk.Now}),
		httplimit.TrustedProxies("127.0.0.0/8", "::1"),
		httplimit.Cost(func(r *http.Request) int64 {
			v := r.Header.Get("X-Cost")
			if v == "" {
				return 1
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1 // a limiter failure, which the steps never expect
			}
			return n
		}),
		httplimit.OnDecision(func(ev httplimit.Event) {
			mu.Lock()
			limits = append(limits, ev.Verdict.Limits...)
			if ev.Verdict.Refunded {
				refunded++
			}
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, "ok")
	})))
	defer srv.Close()

	out := make([]backendResult, len(backendSteps))
	var admitted int64
	for i, s := range backendSteps {
		req, err := http.NewRequest(http.MethodGet, srv.URL+s.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", ips[s.client])
		if s.cost != "" {
			req.Header.Set("X-Cost", s.cost)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: step %d (%s): %v", b.name, i, s.name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out[i].status = resp.StatusCode
		// OnDecision ran before the response was written.
		mu.Lock()
		out[i].refunded, refunded = refunded > 0, 0
		mu.Unlock()
		for j, h := range backendHeaders {
			out[i].headers[j] = resp.Header.Get(h)
		}
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	if n := served.Load(); n != admitted {
		t.Errorf("%s: the handler ran %d times for %d admitted requests", b.name, n, admitted)
	}

	mu.Lock()
	defer mu.Unlock()
	owners := map[string]int{}
	for _, l := range limits {
		want := b.owner(l.Request.Name, l.Request.Key)
		if l.Err != nil || l.Decision.WithoutOwner || l.Decision.Owner != want {
			t.Errorf("%s: %s/%s decided by %q (without owner %v, err %v), want by %q",
				b.name, l.Request.Name, l.Request.Key, l.Decision.Owner, l.Decision.WithoutOwner, l.Err, want)
		}
		owners[l.Decision.Owner]++
	}
	t.Logf("%s: decisions by owner %v", b.name, owners)
	return out
}
