package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
)

// envoyMessaging is envoyproxy/ratelimit's README example 2: 5 marketing
// messages a day to each number, 100 messages of any kind.
const envoyMessaging = `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`

// envoyAPI limits each user to 5 a minute, and watches each client in
// shadow mode with a detailed metric.
const envoyAPI = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// writeEnvoyFile writes a configuration file into dir as a deployment
// should: to a hidden temporary file renamed over the file.
func writeEnvoyFile(t *testing.T, dir, name, text string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// envoyDir returns a new directory holding the messaging and api
// domains.
func envoyDir(t *testing.T) string {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "messaging.yaml", envoyMessaging)
	writeEnvoyFile(t, dir, "api.yaml", envoyAPI)
	return dir
}

// rlsClient is go-control-plane's client of Envoy's rate limit service,
// connected to addr.
// rlsCaller returns a function that asks client about domain with one
// descriptor per entry ("key=value"), each with hits as its hits_addend.
func rlsCaller(t *testing.T, client rlsv3.RateLimitServiceClient, domain string) func(hits uint64, entries ...string) *rlsv3.RateLimitResponse {
	return func(hits uint64, entries ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: domain}
		for _, e := range entries {
			one := rlsRequest(domain, []string{e}).Descriptors[0]
			one.HitsAddend = wrapperspb.UInt64(hits)
			req.Descriptors = append(req.Descriptors, one)
		}
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
}

