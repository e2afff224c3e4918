package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
)

// A check a node decides as the key's owner, against the same check on its
// store alone: what routing and the hand-over cost on the owner's path.
// Parallel callers on one key, as on a hot key's owner.
func BenchmarkOwnerDecision(b *testing.B) {
	nd, err := cluster.New(cluster.TestConfig("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer nd.Close()
	req := limiter.Request{Name: "bench", Key: "hot", Hits: 1, Limit: 1_000_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
	b.Run("node", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := nd.Check(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("store", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := nd.Store().CheckAt(req, time.Now()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
