package rules

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// newFakeClock returns the time of a test node and of the fields computed
// from its decisions, starting 40s into a minute (Unix time 1_700_000_020).
func newFakeClock() *fakeclock.Clock { return fakeclock.New(time.Unix(1_700_000_020, 0)) }

// newNode starts a real single node on loopback whose decisions use clk.
func newNode(t *testing.T, clk *fakeclock.Clock) *cluster.Node {
	t.Helper()
	cfg := cluster.TestConfig("rules-test")
	cfg.Clock = cluster.ClockFunc(clk.Now)
	n, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// remaining peeks at a rule's counter for d.
func remaining(t *testing.T, n sluice.Limiter, s *Set, name string, d *Descriptor) int64 {
	t.Helper()
	r, _ := s.Rule(name)
	req, ok := r.Request(d, 0)
	if !ok {
		t.Fatalf("%s does not apply", name)
	}
	dec, err := n.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return dec.Remaining
}

// step is one request in an enforcement table: what to expect of it.
type step struct {
	advance     time.Duration
	wantAllowed bool
	wantRetry   time.Duration
	wantShadow  bool
	wantDelay   time.Duration
	remaining   map[string]int64 // rule name -> remaining after the step
}

func runSteps(t *testing.T, e *Enforcer, n *cluster.Node, clk *fakeclock.Clock, s *Set, d *Descriptor, steps []step) {
	t.Helper()
	for i, st := range steps {
		clk.Advance(st.advance)
		v := e.Enforce(context.Background(), s, d, 1)
		if v.Err != nil {
			t.Fatalf("step %d: %v", i, v.Err)
		}
		if v.Allowed != st.wantAllowed || v.RetryAfter != st.wantRetry || v.ShadowRejected != st.wantShadow || v.Delay != st.wantDelay {
			t.Fatalf("step %d: allowed %v retry %v shadow %v delay %v; want %v %v %v %v",
				i, v.Allowed, v.RetryAfter, v.ShadowRejected, v.Delay, st.wantAllowed, st.wantRetry, st.wantShadow, st.wantDelay)
		}
		for name, want := range st.remaining {
			if got := remaining(t, n, s, name, d); got != want {
				t.Fatalf("step %d: %s remaining %d, want %d", i, name, got, want)
			}
		}
	}
}

func TestEnforceAllOrNothing(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "per_user", Key: []string{"user"}, Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute},
		Rule{Name: "writes", Match: Match{Methods: []string{"POST"}}, Key: []string{"user"}, Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute},
	)
	if err != nil {
		t.Fatal(err)
	}
	e := &Enforcer{Limiter: n}
	post := &Descriptor{Method: "POST", User: "u"}
	runSteps(t, e, n, clk, s, post, []step{
		{wantAllowed: true, remaining: map[string]int64{"per_user": 4, "writes": 1}},
		{wantAllowed: true, remaining: map[string]int64{"per_user": 3, "writes": 0}},
		// writes is exhausted: rejected, and per_user keeps its 3.
		{wantRetry: 20 * time.Second, remaining: map[string]int64{"per_user": 3, "writes": 0}},
		{advance: 10 * time.Second, wantRetry: 10 * time.Second, remaining: map[string]int64{"per_user": 3, "writes": 0}},
		{advance: 10 * time.Second, wantAllowed: true, remaining: map[string]int64{"per_user": 4, "writes": 1}},
	})
	// A GET matches per_user only.
	v := e.Enforce(context.Background(), s, &Descriptor{Method: "GET", User: "u"}, 1)
	if !v.Allowed || len(v.Limits) != 1 || v.Limits[0].Rule.Name != "per_user" {
		t.Fatalf("GET verdict %+v", v)
	}
	// No user: no rule applies, the request is allowed untouched.
	if v := e.Enforce(context.Background(), s, &Descriptor{Method: "POST"}, 1); !v.Allowed || len(v.Limits) != 0 {
		t.Fatalf("anonymous verdict %+v", v)
	}
}

func TestEnforceShadow(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "enforced", Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Minute},
		Rule{Name: "trial", Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Minute, Shadow: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	runSteps(t, &Enforcer{Limiter: n}, n, clk, s, d, []step{
		{wantAllowed: true, remaining: map[string]int64{"enforced": 2, "trial": 0}},
		{wantAllowed: true, wantShadow: true, remaining: map[string]int64{"enforced": 1, "trial": 0}},
		{wantAllowed: true, wantShadow: true, remaining: map[string]int64{"enforced": 0, "trial": 0}},
		{wantRetry: 20 * time.Second, wantShadow: true, remaining: map[string]int64{"enforced": 0, "trial": 0}},
	})
	// Globally shadowed, nothing blocks.
	v := (&Enforcer{Limiter: n, Shadow: true}).Enforce(context.Background(), s, d, 1)
	if !v.Allowed || !v.ShadowRejected || v.Limits[0].Enforced {
		t.Fatalf("global shadow verdict %+v", v)
	}
}

