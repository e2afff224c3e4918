package daemon

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// serverLimits is the node as the daemon's server-side limits (the rules'
// enforcer, Envoy's rate limit service) count through it: every request's
// Name gets serverNamePrefix, which permit refuses to checks that carry
// their own limits, so that no such check reaches these counters.
type serverLimits struct{ node sluice.Limiter }

var _ sluice.Limiter = serverLimits{}

func (l serverLimits) Check(ctx context.Context, req limiter.Request, opts ...sluice.CheckOption) (sluice.Decision, error) {
	req.Name = serverNamePrefix + req.Name
	return l.node.Check(ctx, req, opts...)
}

func (l serverLimits) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	own := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		r.Name = serverNamePrefix + r.Name
		own[i] = r
	}
	return l.node.CheckMany(ctx, own, opts...)
}
