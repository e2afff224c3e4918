package envoyrls

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkMatch matches a two-entry descriptor through a pattern and
// builds its counter key:
//
//	go test -run '^$' -bench 'BenchmarkMatch|BenchmarkShouldRateLimit' -benchmem ./envoyrls
func BenchmarkMatch(b *testing.B) {
	d, err := ParseDomain("b.yaml", []byte(matchConfig))
	if err != nil {
		b.Fatal(err)
	}
	entries := []Entry{{"tenant", "t-42"}, {"user", "user-1234"}}
	b.ReportAllocs()
	for b.Loop() {
		m := d.Match(entries)
		if m.Descriptor == nil || m.CounterKey() == "" {
			b.Fatal("no match")
		}
	}
}

// BenchmarkShouldRateLimit is a whole request of one descriptor over a
// local limiter: matching, the key, the check and the response.
func BenchmarkShouldRateLimit(b *testing.B) {
	e := newEnv(b, []string{matchConfig}, func(c *Config) { c.OnHit = nil })
	req := &rlsv3.RateLimitRequest{Domain: "m", Descriptors: descs(desc("tenant=t-42", "user=user-1234"))}
	b.ReportAllocs()
	for b.Loop() {
		e.clk.Advance(60_000_000_000) // a new minute: never over
		if _, err := e.svc.ShouldRateLimit(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
