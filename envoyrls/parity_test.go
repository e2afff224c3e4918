package envoyrls

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// parityConfig has a limit of 10 a minute (near-limit threshold 8), one
// in shadow mode, two small ones and descriptors with metadata.
const parityConfig = `
domain: p
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: a
    metadata: {team: {name: alpha}, tier: gold}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    metadata: {team: {size: 2}, tier: silver}
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
`

// The near, over and shadow statistics of a request that straddles the
// limit are envoyproxy/ratelimit's (base_limiter.go): the hits beyond the
// limit are over (all of them once the window is full), those between
// the threshold and the limit near; within_limit counts only admitted
// requests.
func TestStraddleStatistics(t *testing.T) {
	e := newEnv(t, []string{parityConfig})
	const m = "/10/minute t=40s"
	for i, s := range []struct {
		d        *rlDesc
		want     string
		wantHits Hit
	}{
		{desc("user=x", "hits=7"), "OK; OK 3" + m, Hit{TotalHits: 7, WithinLimit: 7}},
		{desc("user=x", "hits=3"), "OK; OK 0" + m, Hit{TotalHits: 3, WithinLimit: 3, NearLimit: 2}},
		{desc("user=x", "hits=2"), "OVER_LIMIT; OVER 0" + m, Hit{TotalHits: 2, OverLimit: 2}},
		{desc("user=y", "hits=9"), "OK; OK 1" + m, Hit{TotalHits: 9, WithinLimit: 9, NearLimit: 1}},
		{desc("user=y", "hits=4"), "OVER_LIMIT; OVER 0" + m, Hit{TotalHits: 4, OverLimit: 3, NearLimit: 1}},
		{desc("user=y"), "OVER_LIMIT; OVER 0" + m, Hit{TotalHits: 1, OverLimit: 1}}, // the window was left full
		{desc("user=y", "hits=0"), "OVER_LIMIT; OVER 0" + m, Hit{}},                 // check-then-charge: past the limit is over
		{desc("user=z", "hits=0"), "OK; OK 10" + m, Hit{}},
		{desc("user=w", "hits=12"), "OVER_LIMIT; OVER 0" + m, Hit{TotalHits: 12, OverLimit: 2, NearLimit: 2}},
		{desc("user=w", "hits=0"), "OVER_LIMIT; OVER 0" + m, Hit{}},
		{desc("shadow=s", "hits=12"), "OK; OK 0" + m, Hit{TotalHits: 12, OverLimit: 2, NearLimit: 2, ShadowMode: 2}},
		{desc("shadow=s"), "OK; OK 0" + m, Hit{TotalHits: 1, OverLimit: 1, ShadowMode: 1}},
	} {
		if got := summary(e.call("p", 0, s.d)); got != s.want {
			t.Errorf("step %d: got %s, want %s", i, got, s.want)
		}
		hits := e.takeHits()
		if len(hits) != 1 {
			t.Fatalf("step %d: %d hits reported", i, len(hits))
		}
		got := hits[0]
		got.Domain, got.Key = "", ""
		if got != s.wantHits {
			t.Errorf("step %d: hit %+v, want %+v", i, got, s.wantHits)
		}
	}
}

// Global shadow mode answers OK overall while the descriptors are
// counted and their statuses, headers and statistics say what would have
// happened, as envoyproxy/ratelimit's SHADOW_MODE; each request turned OK
// is reported.
func TestGlobalShadowMode(t *testing.T) {
	var shadowed []string
	e := newEnv(t, []string{parityConfig}, func(c *Config) {
		c.ShadowMode = true
		c.Headers = XRateLimitHeaders()
		c.OnGlobalShadow = func(d string) { shadowed = append(shadowed, d) }
	})
	const m = "/2/minute t=40s"
	e.run("p", []step{
		{descs: descs(desc("b=1", "hits=2")), want: "OK; OK 0" + m + "; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 40"},
		{name: "over, answered OK", descs: descs(desc("b=1")), want: "OK; OVER 0" + m + "; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 40"},
		{name: "still counted", advance: 39 * time.Second, descs: descs(desc("b=1")), want: "OK; OVER 0/2/minute t=1s; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 1"},
		{name: "next window", advance: time.Second, descs: descs(desc("b=1")), want: "OK; OK 1/2/minute t=1m0s; X-RateLimit-Limit: 2; X-RateLimit-Remaining: 1; X-RateLimit-Reset: 60"},
	})
	if strings.Join(shadowed, ",") != "p,p" {
		t.Errorf("requests turned OK: %q, want two of p", shadowed)
	}
	hits := e.takeHits()
	if hits[1].OverLimit != 1 || hits[1].ShadowMode != 0 {
		t.Errorf("statistics of the request over: %+v, want over_limit 1 (shadow_mode counts per-descriptor shadow only, as upstream)", hits[1])
	}
}

