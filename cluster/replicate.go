package cluster

import (
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/transport"
)

// Replication: with Config.Replicas R > 1, every ReplicateInterval the
// owner takes the keys its store changed (Store.Changed) and sends the state
// of those it owns to the R-1 members next in line (ring.Owners), batched
// per member. Replicas merge the copies into their own stores, so when an
// owner dies the next owner continues from its copy, and every replica
// hands its copy to a new owner that was not one (handoff.go).
//
// The bound: after an owner is killed hard, the hits it admitted since its
// last completed replication are forgotten and can be admitted again: at
// most what it admitted in about one ReplicateInterval plus one Transfer
// round trip. When the new owner was not a replica, add the checks it
// decides between noticing the failure and the replica's hand-off arriving.

// Replicas returns the members that hold (name, key) in this node's ring:
// its owner first, then up to Config.Replicas-1 replicas.
func (n *Node) Replicas(name, key string) []ring.Member {
	return n.ring.Owners(name, key, n.cfg.Replicas)
}

// pendingBatch is states a replica did not take, kept for the next tick.
type pendingBatch struct {
	states   []limiter.Snapshot
	attempts int
}

func (n *Node) replicateLoop() {
	t := time.NewTicker(n.cfg.ReplicateInterval)
	defer t.Stop()
	owners := newOwnersCache(n.ring, n.cfg.Replicas)
	retry := map[string]pendingBatch{}
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
			retry = n.replicate(owners, retry)
		}
	}
}

// replicate sends the changed keys this node owns to their replicas, and
// the batches of previous ticks that failed; it returns the batches that
// failed this time and may be tried again.
func (n *Node) replicate(owners *ownersCache, retry map[string]pendingBatch) map[string]pendingBatch {
	batches := map[string][]limiter.Snapshot{}
	n.xfer.changedMu.Lock()
	if n.xfer.leaving {
		n.xfer.changedMu.Unlock()
		return nil
	}
	self := n.cfg.NodeName
	n.store.Changed(n.now(), func(s limiter.Snapshot) {
		ms := owners.get(ring.RouteHash(s.Name, s.Key))
		if len(ms) == 0 || ms[0].Name != self {
			return // a copy held here, or a key decided without its owner
		}
		for _, m := range ms[1:] {
			batches[m.Name] = append(batches[m.Name], s)
		}
	})
	n.xfer.changedMu.Unlock()
	attempts := map[string]int{}
	for to, b := range retry {
		if _, ok := n.peers.Get(to); ok { // a member gone is no replica
			batches[to] = append(b.states, batches[to]...)
			attempts[to] = b.attempts
		}
	}
	if len(batches) == 0 {
		return nil
	}
	failed := n.sendAll(n.xfer.ctx, transport.Replica, batches, 1)
	var next map[string]pendingBatch
	for to, states := range failed {
		if a := attempts[to] + 1; a < replicateAttempts {
			if next == nil {
				next = map[string]pendingBatch{}
			}
			next[to] = pendingBatch{states: states, attempts: a}
		}
	}
	return next
}
