package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// On Redis, as in limiter's store, a refund that carries its charge's
// window gives the hits back to that window only: after a reload shortens
// the Period of a key that keeps its strictest rate, or changes its
// algorithm, the refund finds the key begun anew and gives nothing back;
// a sliding window counter's hits go back to its previous window while it
// counts them.
func TestRefundToItsChargedWindow(t *testing.T) {
	srv := testredis.Start(t)
	span := time.Unix(1_700_000_000-1_700_000_000%70, 0) // 7s and 10s windows start here
	fixed10 := limiter.Request{Name: "r", Hits: 1, Limit: 10, Period: 10 * time.Second, Algorithm: limiter.FixedWindow}
	fixed7, bucket, counter := fixed10, fixed10, fixed10
	fixed7.Period = 7 * time.Second
	bucket.Algorithm = limiter.TokenBucket
	counter.Algorithm = limiter.SlidingWindowCounter
	type step struct {
		at     time.Duration // into span
		req    limiter.Request
		refund bool // a refund carrying the window of the second step
		// wantRemaining is the decision's; wantBack says the refund gave
		// its hits back (its decision names the window).
		wantRemaining int64
		wantBack      bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		// [7s, 14s) ends after [0s, 10s): the count moves to it, at the
		// least either rate allows over 7s (7), and stays counted, and
		// refundable, until 14s.
		{"a shorter period ending later", []step{
			{at: time.Second, req: fixed10, wantRemaining: 9},
			{at: 9500 * time.Millisecond, req: fixed7, wantRemaining: 5}, // into [7s, 14s)
			{at: 10500 * time.Millisecond, req: fixed7, wantRemaining: 4},
			{at: 10500 * time.Millisecond, req: fixed7, refund: true, wantRemaining: 5, wantBack: true},
			{at: 14 * time.Second, req: fixed7, wantRemaining: 9},
			{at: 14 * time.Second, req: fixed7, refund: true, wantRemaining: 9},
		}},
		{"another algorithm", []step{
			{at: time.Second, req: fixed10, wantRemaining: 9},
			{at: 9500 * time.Millisecond, req: bucket, wantRemaining: 8}, // decided as the kept fixed window
			{at: 10500 * time.Millisecond, req: bucket, wantRemaining: 9},
			{at: 10500 * time.Millisecond, req: bucket, refund: true, wantRemaining: 9},
		}},
		{"the same window", []step{
			{at: time.Second, req: fixed10, wantRemaining: 9},
			{at: 9500 * time.Millisecond, req: fixed7, wantRemaining: 5},
			{at: 9900 * time.Millisecond, req: fixed7, refund: true, wantRemaining: 6, wantBack: true},
		}},
		{"a counter's previous window", []step{
			{at: time.Second, req: counter, wantRemaining: 9},
			{at: 5 * time.Second, req: counter, wantRemaining: 8},
			{at: 10 * time.Second, req: counter, wantRemaining: 7}, // 1 + the previous 2
			{at: 10 * time.Second, req: counter, refund: true, wantRemaining: 8, wantBack: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &testClock{now: span}
			l := newTestLimiter(t, clock, srv.Addr())
			l.cfg.KeepStrictest = true
			var charged limiter.Window
			for i, st := range tc.steps {
				clock.now = span.Add(st.at)
				req := st.req
				req.Key = tc.name
				if st.refund {
					req.Behavior, req.Charged = limiter.Refund, charged
				}
				d, err := l.Check(context.Background(), req)
				if err != nil || d.WithoutOwner {
					t.Fatalf("step %d: %+v, %v", i, d, err)
				}
				if i == 1 {
					charged = d.Window
					if charged.IsZero() {
						t.Fatalf("step 1: the charge names no window: %+v", d)
					}
				}
				if d.Remaining != st.wantRemaining || st.refund && (d.Window == charged) != st.wantBack {
					t.Fatalf("step %d: %+v, want remaining %d and the hits given back %v to %+v", i, d.Decision, st.wantRemaining, st.wantBack, charged)
				}
			}
		})
	}
}

// On Redis, as in limiter's store, a refund carrying the instant a token
// bucket, leaky bucket, GCRA or sliding window log charged its hits at
// gives back only what of them is still counted: nothing of a charge that
// has drained (or left the log's window) before another request charged
// the key, and part of one that has partly drained.
func TestRefundToItsChargedInstant(t *testing.T) {
	srv := testredis.Start(t)
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at            time.Duration
		hits          int64
		refund        bool // a refund carrying the instant of the first step
		wantRemaining int64
		wantBack      bool
	}
	drained := []step{
		{hits: 1, wantRemaining: 9},
		{at: 2 * time.Second, hits: 1, wantRemaining: 9},
		{at: 2 * time.Second, hits: 1, refund: true, wantRemaining: 9},
	}
	partly := []step{
		{hits: 4, wantRemaining: 6},
		{at: 2 * time.Second, hits: 4, wantRemaining: 4},
		{at: 2 * time.Second, hits: 4, refund: true, wantRemaining: 6, wantBack: true},
	}
	for _, tc := range []struct {
		algo  limiter.Algorithm
		name  string
		steps []step
	}{
		{limiter.TokenBucket, "drained", drained},
		{limiter.TokenBucket, "partly drained", partly},
		{limiter.LeakyBucket, "drained", drained},
		{limiter.LeakyBucket, "partly drained", partly},
		{limiter.GCRA, "drained", drained},
		{limiter.GCRA, "partly drained", partly},
		{limiter.SlidingWindowLog, "left the window", []step{
			{hits: 1, wantRemaining: 9},
			{at: 11 * time.Second, hits: 1, wantRemaining: 9},
			{at: 11 * time.Second, hits: 1, refund: true, wantRemaining: 9},
		}},
		{limiter.SlidingWindowLog, "in the window", []step{
			{hits: 1, wantRemaining: 9},
			{at: 2 * time.Second, hits: 1, wantRemaining: 8},
			{at: 2 * time.Second, hits: 1, refund: true, wantRemaining: 9, wantBack: true},
			{at: 10500 * time.Millisecond, wantRemaining: 9}, // the other's hit still counts
		}},
	} {
		t.Run(tc.algo.String()+", "+tc.name, func(t *testing.T) {
			clock := &testClock{now: t0}
			l := newTestLimiter(t, clock, srv.Addr())
			var charged limiter.Window
			for i, st := range tc.steps {
				clock.now = t0.Add(st.at)
				req := limiter.Request{Name: "r", Key: tc.algo.String() + tc.name, Hits: st.hits, Limit: 10, Period: 10 * time.Second, Algorithm: tc.algo}
				if st.refund {
					req.Behavior, req.Charged = limiter.Refund, charged
				}
				d, err := l.Check(context.Background(), req)
				if err != nil || d.WithoutOwner {
					t.Fatalf("step %d: %+v, %v", i, d, err)
				}
				if i == 0 {
					charged = d.Window
					if charged != (limiter.Window{Start: t0.UnixNano(), End: t0.UnixNano()}) {
						t.Fatalf("step 0: the charge names no instant: %+v", d)
					}
				}
				if d.Remaining != st.wantRemaining || st.refund && (d.Window == charged) != st.wantBack {
					t.Fatalf("step %d: %+v, want remaining %d and the hits given back %v to %+v", i, d.Decision, st.wantRemaining, st.wantBack, charged)
				}
			}
		})
	}
}
