package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/serf/serf"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

var _ sluice.Limiter = (*Node)(nil)

// Check decides req: on this node's store when it owns the key, otherwise
// on the owner's. Invalid requests return an error wrapping a limiter
// sentinel; a cancelled ctx returns ctx's error. An unreachable owner is not
// an error: the policy decides and Decision.WithoutOwner is set.
func (n *Node) Check(ctx context.Context, req limiter.Request, opts ...sluice.CheckOption) (sluice.Decision, error) {
	if n.metrics == nil && n.tracing == nil {
		return n.check(ctx, &req, opts)
	}
	// Latencies are measured on the system's monotonic clock, not the
	// node's: they report how long the caller waited, which a test's
	// clock does not change.
	start := time.Now()
	var span trace.Span
	if n.tracing != nil && ctx != nil {
		ctx, span = n.tracing.startCheck(ctx, &req)
	}
	d, err := n.check(ctx, &req, opts)
	if span != nil {
		n.tracing.endCheck(span, &d, err)
	}
	if n.metrics != nil {
		n.metrics.check(&req, &d, err, n.isRemote(d.Owner), time.Since(start))
	}
	return d, err
}

func (n *Node) check(ctx context.Context, reqp *limiter.Request, opts []sluice.CheckOption) (sluice.Decision, error) {
	if n.closed.Load() {
		return sluice.Decision{}, ErrClosed
	}
	if ctx == nil {
		return sluice.Decision{}, ErrNilContext
	}
	d, err := n.route(ctx, reqp, n.policy(opts))
	if err == nil && n.closedWhileDeciding() {
		return sluice.Decision{}, ErrClosed
	}
	return d, err
}

// closedWhileDeciding reports whether a check that was under way as Close
// began is answered ErrClosed rather than with its decision: with
// Config.DataDir, Close writes the store once the node's loops stop, and
// a decision made meanwhile may come after that write, so that the node
// restarted from its directory would not count a hit its caller was
// told was admitted. Read after the decision: one that Close's write
// does not hold reads the node closed (more counted, never less).
func (n *Node) closedWhileDeciding() bool { return n.persist != nil && n.closed.Load() }

// route is the one path every check takes, alone or in a batch: decide it
// here as the key's settled owner, admit it from a lease, forward it to
// the owner (or, while a key that moved here is being handed over, to the
// key's previous owner), or apply policy when the owner cannot be reached.
// When the node asked is not the owner now (transport.ErrNotOwner), or
// the hand-over of a key that moved here is not in, route waits for the
// ring or the hand-over to move on and tries again, within
// Config.HandoverTimeout; then policy decides.
func (n *Node) route(ctx context.Context, req *limiter.Request, policy sluice.Policy) (sluice.Decision, error) {
	hash := ring.RouteHash(req.Name, req.Key)
	var d sluice.Decision
	err, timedOut := n.retryRoute(ctx, func(ctx context.Context) (err error, again bool) {
		d, err, again = n.routeOnce(ctx, req, hash, policy)
		return err, again
	})
	if timedOut {
		n.logger.Warn("cluster: no owner decided the key in time", "name", req.Name, "key", req.Key, "after", n.cfg.HandoverTimeout)
		n.waitedOut.Add(1)
		return n.unreachable(req, policy)
	}
	return d, err
}

// retryRoute makes attempts with once until one says not to try again,
// and returns its error. Between attempts it waits for the ring or the
// hand-over to move on, within Config.HandoverTimeout, which also ends
// the calls of the later attempts; when that passes, it returns timedOut,
// or the caller's context error, or ErrClosed.
func (n *Node) retryRoute(ctx context.Context, once func(ctx context.Context) (err error, again bool)) (err error, timedOut bool) {
	if err, again := once(ctx); !again {
		return err, false
	}
	return n.retryRouteAgain(ctx, once)
}

// retryRouteAgain is retryRoute once its first attempt, made on the
// caller's ctx, said to try again. It is apart so that the first attempt,
// which decides nearly every check, runs without deferred calls.
func (n *Node) retryRouteAgain(ctx context.Context, once func(ctx context.Context) (err error, again bool)) (err error, timedOut bool) {
	caller := ctx
	// The deadline is on the node's clock, as the hand-over's timeout is.
	deadline := n.now().Add(n.cfg.HandoverTimeout)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer n.clock.AfterFunc(n.cfg.HandoverTimeout, cancel)()
	backoff := time.Millisecond
	for {
		if !n.waitRoute(ctx, deadline, &backoff) {
			if err := caller.Err(); err != nil {
				return err, false
			}
			if n.closed.Load() {
				return ErrClosed, false
			}
			return nil, true
		}
		err, again := once(ctx)
		if !again && err != nil && ctx.Err() != nil && caller.Err() == nil {
			again = true // retryRoute's own deadline ended the attempt
		}
		if !again {
			return err, false
		}
	}
}