// Global quota mode makes every descriptor a quota: a request is over
// only when all of its limited descriptors are.
func TestGlobalQuotaMode(t *testing.T) {
	e := newEnv(t, []string{parityConfig}, func(c *Config) { c.QuotaMode = true })
	const a, b = "/5/minute t=40s", "/2/minute t=40s"
	e.run("p", []step{
		{descs: descs(desc("a=1", "hits=4"), desc("b=1", "hits=2")), want: "OK; OK 1" + a + "; OK 0" + b},
		{name: "b over, a not", descs: descs(desc("a=1"), desc("b=1")), want: "OK; OK 0" + a + "; OVER 0" + b},
		{name: "both over", descs: descs(desc("a=1"), desc("b=1")), want: "OVER_LIMIT; OVER 0" + a + "; OVER 0" + b},
	})
}

// With StopIncrementOverLimit a request over on any descriptor charges
// only the one over, as upstream's Redis cache increments only the
// counters that go over (its TestOverLimitWithStopCacheKeyIncrement-
// WhenOverlimitConfig): the others report their remaining uncharged;
// without it each descriptor is charged on its own. Either way the one
// over is left past its limit, as upstream's counter incremented by the
// hits that go over (fixed_cache_impl.go increments the keys that would
// go over, getHitsAddend): a check of 0 hits on it is OVER_LIMIT until
// the window ends, and with StopIncrementOverLimit it stops the other
// descriptors' charges as a descriptor going over does.
func TestStopIncrementOverLimit(t *testing.T) {
	const a, b = "/5/minute t=40s", "/2/minute t=40s"
	for _, tc := range []struct {
		stop bool
		// the request over; a peek of a and b after it; a charge of a
		// beside a peek of b; a peek of a
		over, now, beside, peek string
	}{
		{false, "OVER_LIMIT; OK 4" + a + "; OVER 0" + b, "OVER_LIMIT; OK 4" + a + "; OVER 0" + b,
			"OVER_LIMIT; OK 3" + a + "; OVER 0" + b, "OK; OK 3" + a},
		{true, "OVER_LIMIT; OK 5" + a + "; OVER 0" + b, "OVER_LIMIT; OK 5" + a + "; OVER 0" + b,
			"OVER_LIMIT; OK 5" + a + "; OVER 0" + b, "OK; OK 5" + a},
	} {
		e := newEnv(t, []string{parityConfig}, func(c *Config) { c.StopIncrementOverLimit = tc.stop })
		e.run("p", []step{
			{descs: descs(desc("b=1")), want: "OK; OK 1" + b},
			{name: "b over", descs: descs(desc("a=1"), desc("b=1", "hits=2")), want: tc.over},
			{name: "peek", descs: descs(desc("a=1", "hits=0"), desc("b=1", "hits=0")), want: tc.now},
			{name: "a charged beside a peek of b", descs: descs(desc("a=1"), desc("b=1", "hits=0")), want: tc.beside},
			{name: "peek of a", descs: descs(desc("a=1", "hits=0")), want: tc.peek},
			{name: "next window", advance: 40 * time.Second, descs: descs(desc("b=1", "hits=0")), want: "OK; OK 2/2/minute t=1m0s"},
		})
	}
	// A descriptor over with more hits than its limit, admitted capped,
	// fills its window too and goes past it, as upstream's counter does.
	for _, stop := range []bool{false, true} {
		e := newEnv(t, []string{parityConfig}, func(c *Config) { c.StopIncrementOverLimit = stop })
		e.run("p", []step{
			{descs: descs(desc("b=1", "hits=3")), want: "OVER_LIMIT; OVER 0" + b},
			{descs: descs(desc("b=1", "hits=0")), want: "OVER_LIMIT; OVER 0" + b},
		})
	}
}

