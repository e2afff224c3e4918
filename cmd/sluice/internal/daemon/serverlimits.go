package daemon

import (
	"context"
	"sync"
	"sync/atomic"

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
	req.Name = serverName(req.Name)
	return l.node.Check(ctx, req, opts...)
}

func (l serverLimits) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	own := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		r.Name = serverName(r.Name)
		own[i] = r
	}
	return l.node.CheckMany(ctx, own, opts...)
}

// maxServerNames bounds the names serverName keeps: those of the rules
// and of Envoy's units, which come from the configuration, not from
// requests, and are few.
const maxServerNames = 4096

var serverNames struct {
	m  atomic.Pointer[map[string]string] // name -> serverNamePrefix+name; replaced whole
	mu sync.Mutex                        // serializes the replacements
}

// serverName returns serverNamePrefix+name, kept for the next check of
// name instead of joined each time while fewer than maxServerNames are
// kept.
func serverName(name string) string {
	if m := serverNames.m.Load(); m != nil {
		if p, ok := (*m)[name]; ok {
			return p
		}
	}
	p := serverNamePrefix + name
	serverNames.mu.Lock()
	defer serverNames.mu.Unlock()
	old := serverNames.m.Load()
	if old != nil && len(*old) >= maxServerNames {
		return p
	}
	m := make(map[string]string, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[p[len(serverNamePrefix):]] = p
	serverNames.m.Store(&m)
	return p
}

func lenOf(m *map[string]string) int {
	if m == nil {
		return 0
	}
	return len(*m)
}
