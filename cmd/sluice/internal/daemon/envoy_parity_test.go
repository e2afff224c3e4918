package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/fakeclock"
)

// healthClient is a grpc.health.v1 client of addr.
func healthClient(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// healthOf returns the status grpc.health.v1 gives service, or the
// error's text.
func healthOf(t *testing.T, c healthpb.HealthClient, service string) string {
	t.Helper()
	resp, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err.Error()
	}
	return resp.Status.String()
}

// GET /healthcheck and grpc.health.v1 (services "ratelimit" and "") say
// what /readyz says: ready, then not from the start of a shutdown (its
// delay included, while the daemon still serves), with a Watch stream
// told at once; a node that has not joined its cluster is not ready.
func TestEnvoyHealth(t *testing.T) {
	for _, peerAddr := range []bool{false, true} {
		inDelay, release := make(chan struct{}), make(chan struct{})
		cfg := testConfig("health")
		cfg.EnvoyConfigDir = envoyDir(t)
		cfg.ShutdownDelay = time.Hour
		if peerAddr {
			cfg.PeerAddr = "127.0.0.1:0"
		}
		d := start(t, cfg, WithSleep(func(ctx context.Context, _ time.Duration) {
			close(inDelay)
			<-release
		}))
		base := "http://" + d.HTTPAddr()
		hc := healthClient(t, d.GRPCAddr())
		if r := do(t, http.MethodGet, base+"/healthcheck", ""); r.status != http.StatusOK || string(r.body) != "OK" {
			t.Errorf("peer_addr %v: /healthcheck when ready: %d %q", peerAddr, r.status, r.body)
		}
		for _, svc := range []string{"ratelimit", ""} {
			if got := healthOf(t, hc, svc); got != "SERVING" {
				t.Errorf("peer_addr %v: health of %q when ready: %s", peerAddr, svc, got)
			}
		}
		if got := healthOf(t, hc, "other"); !strings.Contains(got, "NotFound") {
			t.Errorf("health of an unknown service: %s", got)
		}
		ctx, cancel := context.WithCancel(context.Background())
		watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := watch.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("first watch status: %v %v", m, err)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- d.Shutdown(context.Background()) }()
		<-inDelay
		if m, err := watch.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("watch status at shutdown: %v %v", m, err)
		}
		if r := do(t, http.MethodGet, base+"/healthcheck", ""); r.status != http.StatusInternalServerError {
			t.Errorf("/healthcheck while shutting down: %d %q", r.status, r.body)
		}
		for _, svc := range []string{"ratelimit", ""} {
			if got := healthOf(t, hc, svc); got != "NOT_SERVING" {
				t.Errorf("health of %q while shutting down: %s", svc, got)
			}
		}
		cancel()
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
	}

	cfg := testConfig("health-lonely")
	cfg.Join = []string{"127.0.0.1:1"} // nobody there
	d := start(t, cfg)
	if r := do(t, http.MethodGet, "http://"+d.HTTPAddr()+"/healthcheck", ""); r.status != http.StatusInternalServerError {
		t.Errorf("/healthcheck before joining: %d", r.status)
	}
	if got := healthOf(t, healthClient(t, d.GRPCAddr()), "ratelimit"); got != "NOT_SERVING" {
		t.Errorf("health before joining: %s", got)
	}
}

// POST /json is envoyproxy/ratelimit's JSON form of ShouldRateLimit: 200
// with the response, 429 once over, 400 for what is not a request, 404
// without an Envoy configuration.
func TestEnvoyJSON(t *testing.T) {
	cfg := testConfig("json")
	cfg.EnvoyConfigDir = envoyDir(t)
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	base := "http://" + d.HTTPAddr()
	const req = `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`
	for i := range 5 {
		r := do(t, http.MethodPost, base+"/json", req)
		if r.status != http.StatusOK || r.contentType != "application/json" || !strings.Contains(string(r.body), `"overallCode":"OK"`) {
			t.Fatalf("call %d: %d %s %s", i, r.status, r.contentType, r.body)
		}
	}
	r := do(t, http.MethodPost, base+"/json", req)
	if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), `"overallCode":"OVER_LIMIT"`) ||
		!strings.Contains(string(r.body), `"durationUntilReset":"40s"`) {
		t.Errorf("over: %d %s", r.status, r.body)
	}
	for _, bad := range []string{`{"domain":`, `{"domain":"api","descriptors":[],"colour":1}`, `{"domain":"api"}`, `[]`} {
		if r := do(t, http.MethodPost, base+"/json", bad); r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
	off := start(t, testConfig("json-off"))
	if r := do(t, http.MethodPost, "http://"+off.HTTPAddr()+"/json", req); r.status != http.StatusNotFound {
		t.Errorf("without an Envoy configuration: %d %s", r.status, r.body)
	}
}