// A limit of 0 is upstream's counter that any hit takes past it: a
// check of 0 hits is OK with none left on a window no hit reached, and
// OVER_LIMIT once one did, until the window ends (base_limiter.go:
// after > limit); a limit of 0 Envoy sends is the same. With
// StopIncrementOverLimit a descriptor of a limit of 0 that is over stops
// the other descriptors' charges, as one over its limit does.
func TestZeroLimitAsUpstream(t *testing.T) {
	const z, a = "/0/minute t=40s", "/5/minute t=40s"
	zeroOverride := func(hits string) *rlDesc {
		d := desc("route=r", hits)
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for _, stop := range []bool{false, true} {
		aAfter := "OK 4" + a // a charged beside a limit of 0 over
		if stop {
			aAfter = "OK 5" + a
		}
		e := newEnv(t, []string{parityConfig}, func(c *Config) { c.StopIncrementOverLimit = stop })
		e.run("p", []step{
			{name: "peek of a window no hit reached", descs: descs(desc("zero=1", "hits=0")), want: "OK; OK 0" + z},
			{name: "a hit", descs: descs(desc("zero=1")), want: "OVER_LIMIT; OVER 0" + z},
			{name: "peek after the hit", descs: descs(desc("zero=1", "hits=0")), want: "OVER_LIMIT; OVER 0" + z},
			{name: "another value's window", descs: descs(desc("zero=2", "hits=0")), want: "OK; OK 0" + z},
			{name: "beside a", descs: descs(desc("a=1"), desc("zero=2")), want: "OVER_LIMIT; " + aAfter + "; OVER 0" + z},
			{name: "a peeked beside a peek over", descs: descs(desc("a=1", "hits=0"), desc("zero=2", "hits=0")), want: "OVER_LIMIT; " + aAfter + "; OVER 0" + z},
			{name: "Envoy's limit of 0, peeked", descs: descs(zeroOverride("hits=0")), want: "OK; OK 0" + z},
			{name: "Envoy's limit of 0, a hit", descs: descs(zeroOverride("hits=1")), want: "OVER_LIMIT; OVER 0" + z},
			{name: "Envoy's limit of 0, peeked after", descs: descs(zeroOverride("hits=0")), want: "OVER_LIMIT; OVER 0" + z},
			{name: "next window", advance: 40 * time.Second, descs: descs(desc("zero=1", "hits=0")), want: "OK; OK 0/0/minute t=1m0s"},
		})
		hits := e.takeHits()
		if want := (Hit{Domain: "p", Key: "p.zero", TotalHits: 1, OverLimit: 1}); hits[1] != want {
			t.Errorf("stop %v: hit of a limit of 0: %+v, want %+v", stop, hits[1], want)
		}
		if want := (Hit{Domain: "p", Key: "p.zero"}); hits[2] != want {
			t.Errorf("stop %v: peek of a limit of 0 over: %+v, want %+v", stop, hits[2], want)
		}
	}
}

// Dynamic metadata is envoyproxy/ratelimit's: the domain, the request's
// descriptors and hits_addend, and the metadata of the descriptors not
// over, merged.
func TestDynamicMetadata(t *testing.T) {
	e := newEnv(t, []string{parityConfig}, func(c *Config) { c.DynamicMetadata = true })
	md := func(r *rlsv3.RateLimitResponse) string {
		b, err := protojson.Marshal(r.DynamicMetadata)
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(b), " ", "")
	}
	r := e.call("p", 3, desc("a=1"), desc("b=1", "hits=2"))
	want := `{"descriptors":[{"entries":["a=1"]},{"entries":["b=1"],"hitsAddend":2}],"domain":"p","hitsAddend":3,"metadata":{"team":{"name":"alpha","size":2},"tier":"gold"}}`
	if got := md(r); got != want {
		t.Errorf("both OK:\n got %s\nwant %s", got, want)
	}
	r = e.call("p", 0, desc("a=1"), desc("b=1"))
	want = `{"descriptors":[{"entries":["a=1"]},{"entries":["b=1"]}],"domain":"p","metadata":{"team":{"name":"alpha"},"tier":"gold"}}`
	if got := md(r); got != want {
		t.Errorf("b over:\n got %s\nwant %s", got, want)
	}
	if r := newEnv(t, []string{parityConfig}).call("p", 0, desc("a=1")); r.DynamicMetadata != nil {
		t.Error("dynamic metadata without DynamicMetadata")
	}
}

