package sluice

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Local is a Limiter over one process's limiter.Store: every key is
// decided here, so no Policy ever applies. It suits a single instance, and
// tests; its decisions are those of the Store, with Owner "".
type Local struct {
	store *limiter.Store
	now   func() time.Time
}

var _ Limiter = (*Local)(nil)

// NewLocal returns a Limiter deciding on store at now(); a nil now is
// time.Now.
func NewLocal(store *limiter.Store, now func() time.Time) *Local {
	if now == nil {
		now = time.Now
	}
	return &Local{store: store, now: now}
}

// Check decides req on the store. It returns ErrNilContext for a nil ctx,
// ctx's error when ctx has ended, and the store's error for an invalid req.
func (l *Local) Check(ctx context.Context, req limiter.Request, _ ...CheckOption) (Decision, error) {
	if ctx == nil {
		return Decision{}, ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	d, err := l.store.CheckAt(req, l.now())
	return Decision{Decision: d}, err
}

// CheckMany decides every request, in order, at one instant.
func (l *Local) CheckMany(ctx context.Context, reqs []limiter.Request, _ ...CheckOption) []Result {
	out := make([]Result, len(reqs))
	var err error
	switch {
	case ctx == nil:
		err = ErrNilContext
	default:
		err = ctx.Err()
	}
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	now := l.now()
	for i := range reqs {
		out[i].Decision.Decision, out[i].Err = l.store.CheckAt(reqs[i], now)
	}
	return out
}
