package cluster

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkDecideLocksUnderCopyBarrier measures a decision's hold of its
// key's decide lock (the shared hold every decision as owner or stand-in
// takes) while the copy loop takes the barrier over all of them, as it
// does once per ReplicateInterval while the node holds stand-in parts:
// none, one barrier per 1000 decisions, and barriers back to back (the
// worst a copy loop that never sleeps could do). ns/op is per decision;
// barriers/op how many barriers ran beside them.
func BenchmarkDecideLocksUnderCopyBarrier(b *testing.B) {
	for _, tc := range []struct {
		name  string
		every int64 // a barrier per every decisions; 0: none, -1: back to back
	}{
		{"none", 0},
		{"every1000", 1000},
		{"backToBack", -1},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := &handover{}
			var decided, barriers atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if tc.every != 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					next := tc.every
					for {
						select {
						case <-stop:
							return
						default:
						}
						if tc.every > 0 && decided.Load() < next {
							runtime.Gosched()
							continue
						}
						next += tc.every
						h.barrier()
						barriers.Add(1)
					}
				}()
			}
			var seq atomic.Uint64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				hash := seq.Add(1) * 0x9e3779b97f4a7c15
				for pb.Next() {
					hash = hash*6364136223846793005 + 1442695040888963407
					l := h.lock(hash >> 7)
					l.RLock()
					decided.Add(1)
					l.RUnlock()
				}
			})
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(barriers.Load())/float64(b.N), "barriers/op")
		})
	}
}