func TestEnforceLeakyBucketWait(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(Rule{Name: "paced", Algorithm: limiter.LeakyBucket, Limit: 10, Period: time.Second, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	// Each queued hit adds 100ms; up to 250ms of waiting is accepted.
	runSteps(t, &Enforcer{Limiter: n, MaxWait: 250 * time.Millisecond}, n, clk, s, d, []step{
		{wantAllowed: true, remaining: map[string]int64{"paced": 4}},
		{wantAllowed: true, wantDelay: 100 * time.Millisecond, remaining: map[string]int64{"paced": 3}},
		{wantAllowed: true, wantDelay: 200 * time.Millisecond, remaining: map[string]int64{"paced": 2}},
		// 300ms > 250ms: rejected for 50ms, nothing queued.
		{wantRetry: 50 * time.Millisecond, remaining: map[string]int64{"paced": 2}},
		// 50ms later 2.5 hits are queued: a wait of 250ms.
		{advance: 50 * time.Millisecond, wantAllowed: true, wantDelay: 250 * time.Millisecond, remaining: map[string]int64{"paced": 1}},
	})
	// Without MaxWait, only requests that need no delay pass.
	runSteps(t, &Enforcer{Limiter: n}, n, clk, s, &Descriptor{}, []step{
		{wantRetry: 350 * time.Millisecond, remaining: map[string]int64{"paced": 1}},
	})
}

// Wait honours the delay through the injected timer, and a request whose
// context ends while it waits gives its hits back.
func TestEnforceWait(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(Rule{Name: "paced", Algorithm: limiter.LeakyBucket, Limit: 10, Period: time.Second, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan time.Duration, 1)
	fire := make(chan time.Time, 1)
	e := &Enforcer{Limiter: n, MaxWait: time.Second, After: func(d time.Duration) <-chan time.Time {
		asked <- d
		return fire
	}}
	d := &Descriptor{}
	if v := e.Enforce(context.Background(), s, d, 1); !v.Allowed || v.Delay != 0 || e.Wait(context.Background(), v) != nil {
		t.Fatalf("first %+v", v)
	}
	v := e.Enforce(context.Background(), s, d, 1)
	fire <- time.Time{}
	if err := e.Wait(context.Background(), v); err != nil || <-asked != 100*time.Millisecond {
		t.Fatalf("wait: %v", err)
	}
	if got := remaining(t, n, s, "paced", d); got != 3 {
		t.Fatalf("remaining %d, want 3", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v = e.Enforce(ctx, s, d, 1)
	if v.Delay != 200*time.Millisecond || remaining(t, n, s, "paced", d) != 2 {
		t.Fatalf("third %+v", v)
	}
	cancel()
	if err := e.Wait(ctx, v); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v", err)
	}
	<-asked
	if v.Allowed || !v.Refunded || remaining(t, n, s, "paced", d) != 3 {
		t.Fatalf("after the cancelled wait: %+v, remaining %d", v, remaining(t, n, s, "paced", d))
	}
}

// racer is a real limiter with a concurrent request slipped in between the
// peek and the consume of the enforcer it serves.
type racer struct {
	sluice.Limiter
	mu    sync.Mutex
	calls int
	race  func()
	// raceAll runs race before every call, not only the second.
	raceAll bool
	// afterConsume runs when the second call (the consume) returns.
	afterConsume func()
}

func (r *racer) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	r.mu.Lock()
	r.calls++
	calls := r.calls
	if r.race != nil && (calls == 2 || r.raceAll) {
		r.race()
	}
	r.mu.Unlock()
	res := r.Limiter.CheckMany(ctx, reqs, opts...)
	if calls == 2 && r.afterConsume != nil {
		r.afterConsume()
	}
	return res
}

// A concurrent request takes the last hit of one limit between the peek
// and the consume: the request is rejected and the other limit's hit is
// refunded.
func TestEnforceRefundsWhenARaceIsLost(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "wide", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Minute},
		Rule{Name: "narrow", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Minute},
	)
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	narrow, _ := s.Rule("narrow")
	other, _ := narrow.Request(d, 1)
	rc := &racer{Limiter: n, race: func() {
		if dec, err := n.Check(context.Background(), other); err != nil || !dec.Allowed {
			t.Errorf("the racing request: %+v, %v", dec, err)
		}
	}}
	v := (&Enforcer{Limiter: rc}).Enforce(context.Background(), s, d, 1)
	if v.Allowed || !v.Refunded || v.Err != nil || v.RetryAfter < 59*time.Second {
		t.Fatalf("verdict %+v", v)
	}
	if rc.calls != 3 {
		t.Fatalf("%d limiter calls, want peek, consume, refund", rc.calls)
	}
	if got := remaining(t, n, s, "wide", d); got != 10 {
		t.Fatalf("wide remaining %d after the refund, want 10", got)
	}
	if got := remaining(t, n, s, "narrow", d); got != 0 {
		t.Fatalf("narrow remaining %d, want 0 (the racer's)", got)
	}
	// The refunded limit reports its state after the refund.
	if l := v.Limits[0]; l.Rule.Name != "wide" || l.Consumed || l.Decision.Remaining != 10 {
		t.Fatalf("wide in the verdict: %+v", l)
	}
}

// Rules with different unreachable policies are checked in separate calls
// and still decided together.
func TestEnforceMixedPolicies(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 2, Period: time.Second, Unreachable: sluice.PolicyDeny},
		Rule{Name: "b", Algorithm: limiter.GCRA, Limit: 2, Period: time.Second, Unreachable: sluice.PolicyAllow},
		Rule{Name: "c", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second},
	)
	if err != nil {
		t.Fatal(err)
	}
	runSteps(t, &Enforcer{Limiter: n}, n, clk, s, &Descriptor{}, []step{
		{wantAllowed: true, remaining: map[string]int64{"a": 1, "b": 1, "c": 0}},
		{wantRetry: time.Second, remaining: map[string]int64{"a": 1, "b": 1, "c": 0}},
	})
}

