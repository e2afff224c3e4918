package cluster

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Attacks on the lease grants carried with key states (carry.go), from a
// forged peer's side: a node alone, states taken as a peer's hand-off,
// returns as that peer's. Each judges the key's count from the callers'
// side: what the key admits after the attack against what it admits
// without it.

// atkLeaseNode returns a ready node alone whose clock is *at (Unix ns).
func atkLeaseNode(t *testing.T, at *atomic.Int64) *Node {
	t.Helper()
	cfg := TestConfig("self")
	cfg.Clock = ClockFunc(func() time.Time { return time.Unix(0, at.Load()) })
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	for deadline := time.Now().Add(20 * time.Second); !n.Ready(); {
		if time.Now().After(deadline) {
			t.Fatal("not ready after 20s")
		}
		runtime.Gosched()
	}
	return n
}

// atkForgeState returns a state of req's key counting hits at now, with
// grants gs.
func atkForgeState(t *testing.T, req limiter.Request, hits int64, now time.Time, gs ...limiter.LeaseGrant) limiter.Snapshot {
	t.Helper()
	st, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, MaxEntries: 16, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := req
	r.Hits = hits
	if d, err := st.CheckAt(r, now); err != nil || !d.Allowed {
		t.Fatalf("forging %d: %+v, %v", hits, d, err)
	}
	sn, _ := st.Snapshot(req.Name, req.Key, now)
	sn.Grants = gs
	return sn
}

func atkSpend(t *testing.T, n *Node, req limiter.Request, hits int64) {
	t.Helper()
	r := req
	r.Hits = hits
	if d, err := n.Check(context.Background(), r); err != nil || !d.Allowed {
		t.Fatalf("%d hits: %+v, %v", hits, d, err)
	}
}

func atkRemaining(t *testing.T, n *Node, req limiter.Request) int64 {
	t.Helper()
	r := req
	r.Hits = 0
	d, err := n.Check(context.Background(), r) // a peek
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// A forged hand-off state of a key of 100 per 10 s that counts 20 hits
// more than the owner's 30, with a grant of those 20 to the forger whose
// hits entered (EnteredAgoNanos) a minute after the sending, as the wire
// takes (MaxLeaseTTL). The 20 drain from the bucket with the rest; 5 s
// later the bucket is empty, callers spend all 100, and the forger
// returns 20: the owner must free none (they drained long ago), and the
// key stays at 0 remaining; 100 + 20 admitted at one instant would be
// more than the burst.
//
// The forger may also name a rate of 100 a day for its grant, its state
// and its return, where callers decide the key at 100 per 10 s: the 20
// drain at the callers' rate all the same.
func TestAtkLeaseForgedGrantEnteredAhead(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		for _, forged := range []time.Duration{10 * time.Second, 24 * time.Hour} {
			t.Run(a.String()+"/"+forged.String(), func(t *testing.T) {
				atkForgedGrantEnteredAhead(t, a, forged)
			})
		}
	}
}

func atkForgedGrantEnteredAhead(t *testing.T, a limiter.Algorithm, forged time.Duration) {
	var at atomic.Int64
	t0 := time.Unix(1_800_000_000, 0)
	at.Store(t0.UnixNano())
	n := atkLeaseNode(t, &at)
	req := limiter.Request{Name: "atkahead", Key: "k", Limit: 100, Period: 10 * time.Second, Algorithm: a}
	atkSpend(t, n, req, 30)
	slow := req
	slow.Period = forged
	state := slow
	if a == limiter.GCRA {
		state = req // a GCRA state of 100 a day would hold the key shut for hours
	}
	g := limiter.LeaseGrant{Holder: "evil", Hits: 20, Request: slow,
		Entered: t0.Add(MaxLeaseTTL).UnixNano(), Expires: t0.Add(MaxLeaseTTL).UnixNano()}
	sn := atkForgeState(t, state, 50, t0, g)
	if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "evil", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
		t.Fatalf("take: %d rejected, %v", rejected, err)
	}
	at.Store(t0.Add(5 * time.Second).UnixNano())
	atkSpend(t, n, req, 100)
	if err := n.ReturnLease(context.Background(), "evil", slow, 20); err != nil {
		t.Fatalf("return: %v", err)
	}
	if got := atkRemaining(t, n, req); got != 0 {
		t.Errorf("after 100 spent on an empty bucket and the forger's return: %d remaining, want 0 (%d admitted at one instant over a burst of 100)", got, 100+got)
	}
}

