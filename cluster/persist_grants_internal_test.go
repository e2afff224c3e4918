package cluster

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// persistNode returns a ready node alone on dir whose clock is *at (Unix
// ns), closed at the test's end.
func persistNode(t *testing.T, dir string, at *atomic.Int64) *Node {
	t.Helper()
	cfg := TestConfig("self")
	cfg.DataDir = dir
	cfg.PersistInterval = 10 * time.Millisecond
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

// advanceBefore moves the clock at by step while it is before limit: a
// loop that waits for the persister's write moves the node's time past
// PersistInterval, and no further however long a loaded machine makes it
// wait. Unbounded, a loaded run's loop took it past the 10 s lease of
// TestLeaseHeldHitsRestoredFromDataDir before the write: the node wrote
// the lease ended, and h's return freed nothing (600 remaining, as steps
// of 500 ms reproduce).
func advanceBefore(at *atomic.Int64, limit time.Time, step time.Duration) {
	if at.Load() < limit.UnixNano() {
		at.Add(int64(step))
	}
}

// A node takes a hand-off state of a key of 100 a day counting 50, with a
// grant of 20 to holder h, and is restarted from its DataDir (closed:
// its last snapshot; or killed: its last segment, read from the
// directory while it runs). The state files hold the grant with the
// state, and the restarted node takes h's return: 70 remaining, as
// before the restart, where it freed nothing (50) when the grant was
// not written. A second return frees nothing more.
func TestLeaseGrantsRestoredFromDataDir(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			dir := t.TempDir()
			var at atomic.Int64
			t0 := time.Unix(1_800_000_000, 0)
			at.Store(t0.UnixNano())
			n := persistNode(t, dir, &at)
			req := limiter.Request{Name: "restored", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			scratch, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
			if err != nil {
				t.Fatal(err)
			}
			one := req
			one.Hits = 1
			d, err := scratch.CheckAt(one, t0) // a window's end
			if err != nil {
				t.Fatal(err)
			}
			g := limiter.LeaseGrant{Holder: "h", Hits: 20, Request: req, Entered: t0.UnixNano(), Expires: t0.Add(time.Second).UnixNano()}
			if a == limiter.FixedWindow {
				g.Window = d.ResetAt.UnixNano()
			}
			sn := atkForgeState(t, req, 50, t0, g)
			if _, rejected, err := (stateSink{n}).TakeStates(context.Background(), "a", transport.Handoff, []limiter.Snapshot{sn}); err != nil || rejected > 0 {
				t.Fatalf("take: %d rejected, %v", rejected, err)
			}
			// Looked up by key, with the table walked for more keys than
			// have grants, and for every key.
			own := stateKey{req.Name, req.Key}
			for _, keys := range []map[stateKey]limiter.Snapshot{
				{own: sn},
				{own: sn, {"other", "a"}: {}, {"other", "b"}: {}},
				nil,
			} {
				gs := n.persistedGrants(keys, t0)
				if len(gs) != 1 || len(gs[own]) != 1 || gs[own][0].Holder != "h" || gs[own][0].Hits != 20 {
					t.Fatalf("grants of %d keys: %+v, want h's 20 of the key", len(keys), gs)
				}
			}
			// The segment of the changed key holds it with its grant.
			var written []limiter.LeaseGrant
			for deadline := time.Now().Add(20 * time.Second); written == nil; {
				if time.Now().After(deadline) {
					t.Fatal("no segment holds the key's grant after 20s")
				}
				advanceBefore(&at, t0.Add(500*time.Millisecond), 20*time.Millisecond) // past PersistInterval
				states, err := ReadDataDir(dir)
				if err != nil {
					continue // a file renamed as it was listed
				}
				for _, s := range states {
					if s.Name == req.Name && s.Key == req.Key {
						written = s.Grants
					}
				}

				runtime.Gosched()
			}
			if len(written) != 1 || written[0].Holder != "h" || written[0].Hits != 20 {
				t.Fatalf("the segment holds grants %+v, want h's 20", written)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			at.Store(t0.Add(2 * time.Second).UnixNano())
			n = persistNode(t, dir, &at)
			if got := atkRemaining(t, n, req); got != 50 {
				t.Fatalf("restored: %d remaining, want 50", got)
			}
			for i := range 2 {
				if err := n.ReturnLease(context.Background(), "h", req, 20); err != nil {
					t.Fatalf("return %d: %v", i, err)
				}
				if got := atkRemaining(t, n, req); got != 70 {
					t.Errorf("after return %d of h's 20: %d remaining, want 70", i+1, got)
				}
			}
		})
	}
}

// A node alone grants holder h a token bucket or GCRA lease of 400 of a
// key of 1000 a day, held apart from the bucket, and is restarted from
// its DataDir while the lease lasts (closed, or killed once a segment
// holds the key). The restored key counts the 400 (h may have used them),
// where it counted none before they were written (1000 remaining: h's
// hits admitted twice); h's return of them frees them.
func TestLeaseHeldHitsRestoredFromDataDir(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			dir := t.TempDir()
			var at atomic.Int64
			t0 := time.Unix(1_800_000_000, 0)
			at.Store(t0.UnixNano())
			n := persistNode(t, dir, &at)
			req := limiter.Request{Name: "held", Key: "k", Limit: 1000, Period: 24 * time.Hour, Algorithm: a}
			l, err := n.Lease(context.Background(), "h", req, 400, 10*time.Second)
			if err != nil || l.Granted != 400 {
				t.Fatalf("lease: %+v, %v", l, err)
			}
			// A segment holds the key, its held hits charged, with h's
			// grant.
			for deadline := time.Now().Add(20 * time.Second); ; {
				if time.Now().After(deadline) {
					t.Fatal("no segment holds the key after 20s")
				}
				advanceBefore(&at, t0.Add(500*time.Millisecond), 20*time.Millisecond) // past PersistInterval
				states, _ := ReadDataDir(dir)
				var grants []limiter.LeaseGrant
				for _, s := range states {
					if s.Name == req.Name && s.Key == req.Key {
						grants = s.Grants
					}
				}
				if len(grants) == 1 && grants[0].Holder == "h" && grants[0].Hits == 400 {
					break
				}
				runtime.Gosched()
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			at.Store(t0.Add(2 * time.Second).UnixNano())
			n = persistNode(t, dir, &at)
			if got := atkRemaining(t, n, req); got > 600 {
				t.Fatalf("restored while h holds 400: %d remaining, want 600 at most", got)
			}
			if err := n.ReturnLease(context.Background(), "h", req, 400); err != nil {
				t.Fatal(err)
			}
			if got := atkRemaining(t, n, req); got < 999 || got > 1000 {
				t.Errorf("after h's return of 400: %d remaining, want 999 to 1000", got)
			}
		})
	}
}
