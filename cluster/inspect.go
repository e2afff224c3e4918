package cluster

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Inspecting and resetting a key, for operators. Inspect goes where a
// check would (the router's pick: here, the owner, or the previous owner
// while the key is handed over to this node) and reads the state there
// without changing it: on the owner, Store.Snapshot under the key's
// decide lock; from another node, the Peer service's Inspect. A reset is
// a check with Behavior Reset (limiter.ResetRequest), so it takes the
// check's path; the owner that decides it also queues the key's reset to
// its replicas (resetReplicas), which drop their copies, so that neither
// a replica that becomes owner nor a replica's hand-off brings the old
// state back.

// Inspect returns the state of (name, key) as its owner holds it, with
// the owner's name and the replicas of this node's ring. Reading it
// changes nothing. When the owner cannot be reached, or no node decides
// the key within Config.HandoverTimeout, it returns this node's own state
// of the key with WithoutOwner set. An invalid name or key returns an
// error wrapping limiter.ErrInvalidName or limiter.ErrInvalidKey.
func (n *Node) Inspect(ctx context.Context, name, key string) (sluice.Inspection, error) {
	if n.closed.Load() {
		return sluice.Inspection{}, ErrClosed
	}
	if ctx == nil {
		return sluice.Inspection{}, ErrNilContext
	}
	if err := limiter.ValidateKey(name, key); err != nil {
		return sluice.Inspection{}, err
	}
	hash := ring.RouteHash(name, key)
	var ins sluice.Inspection
	err, timedOut := n.retryRoute(ctx, func(ctx context.Context) (err error, again bool) {
		ins, err, again = n.inspectOnce(ctx, name, key, hash)
		return err, again
	})
	if timedOut {
		ins = n.inspectHere(name, key, true)
	} else if err != nil {
		return sluice.Inspection{}, err
	}
	ins.Replicas = n.replicaNames(name, key)
	return ins, nil
}

// inspectOnce makes one attempt at reading the key's state where the
// router says; again is set when Inspect should wait and try again.
func (n *Node) inspectOnce(ctx context.Context, name, key string, hash uint64) (ins sluice.Inspection, err error, again bool) {
	p := n.router.pick(hash)
	switch p.way {
	case wayHere:
		ins, ok := n.inspectOwned(name, key, hash)
		return ins, nil, !ok
	case wayWait:
		return sluice.Inspection{}, nil, true
	case wayNotReady, wayDown:
		return n.inspectHere(name, key, true), nil, false
	}
	ins, err = p.client.Inspect(ctx, name, key)
	switch n.router.done(&p, err) {
	case retry:
		return sluice.Inspection{}, nil, true
	case decided:
		return ins, err, false
	}
	if ctx.Err() != nil {
		return sluice.Inspection{}, ctx.Err(), false
	}
	return n.inspectHere(name, key, true), nil, false
}

// inspectOwned reads the key's state when, holding its decide lock
// shared, this node is the key's settled owner; ok is false when it is
// not.
func (n *Node) inspectOwned(name, key string, hash uint64) (ins sluice.Inspection, ok bool) {
	mu := n.handover.lock(hash)
	mu.RLock()
	defer mu.RUnlock()
	if st, _ := n.handover.stateOf(hash); st != owned {
		return sluice.Inspection{}, false
	}
	return n.inspectHere(name, key, false), true
}

// inspectHere reads the key's state in this node's store.
func (n *Node) inspectHere(name, key string, withoutOwner bool) sluice.Inspection {
	now := n.now()
	s, found := n.store.Snapshot(name, key, now)
	return sluice.Inspection{State: s, Found: found, Owner: n.cfg.NodeName, WithoutOwner: withoutOwner, At: now}
}

// ownerInspector serves the Peer service's Inspect: the caller routed the
// key here as its owner. Like ownerChecker, it never asks another node.
type ownerInspector struct{ n *Node }

var _ transport.Inspector = ownerInspector{}

func (o ownerInspector) Inspect(_ context.Context, name, key string) (sluice.Inspection, error) {
	if o.n.closed.Load() {
		return sluice.Inspection{}, ErrClosed
	}
	ins, ok := o.n.inspectOwned(name, key, ring.RouteHash(name, key))
	if !ok {
		return sluice.Inspection{}, fmt.Errorf("%w: %s does not decide %s/%s now", transport.ErrNotOwner, o.n.cfg.NodeName, name, key)
	}
	return ins, nil
}

// Inspect serves the public service's Inspect.
func (r publicAPI) Inspect(ctx context.Context, name, key string) (sluice.Inspection, error) {
	return r.n.Inspect(ctx, name, key)
}

// resetReplicas queues the reset of req's key, which this node decided as
// its owner, to the key's replicas, when req resets it: they drop their
// copies, and keep the reset's mark, which the reset carries. Copies of
// the key queued for them before are dropped unsent.
func (n *Node) resetReplicas(req *limiter.Request) {
	if req.Behavior&limiter.Reset == 0 || n.cfg.Replicas < 2 {
		return
	}
	reset, ok := n.store.ResetMark(req.Name, req.Key, n.now())
	if !ok {
		reset = limiter.Snapshot{Name: req.Name, Key: req.Key}
	}
	for _, to := range n.replicaNames(req.Name, req.Key) {
		n.transfers.outbox.reset(to, reset)
	}
}

// replicaNames returns the names of the replicas of (name, key) in this
// node's ring, its owner left out.
func (n *Node) replicaNames(name, key string) []string {
	var out []string
	for i, m := range n.Replicas(name, key) {
		if i > 0 {
			out = append(out, m.Name)
		}
	}
	return out
}

// dropCopies drops this node's states of the keys of states, which their
// owner, the peer named from, reset, and returns how many it held. Only
// a copy is dropped: the state of a key this node's ring gives to itself,
// or to a node other than from, stays (a reset lowers a count only where
// its owner decides it), and a late reset leaves the old count on this
// node, which only counts too much. The reset's mark a state carries is
// kept: should this node decide the key next, a refund of a charge made
// before the reset gives nothing back; a mark never lowers a count. A
// mark the store refuses (its times implausible here) is counted
// rejected.
func (n *Node) dropCopies(from string, states []limiter.Snapshot) (dropped, rejected int) {
	now := n.now()
	for _, s := range states {
		if owner, ok := n.Owner(s.Name, s.Key); ok && owner.Name == from && from != n.cfg.NodeName && n.store.Forget(s.Name, s.Key) {
			dropped++
		}
		if s.HasResetMark() {
			if _, err := n.store.Merge([]limiter.Snapshot{s}, now); err != nil {
				rejected++
			}
		}
	}
	return dropped, rejected
}
