package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
)

// envoyUpstream exercises envoyproxy/ratelimit's configuration features
// one descriptor each: unlimited, a named limit another replaces,
// shadow mode, a wildcard value before the key's default, nested
// descriptors with and without values, and a detailed metric.
const envoyUpstream = `domain: up
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 3}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 10
      replaces: [{name: per-user}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: org
    value: acme
    rate_limit: {unit: day, requests_per_unit: 50}
    descriptors:
      - key: team
        rate_limit: {unit: second, requests_per_unit: 4}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// rlsStatuses writes each status of r in full: code, current_limit
// (name, requests per unit, unit) or "-", limit_remaining, and
// duration_until_reset in seconds or "-".
func rlsStatuses(r *rlsv3.RateLimitResponse) string {
	parts := []string{r.OverallCode.String()}
	for _, st := range r.Statuses {
		limit := "-"
		if l := st.CurrentLimit; l != nil {
			limit = fmt.Sprintf("%s%d/%s", l.Name+":", l.RequestsPerUnit, l.Unit)
		}
		reset := "-"
		if d := st.DurationUntilReset; d != nil {
			reset = fmt.Sprint(d.AsDuration().Seconds())
		}
		parts = append(parts, fmt.Sprintf("%s %s r=%d t=%s", st.Code, limit, st.LimitRemaining, reset))
	}
	for _, h := range r.ResponseHeadersToAdd {
		parts = append(parts, h.Key+"="+h.Value)
	}
	return strings.Join(parts, "; ")
}

// Each response of the daemon, asked through go-control-plane's RLS
// client, is what envoyproxy/ratelimit's service answers (read from its
// src/service/ratelimit.go, src/config/config_impl.go and
// src/limiter/base_limiter.go): an unlimited descriptor is OK with
// remaining MaxUint32 and no limit; a replaced limit is OK with no limit;
// a shadow_mode limit over is OK with 0 remaining; a wildcard value wins
// over the key's default; nested descriptors apply where the entries end
// and nothing when the entries go deeper or elsewhere; a limit Envoy
// sends is reported under its unit, unnamed; a huge hits_addend is over
// and fills the window; statuses keep the request's order; the
// X-RateLimit headers carry the limit closest to being reached; a request
// without a domain or descriptors fails.
func TestEnvoyUpstreamSemantics(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "up.yaml", envoyUpstream)
	cfg := testConfig("envoy-upstream")
	cfg.EnvoyConfigDir = dir
	cfg.EnvoyResponseHeaders = EnvoyHeadersX
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	client := rlsClient(t, d.GRPCAddr())
	ask := func(req *rlsv3.RateLimitRequest) string {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return rlsStatuses(resp)
	}
	withHits := func(req *rlsv3.RateLimitRequest, hits uint64) *rlsv3.RateLimitRequest {
		for _, d := range req.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		return req
	}
	withLimit := func(req *rlsv3.RateLimitRequest, rpu uint32, unit typev3.RateLimitUnit) *rlsv3.RateLimitRequest {
		req.Descriptors[0].Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		return req
	}
	// rulesStart is 20 s into a minute, 800 s into an hour, 80000 s into
	// a day.
	for i, s := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{rlsRequest("up", []string{"free=x"}),
			"OK; OK - r=4294967295 t=-"},
		{rlsRequest("up", []string{"user=u"}, []string{"vip=v"}),
			"OK; OK - r=0 t=-; OK :10/MINUTE r=9 t=40; X-RateLimit-Limit=10; X-RateLimit-Remaining=9; X-RateLimit-Reset=40"},
		{rlsRequest("up", []string{"user=u"}),
			"OK; OK per-user:3/MINUTE r=2 t=40; X-RateLimit-Limit=3; X-RateLimit-Remaining=2; X-RateLimit-Reset=40"},
		{withHits(rlsRequest("up", []string{"shadow=s"}), 2),
			"OK; OK :1/MINUTE r=0 t=40; X-RateLimit-Limit=1; X-RateLimit-Remaining=0; X-RateLimit-Reset=40"},
		{rlsRequest("up", []string{"path=/api/v1"}, []string{"path=/web"}, []string{"path=/api/"}),
			"OK; OK :2/HOUR r=1 t=2800; OK :100/HOUR r=99 t=2800; OK :2/HOUR r=1 t=2800; X-RateLimit-Limit=2; X-RateLimit-Remaining=1; X-RateLimit-Reset=2800"},
		{rlsRequest("up", []string{"org=acme"}, []string{"org=acme", "team=t"}, []string{"org=other"}, []string{"org=acme", "team=t", "x=1"}, []string{"org=acme", "x=1"}),
			"OK; OK :50/DAY r=49 t=6400; OK :4/SECOND r=3 t=1; OK - r=0 t=-; OK - r=0 t=-; OK - r=0 t=-; X-RateLimit-Limit=4; X-RateLimit-Remaining=3; X-RateLimit-Reset=1"},
		{withLimit(rlsRequest("up", []string{"user=o"}), 7, typev3.RateLimitUnit_HOUR),
			"OK; OK :7/HOUR r=6 t=2800; X-RateLimit-Limit=7; X-RateLimit-Remaining=6; X-RateLimit-Reset=2800"},
		{withLimit(rlsRequest("up", []string{"nolimit=o"}), 2, typev3.RateLimitUnit_SECOND),
			"OK; OK :2/SECOND r=1 t=1; X-RateLimit-Limit=2; X-RateLimit-Remaining=1; X-RateLimit-Reset=1"},
		{withHits(rlsRequest("up", []string{"user=big"}), 1<<40),
			"OVER_LIMIT; OVER_LIMIT per-user:3/MINUTE r=0 t=40; X-RateLimit-Limit=3; X-RateLimit-Remaining=0; X-RateLimit-Reset=40"},
		{rlsRequest("up", []string{"user=big"}),
			"OVER_LIMIT; OVER_LIMIT per-user:3/MINUTE r=0 t=40; X-RateLimit-Limit=3; X-RateLimit-Remaining=0; X-RateLimit-Reset=40"},
		{rlsRequest("up", []string{"path=/web"}, []string{"user=big"}, []string{"nomatch=1"}, []string{"user=u"}),
			"OVER_LIMIT; OK :100/HOUR r=98 t=2800; OVER_LIMIT per-user:3/MINUTE r=0 t=40; OK - r=0 t=-; OK per-user:3/MINUTE r=1 t=40; X-RateLimit-Limit=3; X-RateLimit-Remaining=0; X-RateLimit-Reset=40"},
		{rlsRequest("up", []string{"client=c1"}),
			"OK; OK :5/MINUTE r=4 t=40; X-RateLimit-Limit=5; X-RateLimit-Remaining=4; X-RateLimit-Reset=40"},
		{rlsRequest("nowhere", []string{"user=u"}),
			"OK; OK - r=0 t=-"},
		// A descriptor without entries matches nothing.
		{rlsRequest("up", []string{}),
			"OK; OK - r=0 t=-"},
		// One key four times in a request: counted in order, as
		// upstream's pipeline of INCRBY counts it.
		{rlsRequest("up", []string{"user=d"}, []string{"user=d"}, []string{"user=d"}, []string{"user=d"}),
			"OVER_LIMIT; OK per-user:3/MINUTE r=2 t=40; OK per-user:3/MINUTE r=1 t=40; OK per-user:3/MINUTE r=0 t=40; OVER_LIMIT per-user:3/MINUTE r=0 t=40; X-RateLimit-Limit=3; X-RateLimit-Remaining=0; X-RateLimit-Reset=40"},
		// An empty value: the key's default, as upstream falls back from
		// key_ to key, on a counter of its own.
		{rlsRequest("up", []string{"path="}),
			"OK; OK :100/HOUR r=99 t=2800; X-RateLimit-Limit=100; X-RateLimit-Remaining=99; X-RateLimit-Reset=2800"},
	} {
		if got := ask(s.req); got != s.want {
			t.Errorf("step %d:\n got %s\nwant %s", i, got, s.want)
		}
	}
	for _, units := range []struct {
		unit typev3.RateLimitUnit
		want string
	}{
		{typev3.RateLimitUnit_SECOND, "SECOND"}, {typev3.RateLimitUnit_MINUTE, "MINUTE"}, {typev3.RateLimitUnit_HOUR, "HOUR"},
		{typev3.RateLimitUnit_DAY, "DAY"}, {typev3.RateLimitUnit_MONTH, "MONTH"}, {typev3.RateLimitUnit_YEAR, "YEAR"},
	} {
		got := ask(withLimit(rlsRequest("up", []string{"unit=" + units.want}), 1, units.unit))
		if !strings.HasPrefix(got, "OK; OK :1/"+units.want+" r=0 ") {
			t.Errorf("a limit Envoy sends of unit %s: %s", units.want, got)
		}
	}
	for _, bad := range []*rlsv3.RateLimitRequest{
		{Domain: "up"},
		rlsRequest("", []string{"user=u"}),
	} {
		if _, err := client.ShouldRateLimit(context.Background(), bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("request %v: %v, want InvalidArgument", bad, err)
		}
	}
	m := scrape(t, "http://"+d.HTTPAddr())
	for series, want := range map[string]float64{
		`sluice_envoy_hits_total{domain="up",key="up.client_c1",stat="total_hits"}`:   1,
		`sluice_envoy_hits_total{domain="up",key="up.path_/api/*",stat="total_hits"}`: 2,
		`sluice_envoy_hits_total{domain="up",key="up.shadow",stat="shadow_mode"}`:     1,
		`sluice_envoy_hits_total{domain="up",key="up.user",stat="over_limit"}`:        1 << 40, // 1<<40 - 3, then 1, 1 and 1
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
}

// envoy_stop_increment_over_limit does what upstream's integration test
// of STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT sees, through the daemon and
// go-control-plane's RLS client: two descriptors of 20 a minute and 10 an
// hour, 15 requests; once the second is over, the first is no longer
// charged and reports the same remaining each time. A descriptor over is
// charged itself: 2 hits on a window holding 9 of 10 leave it full.
func TestEnvoyStopIncrementAsUpstream(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "another.yaml", "domain: another\ndescriptors:\n"+
		"  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"+
		"  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	cfg := testConfig("envoy-stop-increment")
	cfg.EnvoyConfigDir = dir
	cfg.EnvoyStopIncrementOverLimit = true
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	call := rlsCaller(t, rlsClient(t, d.GRPCAddr()), "another")
	for i := range 15 {
		want := fmt.Sprintf("OK; OK r=%d; OK r=%d", 20-(i+1), 10-(i+1))
		if i >= 10 {
			want = "OVER_LIMIT; OK r=10; OVER_LIMIT r=0"
		}
		if got := rlsSummary(call(1, "key2=7", "key3=7")); got != want {
			t.Errorf("request %d: %s, want %s", i, got, want)
		}
	}
	for i, s := range []struct {
		hits    uint64
		entries []string
		want    string
	}{
		{9, []string{"key3=8"}, "OK; OK r=1"},
		{2, []string{"key2=8", "key3=8"}, "OVER_LIMIT; OK r=20; OVER_LIMIT r=0"},
		{1, []string{"key3=8"}, "OVER_LIMIT; OVER_LIMIT r=0"},
		{0, []string{"key2=8"}, "OK; OK r=20"},
	} {
		if got := rlsSummary(call(s.hits, s.entries...)); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
}

// A named unlimited limit another replaces stays unlimited (remaining
// MaxUint32), as upstream sets unlimited descriptors aside before it
// replaces limits; its own replaces still apply.
func TestEnvoyReplacedUnlimited(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "r.yaml", `domain: r
descriptors:
  - key: free
    rate_limit: {name: open, unlimited: true, replaces: [{name: per-user}]}
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 3}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: open}]}
`)
	cfg := testConfig("envoy-replaced-unlimited")
	cfg.EnvoyConfigDir = dir
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	client := rlsClient(t, d.GRPCAddr())
	resp, err := client.ShouldRateLimit(context.Background(), rlsRequest("r", []string{"free=x"}, []string{"user=u"}, []string{"vip=v"}))
	if err != nil {
		t.Fatal(err)
	}
	want := "OK; OK - r=4294967295 t=-; OK - r=0 t=-; OK :10/MINUTE r=9 t=40"
	if got := rlsStatuses(resp); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// withNewerFields gives d the quota_mode (field 7) and metadata (field 8)
// of the RateLimitDescriptor that envoyproxy/ratelimit builds with, in
// the wire form such a server sends: the go-control-plane/ratelimit
// release this module uses does not define them.
func withNewerFields(t *testing.T, d *rlconfv3.RateLimitDescriptor, quota bool, md *structpb.Struct) *rlconfv3.RateLimitDescriptor {
	t.Helper()
	var b []byte
	if quota {
		b = protowire.AppendTag(b, 7, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if md != nil {
		raw, err := proto.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendTag(b, 8, protowire.BytesType)
		b = protowire.AppendBytes(b, raw)
	}
	d.ProtoReflect().SetUnknown(b)
	return d
}

// A RateLimitConfig from an xDS server built on upstream's newer
// definition, served by go-control-plane's server: month and year units
// are taken (not NACKed), quota_mode makes a request over only when all
// its quota descriptors are, and metadata comes back in the dynamic
// metadata, as upstream reads the same resource.
func TestEnvoyXDSNewerFields(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{"team": "beta"})
	if err != nil {
		t.Fatal(err)
	}
	conf := &rlconfv3.RateLimitConfig{Name: "q", Domain: "q", Descriptors: []*rlconfv3.RateLimitDescriptor{
		withNewerFields(t, &rlconfv3.RateLimitDescriptor{Key: "a", RateLimit: &rlconfv3.RateLimitPolicy{Unit: 5, RequestsPerUnit: 1}}, true, nil),
		withNewerFields(t, &rlconfv3.RateLimitDescriptor{Key: "b", RateLimit: &rlconfv3.RateLimitPolicy{Unit: 6, RequestsPerUnit: 5}}, true, md),
	}}
	snap, err := cachev3.NewSnapshot("1", map[resource.Type][]types.Resource{resource.RateLimitConfigType: {conf}})
	if err != nil {
		t.Fatal(err)
	}
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "sluice-xds", snap); err != nil {
		t.Fatal(err)
	}
	addr, _ := serveXDS(t, cache, "127.0.0.1:0")
	cfg := testConfig("xds-newer")
	cfg.EnvoyXDSAddr, cfg.EnvoyXDSNodeID = addr, "sluice-xds"
	cfg.EnvoyDynamicMetadata = true
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	testwait.For(t, "the daemon to be ready", d.Ready)
	client := rlsClient(t, d.GRPCAddr())
	month := time.Date(2023, time.December, 1, 0, 0, 0, 0, time.UTC).Sub(rulesStart).Seconds()
	year := time.Date(2024, time.January, 1, 0, 0, 0, 0, time.UTC).Sub(rulesStart).Seconds()
	for i, want := range []string{
		fmt.Sprintf("OK; OK :1/MONTH r=0 t=%v; OK :5/YEAR r=4 t=%v", month, year),
		fmt.Sprintf("OK; OVER_LIMIT :1/MONTH r=0 t=%v; OK :5/YEAR r=3 t=%v", month, year), // a quota over, b not
	} {
		resp, err := client.ShouldRateLimit(context.Background(), rlsRequest("q", []string{"a=1"}, []string{"b=1"}))
		if err != nil {
			t.Fatal(err)
		}
		if got := rlsStatuses(resp); got != want {
			t.Errorf("request %d:\n got %s\nwant %s", i, got, want)
		}
		if team := resp.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["team"].GetStringValue(); team != "beta" {
			t.Errorf("request %d: dynamic metadata %v, want metadata.team beta", i, resp.DynamicMetadata)
		}
	}
}

// envoy_quota_mode, as upstream's QUOTA_MODE, counts every descriptor of
// a request as a quota, those that match no limit (or whose limit is
// replaced) too, which are never over: a request with one is OK however
// far over the others are; an unlimited descriptor is not counted.
func TestEnvoyGlobalQuotaModeCountsUnmatched(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "q.yaml", "domain: q\ndescriptors:\n"+
		"  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"+
		"  - key: free\n    rate_limit: {unlimited: true}\n")
	cfg := testConfig("envoy-quota-unmatched")
	cfg.EnvoyConfigDir = dir
	cfg.EnvoyQuotaMode = true
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
	call := rlsCaller(t, rlsClient(t, d.GRPCAddr()), "q")
	for i, s := range []struct {
		entries []string
		want    string
	}{
		{[]string{"a=1"}, "OK; OK r=0"},
		{[]string{"a=1"}, "OVER_LIMIT; OVER_LIMIT r=0"},
		{[]string{"a=1", "nomatch=1"}, "OK; OVER_LIMIT r=0; OK r=0"},
		{[]string{"a=1", "free=1"}, "OVER_LIMIT; OVER_LIMIT r=0; OK r=4294967295"},
	} {
		if got := rlsSummary(call(1, s.entries...)); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
}

// envoy_stop_increment_over_limit across a cluster of three: the two
// descriptors of a request have their counters on two different owners,
// and the request goes to the third daemon; the descriptor over is
// drained on its owner and the other's hits are given back on its own,
// so that every daemon then reads what upstream's counters would hold:
// the one over past its limit, the other uncharged.
func TestEnvoyStopIncrementAcrossCluster(t *testing.T) {
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "another.yaml", "domain: another\ndescriptors:\n"+
		"  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"+
		"  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	ds := startThree(t, "envoy-stop", func(c *Config) {
		c.EnvoyConfigDir = dir
		c.EnvoyStopIncrementOverLimit = true
	}, WithClock(fakeclock.New(rulesStart).Now))
	node := ds[0].Node()
	ownerOf := func(unit, key string) string {
		owner, _ := node.Owner(serverNamePrefix+"envoy/"+unit, key)
		return owner.Name
	}
	var v2, v3, via string
	for i := 0; via == "" && i < 1000; i++ {
		v2, v3 = fmt.Sprint("a", i), fmt.Sprint("b", i)
		o2, o3 := ownerOf("minute", "another|key2="+v2), ownerOf("hour", "another|key3="+v3)
		if o2 == o3 {
			continue
		}
		for _, d := range ds {
			if name := d.Config().NodeName; name != o2 && name != o3 {
				via = d.GRPCAddr()
			}
		}
	}
	if via == "" {
		t.Fatal("no two keys on two owners")
	}
	ask := rlsCaller(t, rlsClient(t, via), "another")
	for i, s := range []struct {
		hits    uint64
		entries []string
		want    string
	}{
		{2, []string{"key2=" + v2, "key3=" + v3}, "OK; OK r=18; OK r=1"},
		{2, []string{"key2=" + v2, "key3=" + v3}, "OVER_LIMIT; OK r=18; OVER_LIMIT r=0"},
	} {
		if got := rlsSummary(ask(s.hits, s.entries...)); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
	// key3's counter upstream is 4, past its 3: a peek is over, and
	// stops key2's charge (0 here).
	for _, d := range ds {
		peek := rlsCaller(t, rlsClient(t, d.GRPCAddr()), "another")
		if got := rlsSummary(peek(0, "key2="+v2, "key3="+v3)); got != "OVER_LIMIT; OK r=18; OVER_LIMIT r=0" {
			t.Errorf("a peek through %s: %s, want OVER_LIMIT; OK r=18; OVER_LIMIT r=0", d.Config().NodeName, got)
		}
	}
}

// rlsHits asks client about domain with one descriptor per "key=value:hits"
// (its own hits_addend) or "limit0/key=value:hits" (with a limit of 0 a
// minute Envoy sends).
func rlsHits(t *testing.T, client rlsv3.RateLimitServiceClient, domain string, descs ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, s := range descs {
		entry, hits, _ := strings.Cut(s, ":")
		var n uint64
		fmt.Sscan(hits, &n)
		d := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(n)}
		if rest, ok := strings.CutPrefix(entry, "limit0/"); ok {
			entry = rest
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
		}
		k, v, _ := strings.Cut(entry, "=")
		d.Entries = []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: v}}
		req.Descriptors = append(req.Descriptors, d)
	}
	resp, err := client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Through the daemon and go-control-plane's RLS client, with and without
// envoy_stop_increment_over_limit, a check of hits_addend 0 answers what
// envoyproxy/ratelimit's counters would: OVER_LIMIT on a window a request
// went past (fixed_cache_impl.go increments the keys that go over in
// either mode) and on a limit of 0 (configured or sent by Envoy) once a
// hit reached it, OK with none left before; with the setting, a
// descriptor so over stops the charge of the others, as one going over,
// and descriptors of one counter are judged on the count before the
// request, their counter left past its limit.
func TestEnvoyPeeksPastTheLimitAsUpstream(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprint("stop=", stop), func(t *testing.T) {
			dir := t.TempDir()
			writeEnvoyFile(t, dir, "p.yaml", "domain: p\ndescriptors:\n"+
				"  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"+
				"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"+
				"  - key: zero\n    rate_limit: {unit: minute, requests_per_unit: 0}\n")
			cfg := testConfig(fmt.Sprint("envoy-peeks-", stop))
			cfg.EnvoyConfigDir = dir
			cfg.EnvoyStopIncrementOverLimit = stop
			d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now))
			client := rlsClient(t, d.GRPCAddr())
			// a's remaining once charged beside a descriptor over.
			charged := func(uncharged, chargedLeft int) string {
				if stop {
					return fmt.Sprint("OK r=", uncharged)
				}
				return fmt.Sprint("OK r=", chargedLeft)
			}
			for i, s := range []struct {
				descs []string
				want  string
			}{
				{[]string{"b=1:3"}, "OVER_LIMIT; OVER_LIMIT r=0"},
				{[]string{"b=1:0"}, "OVER_LIMIT; OVER_LIMIT r=0"},
				{[]string{"a=1:1", "b=1:0"}, "OVER_LIMIT; " + charged(5, 4) + "; OVER_LIMIT r=0"},
				{[]string{"zero=1:0"}, "OK; OK r=0"},
				{[]string{"a=2:1", "zero=1:1"}, "OVER_LIMIT; " + charged(5, 4) + "; OVER_LIMIT r=0"},
				{[]string{"a=2:1", "zero=1:0"}, "OVER_LIMIT; " + charged(5, 3) + "; OVER_LIMIT r=0"},
				{[]string{"limit0/route=r:0"}, "OK; OK r=0"},
				{[]string{"limit0/route=r:2"}, "OVER_LIMIT; OVER_LIMIT r=0"},
				{[]string{"limit0/route=r:0"}, "OVER_LIMIT; OVER_LIMIT r=0"},
				{[]string{"zero=2:0", "a=3:0"}, "OK; OK r=0; OK r=5"},
				// three descriptors of one counter: counted in turn, the
				// counter left past its limit, nothing given back
				{[]string{"a=4:1", "b=9:1", "b=9:1", "b=9:1"}, "OVER_LIMIT; OK r=4; OK r=1; OK r=0; OVER_LIMIT r=0"},
				{[]string{"b=9:1"}, "OVER_LIMIT; OVER_LIMIT r=0"},
			} {
				if got := rlsSummary(rlsHits(t, client, "p", s.descs...)); got != s.want {
					t.Errorf("step %d %v: %s, want %s", i, s.descs, got, s.want)
				}
			}
		})
	}
}