// waitRoute waits until the ring or the hand-over changes, or backoff
// passes (doubling it, up to 50ms), and reports false when deadline or
// ctx ended the wait instead.
func (n *Node) waitRoute(ctx context.Context, deadline time.Time, backoff *time.Duration) bool {
	wait := min(*backoff, deadline.Sub(n.now()))
	if wait <= 0 {
		return false
	}
	*backoff = min(2**backoff, 50*time.Millisecond)
	t := clocks.NewTimer(n.clock, wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-n.shutdown:
		return false
	case <-n.handover.wake():
	case <-t.C:
	}
	return true
}

// routeOnce makes one attempt at req, as plan says, calling the owner
// alone when it must; again is set when route should wait and try again.
func (n *Node) routeOnce(ctx context.Context, req *limiter.Request, hash uint64, policy sluice.Policy) (d sluice.Decision, err error, again bool) {
	p, err, next := n.plan(ctx, req, hash, policy, &d)
	switch next {
	case planDone:
		return d, err, false
	case planWait:
		return sluice.Decision{}, nil, true
	case planDown:
		d, err := n.unreachable(req, policy)
		return d, err, false
	}
	n.forwarded.Add(1)
	fd, err := p.client.Check(ctx, *req)
	o := n.router.done(&p, err)
	if o == decided && err == nil && fd.Allowed {
		// What answered returns for an admitted check, without its call.
		return sluice.Decision{Decision: fd, Owner: p.peer}, nil, false
	}
	return n.answered(ctx, req, policy, &p, o, fd, err)
}

// planStep is what plan leaves to its caller.
type planStep uint8

const (
	planDone    planStep = iota // decided here: the decision or error is the answer
	planWait                    // nobody decides the key now: wait and plan again
	planForward                 // call the pick's peer, then answered
	planDown                    // the owner cannot be called: the unreachable policy decides
)

// plan is the one plan of every check, alone or in a batch: a cancelled
// ctx is answered with its error before anything is consumed; then the
// check is decided here as the key's settled owner, or admitted from a
// lease, or left to the caller to forward to the pick's peer, to wait for,
// or to the unreachable policy. The caller of a planForward pick calls its
// peer, or releases it. A planDone decision is written to d.
func (n *Node) plan(ctx context.Context, req *limiter.Request, hash uint64, policy sluice.Policy, d *sluice.Decision) (p pick, err error, next planStep) {
	if err := ctx.Err(); err != nil {
		return pick{}, err, planDone
	}
	p = n.router.pick(hash)
	if p.way == wayHere {
		var ok bool
		if *d, err, ok = n.decideOwned(req, hash); ok {
			return pick{}, err, planDone
		}
		if p = n.router.pick(hash); p.way == wayHere {
			return pick{}, nil, planWait // the ring changed under decideOwned
		}
	}
	if n.closed.Load() {
		n.router.release(&p)
		return pick{}, ErrClosed, planDone
	}
	if err := req.Validate(); err != nil {
		n.router.release(&p)
		return pick{}, err, planDone
	}
	if n.leases.enabled && (p.way == wayOwner || p.way == wayDown) {
		var ok bool
		if *d, ok = n.leases.decide(req, p.peer, n.now().UnixNano()); ok {
			n.router.release(&p)
			return pick{}, nil, planDone
		}
	}
	switch p.way {
	case wayWait:
		return pick{}, nil, planWait
	case wayNotReady:
		*d, err = n.unreachable(req, policy)
		return pick{}, err, planDone
	case wayDown:
		return p, nil, planDown
	}
	return p, nil, planForward
}

// answered turns the answer of a forwarded check, whose call had outcome
// o, into the caller's: the owner's decision, again when route should
// wait and try again, or forwardFailed's.
func (n *Node) answered(ctx context.Context, req *limiter.Request, policy sluice.Policy, p *pick, o outcome, fd limiter.Decision, err error) (sluice.Decision, error, bool) {
	switch {
	case o == retry:
		return sluice.Decision{}, nil, true
	case o == decided && err == nil:
		if n.leases.enabled && !fd.Allowed && p.way == wayOwner {
			n.leases.noteDenied(req, p.peer, &fd, n.now().UnixNano())
		}
		return sluice.Decision{Decision: fd, Owner: p.peer}, nil, false
	}
	d, err := n.forwardFailed(ctx, req, policy, err)
	return d, err, false
}

