package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// slidingLog: one sliding_window_log key of a billion hits an hour, hit by
// single checks, each at an instant of its own, for half the hostile
// phase; then by batches of 1000 checks of it for the other half, whose
// cost is the daemon's CPU time (from /proc/<pid>/stat) per batch.
func slidingLog(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "sliding-log", nil, overGRPC, func(t *target, r *row) error {
		client := t.client
		key := &pb.RateLimitRequest{Name: "log", Key: "one", Limit: 1_000_000_000, PeriodNanos: int64(time.Hour),
			Algorithm: pb.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG, Hits: proto.Int64(1)}
		var singles, batches tally
		half := c.duration / 2
		c.rounds(ctx, c.count(200_000), time.Now().Add(half), func(i, k int) {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			res, err := client.Check(cctx, &pb.CheckRequest{Request: key})
			if err != nil {
				singles.add(codeOf(err), 1)
				return
			}
			singles.add(itemOutcome(res.GetResponse()), 1)
		})

		batch := &pb.BatchCheckRequest{Requests: make([]*pb.RateLimitRequest, floodBatch)}
		for i := range batch.Requests {
			batch.Requests[i] = key
		}
		var answered atomic.Int64
		var worst atomic.Int64
		cpuBefore, err := readCPU(t.d.pid())
		if err != nil {
			return err
		}
		c.rounds(ctx, c.count(20_000), time.Now().Add(half), func(i, k int) {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			began := time.Now()
			res, err := client.CheckBatch(cctx, batch)
			atomicMax(&worst, int64(time.Since(began)))
			if err != nil {
				batches.add(codeOf(err), 1)
				return
			}
			answered.Add(1)
			for _, it := range res.GetResponses() {
				batches.add(itemOutcome(it), 1)
			}
		})
		cpuAfter, err := readCPU(t.d.pid())
		if err != nil {
			return err
		}
		r.did = fmt.Sprintf("%d attackers hit one sliding_window_log key (1e9 per hour) with single checks for %v, then with batches of %d checks of it for %v",
			c.attackers, half, floodBatch, half)
		r.result = fmt.Sprintf("singles: %s; %s batches answered (items: %s), worst %s, daemon CPU per batch %s (gRPC included)",
			singles.String(), thousands(answered.Load()), batches.String(), ms(time.Duration(worst.Load())),
			ms((cpuAfter-cpuBefore)/time.Duration(max(answered.Load(), 1))))
		return nil
	})
}
