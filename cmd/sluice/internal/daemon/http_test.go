package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/leakcheck"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// testConfig is DefaultConfig for a daemon in a test: loopback, free
// ports, fast gossip, and ready alone when it joins no one
// (bootstrap_expect 1).
func testConfig(name string) Config {
	c := DefaultConfig()
	c.NodeName = name
	c.GossipAddr = "127.0.0.1:0"
	c.GRPCAddr = "127.0.0.1:0"
	c.HTTPAddr = "127.0.0.1:0"
	c.GossipProfile = cluster.ProfileFast
	c.RetryJoinInterval = 100 * time.Millisecond
	c.BootstrapExpect = 1
	c.MaxKeys = 100_000
	// A forwarded check under -race on a loaded machine can take more
	// than the default second; the tests are about where checks are
	// decided, not how fast.
	c.PeerTimeout = 10 * time.Second
	return c
}

// withTestCluster builds the daemon's node on cluster.TestConfig, whose
// fast gossip tolerates a process starved of CPU for a second, as a test
// under -race on a loaded machine is: cluster.DefaultConfig's suspects a
// member whose probe is not answered within 100ms, and the ring and the
// routing of its keys change under the test.
func withTestCluster() Option {
	return WithClusterBase(cluster.TestConfig)
}

// start starts a daemon and closes it when the test ends; the test's log
// shows the daemon's logs if it failed, unless opts send them elsewhere.
func start(t testing.TB, cfg Config, opts ...Option) *Daemon {
	t.Helper()
	logs := &lockedBuffer{}
	d, err := New(cfg, append([]Option{WithLogOutput(logs), withTestCluster()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		if t.Failed() && logs.Len() > 0 {
			t.Logf("logs of %s:\n%s", cfg.NodeName, logs)
		}
	})
	return d
}

// waitSettled waits until every daemon of ds is ready, routes over
// len(ds) members and has the hand-over confirmation of each: before that,
// a check of a key that moved waits for the confirmation (up to
// cluster.Config.HandoverTimeout, 5s) and may then be decided without its owner.
func waitSettled(t testing.TB, ds []*Daemon) {
	t.Helper()
	// As testcluster.DefaultWait: under -race beside other test binaries,
	// gossip flaps and hand-over confirmations are retried for more than
	// 30s before the daemons settle.
	err := testwait.Until(time.Minute, func() error {
		for _, d := range ds {
			n := d.Node()
			switch {
			case !d.Ready():
				return fmt.Errorf("%s is not ready", n.Name())
			case len(n.RingMembers()) != len(ds):
				return fmt.Errorf("%s routes over %v", n.Name(), n.RingMembers())
			case len(n.Unconfirmed()) != 0:
				return fmt.Errorf("%s waits for the hand-over confirmations of %v", n.Name(), n.Unconfirmed())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%d daemons ready, each routing over all, confirmed: %v", len(ds), err)
	}
}

// probe is an HTTP client that opens a new connection per request, so that
// a closed listener shows at once.
var probe = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

type response struct {
	status      int
	contentType string
	body        []byte
}

func do(t *testing.T, method, url, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := probe.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header.Get("Content-Type"), b}
}

// gauge returns the value of the unlabelled gauge name in d's registry.
func gauge(t *testing.T, d *Daemon, name string) float64 {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// scrape GETs /metrics and returns every sample by its series, such as
// `sluice_http_requests_total{code="200",endpoint="/healthz"}`.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	r := do(t, http.MethodGet, base+"/metrics", "")
	if r.status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", r.status, r.body)
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(string(r.body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// checkStep is one request to the check endpoint and what must come back.
type checkStep struct {
	name          string
	method, path  string // default POST /v1/check
	body          string
	wantStatus    int
	wantField     string // for errors
	wantCode      string
	wantAllowed   bool // for 200
	wantRemaining int64
	wantInDetail  string
}

func runSteps(t *testing.T, base string, steps []checkStep) {
	t.Helper()
	for _, s := range steps {
		method, path := s.method, s.path
		if method == "" {
			method, path = http.MethodPost, "/v1/check"
		}
		r := do(t, method, base+path, s.body)
		if r.status != s.wantStatus {
			t.Errorf("%s: status %d, want %d: %s", s.name, r.status, s.wantStatus, r.body)
			continue
		}
		switch {
		case r.status == http.StatusOK:
			var d Decision
			if err := json.Unmarshal(r.body, &d); err != nil {
				t.Errorf("%s: %v: %s", s.name, err, r.body)
				continue
			}
			if d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining || d.Owner == "" {
				t.Errorf("%s: got %s, want allowed %v remaining %d", s.name, r.body, s.wantAllowed, s.wantRemaining)
			}
		case r.status == http.StatusMethodNotAllowed || r.status == http.StatusNotFound:
		default:
			if r.contentType != "application/problem+json" {
				t.Errorf("%s: content type %q", s.name, r.contentType)
			}
			var p problem
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Errorf("%s: %v: %s", s.name, err, r.body)
				continue
			}
			if p.Status != s.wantStatus || p.Field != s.wantField || p.Code != s.wantCode || p.Detail == "" || p.Title == "" {
				t.Errorf("%s: problem %s, want field %q code %q", s.name, r.body, s.wantField, s.wantCode)
			}
			if !strings.Contains(p.Detail, s.wantInDetail) {
				t.Errorf("%s: detail %q does not contain %q", s.name, p.Detail, s.wantInDetail)
			}
		}
	}
}

func TestCheckEndpoint(t *testing.T) {
	d := start(t, testConfig("http-check"))
	base := "http://" + d.HTTPAddr()
	req := func(key, extra string) string {
		return fmt.Sprintf(`{"name":"api","key":%q,"limit":3,"period":"1h","algorithm":"token_bucket"%s}`, key, extra)
	}
	// rawKey is req with the key's JSON text as given, escapes and all.
	rawKey := func(key string) string {
		return `{"name":"api","key":"` + key + `","limit":3,"period":"1h","algorithm":"token_bucket"}`
	}
	runSteps(t, base, []checkStep{
		{name: "first hit", body: req("a", ""), wantStatus: 200, wantAllowed: true, wantRemaining: 2},
		{name: "peek", body: req("a", `,"hits":0`), wantStatus: 200, wantAllowed: true, wantRemaining: 2},
		{name: "two hits", body: req("a", `,"hits":2`), wantStatus: 200, wantAllowed: true, wantRemaining: 0},
		{name: "limited", body: req("a", ""), wantStatus: 200, wantAllowed: false, wantRemaining: 0},
		{name: "reset", body: req("a", `,"reset":true`), wantStatus: 200, wantAllowed: true, wantRemaining: 2},
		{name: "period in nanoseconds", body: `{"name":"api","key":"ns","limit":5,"period":60000000000,"algorithm":"gcra","unreachable":"deny"}`, wantStatus: 200, wantAllowed: true, wantRemaining: 4},
		{name: "calendar", body: `{"name":"day","key":"c","limit":5,"algorithm":"fixed_window","calendar":"day","time_zone":"Europe/Paris"}`, wantStatus: 200, wantAllowed: true, wantRemaining: 4},

		{name: "malformed", body: `{"name":`, wantStatus: 400, wantCode: "invalid_argument", wantInDetail: "malformed JSON"},
		{name: "syntax error", body: `{"name" "x"}`, wantStatus: 400, wantCode: "invalid_argument", wantInDetail: "malformed JSON at byte"},
		{name: "trailing data", body: req("a", "") + `{}`, wantStatus: 400, wantCode: "invalid_argument", wantInDetail: "after the JSON object"},
		{name: "invalid UTF-8 in a key", body: `{"name":"api","key":"a` + "\xff" + `","limit":3,"period":"1h","algorithm":"token_bucket"}`, wantStatus: 400, wantField: "key", wantCode: "invalid_key", wantInDetail: "key is not valid UTF-8 (byte 22)"},
		{name: "lone high surrogate in a key", body: rawKey(`\ud800`), wantStatus: 400, wantField: "key", wantCode: "invalid_key", wantInDetail: `\ud800, a lone UTF-16 surrogate`},
		{name: "high surrogate without its low one", body: rawKey(`a\udbffb`), wantStatus: 400, wantField: "key", wantCode: "invalid_key", wantInDetail: "surrogate"},
		{name: "lone low surrogate in a name", body: `{"name":"\udc00","key":"k","limit":1,"period":"1s","algorithm":"gcra"}`, wantStatus: 400, wantField: "name", wantCode: "invalid_name", wantInDetail: "surrogate"},
		{name: "a surrogate pair is a character", body: rawKey(`\ud83d\ude00`), wantStatus: 200, wantAllowed: true, wantRemaining: 2},
		{name: "U+FFFD itself is a key", body: rawKey(`\ufffd`), wantStatus: 200, wantAllowed: true, wantRemaining: 2},
		{name: "empty body", body: "", wantStatus: 400, wantInDetail: "empty"},
		{name: "array body", body: `[]`, wantStatus: 400, wantCode: "invalid_argument", wantInDetail: "want a JSON object"},
		{name: "unknown field", body: req("a", `,"limt":3`), wantStatus: 400, wantField: "limt", wantCode: "invalid_argument", wantInDetail: `unknown field "limt"`},
		{name: "bad algorithm", body: `{"name":"n","key":"k","limit":1,"period":"1s","algorithm":"leaky"}`, wantStatus: 400, wantField: "algorithm", wantCode: "unknown_algorithm", wantInDetail: `"leaky"`},
		{name: "no algorithm", body: `{"name":"n","key":"k","limit":1,"period":"1s"}`, wantStatus: 400, wantField: "algorithm", wantCode: "unknown_algorithm", wantInDetail: "required"},
		{name: "zero limit", body: `{"name":"n","key":"k","limit":0,"period":"1s","algorithm":"gcra"}`, wantStatus: 400, wantField: "limit", wantCode: "invalid_limit"},
		{name: "limit as a string", body: `{"name":"n","key":"k","limit":"3","period":"1s","algorithm":"gcra"}`, wantStatus: 400, wantField: "limit", wantCode: "invalid_limit", wantInDetail: "integer"},
		{name: "fractional hits", body: req("a", `,"hits":1.5`), wantStatus: 400, wantField: "hits", wantCode: "invalid_hits"},
		{name: "bad period", body: `{"name":"n","key":"k","limit":1,"period":"1 minute","algorithm":"gcra"}`, wantStatus: 400, wantField: "period", wantCode: "invalid_period"},
		{name: "no period", body: `{"name":"n","key":"k","limit":1,"algorithm":"gcra"}`, wantStatus: 400, wantField: "period", wantCode: "invalid_period"},
		{name: "hits over the burst", body: req("a", `,"hits":4`), wantStatus: 400, wantField: "hits", wantCode: "hits_exceed_limit"},
		{name: "empty key", body: req("", ""), wantStatus: 400, wantField: "key", wantCode: "invalid_key"},
		{name: "bad calendar", body: `{"name":"n","key":"k","limit":1,"algorithm":"fixed_window","calendar":"fortnight"}`, wantStatus: 400, wantField: "calendar", wantCode: "invalid_calendar"},
		{name: "calendar on a bucket", body: `{"name":"n","key":"k","limit":1,"algorithm":"token_bucket","calendar":"day"}`, wantStatus: 400, wantField: "calendar", wantCode: "invalid_calendar"},
		{name: "bad time zone", body: `{"name":"n","key":"k","limit":1,"algorithm":"fixed_window","calendar":"day","time_zone":"Mars/Olympus"}`, wantStatus: 400, wantField: "time_zone", wantCode: "invalid_calendar"},
		{name: "bad policy", body: req("a", `,"unreachable":"sometimes"`), wantStatus: 400, wantField: "unreachable", wantCode: "invalid_argument"},

		{name: "wrong method", method: http.MethodGet, path: "/v1/check", wantStatus: 405},
		{name: "unknown path", method: http.MethodPost, path: "/v1/chek", body: req("a", ""), wantStatus: 404},
	})
}

func TestBatchEndpoint(t *testing.T) {
	cfg := testConfig("http-batch")
	cfg.MaxBatchItems = 10
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	body := `{"requests":[
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log"},
		{"name":"api","key":"b","limit":0,"period":"1m","algorithm":"sliding_window_log"},
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log","extra":1},
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log","unreachable":"allow"},
		"not an object",
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log","hits":0},
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log","unreachable":"deny"},
		{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"sliding_window_log","time_zone":"../etc/passwd"}
	]}`
	r := do(t, http.MethodPost, base+"/v1/check/batch", body)
	if r.status != 200 || r.contentType != "application/json" {
		t.Fatalf("status %d %q: %s", r.status, r.contentType, r.body)
	}
	var out struct {
		Responses []struct {
			*Decision
			Error *itemError `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	type want struct {
		allowed   bool
		remaining int64
		errField  string
		errCode   string
	}
	// Items are decided in groups by policy, so the order between groups
	// is not the order of the batch: count what the groups admitted.
	wants := []want{
		0: {errField: ""}, // decided: checked below
		1: {errField: "limit", errCode: "invalid_limit"},
		2: {errField: "extra", errCode: "invalid_argument"},
		3: {},
		4: {errField: "", errCode: "invalid_argument"},
		5: {},
		6: {},
		7: {errField: "time_zone", errCode: "invalid_calendar"},
	}
	if len(out.Responses) != len(wants) {
		t.Fatalf("%d responses, want %d: %s", len(out.Responses), len(wants), r.body)
	}
	admitted := 0
	for i, w := range wants {
		got := out.Responses[i]
		if w.errCode != "" {
			if got.Error == nil || got.Error.Code != w.errCode || got.Error.Field != w.errField || got.Error.Message == "" || got.Decision != nil {
				t.Errorf("item %d: %+v %+v, want error %s on %q", i, got.Decision, got.Error, w.errCode, w.errField)
			}
			continue
		}
		if got.Error != nil || got.Decision == nil || got.Owner != "http-batch" || got.Limit != 2 || got.ResetAt == "" {
			t.Errorf("item %d: %+v %+v, want a decision", i, got.Decision, got.Error)
			continue
		}
		if i != 5 && got.Allowed { // item 5 peeks
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("%d of 3 hits admitted on a limit of 2: %s", admitted, r.body)
	}

	many := `{"requests":[` + strings.Repeat(`{},`, 10) + `{}]}`
	runSteps(t, base, []checkStep{
		{name: "too many items", path: "/v1/check/batch", method: http.MethodPost, body: many, wantStatus: 400, wantField: "requests", wantCode: "invalid_argument", wantInDetail: "11 items"},
		{name: "unknown top-level field", path: "/v1/check/batch", method: http.MethodPost, body: `{"items":[]}`, wantStatus: 400, wantField: "items", wantCode: "invalid_argument"},
		{name: "requests not a list", path: "/v1/check/batch", method: http.MethodPost, body: `{"requests":{}}`, wantStatus: 400, wantField: "requests", wantCode: "invalid_argument"},
		{name: "malformed", path: "/v1/check/batch", method: http.MethodPost, body: `{"requests":[`, wantStatus: 400, wantCode: "invalid_argument"},
		{name: "a lone surrogate in an item", path: "/v1/check/batch", method: http.MethodPost,
			body:       `{"requests":[{"name":"api","key":"b","limit":2,"period":"1m","algorithm":"gcra"},{"name":"api","key":"\udfff","limit":2,"period":"1m","algorithm":"gcra"}]}`,
			wantStatus: 400, wantField: "requests[1].key", wantCode: "invalid_key", wantInDetail: "surrogate"},
	})
	if r := do(t, http.MethodPost, base+"/v1/check/batch", `{"requests":[]}`); r.status != 200 || strings.TrimSpace(string(r.body)) != `{"responses":[]}` {
		t.Errorf("empty batch: %d %s", r.status, r.body)
	}
}

func TestBodyTooLarge(t *testing.T) {
	cfg := testConfig("http-large")
	cfg.MaxBodyBytes = MinBodyBytes
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	big := fmt.Sprintf(`{"name":"n","key":%q,"limit":1,"period":"1s","algorithm":"gcra"}`, strings.Repeat("k", MinBodyBytes))
	for _, path := range []string{"/v1/check", "/v1/check/batch"} {
		r := do(t, http.MethodPost, base+path, big)
		if r.status != http.StatusRequestEntityTooLarge || r.contentType != "application/problem+json" || !strings.Contains(string(r.body), "1024 bytes") {
			t.Errorf("%s: %d %q %s", path, r.status, r.contentType, r.body)
		}
	}
	// Just under the bound is fine.
	ok := fmt.Sprintf(`{"name":"n","key":%q,"limit":1,"period":"1s","algorithm":"gcra"}`, strings.Repeat("k", 900))
	if r := do(t, http.MethodPost, base+"/v1/check", ok); r.status != 200 {
		t.Errorf("900-byte key: %d %s", r.status, r.body)
	}
}

func TestHealthReadyAndMetrics(t *testing.T) {
	d := start(t, testConfig("http-health"))
	base := "http://" + d.HTTPAddr()
	if r := do(t, http.MethodGet, base+"/healthz", ""); r.status != 200 || !strings.Contains(string(r.body), `"ok"`) {
		t.Errorf("/healthz: %d %s", r.status, r.body)
	}
	r := do(t, http.MethodGet, base+"/readyz", "")
	if r.status != 200 || !strings.Contains(string(r.body), `"members":1`) || !strings.Contains(string(r.body), `"ready"`) {
		t.Errorf("/readyz: %d %s", r.status, r.body)
	}
	check := `{"name":"m","key":"k","limit":2,"period":"1h","algorithm":"gcra"}`
	for range 3 {
		do(t, http.MethodPost, base+"/v1/check", check)
	}
	do(t, http.MethodPost, base+"/v1/check", `{`)
	do(t, http.MethodPost, base+"/v1/check/batch", `{"requests":[`+check+`,{}]}`)
	do(t, http.MethodGet, base+"/nope", "")

	m := scrape(t, base)
	want := map[string]float64{
		`sluice_http_requests_total{code="200",endpoint="/healthz"}`:        1,
		`sluice_http_requests_total{code="200",endpoint="/readyz"}`:         1,
		`sluice_http_requests_total{code="200",endpoint="/v1/check"}`:       3,
		`sluice_http_requests_total{code="400",endpoint="/v1/check"}`:       1,
		`sluice_http_requests_total{code="200",endpoint="/v1/check/batch"}`: 1,
		`sluice_http_requests_total{code="404",endpoint="other"}`:           1,
		`sluice_http_check_items_total{result="allowed"}`:                   2,
		`sluice_http_check_items_total{result="limited"}`:                   2,
		`sluice_http_check_items_total{result="invalid"}`:                   2,
		`sluice_http_check_items_total{result="failed"}`:                    0,
		`sluice_http_request_duration_seconds_count{endpoint="/v1/check"}`:  4,
		`sluice_http_requests_in_flight`:                                    1, // the scrape itself
		`sluice_daemon_ready`:                                               1,
		// The node's own metrics, on the same registry.
		`sluice_checks_total{algorithm="gcra",name="m",result="allowed"}`: 2,
		`sluice_checks_total{algorithm="gcra",name="m",result="limited"}`: 2,
		`sluice_members`: 1,
	}
	for series, v := range want {
		if got, ok := m[series]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	for _, series := range []string{"go_goroutines", "process_start_time_seconds"} {
		if _, ok := m[series]; !ok {
			t.Errorf("no %s: the Go and process collectors are missing", series)
		}
	}
}

func TestReadyzWaitsForTheJoin(t *testing.T) {
	// A seed nobody answers at: the node starts alone and is not ready.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	cfg := testConfig("lonely")
	cfg.Join = []string{dead}
	lonely := start(t, cfg)
	r := do(t, http.MethodGet, "http://"+lonely.HTTPAddr()+"/readyz", "")
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "joining") {
		t.Errorf("/readyz with no seed: %d %s", r.status, r.body)
	}

	seed := start(t, testConfig("seed"))
	cfg = testConfig("joiner")
	cfg.Join = []string{seed.GossipAddr()}
	joiner := start(t, cfg)
	testwait.For(t, "the joiner to be ready", func() bool {
		return do(t, http.MethodGet, "http://"+joiner.HTTPAddr()+"/readyz", "").status == http.StatusOK
	})
	if lonely.Ready() {
		t.Error("the node with a dead seed became ready")
	}
}

func TestGracefulShutdown(t *testing.T) {
	inDelay, release := make(chan struct{}), make(chan struct{})
	cfg := testConfig("http-shutdown")
	cfg.ShutdownDelay = time.Hour // replaced below: the test ends the delay
	d := start(t, cfg, WithSleep(func(ctx context.Context, dur time.Duration) {
		if dur != time.Hour {
			t.Errorf("delay %v, want the config's", dur)
		}
		close(inDelay)
		<-release
	}))
	base := "http://" + d.HTTPAddr()

	// A check whose body arrives in two parts stays in flight in between.
	pr, pw := io.Pipe()
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := probe.Post(base+"/v1/check", "application/json", pr)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b), err}
	}()
	if _, err := io.WriteString(pw, `{"name":"drain","key":"k",`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the check to be in flight", func() bool { return gauge(t, d, "sluice_http_requests_in_flight") == 1 })

	stopped := make(chan error, 1)
	go func() { stopped <- d.Shutdown(context.Background()) }()
	<-inDelay
	// During the delay the daemon still serves, but reports not ready.
	if r := do(t, http.MethodGet, base+"/readyz", ""); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "shutting down") {
		t.Errorf("/readyz while shutting down: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodGet, base+"/healthz", ""); r.status != http.StatusOK {
		t.Errorf("/healthz while shutting down: %d", r.status)
	}
	close(release)
	// Then it stops accepting, while the check in flight goes on.
	testwait.For(t, "the listener to close", func() bool {
		resp, err := probe.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	default:
	}
	if _, err := io.WriteString(pw, `"limit":1,"period":"1s","algorithm":"gcra"}`); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	res := <-done
	if res.err != nil || res.status != http.StatusOK || !strings.Contains(res.body, `"allowed":true`) {
		t.Errorf("the in-flight check: %d %q %v", res.status, res.body, res.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	// The node has left and closed.
	_, err := d.Node().Check(context.Background(), limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 1, Period: time.Second, Algorithm: limiter.GCRA})
	if !errors.Is(err, cluster.ErrClosed) {
		t.Errorf("node Check after Shutdown = %v, want cluster.ErrClosed", err)
	}
	if err := d.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
}

func TestNewFailures(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(Config{}) = %v", err)
	}
	// A taken HTTP port fails before the node starts.
	taken := start(t, testConfig("taken"))
	cfg := testConfig("second")
	cfg.HTTPAddr = taken.HTTPAddr()
	if _, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "http_addr") {
		t.Errorf("New on a taken port = %v", err)
	}
}

// lockedBuffer is a bytes.Buffer safe for the daemon's logger and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

// A shutdown whose hand-off cannot reach a new owner (they died just
// before) still succeeds: the daemon warns and leaves.
func TestShutdownWithIncompleteHandoff(t *testing.T) {
	var logs lockedBuffer
	var ds []*Daemon
	for i := range 3 {
		cfg := testConfig(fmt.Sprintf("handoff-%d", i))
		cfg.LeaveTimeout = 2 * time.Second
		if i > 0 {
			cfg.Join = []string{ds[0].GossipAddr()}
		}
		var opts []Option
		if i == 0 {
			opts = append(opts, WithLogOutput(&logs))
		}
		ds = append(ds, start(t, cfg, opts...))
	}
	waitSettled(t, ds)
	// Keys on node 0 whose owner without node 0 is node 1.
	body := func(k int) string {
		return fmt.Sprintf(`{"name":"handoff","key":"k%d","limit":10,"period":"1h","algorithm":"token_bucket"}`, k)
	}
	for k := range 200 {
		if r := do(t, "POST", "http://"+ds[0].HTTPAddr()+"/v1/check", body(k)); r.status != 200 {
			t.Fatalf("check: %d %s", r.status, r.body)
		}
	}
	ds[1].Close() // hard: node 0 may still route to them
	ds[2].Close()
	if err := ds[0].Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown = %v, want nil despite the hand-off", err)
	}
	if !strings.Contains(logs.String(), "not handed off") {
		t.Errorf("no warning of the incomplete hand-off in the log:\n%s", logs.String())
	}
}
