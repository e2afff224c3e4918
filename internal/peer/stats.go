package peer

import (
	"math/bits"
	"sync/atomic"
)

// NumBatchBuckets is the number of buckets of Stats.BatchSizes.
const NumBatchBuckets = 11

// Stats counts a Client's traffic since it was made. A call is a batch
// sent on the client's stream.
type Stats struct {
	Calls         uint64 // batches sent
	FailedCalls   uint64 // batches that failed as a whole, failing all their items
	Items         uint64 // checks sent in batches
	CanceledItems uint64 // checks dropped before sending: their caller stopped waiting
	ExpiredItems  uint64 // checks failed before sending: they waited Config.Timeout
	MaxBatchSize  int    // largest batch sent
	// BatchSizes[i] counts batches that had between 2^(i-1)+1 and 2^i
	// checks: [0] counts batches of 1, [1] of 2, [2] of 3-4, ..., [10] of
	// 513-1024.
	BatchSizes [NumBatchBuckets]uint64
	Pending    int // checks waiting for a batch now, with those whose caller gave up until dropped
	InFlight   int // batches in flight now
}

// counters are the atomics behind Stats.
type counters struct {
	calls, failed, items, canceled, expired atomic.Uint64
	maxBatch                                atomic.Int64
	buckets                                 [NumBatchBuckets]atomic.Uint64
}

// recordCall counts a batch of n items, n >= 1.
func (c *counters) recordCall(n int) {
	c.calls.Add(1)
	c.items.Add(uint64(n))
	c.buckets[min(bits.Len(uint(n-1)), NumBatchBuckets-1)].Add(1)
	for {
		m := c.maxBatch.Load()
		if int64(n) <= m || c.maxBatch.CompareAndSwap(m, int64(n)) {
			return
		}
	}
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Calls:         c.calls.Load(),
		FailedCalls:   c.failed.Load(),
		Items:         c.items.Load(),
		CanceledItems: c.canceled.Load(),
		ExpiredItems:  c.expired.Load(),
		MaxBatchSize:  int(c.maxBatch.Load()),
	}
	for i := range s.BatchSizes {
		s.BatchSizes[i] = c.buckets[i].Load()
	}
	return s
}
