package envoyrls

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// hitsConfig has one limit of 10 a minute.
const hitsConfig = `
domain: hits
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// The request's hits_addend counts for every descriptor (0 meaning 1); a
// descriptor's own hits_addend wins, 0 included, which peeks; hits beyond
// the limit are over and, like envoyproxy/ratelimit's counter, leave the
// window full.
func TestHitsAddend(t *testing.T) {
	e := newEnv(t, []string{hitsConfig})
	const m = "/10/minute t=40s"
	e.run("hits", []step{
		{name: "hits_addend 0 means 1", descs: descs(desc("user=a")), want: "OK; OK 9" + m},
		{name: "the request's 3", hits: 3, descs: descs(desc("user=a"), desc("user=b")), want: "OK; OK 6" + m + "; OK 7" + m},
		{name: "a descriptor's own 2 wins", hits: 3, descs: descs(desc("user=a", "hits=2"), desc("user=b")), want: "OK; OK 4" + m + "; OK 4" + m},
		{name: "a descriptor's 0 peeks", hits: 3, descs: descs(desc("user=a", "hits=0")), want: "OK; OK 4" + m},
		{name: "5 do not fit in 4: over, and the window is full", descs: descs(desc("user=a", "hits=5")), want: "OVER_LIMIT; OVER 0" + m},
		{name: "so 1 is over too", descs: descs(desc("user=a")), want: "OVER_LIMIT; OVER 0" + m},
		{name: "a peek of a window a request went past is over, as upstream's counter past the limit", descs: descs(desc("user=a", "hits=0")), want: "OVER_LIMIT; OVER 0" + m},
		{name: "11 never fit in 10", descs: descs(desc("user=c", "hits=11")), want: "OVER_LIMIT; OVER 0" + m},
		{name: "and fill the window", descs: descs(desc("user=c")), want: "OVER_LIMIT; OVER 0" + m},
		{name: "the next minute", advance: 40 * time.Second, descs: descs(desc("user=c", "hits=10")), want: "OK; OK 0/10/minute t=1m0s"},
	})
	hits := e.takeHits()
	if want := (Hit{Domain: "hits", Key: "hits.user", TotalHits: 2, WithinLimit: 2, NearLimit: 0}); hits[3] != want {
		t.Errorf("hit of user=a hits=2: %+v, want %+v", hits[3], want)
	}
	// 6 used, 5 more: as upstream, the one beyond 10 is over and the two
	// between the threshold (8) and the limit near.
	if want := (Hit{Domain: "hits", Key: "hits.user", TotalHits: 5, OverLimit: 1, NearLimit: 2}); hits[6] != want {
		t.Errorf("hit over: %+v, want %+v", hits[6], want)
	}
	if want := (Hit{Domain: "hits", Key: "hits.user", TotalHits: 10, WithinLimit: 10, NearLimit: 2}); hits[len(hits)-1] != want {
		t.Errorf("hit of 10 in 10: %+v, want %+v (8 is the near-limit threshold)", hits[len(hits)-1], want)
	}
}

// unitsConfig has a limit of 1 per unit for every unit.
const unitsConfig = `
domain: units
descriptors:
  - {key: u, value: second, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: u, value: minute, rate_limit: {unit: Minute, requests_per_unit: 1}}
  - {key: u, value: hour, rate_limit: {unit: HOUR, requests_per_unit: 1}}
  - {key: u, value: day, rate_limit: {unit: day, requests_per_unit: 1}}
  - {key: u, value: week, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: u, value: month, rate_limit: {unit: month, requests_per_unit: 1}}
  - {key: u, value: year, rate_limit: {unit: year, requests_per_unit: 1}}
