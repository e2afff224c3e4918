package rules

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// reloadCase is a rules reload that changes rule "wide" from old to new
// while a key is live under old, on limiters that keep the strictest rate
// (the daemon's under destructive_behaviors deny): the key keeps old's
// window until its state is fresh.
type reloadCase struct {
	name     string
	old, new Rule
	// consume is when the enforcer consumes, after a first hit under
	// old a second earlier; gap is how far the clock moves between the
	// consume and the refund, while another request takes a hit of new.
	consume, gap time.Duration
	// want is what new has left after the refund: the other request's
	// hit counted, and the first hit too while a window it was charged
	// under lasts.
	want int64
}

// refundAfterReload runs c through lim, whose decisions read clk, which
// starts at c.consume less a second. The enforcer's request takes a hit
// of wide, which lands in the key's window under old, and is rejected by
// narrow, whose only hit a racing request took between the peek and the
// consume; before the refund the clock moves by c.gap and another request
// takes a hit of new. The refund must leave that hit counted: wide has
// c.want remaining.
func refundAfterReload(t *testing.T, c reloadCase, lim sluice.Limiter, clk *fakeclock.Clock) {
	t.Helper()
	old, err := NewSet(c.old)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSet(c.new, Rule{Name: "narrow", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	oldWide, _ := old.Rule(c.old.Name)
	takeOld, _ := oldWide.Request(d, 1)
	if dec, err := lim.Check(context.Background(), takeOld); err != nil || !dec.Allowed {
		t.Fatalf("a hit under the old rule: %+v, %v", dec, err)
	}
	clk.Advance(time.Second)
	narrow, _ := s.Rule("narrow")
	wide, _ := s.Rule(c.new.Name)
	takeNarrow, _ := narrow.Request(d, 1)
	takeWide, _ := wide.Request(d, 1)
	rc := &racer{Limiter: lim, race: func() {
		if dec, err := lim.Check(context.Background(), takeNarrow); err != nil || !dec.Allowed {
			t.Errorf("the racing request: %+v, %v", dec, err)
		}
	}}
	rc.afterConsume = func() {
		clk.Advance(c.gap)
		if dec, err := lim.Check(context.Background(), takeWide); err != nil || !dec.Allowed {
			t.Errorf("the request after the consume: %+v, %v", dec, err)
		}
	}
	e := &Enforcer{Limiter: rc, Now: clk.Now}
	v := e.Enforce(context.Background(), s, d, 1)
	if v.Allowed || v.Err != nil {
		t.Fatalf("verdict %+v", v)
	}
	if got := remaining(t, lim, s, c.new.Name, d); got != c.want {
		for _, l := range v.Limits {
			t.Logf("%s: %+v", l.Rule.Name, l.Decision)
		}
		t.Fatalf("%s remaining %d after the refund, want %d: the refund took back the other request's hit", c.new.Name, got, c.want)
	}
}

// span is an instant where windows of 7s and of 10s begin.
var span = time.Unix(1_700_000_000-1_700_000_000%70, 0)

// minuteNotOfSeven is a minute boundary that no 7s window begins at, so
// that one 7s window holds the half seconds either side of it.
func minuteNotOfSeven() time.Time {
	m := int64(1_700_000_040) // a multiple of 60
	for m%7 == 0 {
		m += 60
	}
	return time.Unix(m, 0)
}

// The reloads a refund must survive: the enforcer's own check reads the
// new rule (its window holds both the consume and the refund, or it has
// none). A fixed window key moves to the new rule's 7s window, which
// ends after the old window: the first hit stays counted there, and the
// rule has, over 7s, the least either rate allows (7 of 10 per 10s, 11
// of 100 a minute, cut to 10). A bucket keeps the old window, which
// ended in between; the next request began the key anew under the new
// rule.
func reloadCases() []reloadCase {
	fixed10 := Rule{Name: "wide", Algorithm: limiter.FixedWindow, Limit: 10, Period: 10 * time.Second}
	fixed7 := Rule{Name: "wide", Algorithm: limiter.FixedWindow, Limit: 10, Period: 7 * time.Second}
	minute := Rule{Name: "wide", Algorithm: limiter.FixedWindow, Limit: 100, Calendar: limiter.Minute}
	bucket := Rule{Name: "wide", Algorithm: limiter.TokenBucket, Limit: 10, Period: 10 * time.Second}
	counter := Rule{Name: "wide", Algorithm: limiter.SlidingWindowCounter, Limit: 10, Period: 7 * time.Second}
	nearTen := span.Add(9500 * time.Millisecond).Sub(span)
	return []reloadCase{
		{"a shorter period", fixed10, fixed7, nearTen, time.Second, 7 - 2},
		{"a calendar window's end", minute, fixed7, 59500 * time.Millisecond, time.Second, 10 - 2},
		{"another algorithm without windows", fixed10, bucket, nearTen, time.Second, 10 - 1},
		{"another window algorithm", fixed10, counter, nearTen, time.Second, 7 - 2},
	}
}

// caseStart is where c's clock starts: a second before its consume, from
// span, or for the calendar case from the minute before minuteNotOfSeven.
func caseStart(c reloadCase) time.Time {
	from := span
	if c.old.Calendar != limiter.NoCalendar {
		from = minuteNotOfSeven().Add(-time.Minute)
	}
	return from.Add(c.consume - time.Second)
}

// A refund gives its hits back to the window they went into, which the
// limiter names, and not to the window the rule's new Period or algorithm
// puts the refund in: on one node.
func TestEnforceRefundAfterAReload(t *testing.T) {
	for _, c := range reloadCases() {
		t.Run(c.name, func(t *testing.T) {
			clk := fakeclock.New(caseStart(c))
			cfg := cluster.TestConfig("rules-refund-reload")
			cfg.Clock = cluster.ClockFunc(clk.Now)
			cfg.Store.KeepStrictest = true
			n, err := cluster.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			refundAfterReload(t, c, n, clk)
		})
	}
}

// The same through a node that owns none of the keys: the window of the
// charge travels to the owner with the refund.
func TestEnforceRefundAfterAReloadForwarded(t *testing.T) {
	c := reloadCases()[0]
	clk := fakeclock.New(caseStart(c))
	tc := testcluster.New(t, 2, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Clock = cluster.ClockFunc(clk.Now)
		cfg.Store.KeepStrictest = true
	}))
	// A rule name whose counter (key "*") node 1 owns.
	entry := tc.Node(0)
	for i := 0; tc.Owner(c.new.Name, "*") == entry; i++ {
		c.old.Name = "wide" + itoa(int64(i))
		c.new.Name = c.old.Name
	}
	refundAfterReload(t, c, entry, clk)
}

// A token bucket's, leaky bucket's, GCRA's or sliding window log's refund
// carries the instant its consume charged at (limiter.Request.Charged):
// once the hits have drained, or left the log's window, and another
// request has taken a hit, the refund gives nothing back and that hit
// stays counted.
func TestEnforceRefundAfterItDrained(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.LeakyBucket, limiter.GCRA, limiter.SlidingWindowLog} {
		r := Rule{Name: "wide", Algorithm: a, Limit: 10, Period: 10 * time.Second}
		gap := 2 * time.Second // two hits drain
		if a == limiter.SlidingWindowLog {
			gap = 11 * time.Second
		}
		c := reloadCase{a.String(), r, r, 5 * time.Second, gap, r.Limit - 1}
		t.Run(c.name, func(t *testing.T) {
			clk := fakeclock.New(caseStart(c))
			cfg := cluster.TestConfig("rules-refund-drained")
			cfg.Clock = cluster.ClockFunc(clk.Now)
			n, err := cluster.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			refundAfterReload(t, c, n, clk)
		})
	}
}
