package cluster

import (
	"testing"
	"time"

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
