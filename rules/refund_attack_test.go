package rules

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// TestEnforceRefundAfterAPeriodChange attacks the refund's window check
// after a rule's Period changes (a rules_file reload from 10s to 7s) on a
// store with KeepStrictest (the daemon's under destructive_behaviors
// deny). A hit consumed at 9.5s into a 70s-aligned span goes into the
// key's kept 10s window [0s, 10s), which ends at 10s with its state; the
// next request, at 10.5s, charges the fresh key under the 7s rule, window
// [7s, 14s). The refund, at 10.5s, passes Enforcer's check (the rule's 7s
// window [7s, 14s) holds 9.5s and 10.5s) and takes the other request's
// hit off the new window: the refund does not tell the limiter which
// window its hits went into.
func TestEnforceRefundAfterAPeriodChange(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") == "" {
		t.Skip("attack: the refund's window check reads the rule's Period, not the key's kept one (SLUICE_ATTACK=1)")
	}
	span := time.Unix(1_700_000_000-1_700_000_000%70, 0) // both periods' windows start here
	clk := fakeclock.New(span.Add(time.Second))
	cfg := cluster.TestConfig("rules-refund-attack")
	cfg.Clock = cluster.ClockFunc(clk.Now)
	cfg.Store.KeepStrictest = true
	n, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })

	old, err := NewSet(Rule{Name: "wide", Algorithm: limiter.FixedWindow, Limit: 10, Period: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSet(
		Rule{Name: "wide", Algorithm: limiter.FixedWindow, Limit: 10, Period: 7 * time.Second},
		Rule{Name: "narrow", Algorithm: limiter.TokenBucket, Limit: 1, Period: time.Hour},
	)
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{}
	oldWide, _ := old.Rule("wide")
	takeOld, _ := oldWide.Request(d, 1)
	if dec, err := n.Check(context.Background(), takeOld); err != nil || !dec.Allowed {
		t.Fatalf("a hit under the old rule: %+v, %v", dec, err)
	}
	clk.Advance(8500 * time.Millisecond) // 9.5s into the span
	narrow, _ := s.Rule("narrow")
	wide, _ := s.Rule("wide")
	takeNarrow, _ := narrow.Request(d, 1)
	takeWide, _ := wide.Request(d, 1)
	rc := &racer{Node: n, race: func() {
		if dec, err := n.Check(context.Background(), takeNarrow); err != nil || !dec.Allowed {
			t.Errorf("the racing request: %+v, %v", dec, err)
		}
	}}
	rc.afterConsume = func() {
		clk.Advance(time.Second) // 10.5s: the key's next 10s window
		if dec, err := n.Check(context.Background(), takeWide); err != nil || !dec.Allowed {
			t.Errorf("the request of the next window: %+v, %v", dec, err)
		}
	}
	e := &Enforcer{Limiter: rc, Now: clk.Now}
	if v := e.Enforce(context.Background(), s, d, 1); v.Allowed || v.Err != nil {
		t.Fatalf("verdict %+v", v)
	}
	if got := remaining(t, n, s, "wide", d); got != 9 {
		t.Fatalf("wide remaining %d in the key's next window, want 9: the refund took back the other request's hit", got)
	}
}