func TestEnforceLimiterError(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 2, Period: time.Second},
		Rule{Name: "b", Algorithm: limiter.GCRA, Limit: 2, Period: time.Second},
	)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	v := (&Enforcer{Limiter: n}).Enforce(context.Background(), s, &Descriptor{}, 1)
	if v.Allowed || !errors.Is(v.Err, cluster.ErrClosed) {
		t.Fatalf("verdict %+v", v)
	}
	if _, ok := v.Fields(clk.Now()); ok {
		t.Fatal("fields from failed limits")
	}
}

func TestFields(t *testing.T) {
	clk := newFakeClock() // 40s into a minute
	n := newNode(t, clk)
	s, err := NewSet(
		Rule{Name: "per_min", Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Minute},
		Rule{Name: "per_day", Algorithm: limiter.FixedWindow, Limit: 3, Calendar: limiter.Day},
		Rule{Name: "month", Algorithm: limiter.FixedWindow, Limit: 1000, Calendar: limiter.Month, Shadow: true},
		Rule{Name: "fast", Algorithm: limiter.TokenBucket, Limit: 5, Period: 500 * time.Millisecond},
	)
	if err != nil {
		t.Fatal(err)
	}
	e := &Enforcer{Limiter: n}
	v := e.Enforce(context.Background(), s, &Descriptor{}, 1)
	f, ok := v.Fields(clk.Now())
	midnight := clk.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
	toMidnight := int64(midnight.Sub(clk.Now()) / time.Second)
	want := Fields{
		Limit: 3, Remaining: 2, Reset: toMidnight,
		Policy:    `"per_day";q=3;w=86400, "fast";q=5;w=1, "per_min";q=100;w=60, "month";q=1000`,
		RateLimit: `"per_day";r=2;t=` + itoa(toMidnight) + `, "fast";r=4;t=1, "per_min";r=99;t=20, "month";r=999;t=` + itoa(monthEnd(clk.Now())),
	}
	if !ok || !fieldsEqual(f, want) {
		t.Fatalf("fields\n%+v\nwant\n%+v", f, want)
	}
	e.Enforce(context.Background(), s, &Descriptor{}, 1)
	e.Enforce(context.Background(), s, &Descriptor{}, 1)
	v = e.Enforce(context.Background(), s, &Descriptor{}, 1)
	f, _ = v.Fields(clk.Now())
	if v.Allowed || f.RetryAfter != toMidnight || f.Reset != toMidnight || f.Remaining != 0 || !slices.Equal(f.Violated, []string{"per_day"}) {
		t.Fatalf("rejected fields %+v", f)
	}
}

func fieldsEqual(a, b Fields) bool {
	return a.Limit == b.Limit && a.Remaining == b.Remaining && a.Reset == b.Reset && a.Policy == b.Policy &&
		a.RateLimit == b.RateLimit && a.RetryAfter == b.RetryAfter && slices.Equal(a.Violated, b.Violated)
}

