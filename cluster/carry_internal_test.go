package cluster

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// A grant's held hits entering the bucket before the lease's expiry (a
// change of owner: grantTable.flush, a replica's copy) leave the bucket
// at the expiry and after holding no less than entering at the expiry
// would, and at most one hit more (the drain until the expiry is charged
// rounded down): a bucket of 100 and 10 a second, 50 hits leased at 0
// for 3 s, entered at 0.1 s. Entered at 0.1 s alone, they would have
// drained 29 by the expiry: 29 more admitted within Burst + rate*T.
func TestGrantEnteredEarlyKeepsBound(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			req := limiter.Request{Name: "n", Key: "k", Limit: 100, Period: 10 * time.Second, Algorithm: a}
			newStore := func() *limiter.Store {
				st, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, MaxEntries: 16, MaxBytes: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			early, atExpiry := newStore(), newStore()
			newGrant := func() grant {
				return grant{from: "h", req: req, hits: 50, granted: start.UnixNano(), expires: start.Add(3 * time.Second).UnixNano()}
			}
			ge, gx := newGrant(), newGrant()
			ge.enterEarly(early, start.Add(100*time.Millisecond), &req)
			gx.enter(atExpiry, start.Add(3*time.Second), &req)
			if ge.entered != ge.expires {
				t.Errorf("entered %v, want the expiry %v", time.Unix(0, ge.entered), time.Unix(0, ge.expires))
			}
			for _, after := range []time.Duration{3 * time.Second, 4 * time.Second, 7 * time.Second, 9 * time.Second} {
				at := start.Add(after)
				de, err := early.CheckAt(req, at)
				if err != nil {
					t.Fatal(err)
				}
				dx, err := atExpiry.CheckAt(req, at)
				if err != nil {
					t.Fatal(err)
				}
				if de.Remaining > dx.Remaining || de.Remaining < dx.Remaining-1 {
					t.Errorf("at %v: %d remaining, want %d (entered at the expiry) or one less", after, de.Remaining, dx.Remaining)
				}
			}
		})
	}
}

// Forged lease grants from a peer against an owner that counts 30 of a
// key of 100: a hand-off state counting 10 with a grant of 10 to the
// forger merges to 30, adds nothing, and the forger's return frees
// nothing; one counting 50 with a grant of 50 adds 20, and a return of 50
// frees those 20 only. The key never counts less than before the state
// came.
func TestForgedLeaseGrantsNeverLowerACount(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			n, err := New(TestConfig("self"))
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
			req := limiter.Request{Name: "forged", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			spend := func(hits int64) {
				t.Helper()
				r := req
				r.Hits = hits
				if d, err := n.Check(context.Background(), r); err != nil || !d.Allowed {
					t.Fatalf("%d hits: %+v, %v", hits, d, err)
				}
			}
			remaining := func() int64 {
				t.Helper()
				d, err := n.Check(context.Background(), req) // Hits 0: a peek
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			spend(30)
			for _, tc := range []struct {
				counts, want int64
			}{{10, 70}, {50, 70}} {
				st, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, MaxEntries: 16, MaxBytes: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				now := n.now()
				r := req
				r.Hits = tc.counts
				d, err := st.CheckAt(r, now)
				if err != nil || !d.Allowed {
					t.Fatalf("forging %d: %+v, %v", tc.counts, d, err)
				}
				sn, _ := st.Snapshot(req.Name, req.Key, now)
				g := limiter.LeaseGrant{Holder: "evil", Hits: tc.counts, Request: req, Entered: now.UnixNano(), Expires: now.Add(time.Second).UnixNano()}
				if a == limiter.FixedWindow {
					g.Window = d.ResetAt.UnixNano()
				}
				sn.Grants = []limiter.LeaseGrant{g}
				if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "evil", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
					t.Fatalf("take: %d rejected, %v", rejected, err)
				}
				if err := n.ReturnLease(context.Background(), "evil", req, tc.counts); err != nil {
					t.Fatalf("return: %v", err)
				}
				if got := remaining(); got != tc.want {
					t.Errorf("a state of %d with a grant of as many, returned: %d remaining, want %d", tc.counts, got, tc.want)
				}
			}
		})
	}
}