`

// Every unit is a fixed window: the clock starts on Tuesday 2023-11-14
// 22:13:20 UTC, and each window admits its one request until its end, and
// one more from there. Weeks, months and years follow the UTC calendar,
// or with AlignEpoch envoyproxy/ratelimit's blocks of 7, 30 and 365 days
// since the epoch.
func TestUnits(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		unit  string
		align Alignment
		reset time.Duration
	}{
		{"second", AlignCalendar, time.Second},
		{"minute", AlignCalendar, 40 * time.Second},
		{"hour", AlignCalendar, 46*time.Minute + 40*time.Second},
		{"day", AlignCalendar, time.Hour + 46*time.Minute + 40*time.Second},
		{"week", AlignCalendar, 5*day + time.Hour + 46*time.Minute + 40*time.Second},   // to Monday 11-20
		{"month", AlignCalendar, 16*day + time.Hour + 46*time.Minute + 40*time.Second}, // to 12-01
		{"year", AlignCalendar, 47*day + time.Hour + 46*time.Minute + 40*time.Second},  // to 2024-01-01
		{"second", AlignEpoch, time.Second},
		{"day", AlignEpoch, time.Hour + 46*time.Minute + 40*time.Second},
		{"week", AlignEpoch, 7*day - time.Duration(1_700_000_000%(7*86400))*time.Second},
		{"month", AlignEpoch, 30*day - time.Duration(1_700_000_000%(30*86400))*time.Second},
		{"year", AlignEpoch, 365*day - time.Duration(1_700_000_000%(365*86400))*time.Second},
	} {
		t.Run(tc.unit+"/"+map[Alignment]string{AlignCalendar: "calendar", AlignEpoch: "epoch"}[tc.align], func(t *testing.T) {
			e := newEnv(t, []string{unitsConfig}, func(c *Config) { c.Alignment = tc.align })
			exact := newEnv(t, []string{unitsConfig}, func(c *Config) { c.Alignment = tc.align; c.ExactReset = true })
			d := descs(desc("u=" + tc.unit))
			l := " 0/1/" + tc.unit + " t="
			// duration_until_reset is whole seconds rounded up, never 0,
			// unless ExactReset.
			exact.run("units", []step{
				{name: "the one", descs: d, want: "OK; OK" + l + tc.reset.String()},
				{name: "one more, a nanosecond before the end", advance: tc.reset - time.Nanosecond, descs: d, want: "OVER_LIMIT; OVER" + l + "1ns"},
			})
			e.run("units", []step{
				{name: "the one", descs: d, want: "OK; OK" + l + tc.reset.String()},
				{name: "one more, a nanosecond before the end", advance: tc.reset - time.Nanosecond, descs: d, want: "OVER_LIMIT; OVER" + l + "1s"},
			})
			e.clk.Advance(time.Nanosecond)
			for i, want := range []string{"OK; OK" + l, "OVER_LIMIT; OVER" + l} {
				if got := summary(e.call("units", 0, d...)); !strings.HasPrefix(got, want) {
					t.Errorf("the next window, call %d: %s, want %s...", i, got, want)
				}
			}
		})
	}
}

// headersConfig has a limit of 10 a minute and one of 5 an hour.
const headersConfig = `
domain: h
descriptors:
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: per_hour
    rate_limit: {unit: hour, requests_per_unit: 5}
    shadow_mode: true
  - key: free
    rate_limit: {unlimited: true}
`

// Response headers show the limit closest to being reached: the first
// with the least remaining, or one that is over; none without a limit.
func TestResponseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names *HeaderNames
		want  []string
	}{
		{"draft", DraftHeaders(), []string{
			"RateLimit-Limit: 10; RateLimit-Remaining: 7; RateLimit-Reset: 40",
			"RateLimit-Limit: 5; RateLimit-Remaining: 3; RateLimit-Reset: 2800",
			"RateLimit-Limit: 10; RateLimit-Remaining: 0; RateLimit-Reset: 40",
			"",
		}},
		{"x-ratelimit", XRateLimitHeaders(), []string{
			"X-RateLimit-Limit: 10; X-RateLimit-Remaining: 7; X-RateLimit-Reset: 40",
			"X-RateLimit-Limit: 5; X-RateLimit-Remaining: 3; X-RateLimit-Reset: 2800",
			"X-RateLimit-Limit: 10; X-RateLimit-Remaining: 0; X-RateLimit-Reset: 40",
			"",
		}},
		{"off", nil, []string{"", "", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, []string{headersConfig}, func(c *Config) { c.Headers = tc.names })
			headers := func(r *rlsv3.RateLimitResponse) string {
				var parts []string
				for _, h := range r.ResponseHeadersToAdd {
					parts = append(parts, h.Key+": "+h.Value)
				}
				return strings.Join(parts, "; ")
			}
			for i, call := range []struct {
				hits uint32
				ds   []*rlDesc
			}{
				{3, descs(desc("per_minute=a"), desc("free=x"))},
				{2, descs(desc("per_minute=a"), desc("per_hour=a"), desc("free=x"))},
				// per_hour is over but in shadow mode: its remaining is 0,
				// yet per_minute, over and enforced, is shown.
				{6, descs(desc("per_hour=a"), desc("per_minute=a"))},
				{1, descs(desc("free=x"), desc("other=y"))},
			} {
				if got := headers(e.call("h", call.hits, call.ds...)); got != tc.want[i] {
					t.Errorf("call %d: headers %q, want %q", i, got, tc.want[i])
				}
			}
		})
	}
}

// quotaConfig has two quota-mode limits and an enforced one.
const quotaConfig = `
domain: q
descriptors:
  - {key: quota_a, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: quota_b, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 2}}
