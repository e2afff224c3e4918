package cluster

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/peer"
	"github.com/sluicehq/sluice/transport"
)

// Check decides req: on this node's store when it owns the key, otherwise
// on the owner's. Invalid requests return an error wrapping a limiter
// sentinel; a cancelled ctx returns ctx's error. An unreachable owner is not
// an error: the policy decides and Decision.WithoutOwner is set.
func (n *Node) Check(ctx context.Context, req limiter.Request, opts ...CheckOption) (Decision, error) {
	if n.metrics == nil {
		return n.check(ctx, &req, opts)
	}
	start := time.Now()
	d, err := n.check(ctx, &req, opts)
	n.metrics.check(&req, &d, err, n.isRemote(d.Owner), time.Since(start))
	return d, err
}

func (n *Node) check(ctx context.Context, reqp *limiter.Request, opts []CheckOption) (Decision, error) {
	req := *reqp
	if n.closed.Load() {
		return Decision{}, ErrClosed
	}
	owner, ok := n.ring.Owner(req.Name, req.Key)
	if !ok || owner.Name == n.cfg.NodeName {
		return n.decideLocal(&req) // the store validates
	}
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	if n.leases.on {
		if d, ok := n.leases.decide(&req, owner.Name, n.now().UnixNano()); ok {
			return d, nil
		}
	}
	policy := n.policy(opts)
	c, ok := n.peers.Get(owner.Name)
	br := n.breakers.get(owner.Name)
	if !ok || (!br.closed() && !br.allow(n.now().UnixNano())) {
		return n.unreachable(&req, policy)
	}
	n.forwarded.Add(1)
	d, err := c.Check(ctx, req)
	n.callDone(br, err)
	if err == nil {
		if n.leases.on && !d.Allowed {
			n.leases.noteDenied(&req, owner.Name, &d, n.now().UnixNano())
		}
		return Decision{Decision: d, Owner: owner.Name}, nil
	}
	return n.forwardFailed(ctx, &req, policy, err)
}

// callDone feeds a forwarded call's outcome to the owner's breaker: only an
// unreachable owner counts as a failure.
func (n *Node) callDone(br *breaker, err error) {
	down := err != nil && errors.Is(err, transport.ErrUnavailable)
	var now int64 // read by done only when the call failed
	if down {
		now = n.now().UnixNano()
	}
	br.done(!down, now, int32(n.cfg.BreakerThreshold), n.cfg.BreakerCooldown)
}

// forwardFailed turns the error of a forwarded check into the caller's
// answer: the owner's verdict on a bad request, the caller's own context
// error, or the unreachable policy's decision.
func (n *Node) forwardFailed(ctx context.Context, req *limiter.Request, policy Policy, err error) (Decision, error) {
	switch {
	case ctx.Err() != nil:
		return Decision{}, ctx.Err()
	case !errors.Is(err, transport.ErrUnavailable):
		// The owner answered: its verdict on this request stands.
		return Decision{}, err
	}
	n.logger.Debug("cluster: owner unreachable", "key", req.Key, "err", err)
	return n.unreachable(req, policy)
}

// CheckMany decides every request, in order, one Result each. Requests for
// one owner travel together.
func (n *Node) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...CheckOption) []Result {
	policy := n.policy(opts)
	policies := make([]Policy, len(reqs))
	for i := range policies {
		policies[i] = policy
	}
	return n.checkMany(ctx, reqs, policies)
}

// recordMany records the metrics of a batch answered together.
func (n *Node) recordMany(reqs []limiter.Request, out []Result, start time.Time) {
	if n.metrics == nil {
		return
	}
	took := time.Since(start)
	for i := range out {
		n.metrics.check(&reqs[i], &out[i].Decision, out[i].Err, n.isRemote(out[i].Owner), took)
	}
}

