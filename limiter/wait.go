package limiter

import (
	"context"
	"errors"
	"time"
)

// ErrNotAllowed is returned by Wait for a decision that did not admit.
var ErrNotAllowed = errors.New("limiter: request was not allowed")

// Wait blocks for d.Delay, the leaky bucket's pacing, or until ctx ends,
// whichever is first, and returns ctx's error in the second case. after
// returns a channel that receives once the duration has passed; nil uses a
// real timer. Tests pass a fake to control time.
func Wait(ctx context.Context, d Decision, after func(time.Duration) <-chan time.Time) error {
	if !d.Allowed {
		return ErrNotAllowed
	}
	if d.Delay <= 0 {
		return ctx.Err()
	}
	var ch <-chan time.Time
	if after != nil {
		ch = after(d.Delay)
	} else {
		t := time.NewTimer(d.Delay)
		defer t.Stop()
		ch = t.C
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