// A forged hand-off state counting 20 hits more than the owner's 30 of a
// key of 100 a day, with a grant of 200 hits to the forger at a limit of
// 1000 a day: the merge's count is read at the grant's limit. The
// forger's return of 200 at the key's limit must leave the key at 70
// remaining or fewer.
func TestAtkLeaseForgedGrantOfAnotherLimit(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			var at atomic.Int64
			t0 := time.Unix(1_800_000_000, 0)
			at.Store(t0.UnixNano())
			n := atkLeaseNode(t, &at)
			req := limiter.Request{Name: "atklimit", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			atkSpend(t, n, req, 30)
			big := req
			big.Limit = 1000
			g := limiter.LeaseGrant{Holder: "evil", Hits: 200, Request: big, Entered: t0.UnixNano(), Expires: t0.Add(time.Second).UnixNano()}
			sn := atkForgeState(t, req, 50, t0, g)
			if a == limiter.FixedWindow {
				d, _ := n.store.CheckAt(req, t0)
				sn.Grants[0].Window = d.ResetAt.UnixNano()
			}
			if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "evil", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
				t.Fatalf("take: %d rejected, %v", rejected, err)
			}
			for _, r := range []limiter.Request{req, big} {
				if err := n.ReturnLease(context.Background(), "evil", r, 200); err != nil {
					t.Fatalf("return: %v", err)
				}
			}
			if got := atkRemaining(t, n, req); got > 70 {
				t.Errorf("after the forger's returns: %d remaining, want 70 at most (30 spent)", got)
			}
		})
	}
}

// One grant carried twice: a hand-off state of a key of 100 a day counting
// 50 with a grant of 20 to holder h, then a replica copy of the same key
// counting 60 (its owner admitted 10 more meanwhile) naming the same grant
// again, its instants a millisecond later. h's return of 20, sent twice
// (once to each), frees 20 in all: 60 - 20 = 40 remaining 60; h sending
// it a third time changes nothing.
func TestAtkLeaseGrantCarriedTwice(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			var at atomic.Int64
			t0 := time.Unix(1_800_000_000, 0)
			at.Store(t0.UnixNano())
			n := atkLeaseNode(t, &at)
			req := limiter.Request{Name: "atktwice", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			d, err := n.store.CheckAt(req, t0)
			if err != nil {
				t.Fatal(err)
			}
			for i, tc := range []struct {
				counts int64
				reason transport.TransferReason
			}{{50, transport.Handoff}, {60, transport.Replica}} {
				skew := time.Duration(i) * time.Millisecond
				g := limiter.LeaseGrant{Holder: "h", Hits: 20, Request: req, Entered: t0.Add(skew).UnixNano(), Expires: t0.Add(time.Second + skew).UnixNano()}
				if a == limiter.FixedWindow {
					g.Window = d.ResetAt.Add(skew).UnixNano()
				}
				sn := atkForgeState(t, req, tc.counts, t0, g)
				if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "a", tc.reason, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
					t.Fatalf("take %d: %d rejected, %v", tc.counts, rejected, err)
				}
			}
			at.Store(t0.Add(2 * time.Second).UnixNano())
			for i := range 3 {
				if err := n.ReturnLease(context.Background(), "h", req, 20); err != nil {
					t.Fatalf("return %d: %v", i, err)
				}
				if got := atkRemaining(t, n, req); got > 60 {
					t.Errorf("after return %d of 20: %d remaining, want 60 at most (60 counted, 20 of them h's)", i+1, got)
				}
			}
		})
	}
}

