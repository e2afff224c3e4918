package cluster

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

func benchRequests(n int) []limiter.Request {
	reqs := make([]limiter.Request, n)
	for i := range reqs {
		reqs[i] = limiter.Request{Name: "bench", Key: "client:" + strconv.Itoa(i), Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
	}
	return reqs
}

// What hot-key detection adds to a forwarded check of a cold key: 10,000
// keys, none over the threshold.
func BenchmarkLeaseDetectCold(b *testing.B) {
	t := newLeaseTable(LeaseConfig{Threshold: 1 << 40, TTL: 100 * time.Millisecond, Share: 0.1}, 0)
	reqs := benchRequests(10_000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := t.decide(&reqs[i%len(reqs)], "owner", time.Now().UnixNano()); ok {
				b.Fatal("a cold key was decided from a lease")
			}
			i++
		}
	})
}

// A check decided from a lease: one hot key whose lease never runs out.
func BenchmarkLeaseDecideHot(b *testing.B) {
	t := newLeaseTable(LeaseConfig{Threshold: 1, TTL: time.Minute, Share: 1}, 0)
	req := benchRequests(1)[0]
	now := time.Now().UnixNano()
	t.decide(&req, "owner", now) // hot; asks for a lease
	f := <-t.fetches
	t.install(&f, leaseOf(1<<40, now+int64(time.Hour)), nil, now, now)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := t.decide(&req, "owner", time.Now().UnixNano()); !ok {
				b.Fatal("not decided from the lease")
			}
		}
	})
}

func leaseOf(hits, expires int64) transport.Lease {
	return transport.Lease{Granted: hits, ExpiresAt: time.Unix(0, expires), Decision: limiter.Decision{Allowed: true, Limit: 1, ResetAt: time.Unix(0, expires)}}
}