func rlsClient(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// rlsRequest is a request of domain with one descriptor per list of
// "key=value" entries.
func rlsRequest(domain string, descriptors ...[]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, entries := range descriptors {
		d := &rlcommon.RateLimitDescriptor{}
		for _, e := range entries {
			k, v, _ := strings.Cut(e, "=")
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// rlsSummary writes a response on one line: the overall code, then each
// descriptor's code and limit_remaining, then the response headers.
func rlsSummary(r *rlsv3.RateLimitResponse) string {
	parts := []string{r.OverallCode.String()}
	for _, st := range r.Statuses {
		parts = append(parts, fmt.Sprintf("%s r=%d", st.Code, st.LimitRemaining))
	}
	for _, h := range r.ResponseHeadersToAdd {
		parts = append(parts, h.Key+"="+h.Value)
	}
	return strings.Join(parts, "; ")
}

// Three daemons serve Envoy's rate limit service from one configuration
// directory; Go's client of the service, sending each user's requests to
// the three in turn, all users at once, gets exactly 5 OK per user a
// minute, counted by the owner of each user's key whichever daemon was
// asked; 30 requests on one key at once, 10 at each daemon, get 5 OK;
// and the README's messaging example holds across them.
func TestEnvoyLimitAcrossCluster(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	dir := envoyDir(t)
	ds := startThree(t, "envoy", func(c *Config) {
		c.EnvoyConfigDir = dir
		c.EnvoyResponseHeaders = EnvoyHeadersDraft
	}, WithClock(clk.Now))
	var clients []rlsv3.RateLimitServiceClient
	for _, d := range ds {
		clients = append(clients, rlsClient(t, d.GRPCAddr()))
	}
	users := keysOnEveryNode(ds[0].Node(), serverNamePrefix+"envoy/minute", "api|user=", 9)

	var wg sync.WaitGroup
	errs := make(chan error, len(users))
	for _, u := range users {
		wg.Go(func() {
			for i := range 8 {
				resp, err := clients[i%3].ShouldRateLimit(context.Background(), rlsRequest("api", []string{"user=" + u}))
				if err != nil {
					errs <- err
					return
				}
				want := fmt.Sprintf("OK; OK r=%d; RateLimit-Limit=5; RateLimit-Remaining=%d; RateLimit-Reset=40", 4-i, 4-i)
				if i >= 5 {
					want = "OVER_LIMIT; OVER_LIMIT r=0; RateLimit-Limit=5; RateLimit-Remaining=0; RateLimit-Reset=40"
				}
				if got := rlsSummary(resp); got != want {
					errs <- fmt.Errorf("%s, request %d to %s: %s, want %s", u, i, ds[i%3].Config().NodeName, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// A burst on one key: 10 requests at each daemon at once, 5 OK.
	var ok atomic.Int64
	errs = make(chan error, 30)
	for i := range 30 {
		wg.Go(func() {
			resp, err := clients[i%3].ShouldRateLimit(context.Background(), rlsRequest("api", []string{"user=burst"}))
			switch {
			case err != nil:
				errs <- err
			case resp.OverallCode == rlsv3.RateLimitResponse_OK:
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ok.Load() != 5 {
		t.Errorf("a burst of 30 on one key across the daemons: %d OK, want 5", ok.Load())
	}

	marketing := []string{"message_type=marketing", "to_number=2061111111"}
	for i := range 6 {
		resp, err := clients[i%3].ShouldRateLimit(context.Background(), rlsRequest("messaging", marketing, []string{"to_number=2061111111"}))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("OK; OK r=%d; OK r=%d; RateLimit-Limit=5; RateLimit-Remaining=%d; RateLimit-Reset=6400", 4-i, 99-i, 4-i)
		if i == 5 {
			want = "OVER_LIMIT; OVER_LIMIT r=0; OK r=94; RateLimit-Limit=5; RateLimit-Remaining=0; RateLimit-Reset=6400"
		}
		if got := rlsSummary(resp); got != want {
			t.Errorf("marketing message %d: %s, want %s", i, got, want)
		}
	}
}

// The configuration directory is loaded at start, where an invalid file
// fails New naming its file and line, and reloaded as it changes, an
// invalid edit leaving the previous configuration in force; /metrics
// counts the hits by envoyproxy/ratelimit's metric keys, shadow-mode and
// detailed ones included.
func TestEnvoyConfigDir(t *testing.T) {
	bad := t.TempDir()
	writeEnvoyFile(t, bad, "api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
	cfg := testConfig("envoy-bad")
	cfg.EnvoyConfigDir = bad
	_, err := New(cfg, WithLogOutput(&lockedBuffer{}))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "envoy_config_dir" || !errors.Is(err, envoyrls.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), filepath.Join(bad, "api.yaml")+":4:24: invalid rate limit unit \"fortnight\"") {
		t.Fatalf("New with an invalid file: %v", err)
	}

	clk := fakeclock.New(rulesStart)
	dir := envoyDir(t)
	cfg = testConfig("envoy-reload")
	cfg.EnvoyConfigDir = dir
	var logs lockedBuffer
	d := start(t, cfg, WithClock(clk.Now), WithLogOutput(&logs),
		WithEnvoyWatch(func(wc *envoyrls.WatchConfig) { wc.PollInterval = envoyrls.MinPollInterval }))
	client := rlsClient(t, d.GRPCAddr())
	call := func(req *rlsv3.RateLimitRequest) string {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return rlsSummary(resp)
	}
	if got := call(rlsRequest("api", []string{"user=u1"})); got != "OK; OK r=4" {
		t.Errorf("first call: %s", got)
	}
	for i, want := range []string{"OK; OK r=1", "OK; OK r=0", "OK; OK r=0", "OK; OK r=0"} { // the 3rd and 4th are over, in shadow mode
		if got := call(rlsRequest("api", []string{"client=c1"})); got != want {
			t.Errorf("client call %d: %s, want %s", i, got, want)
		}
	}
	m := scrape(t, "http://"+d.HTTPAddr())
	for series, want := range map[string]float64{
		`sluice_envoy_hits_total{domain="api",key="api.user",stat="total_hits"}`:        1,
		`sluice_envoy_hits_total{domain="api",key="api.user",stat="within_limit"}`:      1,
		`sluice_envoy_hits_total{domain="api",key="api.client_c1",stat="total_hits"}`:   4,
		`sluice_envoy_hits_total{domain="api",key="api.client_c1",stat="over_limit"}`:   2,
		`sluice_envoy_hits_total{domain="api",key="api.client_c1",stat="shadow_mode"}`:  2,
		`sluice_envoy_hits_total{domain="api",key="api.client_c1",stat="near_limit"}`:   1,
		`sluice_envoy_hits_total{domain="api",key="api.client_c1",stat="within_limit"}`: 2,
		`sluice_envoy_domains`: 2,
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}

	// Raise the users' limit: the next call sees it, and what the window
	// counted stays.
	writeEnvoyFile(t, dir, "api.yaml", strings.Replace(envoyAPI, "requests_per_unit: 5", "requests_per_unit: 50", 1))
	testwait.For(t, "the reload", func() bool {
		return scrape(t, "http://"+d.HTTPAddr())["sluice_envoy_config_reloads_total"] == 1
	})
	if got := call(rlsRequest("api", []string{"user=u1"})); got != "OK; OK r=48" {
		t.Errorf("after the reload: %s, want 48 left of 50", got)
	}
	writeEnvoyFile(t, dir, "api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute}\n    rate_limit: {unit: hour}\n")
	testwait.For(t, "the invalid edit's log line", func() bool {
		return strings.Contains(logs.String(), "keeping the previous configuration") && strings.Contains(logs.String(), filepath.Join(dir, "api.yaml")+":5:5: descriptors[0].rate_limit: the key ") && strings.Contains(logs.String(), "is given twice (first at line 4, column 5)")
	})
	if got := call(rlsRequest("api", []string{"user=u1"})); got != "OK; OK r=47" {
		t.Errorf("after the invalid edit: %s, want the previous limit in force", got)
	}
	if m := scrape(t, "http://"+d.HTTPAddr()); m["sluice_envoy_config_reloads_total"] != 1 || m["sluice_envoy_config_reload_errors_total"] != 1 {
		t.Errorf("reloads %v, errors %v, want 1 and 1", m["sluice_envoy_config_reloads_total"], m["sluice_envoy_config_reload_errors_total"])
	}
}

// Without envoy_config_dir the gRPC port does not serve Envoy's rate
// limit service.
func TestEnvoyServiceOff(t *testing.T) {
	d := start(t, testConfig("envoy-off"))
	_, err := rlsClient(t, d.GRPCAddr()).ShouldRateLimit(context.Background(), rlsRequest("api", []string{"user=u"}))
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("ShouldRateLimit: %v, want Unimplemented", err)
	}
}

// The README's Envoy example is valid: its daemon settings load, and its
// configuration file parses.
func TestEnvoyReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("../../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(first string) string {
		t.Helper()
		_, rest, ok := strings.Cut(string(readme), "```yaml\n"+first+"\n")
		if !ok {
			t.Fatalf("no yaml block starting %q in the README", first)
		}
		text, _, _ := strings.Cut(rest, "```")
		return text
	}
	cfg := DefaultConfig()
	if err := applyYAML(&cfg, "README.md", []byte(block("# sluice.yaml, beside the settings above"))); err != nil || cfg.EnvoyConfigDir == "" || cfg.EnvoyResponseHeaders != EnvoyHeadersDraft {
		t.Errorf("the README's settings: %+v, %v", cfg, err)
	}
	d, err := envoyrls.ParseDomain("README.md", []byte(block("# /etc/sluice/envoy/edge.yaml: 10 requests a second per client address")))
	if err != nil {
		t.Fatal(err)
	}
	if m := d.Match([]envoyrls.Entry{{Key: "remote_address", Value: "192.0.2.1"}}); m.Descriptor == nil || m.Descriptor.RateLimit.RequestsPerUnit != 10 {
		t.Errorf("the README's edge domain: %+v", m.Descriptor)
	}
	// The Envoy Gateway settings load and pass the checks that need no
	// files.
	eg := DefaultConfig()
	eg.NodeName = "eg"
	if err := applyYAML(&eg, "README.md", []byte(block("# sluice.yaml for the pods behind Envoy Gateway's envoy-ratelimit Service"))); err != nil ||
		eg.EnvoyXDSAddr != "envoy-gateway:18001" || eg.EnvoyXDSNodeID != "envoy-ratelimit" || eg.GRPCAddr != ":8081" {
		t.Errorf("the README's Envoy Gateway settings: %+v, %v", eg, err)
	}
	if err := eg.Validate(); err != nil {
		t.Errorf("the README's Envoy Gateway settings: %v", err)
	}
}

// 20,000 descriptor values through Envoy's rate limit service, each new,
// half named in metrics by detailed_metric and half carrying their own
// limit, give at most envoy_metric_keys keys a series of their own; the
// rest count under _other, and the counts still sum to every hit.
func TestEnvoyMetricKeysAreBounded(t *testing.T) {
	cfg := testConfig("envoy-cardinality")
	cfg.EnvoyConfigDir = envoyDir(t)
	cfg.EnvoyMetricKeys = 100
	d := start(t, cfg)
	client := rlsClient(t, d.GRPCAddr())
	const unique, perCall = 20_000, 64 // envoyrls.DefaultConfig().MaxDescriptors
	for i := 0; i < unique; i += perCall {
		req := &rlsv3.RateLimitRequest{Domain: "api"}
		for j := i; j < min(i+perCall, unique); j++ {
			desc := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "client", Value: fmt.Sprintf("c%d", j)}}}
			if j%2 == 1 {
				desc.Entries[0].Key = "caller"
				desc.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		if _, err := client.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	m := scrape(t, "http://"+d.HTTPAddr())
	keys := make(map[string]bool)
	var total float64
	for series, v := range m {
		if !strings.HasPrefix(series, "sluice_envoy_hits_total{") {
			continue
		}
		_, rest, _ := strings.Cut(series, `key="`)
		key, _, _ := strings.Cut(rest, `"`)
		keys[key] = true
		if strings.Contains(series, `stat="total_hits"`) {
			total += v
		}
	}
	if len(keys) > cfg.EnvoyMetricKeys+1 {
		t.Errorf("%d metric keys, more than envoy_metric_keys (%d) and _other", len(keys), cfg.EnvoyMetricKeys)
	}
	if got := m[`sluice_envoy_hits_total{domain="api",key="_other",stat="total_hits"}`]; got != unique-float64(cfg.EnvoyMetricKeys) {
		t.Errorf("_other counts %v hits, want %d", got, unique-cfg.EnvoyMetricKeys)
	}
	if total != unique {
		t.Errorf("total_hits sum to %v, want %d", total, unique)
	}
}