// A forged hand-off state of a key of 100 a day that counts 30 (spent
// here), with grants at limits far from the key's (1 a day, 100 a
// nanosecond's period of a day's bound, the key's limit a thousand
// times): the node reads the key's count at the first grant's limit
// around the merge, and that must not rewrite the key's state. The key
// stays at 70 remaining or fewer at its own limit, and the forger's
// returns at each limit free nothing more.
func TestAtkLeaseForgedGrantLimitsAroundTheMerge(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		for _, lim := range []struct {
			limit  int64
			period time.Duration
		}{{1, 24 * time.Hour}, {1, time.Millisecond}, {100_000, 24 * time.Hour}, {100, time.Second}} {
			t.Run(a.String(), func(t *testing.T) {
				var at atomic.Int64
				t0 := time.Unix(1_800_000_000, 0)
				at.Store(t0.UnixNano())
				n := atkLeaseNode(t, &at)
				req := limiter.Request{Name: "atklimits", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
				atkSpend(t, n, req, 30)
				other := req
				other.Limit, other.Period = lim.limit, lim.period
				g := limiter.LeaseGrant{Holder: "evil", Hits: 1, Request: other, Entered: t0.UnixNano(), Expires: t0.Add(time.Second).UnixNano()}
				if a == limiter.FixedWindow {
					d, _ := n.store.CheckAt(other, t0)
					g.Window = d.ResetAt.UnixNano()
				}
				sn := atkForgeState(t, req, 30, t0, g)
				if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "evil", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
					t.Fatalf("take: %d rejected, %v", rejected, err)
				}
				if got := atkRemaining(t, n, req); got > 70 {
					t.Errorf("grant at %d per %v: after the merge %d remaining, want 70 at most", lim.limit, lim.period, got)
				}
				for _, r := range []limiter.Request{req, other} {
					if err := n.ReturnLease(context.Background(), "evil", r, 1); err != nil {
						t.Fatalf("return: %v", err)
					}
				}
				if got := atkRemaining(t, n, req); got > 70 {
					t.Errorf("grant at %d per %v: after the returns %d remaining, want 70 at most", lim.limit, lim.period, got)
				}
			})
		}
	}
}

// A forged peer sends 100 hand-off states of one key of 100000 a day,
// each counting 16 hits more than the last, with 16 grants of one hit to
// holders no member is named: the node keeps at most 64 (maxCarriedPerKey) of
// other nodes' grants of the key, rather than 1600 it walks at every
// change of the key's grants. Fewer kept frees fewer, never more: the key
// still counts every hit the states added.
func TestAtkLeaseForgedGrantsPerKeyBounded(t *testing.T) {
	var at atomic.Int64
	t0 := time.Unix(1_800_000_000, 0)
	at.Store(t0.UnixNano())
	n := atkLeaseNode(t, &at)
	req := limiter.Request{Name: "atkmany", Key: "k", Limit: 100_000, Period: 24 * time.Hour, Algorithm: limiter.TokenBucket}
	for i := range 100 {
		var gs []limiter.LeaseGrant
		for j := range limiter.MaxLeaseGrants {
			gs = append(gs, limiter.LeaseGrant{Holder: fmt.Sprintf("ghost-%d-%d", i, j), Hits: 1, Request: req, Entered: t0.UnixNano(), Expires: t0.Add(time.Second).UnixNano()})
		}
		sn := atkForgeState(t, req, int64(16*(i+1)), t0, gs...)
		if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "evil", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
			t.Fatalf("take %d: %d rejected, %v", i, rejected, err)
		}
	}
	hash := ring.RouteHash(req.Name, req.Key)
	mu := n.handover.lock(hash)
	mu.Lock()
	kept := len(n.grants.grantsLocked(hash))
	mu.Unlock()
	if kept > 4*limiter.MaxLeaseGrants {
		t.Errorf("%d carried grants kept for one key, want %d at most", kept, 4*limiter.MaxLeaseGrants)
	}
	if got := atkRemaining(t, n, req); got != 100_000-1600 {
		t.Errorf("%d remaining, want %d", got, 100_000-1600)
	}
}