func monthEnd(now time.Time) int64 {
	now = now.UTC()
	end := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	return int64((end.Sub(now) + time.Second - 1) / time.Second)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The refund of a race lost travels to the owner like any check: through
// a node that owns neither limit, the wide limit ends where it began.
func TestEnforceRefundAcrossNodes(t *testing.T) {
	c := testcluster.New(t, 3)
	entry := c.Node(0)
	remote := func(prefix string) string { // a rule name whose owner is not entry
		for i := 0; ; i++ {
			name := prefix + strconv.Itoa(i)
			if c.Owner(name, "*") != entry {
				return name
			}
		}
	}
	wideName, narrowName := remote("wide_"), remote("narrow_")
	s, err := NewSet(
		Rule{Name: wideName, Algorithm: limiter.FixedWindow, Limit: 10, Period: time.Hour},
		Rule{Name: narrowName, Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Hour},
	)
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	narrow, _ := s.Rule(narrowName)
	other, _ := narrow.Request(d, 1)
	rc := &racer{Limiter: entry, race: func() {
		if dec, err := entry.Check(context.Background(), other); err != nil || !dec.Allowed {
			t.Errorf("the racing request: %+v, %v", dec, err)
		}
	}}
	v := (&Enforcer{Limiter: rc}).Enforce(context.Background(), s, d, 1)
	if v.Allowed || !v.Refunded || v.Err != nil {
		t.Fatalf("verdict %+v", v)
	}
	if got := remaining(t, entry, s, wideName, d); got != 10 {
		for _, l := range v.Limits {
			t.Logf("%s: decided by %s, without owner %v", l.Rule.Name, l.Decision.Owner, l.Decision.WithoutOwner)
		}
		t.Fatalf("%s remaining %d after the refund, want 10", wideName, got)
	}
}

// A refund never lands in another window than the one that charged the
// hits: the request is rejected by one limit (a concurrent request took
// its last hit between the peek and the consume), and before the refund
// of the other, a window of 10 a minute, the clock crosses into the next
// minute and another request takes a hit there: after the consume
// returns, or while the refund is on its way, within Enforcer.ClockSkew.
// The new window's count is the other request's and stays so: a fixed
// window's refund gives nothing back, its hit went into the window that
// ended; a sliding window counter's goes back to the previous window,
// which still counts it, weighted.
func TestEnforceRefundStaysInItsWindow(t *testing.T) {
	cases := []struct {
		name     string
		start    time.Duration // into the minute
		skew     time.Duration
		advance  time.Duration
		inFlight bool // the clock crosses during the refund call
	}{
		{"crossed before the refund", 40 * time.Second, 0, 30 * time.Second, false},
		{"crossed in flight, within the skew", 59*time.Second + 500*time.Millisecond, time.Second, 600 * time.Millisecond, true},
	}
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		for _, c := range cases {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				clk := fakeclock.New(time.Unix(1_699_999_980, 0).Add(c.start)) // a minute boundary + start
				n := newNode(t, clk)
				s, err := NewSet(
					Rule{Name: "wide", Algorithm: a, Limit: 10, Period: time.Minute},
					Rule{Name: "narrow", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour},
				)
				if err != nil {
					t.Fatal(err)
				}
				d := &Descriptor{}
				narrow, _ := s.Rule("narrow")
				wide, _ := s.Rule("wide")
				takeNarrow, _ := narrow.Request(d, 1)
				takeWide, _ := wide.Request(d, 1)
				cross := func() {
					clk.Advance(c.advance)
					if dec, err := n.Check(context.Background(), takeWide); err != nil || !dec.Allowed {
						t.Errorf("the request of the next window: %+v, %v", dec, err)
					}
				}
				rc := &racer{Limiter: n, raceAll: true}
				rc.race = func() {
					switch {
					case rc.calls == 2: // between the peek and the consume
						if dec, err := n.Check(context.Background(), takeNarrow); err != nil || !dec.Allowed {
							t.Errorf("the racing request: %+v, %v", dec, err)
						}
					case rc.calls == 3 && c.inFlight:
						cross()
					}
				}
				if !c.inFlight {
					rc.afterConsume = cross
				}
				e := &Enforcer{Limiter: rc, Now: clk.Now, ClockSkew: c.skew}
				v := e.Enforce(context.Background(), s, d, 1)
				if v.Allowed || v.Err != nil {
					t.Fatalf("verdict %+v", v)
				}
				if c.inFlight && rc.calls < 3 {
					cross() // no refund was sent to race with
				}
				// In the new window: the other request's hit; the
				// counter's previous window holds none once the refund
				// took the hit it charged there.
				want := int64(9)
				if got := remaining(t, n, s, "wide", d); got != want {
					t.Fatalf("wide remaining %d in the next window, want %d", got, want)
				}
			})
		}
	}
}
