package cluster

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// ownedBatch returns a one-node cluster's node and a batch of requests of
// every algorithm but the sliding log (whose log grows), on keys that
// stay live (a day's limit) so that each check updates an entry in
// place, each checked once so that the node holds them.
func ownedBatch(tb testing.TB) (*Node, []limiter.Request) {
	tb.Helper()
	n, err := New(TestConfig("allocs"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.Close() })
	var reqs []limiter.Request
	for _, a := range limiter.Algorithms {
		if a == limiter.SlidingWindowLog {
			continue
		}
		reqs = append(reqs, limiter.Request{Name: "allocs", Key: "k-" + a.String(), Hits: 1,
			Limit: 1_000_000_000, Period: 24 * time.Hour, Algorithm: a})
	}
	for i := range reqs {
		if d, err := n.Check(context.Background(), reqs[i]); err != nil || !d.Allowed || d.Owner != n.cfg.NodeName {
			tb.Fatalf("%s: %+v, %v; want admitted by the node", reqs[i].Key, d, err)
		}
	}
	return n, reqs
}

// leastAllocs is testing.AllocsPerRun's least of three: it counts the
// whole process's allocations, and goroutines of earlier tests (and the
// node's own: gossip, replication) may allocate meanwhile.
func leastAllocs(runs int, f func()) float64 {
	least := math.Inf(1)
	for range 3 {
		least = min(least, testing.AllocsPerRun(runs, f))
	}
	return least
}

// A check the node decides as the key's owner allocates nothing, whether
// a caller of Check asks, or a peer forwards a batch to it (the peer
// service's CheckInto, as transport's CheckStream calls it with its
// buffers): routing, the hand-over's and the lease table's checks, the
// clock and the store's decision all stay off the heap.
func TestOwnerCheckAllocatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations")
	}
	n, reqs := ownedBatch(t)
	ctx := context.Background()
	for i := range reqs {
		req := reqs[i]
		if allocs := leastAllocs(1000, func() {
			if _, err := n.Check(ctx, req); err != nil {
				t.Fatal(err)
			}
		}); allocs != 0 {
			t.Errorf("Check of %s: %v allocations, want none", req.Algorithm, allocs)
		}
	}
	out := make([]sluice.Result, len(reqs))
	if allocs := leastAllocs(1000, func() {
		ownerChecker{n}.CheckInto(ctx, reqs, out)
	}); allocs != 0 {
		t.Errorf("a forwarded batch of %d: %v allocations, want none", len(reqs), allocs)
	}
	for i := range out {
		if out[i].Err != nil || !out[i].Allowed {
			t.Fatalf("%s: %+v", reqs[i].Key, out[i])
		}
	}
}

// The owner's side of forwarded checks: a batch a peer sent, decided on
// the owner's store, per check.
func BenchmarkOwnerBatch(b *testing.B) {
	n, reqs := ownedBatch(b)
	out := make([]sluice.Result, len(reqs))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ownerChecker{n}.CheckInto(ctx, reqs, out)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(reqs)), "ns/check")
}
