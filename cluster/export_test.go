package cluster

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// SetProtocol makes a node built from c advertise the protocol versions
// min to max, standing in for a build that speaks them.
func SetProtocol(c *Config, min, max uint8) { c.protocol = protocolRange{min, max} }

// HeldHits returns the hits of (name, key) that token bucket and GCRA
// leases this node granted hold apart from the key's bucket now.
func (n *Node) HeldHits(name, key string) int64 {
	hash := ring.RouteHash(name, key)
	mu := n.handover.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	n.grants.settleLocked(n.store, hash, n.now().UnixNano(), nil)
	held, _ := n.grants.heldLocked(hash)
	return held
}

// SetReconnectTimeout makes a node built from c, of ProfileFast, reap a
// failed member d after it failed (serf's ReconnectTimeout).
func SetReconnectTimeout(c *Config, d time.Duration) { c.reconnectTimeout = d }

// SetBeforeHandoffPass makes a node built from c call f before each of
// its hand-off passes reads the ring.
func SetBeforeHandoffPass(c *Config, f func()) { c.beforeHandoffPass = f }

// SetAfterHandoffRead makes a node built from c call f in each hand-off
// pass, after the pass read the states it hands off and before it
// attaches their parts.
func SetAfterHandoffRead(c *Config, f func()) { c.afterHandoffRead = f }

// SetAfterChangesRead makes a node built from c call f each time its
// changes loop has read the changed states it copies to replicas, before
// it queues them.
func SetAfterChangesRead(c *Config, f func()) { c.afterChangesRead = f }

// CopyTo merges into to the state n holds of (name, key) with its parts,
// read together under the key's decide lock, as a copy n's changes loop
// sends a replica; false when n holds no state of the key or to refused
// it.
func (n *Node) CopyTo(to *Node, name, key string) bool {
	s, ok := n.store.Snapshot(name, key, n.now())
	if !ok {
		return false
	}
	states := []limiter.Snapshot{s}
	n.attachConsistent(states)
	_, _, err := stateSink{to}.TakeStates(context.Background(), n.cfg.NodeName, transport.Replica, states)
	return err == nil
}

// SetBeforeStandinRecord makes a node built from c call f in each
// stand-in decision that admitted hits, between its store's count of them
// and its record's.
func SetBeforeStandinRecord(c *Config, f func()) { c.beforeStandinRecord = f }

// LeaseInterval is how often a key's rate is measured: a key checked
// ceil(Lease.Threshold × LeaseInterval) times in one is hot.
const LeaseInterval = leaseInterval

// ReturnsAfterHandoff counts the lease returns n held back until its
// hand-off states to their owner were delivered.
func (n *Node) ReturnsAfterHandoff() int64 { return n.leases.afterHandoff.Load() }

// LeaseRequestsInFlight counts the lease requests n has sent (or queued)
// and not had an answer to.
func (n *Node) LeaseRequestsInFlight() int {
	k := 0
	for i := range n.leases.shards {
		sh := &n.leases.shards[i]
		sh.mu.Lock()
		for _, h := range sh.hot {
			if h.asking {
				k++
			}
		}
		sh.mu.Unlock()
	}
	return k
}

// StandinParts returns a copy of the stand-in parts n holds for (name,
// key), and the generation of its own open part (0: none).
func (n *Node) StandinParts(name, key string) ([]limiter.SettlePart, uint64) {
	t := n.standins
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[debtKey{name, key}]
	if !ok {
		return nil, 0
	}
	return append([]limiter.SettlePart(nil), e.parts...), e.gen
}

// UnsettledHits returns the hits of (name, key) n admitted without the
// key's owner and has not settled, and how many of them its store counts.
func (n *Node) UnsettledHits(name, key string) (hits, stored int64) {
	n.debts.mu.Lock()
	defer n.debts.mu.Unlock()
	d, ok := n.debts.m[debtKey{name, key}]
	if !ok {
		return 0, 0
	}
	return d.req.Hits, d.stored
}

// ForceLeave makes n's serf tell every member that the member named left
// (serf's RemoveFailedNode): a node whose serf does not list that name
// keeps the leave intent as recent, as one does that a push/pull or a
// rebroadcast brings it after it forgot the member.
func (n *Node) ForceLeave(name string) error { return n.serf.RemoveFailedNode(name) }