`

// A quota-mode descriptor over its limit makes the request over only when
// every quota-mode descriptor of the request is.
func TestQuotaMode(t *testing.T) {
	e := newEnv(t, []string{quotaConfig})
	const t1, t2 = "/1/hour t=46m40s", "/2/hour t=46m40s"
	e.run("q", []step{
		{descs: descs(desc("quota_a=x"), desc("quota_b=x")), want: "OK; OK 0" + t1 + "; OK 1" + t2},
		{name: "a is over, b is not", descs: descs(desc("quota_a=x"), desc("quota_b=x")), want: "OK; OVER 0" + t1 + "; OK 0" + t2},
		{name: "both are over", descs: descs(desc("quota_a=x"), desc("quota_b=x")), want: "OVER_LIMIT; OVER 0" + t1 + "; OVER 0" + t2},
	})
}

// A limit Envoy sends with a descriptor wins over the configuration and
// is counted under the descriptor's entries; a domain with no
// configuration has no limits, not even those.
func TestLimitOverride(t *testing.T) {
	e := newEnv(t, []string{hitsConfig})
	over := desc("user=a", "path=/x")
	over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	e.run("hits", []step{
		{descs: descs(over), want: "OK; OK 1/2/hour t=46m40s"},
		{descs: descs(over), want: "OK; OK 0/2/hour t=46m40s"},
		{descs: descs(over), want: "OVER_LIMIT; OVER 0/2/hour t=46m40s"},
		{name: "the configured limit is untouched", descs: descs(desc("user=a")), want: "OK; OK 9/10/minute t=40s"},
	})
	e.run("unknown", []step{{descs: descs(over, desc("user=a")), want: "OK; OK; OK"}})
	if hits := e.takeHits(); hits[0].Key != "hits.user_a.path_/x" {
		t.Errorf("metric key of an override %q, want hits.user_a.path_/x", hits[0].Key)
	}
	bad := desc("user=a")
	bad.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2}
	if _, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: descs(bad)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an override without a unit: %v, want InvalidArgument", err)
	}
}

// matchConfig exercises the order of matching and the share_threshold of
// a pattern above the level of the limit.
const matchConfig = `
domain: m
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: tenant
    value: t-*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