// departing reports whether the member named name confirmed its
// departure, or serf knows it as leaving or gone, though the ring may
// still route to it. It is asked only when a
// forwarded check or a transfer failed.
func (n *Node) departing(name string) bool {
	if n.departures.has(name) {
		return true
	}
	for _, m := range n.serf.Members() {
		if m.Name == name {
			return m.Status != serf.StatusAlive
		}
	}
	return true
}

// decideOwned decides req on this node's store when, holding the key's
// decide lock shared, this node is the key's settled owner; ok is false
// when it is not (the ring or the hand-over changed since the caller
// looked).
func (n *Node) decideOwned(req *limiter.Request, hash uint64) (d sluice.Decision, err error, ok bool) {
	d, err, how := n.decideAsOwner(req, hash)
	return d, err, how != notOwned
}

// ownedDecision is how decideAsOwner answered.
type ownedDecision uint8

const (
	notOwned      ownedDecision = iota // this node is not the key's settled owner now
	decidedHere                        // decided on this node's store
	refusedNoRoom                      // refused: standing in, with no room in the stand-in record
)

// decideAsOwner is decideOwned, telling a check refused because this
// node stands in for the key's owner with no room in its stand-in record
// (the refusal is a denial that consumed nothing).
func (n *Node) decideAsOwner(req *limiter.Request, hash uint64) (d sluice.Decision, err error, how ownedDecision) {
	mu := n.handover.lock(hash)
	mu.RLock()
	defer mu.RUnlock()
	// Told with the ownership, read before and after it: a rebuild
	// publishes the ring with the cut-off members before it adopts the
	// new ring and drops them after, so one of the two reads holds the
	// cut-off members of the ring the key was owned by. The decision
	// belongs to that ring's history (the hand-off pass waits for it).
	standingIn := n.standins.standingIn(hash)
	if st, _ := n.handover.stateOf(hash); st != owned {
		return sluice.Decision{}, nil, notOwned
	}
	standingIn = standingIn || n.standins.standingIn(hash)
	// A stand-in's hits are recorded, or not admitted: its entry is
	// reserved before the decision.
	counted := standingIn && req.Hits > 0 && req.Behavior&(limiter.Reset|limiter.Refund) == 0
	if counted && !n.standins.reserve(req) {
		if err := req.Validate(); err != nil {
			return sluice.Decision{}, err, decidedHere
		}
		n.standins.refused.Add(1)
		n.local.Add(1)
		now := n.now()
		return sluice.Decision{Decision: limiter.Decision{Limit: req.Limit, RetryAfter: n.cfg.DenyRetryAfter, ResetAt: now.Add(n.cfg.DenyRetryAfter)}, Owner: n.cfg.NodeName}, nil, refusedNoRoom
	}
	// A stand-in's refund lowers its part by what it gave back of the
	// key's state (standins.refunded).
	refunds := standingIn && req.Hits > 0 && req.Behavior&(limiter.Reset|limiter.Refund) == limiter.Refund && req.Charged.IsZero()
	held := false
	if n.grants.active() {
		d, err, held = n.decideLeased(req, hash)
	}
	if !held && refunds {
		var gave int64
		if d, gave, err = n.decideRefund(req); err == nil && gave > 0 {
			n.standins.refunded(req, gave)
		}
	} else if !held {
		d, err = n.decideLocal(req)
	}
	if counted {
		var hits int64
		if err == nil && d.Allowed {
			hits = req.Hits
			if f := n.cfg.beforeStandinRecord; f != nil {
				f()
			}
		}
		n.standins.record(req, hits)
	}
	if err == nil {
		if req.Behavior&limiter.Reset != 0 && !deferred(req.Algorithm) && n.grants.active() {
			// The Reset's decision says what is left after them.
			d.Remaining = max(d.Remaining-n.grants.rechargeReset(n.store, hash, req, n.now()), 0)
		}
		n.resetReplicas(req)
	}
	return d, err, decidedHere
}

