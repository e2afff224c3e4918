package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// lowerByRate: callers try to give hits back to spent keys of all six
// algorithms (3 an hour) by charging them at a laxer rate, on a daemon
// started with --destructive-behaviors deny: checks of one hit with a
// limit 1,000,000 times higher, a period of 1 ms, both, another algorithm
// at 3,000 per 1 ms, and the key's own algorithm again after it (a round
// trip A->B->A), each followed by a check at the key's own rate. The
// daemon keeps the strictest rate a live key was charged under, so none
// of these checks may be admitted, and every canary stays spent.
func lowerByRate(ctx context.Context, c *config) (*row, error) {
	args := []string{"--destructive-behaviors", "deny"}
	return onDaemon(ctx, c, "lower-by-rate", args, overGRPC, func(t *target, r *row) error {
		canary := func(a limiter.Algorithm) limiter.Request {
			return limiter.Request{Name: "rate-canary-" + a.String(), Key: "k", Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
		}
		for _, a := range limiter.Algorithms {
			if ok, err := t.admits(ctx, canary(a)); err != nil || !ok {
				return fmt.Errorf("spending the %v canary: %v, %v", a, ok, err)
			}
		}
		var outcomes tally
		n := len(limiter.Algorithms)
		check := func(kind string, req limiter.Request) {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			res, err := t.client.Check(cctx, &pb.CheckRequest{Request: transport.RequestToProto(req)})
			switch {
			case err != nil:
				outcomes.addErr(kind+": gRPC "+codeOf(err), err)
			case res.GetResponse().GetAllowed():
				outcomes.add(kind+": admitted", 1)
			default:
				outcomes.add(kind+": denied", 1)
			}
		}
		calls := c.rounds(ctx, c.count(400_000), c.hostile(), func(i, k int) {
			a := limiter.Algorithms[(i+k)%n]
			b := limiter.Algorithms[(i+k+1+k/n%(n-1))%n] // another algorithm
			req := canary(a)
			req.Hits = 1
			lax := req
			switch k % 5 {
			case 0:
				lax.Limit = 3_000_000
			case 1:
				lax.Period = time.Millisecond
			case 2:
				lax.Limit, lax.Period = 3_000, time.Millisecond
			case 3:
				lax.Algorithm, lax.Limit, lax.Period = b, 3_000, time.Millisecond
			default: // the round trip's way back, at a laxer rate
				lax.Limit = 3_000_000
				check("lax rate", lax)
				lax.Algorithm, lax.Limit, lax.Period = b, 3_000, time.Millisecond
			}
			check("lax rate", lax)
			check("own rate", req)
		})
		stillSpent := 0
		for _, a := range limiter.Algorithms {
			req := canary(a)
			req.Hits = 1
			ok, err := t.admits(ctx, req)
			if err != nil {
				return fmt.Errorf("checking the %v canary: %w", a, err)
			}
			if !ok {
				stillSpent++
			}
		}
		r.did = fmt.Sprintf("%d callers charge spent keys of all six algorithms (3 an hour) at laxer rates on --destructive-behaviors deny: a limit 1,000,000 times higher, a 1 ms period, another algorithm at 3,000 per 1 ms and back, each followed by a check at the key's own rate", c.attackers)
		r.result = fmt.Sprintf("%s rounds: %s; canaries still spent: %d of %d", thousands(calls), outcomes.String(), stillSpent, n)
		if m := outcomes.get("lax rate: admitted") + outcomes.get("own rate: admitted"); m > 0 {
			r.miss("%d checks admitted on spent keys", m)
		}
		if m := outcomes.others("lax rate: denied", "own rate: denied", "lax rate: admitted", "own rate: admitted"); m > 0 {
			r.miss("%d calls answered otherwise than expected", m)
		}
		if stillSpent != n {
			r.miss("%d canaries got hits back", n-stillSpent)
		}
		return nil
	})
}