// checkMany is CheckMany with a policy per request.
func (n *Node) checkMany(ctx context.Context, reqs []limiter.Request, policies []Policy) []Result {
	out := make([]Result, len(reqs))
	defer n.recordMany(reqs, out, time.Now())
	if n.closed.Load() {
		for i := range out {
			out[i].Err = ErrClosed
		}
		return out
	}
	type group struct {
		client *peer.Client
		owner  string
		idx    []int
		reqs   []limiter.Request
	}
	var groups map[string]*group
	for i := range reqs {
		req := &reqs[i]
		owner, ok := n.ring.Owner(req.Name, req.Key)
		if !ok || owner.Name == n.cfg.NodeName {
			out[i].Decision, out[i].Err = n.decideLocal(req) // the store validates
			continue
		}
		if err := req.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		if n.leases.on {
			if d, ok := n.leases.decide(req, owner.Name, n.now().UnixNano()); ok {
				out[i].Decision = d
				continue
			}
		}
		c, ok := n.peers.Get(owner.Name)
		if !ok || n.breakers.get(owner.Name).openUntil.Load() > n.now().UnixNano() {
			out[i].Decision, out[i].Err = n.unreachable(req, policies[i])
			continue
		}
		if groups == nil {
			groups = make(map[string]*group)
		}
		g := groups[owner.Name]
		if g == nil {
			g = &group{client: c, owner: owner.Name}
			groups[owner.Name] = g
		}
		g.idx = append(g.idx, i)
		g.reqs = append(g.reqs, *req)
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		n.forwarded.Add(int64(len(g.reqs)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs := g.client.CheckMany(ctx, g.reqs)
			var callErr error
			for _, r := range rs {
				if r.Err != nil && errors.Is(r.Err, transport.ErrUnavailable) {
					callErr = r.Err
				}
			}
			n.callDone(n.breakers.get(g.owner), callErr)
			for j, i := range g.idx {
				if err := rs[j].Err; err != nil {
					out[i].Decision, out[i].Err = n.forwardFailed(ctx, &reqs[i], policies[i], err)
					continue
				}
				out[i].Decision = Decision{Decision: rs[j].Decision, Owner: g.owner}
				if n.leases.on && !rs[j].Decision.Allowed {
					n.leases.noteDenied(&reqs[i], g.owner, &rs[j].Decision, n.now().UnixNano())
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// isRemote reports whether a decision by owner came from another node.
func (n *Node) isRemote(owner string) bool { return owner != "" && owner != n.cfg.NodeName }

func (n *Node) policy(opts []CheckOption) Policy {
	o := checkOptions{policy: n.cfg.Unreachable}
	for _, f := range opts {
		f(&o)
	}
	if o.policy == PolicyUnset || o.policy >= numPolicies {
		return n.cfg.Unreachable
	}
	return o.policy
}

// decideLocal decides req on this node's store, which validates it: the
// one validation a locally owned request goes through.
func (n *Node) decideLocal(req *limiter.Request) (Decision, error) {
	d, err := n.store.CheckAt(*req, n.now())
	if err != nil {
		return Decision{}, err
	}
	n.local.Add(1)
	return Decision{Decision: d, Owner: n.cfg.NodeName}, nil
}

// unreachable decides a valid request whose owner cannot be reached.
func (n *Node) unreachable(req *limiter.Request, policy Policy) (Decision, error) {
	n.withoutOwner.Add(1)
	n.metrics.unreachable(policy)
	var d Decision
	switch policy {
	case PolicyAllow:
		d.Decision = limiter.Decision{Allowed: true, Limit: req.Limit, ResetAt: n.now()}
		d.Owner = n.cfg.NodeName
	case PolicyDeny:
		d.Decision = limiter.Decision{Limit: req.Limit, RetryAfter: n.cfg.DenyRetryAfter, ResetAt: n.now().Add(n.cfg.DenyRetryAfter)}
		d.Owner = n.cfg.NodeName
	default:
		var err error
		if d, err = n.decideLocal(req); err != nil {
			return Decision{}, err
		}
	}
	d.WithoutOwner = true
	return d, nil
}

// ownerChecker serves the peer service: the caller routed these requests
// here as their owner, so they are decided on this node's store and never
// forwarded again (rings that disagree while gossip converges cannot loop).
type ownerChecker struct{ n *Node }

var _ transport.CheckerInto = ownerChecker{}

func (o ownerChecker) CheckMany(ctx context.Context, reqs []limiter.Request) []transport.Result {
	out := make([]transport.Result, len(reqs))
	o.CheckInto(ctx, reqs, out)
	return out
}

func (o ownerChecker) CheckInto(ctx context.Context, reqs []limiter.Request, out []transport.Result) {
	for i := range reqs {
		d, err := o.n.decideLocal(&reqs[i])
		out[i] = transport.Result{Decision: d.Decision, Owner: d.Owner, Err: err}
	}
}

// router serves the public service: requests are routed like Check, each
// with its own unreachable policy; it also reports health.
type router struct{ n *Node }

func (r router) Route(ctx context.Context, rr []transport.RoutedRequest) []transport.Result {
	reqs := make([]limiter.Request, len(rr))
	policies := make([]Policy, len(rr))
	for i := range rr {
		reqs[i] = rr[i].Request
		policies[i] = policyFromTransport(rr[i].Policy, r.n.cfg.Unreachable)
	}
	rs := r.n.checkMany(ctx, reqs, policies)
	out := make([]transport.Result, len(rs))
	for i, res := range rs {
		out[i] = transport.Result{Decision: res.Decision.Decision, Owner: res.Owner, WithoutOwner: res.WithoutOwner, Err: res.Err}
	}
	return out
}

func (r router) Health(ctx context.Context) transport.HealthReport {
	status := "serving"
	if r.n.closed.Load() {
		status = "closed"
	}
	return transport.HealthReport{Status: status, Members: r.n.ring.Len(), Node: r.n.cfg.NodeName}
}

func policyFromTransport(p transport.UnreachablePolicy, def Policy) Policy {
	switch p {
	case transport.PolicyLocal:
		return PolicyLocal
	case transport.PolicyAllow:
		return PolicyAllow
	case transport.PolicyDeny:
		return PolicyDeny
	}
	return def
}