// decideLeased decides req, a request for a key this node owns, when
// leases of the key hold hits apart from its bucket (grants.go): with the
// capacity reduced by those hits. held is false when none are held and
// decideLocal should decide. The key's decide lock must be held shared.
//
// The grants lock covers settling and reading the hits held, not the
// decision: a grant that settles meanwhile has entered the bucket before
// the lock was released, so a decision that read it as held counts it
// twice (never too few), and one that read it as settled sees it in the
// bucket. New grants and returns wait for the decide lock.
func (n *Node) decideLeased(req *limiter.Request, hash uint64) (d sluice.Decision, err error, held bool) {
	now := n.now()
	gm := n.grants.lock(hash)
	gm.Lock()
	n.grants.settleLocked(n.store, hash, now.UnixNano(), req)
	var out, earliest int64
	if deferred(req.Algorithm) && req.Behavior&limiter.Charge == 0 {
		// A Reset, a Refund or a DrainOverLimit acts on the bucket
		// beside the hits the leases hold; a Charge counts its hits
		// whatever they hold.
		out, earliest = n.grants.heldLocked(hash)
	}
	gm.Unlock()
	if out == 0 {
		return sluice.Decision{}, nil, false
	}
	if err := req.Validate(); err != nil {
		return sluice.Decision{}, err, true
	}
	r := *req
	r.Burst = r.Capacity() - out
	if r.Burst < max(r.Hits, 1) {
		// The leases hold every hit: none is free before the first one
		// expires (a lower bound: then its hits enter the bucket).
		wait := time.Duration(earliest - now.UnixNano())
		n.local.Add(1)
		return sluice.Decision{Decision: limiter.Decision{Limit: req.Limit, RetryAfter: wait, ResetAt: now.Add(wait)}, Owner: n.cfg.NodeName}, nil, true
	}
	d, err = n.decideLocal(&r)
	return d, err, true
}

// forwardFailed turns the error of a forwarded check into the caller's
// answer: the owner's verdict on a bad request, the caller's own context
// error, or the unreachable policy's decision.
func (n *Node) forwardFailed(ctx context.Context, req *limiter.Request, policy sluice.Policy, err error) (sluice.Decision, error) {
	switch {
	case ctx.Err() != nil:
		return sluice.Decision{}, ctx.Err()
	case !errors.Is(err, transport.ErrUnavailable):
		// The owner answered: its verdict on this request stands.
		return sluice.Decision{}, err
	}
	n.logger.Debug("cluster: owner unreachable", "key", req.Key, "err", err)
	return n.unreachable(req, policy)
}

// CheckMany decides every request, in order, one Result each. Requests for
// one owner travel together.
func (n *Node) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	return n.checkMany(ctx, reqs, n.policy(opts), nil)
}

// recordMany records the metrics of a batch answered together, started
// at start on the system's clock (as Check's latency is).
func (n *Node) recordMany(reqs []limiter.Request, out []sluice.Result, start time.Time) {
	if n.metrics == nil {
		return
	}
	took := time.Since(start)
	for i := range out {
		n.metrics.check(&reqs[i], &out[i].Decision, out[i].Err, n.isRemote(out[i].Owner), took)
	}
}

// checkMany is CheckMany with a policy per request: policies[i], or
// policy for every request when policies is nil. It takes route's steps,
// batching the forwarded checks of each owner into one call; the
// requests that route would wait for go through route itself.
func (n *Node) checkMany(ctx context.Context, reqs []limiter.Request, policy sluice.Policy, policies []sluice.Policy) []sluice.Result {
	out := make([]sluice.Result, len(reqs))
	defer n.recordMany(reqs, out, time.Now())
	if n.tracing != nil && ctx != nil {
		var span trace.Span
		ctx, span = n.tracing.startMany(ctx, len(reqs))
		defer n.tracing.endMany(span, reqs, out)
	}
	if n.closed.Load() {
		for i := range out {
			out[i].Err = ErrClosed
		}
		return out
	}
	if ctx == nil {
		for i := range out {
			out[i].Err = ErrNilContext
		}
		return out
	}
	pols := policyList{one: policy, each: policies}
	var (
		groups map[string]*checkGroup
		slow   []int // to route one by one
	)
	for i := range reqs {
		req := &reqs[i]
		p, err, next := n.plan(ctx, req, ring.RouteHash(req.Name, req.Key), pols.at(i), &out[i].Decision)
		switch next {
		case planDone:
			out[i].Err = err
			continue
		case planWait:
			slow = append(slow, i)
			continue
		}
		if p.way == wayPrevious {
			// A key in hand-over: its check goes alone, as it may wait.
			n.router.release(&p)
			slow = append(slow, i)
			continue
		}
		g := groups[p.peer]
		if next == planDown && g == nil {
			out[i].Decision, out[i].Err = n.unreachable(req, pols.at(i))
			continue
		}
		if g != nil {
			n.router.release(&p) // the group's call is the probe, if any
		} else {
			if groups == nil {
				groups = make(map[string]*checkGroup)
			}
			g = &checkGroup{pick: p}
			groups[p.peer] = g
		}
		g.idx = append(g.idx, i)
		g.reqs = append(g.reqs, *req)
	}
	if len(groups) > 0 || len(slow) > 0 {
		n.sendMany(ctx, reqs, pols, out, groups, slow)
	}
	if n.closedWhileDeciding() {
		for i := range out {
			if out[i].Err == nil {
				out[i] = sluice.Result{Err: ErrClosed}
			}
		}
	}
	return out
}

