package envoyrls

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// testStart is where the clocks of the tests stand: 20s into a minute,
// on Tuesday 2023-11-14 22:13:20 UTC.
var testStart = time.Unix(1_700_000_000, 0)

// env is a Service over a local limiter whose clock the test moves, and
// the hits it reported.
type env struct {
	t   testing.TB
	clk *fakeclock.Clock
	svc *Service

	mu   sync.Mutex
	hits []Hit // guarded by mu
}

// newEnv serves the configuration files texts (one domain each) with the
// config DefaultConfig gives, changed by mods.
func newEnv(t testing.TB, texts []string, mods ...func(*Config)) *env {
	t.Helper()
	var domains []*Domain
	for i, text := range texts {
		d, err := ParseDomain(fmt.Sprintf("config%d.yaml", i), []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		domains = append(domains, d)
	}
	rules, err := NewRules(domains...)
	if err != nil {
		t.Fatal(err)
	}
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, clk: fakeclock.New(testStart)}
	cfg := DefaultConfig()
	cfg.Limiter = sluice.NewLocal(store, e.clk.Now)
	cfg.Rules = Static{rules}
	cfg.Now = e.clk.Now
	cfg.OnHit = func(h *Hit) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.hits = append(e.hits, *h)
	}
	for _, m := range mods {
		m(&cfg)
	}
	if e.svc, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// desc builds a request descriptor from "key=value" entries; an entry
// "hits=N" sets the descriptor's own hits_addend instead.
func desc(entries ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		if k == "hits" {
			var n uint64
			fmt.Sscan(v, &n)
			d.HitsAddend = wrapperspb.UInt64(n)
			continue
		}
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// call sends a request of domain with the request-level hits and
// descriptors, and fails the test on an error.
func (e *env) call(domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// takeHits returns the hits reported since the last call.
func (e *env) takeHits() []Hit {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.hits
	e.hits = nil
	return h
}

// summary writes a response on one line: the overall code, then per
// descriptor "OK" (no limit), "OK unlimited", or the code and
// remaining/limit/unit and the seconds until reset.
func summary(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, st := range r.Statuses {
		b.WriteString("; ")
		b.WriteString(code(st.Code))
		switch l := st.CurrentLimit; {
		case l == nil && st.LimitRemaining == 1<<32-1:
			b.WriteString(" unlimited")
		case l != nil:
			fmt.Fprintf(&b, " %d/%d/%s", st.LimitRemaining, l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
			if l.Name != "" {
				fmt.Fprintf(&b, " %s", l.Name)
			}
			fmt.Fprintf(&b, " t=%v", st.DurationUntilReset.AsDuration())
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		fmt.Fprintf(&b, "; %s: %s", h.Key, h.Value)
	}
	return b.String()
}

func code(c rlsv3.RateLimitResponse_Code) string {
	if c == rlsv3.RateLimitResponse_OVER_LIMIT {
		return "OVER"
	}
	return c.String()
}

// step is one call of a table: after advancing the clock, the request and
// its expected summary.
type step struct {
	name    string
	advance time.Duration
	hits    uint32 // the request's hits_addend
	descs   []*rlcommon.RateLimitDescriptor
	want    string
}

// rlDesc is a request descriptor.
type rlDesc = rlcommon.RateLimitDescriptor

// descs lists request descriptors.
func descs(ds ...*rlDesc) []*rlDesc { return ds }

// run runs steps in order against domain; a step without want is not
// checked.
func (e *env) run(domain string, steps []step) {
	e.t.Helper()
	for i, s := range steps {
		e.clk.Advance(s.advance)
		if got := summary(e.call(domain, s.hits, s.descs...)); s.want != "" && got != s.want {
			e.t.Errorf("step %d (%s):\n got %s\nwant %s", i, s.name, got, s.want)
		}
	}
}

// repeat is n copies of s.
func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}