// The daemon's Envoy settings: a known key out of place is a counted
// warning (refused with envoy_strict_config); global shadow mode answers
// OK and counts; an unknown domain is logged and counted; the reset is
// whole seconds unless envoy_exact_reset.
func TestEnvoySettings(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "api.yaml", "domain: api\ndescriptors:\n  - key: user\n    unit: second\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	cfg := testConfig("envoy-strict")
	cfg.EnvoyConfigDir = dir
	cfg.EnvoyStrictConfig = true
	if _, err := New(cfg, WithLogOutput(&lockedBuffer{})); !errors.Is(err, envoyrls.ErrInvalidConfig) || !strings.Contains(err.Error(), `:4:5: unknown key "unit"`) {
		t.Fatalf("strict: %v", err)
	}

	clk := fakeclock.New(rulesStart.Add(500 * time.Millisecond))
	for _, exact := range []bool{false, true} {
		cfg := testConfig("envoy-settings")
		cfg.EnvoyConfigDir = dir
		cfg.EnvoyShadowMode = true
		cfg.EnvoyExactReset = exact
		var logs lockedBuffer
		d := start(t, cfg, WithClock(clk.Now), WithLogOutput(&logs))
		client := rlsClient(t, d.GRPCAddr())
		call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
			t.Helper()
			resp, err := client.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		call(rlsRequest("api", []string{"user=u"}))
		resp := call(rlsRequest("api", []string{"user=u"}))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("shadow mode: %s", rlsSummary(resp))
		}
		wantReset := 40 * time.Second // 39.5s rounded up
		if exact {
			wantReset = 39*time.Second + 500*time.Millisecond
		}
		if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != wantReset {
			t.Errorf("exact %v: duration_until_reset %v, want %v", exact, got, wantReset)
		}
		for range 3 {
			if resp := call(rlsRequest("nope", []string{"user=u"})); resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("unknown domain: %s", rlsSummary(resp))
			}
		}
		m := scrape(t, "http://"+d.HTTPAddr())
		for series, want := range map[string]float64{
			`sluice_envoy_config_warnings_total`:                                     1,
			`sluice_envoy_global_shadow_mode_total{domain="api"}`:                    1,
			`sluice_envoy_unknown_domain_total{domain="nope"}`:                       3,
			`sluice_envoy_hits_total{domain="api",key="api.user",stat="over_limit"}`: 1,
		} {
			if m[series] != want {
				t.Errorf("%s = %v, want %v", series, m[series], want)
			}
		}
		out := logs.String()
		if n := strings.Count(out, "unknown domain"); n != 1 || !strings.Contains(out, `key \"unit\" is ignored here`) {
			t.Errorf("%d logs of the unknown domain (want 1, the clock stands still), and the ignored key:\n%s", n, out)
		}
	}
}

// The other envoyproxy/ratelimit switches through the daemon and
// go-control-plane's RLS client: merged domain files, a hits_addend of 0
// on a full window, quota mode, dynamic metadata, no charge for a request
// over but on the descriptor over, and upstream's near/over statistics.
func TestEnvoyModes(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "m1.yaml", "domain: m\ndescriptors:\n  - key: a\n    metadata: {team: alpha}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	writeEnvoyFile(t, dir, "m2.yaml", "domain: m\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	cfg := testConfig("envoy-modes")
	cfg.EnvoyConfigDir = dir
	if _, err := New(cfg, WithLogOutput(&lockedBuffer{})); !errors.Is(err, envoyrls.ErrDuplicateDomain) {
		t.Fatalf("two files of one domain without envoy_merge_domains: %v", err)
	}
	cfg.EnvoyMergeDomains, cfg.EnvoyQuotaMode, cfg.EnvoyDynamicMetadata, cfg.EnvoyStopIncrementOverLimit = true, true, true, true
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	client := rlsClient(t, d.GRPCAddr())
	call := rlsCaller(t, client, "m")
	for i, s := range []struct {
		hits    uint64
		entries []string
		want    string
	}{
		{0, []string{"b=1"}, "OK; OK r=2"},
		{2, []string{"b=1"}, "OK; OK r=0"},
		{0, []string{"b=1"}, "OK; OK r=0"},                        // full is not over
		{1, []string{"a=1", "b=1"}, "OK; OK r=5; OVER_LIMIT r=0"}, // quota mode: a is not over, nor charged
		{0, []string{"a=1"}, "OK; OK r=5"},                        // nothing charged but the descriptor over
	} {
		if got := rlsSummary(call(s.hits, s.entries...)); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
	md := call(1, "a=1").DynamicMetadata
	if md.GetFields()["domain"].GetStringValue() != "m" || md.GetFields()["metadata"].GetStructValue().GetFields()["team"].GetStringValue() != "alpha" {
		t.Errorf("dynamic metadata: %v", md)
	}
	m := scrape(t, "http://"+d.HTTPAddr())
	for series, want := range map[string]float64{
		`sluice_envoy_hits_total{domain="m",key="m.b",stat="within_limit"}`: 2,
		`sluice_envoy_hits_total{domain="m",key="m.b",stat="near_limit"}`:   1,
		`sluice_envoy_hits_total{domain="m",key="m.b",stat="over_limit"}`:   1,
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
}