// policyList is the unreachable policy of each request of a batch: each[i],
// or one for all when each is nil.
type policyList struct {
	one  sluice.Policy
	each []sluice.Policy
}

func (l policyList) at(i int) sluice.Policy {
	if l.each != nil {
		return l.each[i]
	}
	return l.one
}

// checkGroup is the requests of checkMany for one owner.
type checkGroup struct {
	pick pick
	idx  []int
	reqs []limiter.Request
}

// sendMany is the rest of checkMany, apart so that a batch decided here
// alone needs none of its goroutines: it sends each group to its owner,
// then routes the slow requests one by one, each answer into out.
func (n *Node) sendMany(ctx context.Context, reqs []limiter.Request, pols policyList, out []sluice.Result,
	groups map[string]*checkGroup, slow []int) {
	var (
		wg     sync.WaitGroup
		slowMu sync.Mutex // guards slow once the groups are sent
	)
	for _, g := range groups {
		n.forwarded.Add(int64(len(g.reqs)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs := g.pick.client.CheckMany(ctx, g.reqs)
			down := n.router.done(&g.pick, batchErr(rs))
			for j, i := range g.idx {
				var again bool
				err := rs[j].Err
				out[i].Decision, out[i].Err, again = n.answered(ctx, &reqs[i], pols.at(i), &g.pick, itemOutcome(down, err), rs[j].Decision.Decision, err)
				if again {
					slowMu.Lock()
					slow = append(slow, i)
					slowMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Decision, out[i].Err = n.route(ctx, &reqs[i], pols.at(i))
		}()
	}
	wg.Wait()
}

// itemOutcome is the outcome of one check of a batch whose call had
// outcome call (router.done of batchErr), as router.done would say of the
// check sent alone: the owner does not decide it now, or its call failed
// before it was sent on a peer that is about to change, is a retry; one
// that failed in flight (peer.ErrInFlight) is not retried, whatever the
// rest of its batch got.
func itemOutcome(call outcome, err error) outcome {
	switch {
	case err == nil:
		return decided
	case errors.Is(err, transport.ErrNotOwner):
		return retry
	case errors.Is(err, transport.ErrUnavailable) && call == retry && errors.Is(err, peer.ErrInFlight):
		return failed
	case errors.Is(err, transport.ErrUnavailable):
		return call
	}
	return decided
}

// isRemote reports whether a decision by owner came from another node.
func (n *Node) isRemote(owner string) bool { return owner != "" && owner != n.cfg.NodeName }

func (n *Node) policy(opts []sluice.CheckOption) sluice.Policy {
	return n.policyOf(sluice.Options(opts).Unreachable)
}

// policyOf is p, or Config.Unreachable for PolicyDefault.
func (n *Node) policyOf(p sluice.Policy) sluice.Policy {
	if p == sluice.PolicyDefault || !p.Valid() {
		return n.cfg.Unreachable
	}
	return p
}

// decideLocal decides req on this node's store, which validates it: the
// one validation a locally owned request goes through.
func (n *Node) decideLocal(req *limiter.Request) (sluice.Decision, error) {
	d, err := n.store.CheckAt(*req, n.now())
	if err != nil {
		return sluice.Decision{}, err
	}
	n.local.Add(1)
	return sluice.Decision{Decision: d, Owner: n.cfg.NodeName}, nil
}

// decideRefund is decideLocal for a refund without Charged, returning
// beside the decision the whole hits it gave back to the key's state
// (limiter.Store.RefundAt).
func (n *Node) decideRefund(req *limiter.Request) (sluice.Decision, int64, error) {
	d, gave, err := n.store.RefundAt(*req, n.now())
	if err != nil {
		return sluice.Decision{}, 0, err
	}
	n.local.Add(1)
	return sluice.Decision{Decision: d, Owner: n.cfg.NodeName}, gave, nil
}

// unreachable decides a valid request whose owner cannot be reached.
func (n *Node) unreachable(req *limiter.Request, policy sluice.Policy) (sluice.Decision, error) {
	n.withoutOwner.Add(1)
	n.metrics.unreachable(policy)
	var d sluice.Decision
	switch policy {
	case sluice.PolicyAllow:
		d.Decision = limiter.Decision{Allowed: true, Limit: req.Limit, ResetAt: n.now()}
		d.Owner = n.cfg.NodeName
		n.debts.add(req, req.Hits, false)
	case sluice.PolicyDeny:
		d.Decision = limiter.Decision{Limit: req.Limit, RetryAfter: n.cfg.DenyRetryAfter, ResetAt: n.now().Add(n.cfg.DenyRetryAfter)}
		d.Owner = n.cfg.NodeName
	default:
		// Admitted and recorded as one step for a state of the key sent
		// meanwhile (withStoredParts): the hits it counts are those
		// recorded.
		mu := n.handover.lock(ring.RouteHash(req.Name, req.Key))
		mu.RLock()
		var err error
		if d, err = n.decideLocal(req); err == nil && d.Allowed {
			n.debts.add(req, req.Hits, true)
		}
		mu.RUnlock()
		if err != nil {
			return sluice.Decision{}, err
		}
	}
	d.WithoutOwner = true
	return d, nil
}

// ownerChecker serves the peer service: the caller routed these requests
// here as their owner. They are decided on this node's store when it is the
// key's settled owner, and answered with transport.ErrNotOwner otherwise;
// they are never forwarded again, so rings that disagree while gossip
// converges cannot make a loop.
type ownerChecker struct{ n *Node }

var _ transport.CheckerInto = ownerChecker{}

func (o ownerChecker) CheckMany(ctx context.Context, reqs []limiter.Request) []sluice.Result {
	out := make([]sluice.Result, len(reqs))
	o.CheckInto(ctx, reqs, out)
	return out
}

func (o ownerChecker) CheckInto(ctx context.Context, reqs []limiter.Request, out []sluice.Result) {
	n := o.n
	var (
		parents []string // the requests' traceparents, when traced
		from    string
	)
	if n.tracing != nil {
		parents = transport.TraceParents(ctx)
		from, _ = transport.PeerFromContext(ctx)
	}
	for i := range reqs {
		var span trace.Span
		if n.tracing != nil {
			parent := ""
			if i < len(parents) {
				parent = parents[i]
			}
			span = n.tracing.startDecide(ctx, &reqs[i], from, parent)
		}
		hash := ring.RouteHash(reqs[i].Name, reqs[i].Key)
		d, err, ok := n.decideOwned(&reqs[i], hash)
		if !ok {
			err = fmt.Errorf("%w: %s does not decide %s/%s now", transport.ErrNotOwner, n.cfg.NodeName, reqs[i].Name, reqs[i].Key)
		}
		out[i] = sluice.Result{Decision: sluice.Decision{Decision: d.Decision, Owner: d.Owner}, Err: err}
		if span != nil {
			n.tracing.endDecide(span, &out[i])
		}
	}
}

// publicAPI serves the public service: requests are routed like Check, each
// with its own unreachable policy; it also reports health.
type publicAPI struct{ n *Node }

func (r publicAPI) Route(ctx context.Context, rr []transport.RoutedRequest) []sluice.Result {
	var reqs []limiter.Request
	var policies []sluice.Policy
	if len(rr) == 1 { // a public Check: one allocation
		one := new(struct {
			req    [1]limiter.Request
			policy [1]sluice.Policy
		})
		reqs, policies = one.req[:], one.policy[:]
	} else {
		reqs, policies = make([]limiter.Request, len(rr)), make([]sluice.Policy, len(rr))
	}
	for i := range rr {
		reqs[i] = rr[i].Request
		policies[i] = r.n.policyOf(rr[i].Policy)
	}
	return r.n.checkMany(ctx, reqs, sluice.PolicyDefault, policies)
}

func (r publicAPI) Health(ctx context.Context) transport.HealthReport {
	status := "serving"
	if r.n.closed.Load() {
		status = "closed"
	}
	return transport.HealthReport{Status: status, Members: r.n.ring.Len(), Node: r.n.cfg.NodeName}
}