`

// An exact value wins over a pattern, the first matching pattern in file
// order over the next, and a pattern over a key without value; a shared
// pattern above the limit's level makes every tenant it matches count
// together, per user.
func TestMatchOrder(t *testing.T) {
	e := newEnv(t, []string{matchConfig})
	const m = " t=40s"
	e.run("m", []step{
		{descs: descs(desc("k=abc")), want: "OK; OK 3/4/minute" + m},
		{descs: descs(desc("k=abd")), want: "OK; OK 1/2/minute" + m},
		{descs: descs(desc("k=ax")), want: "OK; OK 2/3/minute" + m},
		{descs: descs(desc("k=b")), want: "OK; OK 0/1/minute" + m},
		{descs: descs(desc("tenant=t-1", "user=u")), want: "OK; OK 4/5/minute" + m},
		{name: "another tenant, same user: shared", descs: descs(desc("tenant=t-2", "user=u")), want: "OK; OK 3/5/minute" + m},
		{name: "another user", descs: descs(desc("tenant=t-2", "user=v")), want: "OK; OK 4/5/minute" + m},
		{name: "a tenant the pattern does not match", descs: descs(desc("tenant=x", "user=u")), want: "OK; OK"},
	})
	if got := hitKeys(e.takeHits())[4]; got != "m.tenant_t-*.user" {
		t.Errorf("metric key %q, want m.tenant_t-*.user", got)
	}
}

// Counter keys escape their separators, so that no two descriptors share
// a counter by accident, and a long one is hashed.
func TestCounterKey(t *testing.T) {
	d, err := ParseDomain("k.yaml", []byte("domain: d|x\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a|b=c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: s\n    value: p*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		want    string
	}{
		{[]Entry{{"a", "1"}, {"b", "2"}}, "d%7Cx|a=1|b=2"},
		{[]Entry{{"a|b=c", "%~"}}, "d%7Cx|a%7Cb%3Dc=%25%7E"},
		{[]Entry{{"s", "p1"}}, "d%7Cx|s~p*"},
		{[]Entry{{"s", "p*"}}, "d%7Cx|s=p*"},
		{[]Entry{{"a", strings.Repeat("x", 2000)}, {"b", ""}}, "sha256:"},
	} {
		m := d.Match(tc.entries)
		if m.Descriptor == nil {
			t.Fatalf("%v matched nothing", tc.entries)
		}
		got := m.CounterKey()
		if got != tc.want && !(tc.want == "sha256:" && strings.HasPrefix(got, tc.want) && len(got) == 71) {
			t.Errorf("%v: key %q, want %q", tc.entries, got, tc.want)
		}
	}
}

// A request without a domain or descriptors, or with too many, is
// refused; a limiter failure is Unavailable, or the context's code.
func TestInvalidRequests(t *testing.T) {
	e := newEnv(t, []string{hitsConfig})
	many := make([]*rlDesc, 65)
	for i := range many {
		many[i] = desc("user=a")
	}
	long := make([]string, 33)
	for i := range long {
		long[i] = "k=v"
	}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"nil", nil},
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: descs(desc("user=a"))}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "hits"}},
		{"65 descriptors", &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: many}},
		{"33 entries", &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: descs(desc(long...))}},
	} {
		if _, err := e.svc.ShouldRateLimit(context.Background(), tc.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: descs(desc("user=a"))}); status.Code(err) != codes.Canceled {
		t.Errorf("canceled: %v, want Canceled", err)
	}
	svc, err := New(Config{Limiter: failing{}, Rules: e.svc.cfg.Rules, MaxDescriptors: 1, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: descs(desc("user=a"))}); status.Code(err) != codes.Unavailable {
		t.Errorf("a failing limiter: %v, want Unavailable", err)
	}
}

// failing is a limiter that fails every check.
type failing struct{}

func (failing) Check(context.Context, limiter.Request, ...sluice.CheckOption) (sluice.Decision, error) {
	return sluice.Decision{}, errors.New("down")
}

func (failing) CheckMany(_ context.Context, reqs []limiter.Request, _ ...sluice.CheckOption) []sluice.Result {
	out := make([]sluice.Result, len(reqs))
	for i := range out {
		out[i].Err = errors.New("down")
	}
	return out
}

// Config.Validate names each invalid field.
func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Limiter, ok.Rules = failing{}, Static{}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no limiter", func(c *Config) { c.Limiter = nil }},
		{"no rules", func(c *Config) { c.Rules = nil }},
		{"ratio", func(c *Config) { c.NearLimitRatio = 1.5 }},
		{"descriptors", func(c *Config) { c.MaxDescriptors = 0 }},
		{"alignment", func(c *Config) { c.Alignment = 9 }},
		{"header", func(c *Config) { c.Headers = &HeaderNames{Limit: "a", Remaining: "b"} }},
	} {
		c := ok
		tc.mod(&c)
		if _, err := New(c); !errors.Is(err, ErrInvalidServiceConfig) {
			t.Errorf("%s: %v, want ErrInvalidServiceConfig", tc.name, err)
		}
	}
	if _, err := New(ok); err != nil {
		t.Errorf("valid config: %v", err)
	}
}