// A request of an unknown domain is answered OK and reported.
func TestUnknownDomain(t *testing.T) {
	var unknown []string
	e := newEnv(t, []string{parityConfig}, func(c *Config) { c.OnUnknownDomain = func(d string) { unknown = append(unknown, d) } })
	e.run("nope", []step{{descs: descs(desc("user=x")), want: "OK; OK"}})
	e.run("p", []step{{descs: descs(desc("user=x")), want: "OK; OK 9/10/minute t=40s"}})
	if strings.Join(unknown, ",") != "nope" {
		t.Errorf("unknown domains reported: %q, want nope", unknown)
	}
}

// A lenient read ignores a key of the format out of place, with a warning
// at its position, where a strict read refuses it; a key the format does
// not know is an error either way, as with envoyproxy/ratelimit.
func TestLenientLoad(t *testing.T) {
	const misplaced = "domain: d\ndescriptors:\n  - key: k\n    unit: second\n    rate_limit: {unit: minute, requests_per_unit: 1, key: x}\n"
	if _, err := ParseDomain("f.yaml", []byte(misplaced)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `f.yaml:4:5: unknown key "unit"`) {
		t.Errorf("strict: %v", err)
	}
	var warnings []string
	lc := LoadConfig{Warn: func(e *ConfigError) { warnings = append(warnings, e.Error()) }}
	d, err := ParseDomainWith("f.yaml", []byte(misplaced), lc)
	if err != nil {
		t.Fatalf("lenient: %v", err)
	}
	if m := d.Match([]Entry{{"k", "v"}}); m.Descriptor == nil || m.Descriptor.RateLimit.Unit != Minute {
		t.Errorf("lenient: the descriptor's limit is not read: %+v", m.Descriptor)
	}
	want := []string{`envoyrls: f.yaml:4:5: key "unit" is ignored here`, `envoyrls: f.yaml:5:54: key "key" is ignored here`}
	if len(warnings) != 2 || !strings.HasPrefix(warnings[0], want[0]) || !strings.HasPrefix(warnings[1], want[1]) {
		t.Errorf("warnings %q, want %q...", warnings, want)
	}
	for _, strict := range []bool{false, true} {
		_, err := ParseDomainWith("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    colour: red\n"), LoadConfig{Strict: strict})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `f.yaml:4:5: unknown key "colour"`) {
			t.Errorf("strict %v, unknown key: %v", strict, err)
		}
	}
}

