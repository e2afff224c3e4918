package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Sizes of the key flood.
const (
	floodKeyLen = 1000 // bytes, under limiter.MaxKeyLen
	floodBatch  = 1000 // items per CheckBatch, transport.MaxBatchItems
	// floodPhases bounds the flood's time in hostile phases: sending 1.5
	// GB takes longer than the other attacks.
	floodPhases = 12
)

// keyFlood: distinct keys of 1000 bytes, each checked once, in batches of
// 1000 over the public gRPC API, to a daemon of default store settings.
func keyFlood(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "key-flood", nil, overGRPC, func(t *target, r *row) error {
		client := t.client
		keys := c.count(1_500_000)
		batches := (keys + floodBatch - 1) / floodBatch
		var next, sent atomic.Int64 // batches taken, keys answered
		var calls, items tally
		pad := strings.Repeat("k", floodKeyLen)
		began := time.Now()
		end := began.Add(floodPhases * c.duration)
		swarm(c.attackers, func(i int) {
			for time.Now().Before(end) && ctx.Err() == nil {
				b := int(next.Add(1) - 1)
				if b >= batches {
					return
				}
				n := min(floodBatch, keys-b*floodBatch)
				reqs := make([]*pb.RateLimitRequest, n)
				for j := range reqs {
					id := fmt.Sprintf("%d:", b*floodBatch+j)
					reqs[j] = &pb.RateLimitRequest{Name: "flood", Key: id + pad[len(id):], Limit: 10, PeriodNanos: int64(time.Hour),
						Algorithm: pb.Algorithm_ALGORITHM_TOKEN_BUCKET}
				}
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				res, err := client.CheckBatch(cctx, &pb.BatchCheckRequest{Requests: reqs})
				cancel()
				calls.add(codeOf(err), 1)
				if err != nil {
					continue
				}
				sent.Add(int64(n))
				for _, it := range res.GetResponses() {
					items.add(itemOutcome(it), 1)
				}
			}
		})
		took := time.Since(began)
		r.did = fmt.Sprintf("%d attackers check %s distinct keys of %d bytes once each, in CheckBatch calls of %d, at the default store settings",
			c.attackers, thousands(int64(keys)), floodKeyLen, floodBatch)
		r.result = fmt.Sprintf("%s keys answered in %.1f s; calls: %s; items: %s", thousands(sent.Load()), took.Seconds(), calls.String(), items.String())
		if int(next.Load()) < batches {
			r.result += fmt.Sprintf(" (stopped after %v, before every key was sent)", floodPhases*c.duration)
		}
		return nil
	})
}

// itemOutcome names the outcome of one item of a batch.
func itemOutcome(it *pb.RateLimitResponse) string {
	switch {
	case it.GetErrorCode() != pb.ErrorCode_ERROR_CODE_NONE:
		return strings.ToLower(strings.TrimPrefix(it.GetErrorCode().String(), "ERROR_CODE_"))
	case it.GetAllowed():
		return "allowed"
	}
	return "denied"
}