// MergeDomains makes the files of one domain one configuration; a
// descriptor both configure is an error naming the later file.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	write("b.yaml", "domain: d\ndescriptors:\n  - {key: b, rate_limit: {unit: minute, requests_per_unit: 2}}\n")
	if _, err := LoadDirWith(dir, LoadConfig{}); !errors.Is(err, ErrDuplicateDomain) {
		t.Errorf("without merging: %v", err)
	}
	r, err := LoadDirWith(dir, LoadConfig{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := r.Domain("d")
	for _, key := range []string{"a", "b"} {
		if m := d.Match([]Entry{{key, "v"}}); m.Descriptor == nil {
			t.Errorf("merged domain: %s has no limit", key)
		}
	}
	write("c.yaml", "domain: d\ndescriptors:\n  - key: x\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 3}}\n")
	if _, err := LoadDirWith(dir, LoadConfig{MergeDomains: true}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `c.yaml:4: duplicate descriptor "d.a"`) {
		t.Errorf("a descriptor in two files: %v", err)
	}
}

// With StopIncrementOverLimit, the statuses and statistics are those of
// upstream's TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig
// (test/redis/fixed_cache_impl_test.go): limits of 15 and 14 an hour at
// 10 each; 1 hit each, 2 each, then 2 each, which takes the second over:
// the first is not charged, reports 2 remaining and counts its hits
// within (and 1 near), the second counts 1 over and 1 near.
func TestStopIncrementStatisticsAsUpstream(t *testing.T) {
	e := newEnv(t, []string{"domain: s\ndescriptors:\n" +
		"  - key: key4\n    rate_limit: {unit: hour, requests_per_unit: 15}\n" +
		"  - key: key5\n    rate_limit: {unit: hour, requests_per_unit: 14}\n"},
		func(c *Config) { c.StopIncrementOverLimit = true })
	const a, b = "/15/hour t=46m40s", "/14/hour t=46m40s"
	e.call("s", 0, desc("key4=value4", "hits=10"), desc("key5=value5", "hits=10"))
	e.takeHits()
	total := map[string]Hit{}
	for i, s := range []struct {
		hits uint64
		want string
	}{
		{1, "OK; OK 4" + a + "; OK 3" + b},
		{2, "OK; OK 2" + a + "; OK 1" + b},
		{2, "OVER_LIMIT; OK 2" + a + "; OVER 0" + b},
	} {
		n := strconv.FormatUint(s.hits, 10)
		if got := summary(e.call("s", 0, desc("key4=value4", "hits="+n), desc("key5=value5", "hits="+n))); got != s.want {
			t.Errorf("step %d: got %s, want %s", i, got, s.want)
		}
		for _, h := range e.takeHits() {
			sum := total[h.Key]
			sum.TotalHits += h.TotalHits
			sum.WithinLimit += h.WithinLimit
			sum.NearLimit += h.NearLimit
			sum.OverLimit += h.OverLimit
			total[h.Key] = sum
		}
	}
	for key, want := range map[string]Hit{
		"s.key4": {TotalHits: 5, WithinLimit: 5, NearLimit: 2},
		"s.key5": {TotalHits: 5, WithinLimit: 3, NearLimit: 3, OverLimit: 1},
	} {
		if got := total[key]; got != want {
			t.Errorf("%s: %+v, want %+v", key, got, want)
		}
	}
}

// The headers name the limit closest to being reached as upstream's
// service picks it (ratelimit.go): a status whose remaining is below
// every earlier one's, starting from MaxUint32, so that a limit of
// 4,294,967,295 untouched is never closest, and no headers are added
// when it is the only one; an enforced status over wins.
func TestHeadersAsUpstream(t *testing.T) {
	e := newEnv(t, []string{"domain: h\ndescriptors:\n" +
		"  - key: max\n    rate_limit: {unit: minute, requests_per_unit: 4294967295}\n" +
		"  - key: ten\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"},
		func(c *Config) { c.Headers = XRateLimitHeaders() })
	const max, ten = "/4294967295/minute t=40s", "/10/minute t=40s"
	e.run("h", []step{
		{name: "the maximum untouched alone", descs: descs(desc("max=1", "hits=0")), want: "OK; OK 4294967295" + max},
		{name: "beside another", descs: descs(desc("max=1", "hits=0"), desc("ten=1", "hits=0")),
			want: "OK; OK 4294967295" + max + "; OK 10" + ten + "; X-RateLimit-Limit: 10; X-RateLimit-Remaining: 10; X-RateLimit-Reset: 40"},
		{name: "one hit on the maximum", descs: descs(desc("max=1")),
			want: "OK; OK 4294967294" + max + "; X-RateLimit-Limit: 4294967295; X-RateLimit-Remaining: 4294967294; X-RateLimit-Reset: 40"},
	})
}

// A limit Envoy sends in a unit of 7, WEEK in RateLimitResponse's units
// (which upstream casts it to, and counts in weeks), is counted in a
// week; units outside second to year fail as upstream's do.
func TestLimitOverrideWeekAsUpstream(t *testing.T) {
	e := newEnv(t, []string{hitsConfig})
	week := func(hits string) *rlDesc {
		d := desc("route=w", hits)
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit(7)}
		return d
	}
	// Tuesday 22:13:20 UTC: the ISO week ends Monday 00:00, 5 days,
	// 1 h 46 min 40 s on.
	const w = "/2/week t=121h46m40s"
	e.run("hits", []step{
		{descs: descs(week("hits=1")), want: "OK; OK 1" + w},
		{descs: descs(week("hits=1")), want: "OK; OK 0" + w},
		{descs: descs(week("hits=1")), want: "OVER_LIMIT; OVER 0" + w},
		{advance: 5 * 24 * time.Hour, descs: descs(week("hits=0")), want: "OVER_LIMIT; OVER 0/2/week t=1h46m40s"},
		{advance: 2 * time.Hour, descs: descs(week("hits=0")), want: "OK; OK 2/2/week t=167h46m40s"},
	})
	for _, u := range []typev3.RateLimitUnit{0, 8, 99} {
		d := desc("route=w")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: u}
		if _, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: []*rlDesc{d}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("unit %d: %v, want InvalidArgument", u, err)
		}
	}
}
