package cluster

import (
	"time"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
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

// changesLoop takes the store's changes for the replicas every
// ReplicateInterval and, with a data directory, writes them there every
// PersistInterval (persist.go).
func (n *Node) changesLoop() {
	every := n.cfg.PersistInterval
	if n.cfg.Replicas > 1 && (n.persist == nil || n.cfg.ReplicateInterval < every) {
		every = n.cfg.ReplicateInterval
	}
	t := clocks.NewTicker(n.clock, every)
	defer t.Stop()
	owners := newOwnersCache(n.ring, n.cfg.Replicas)
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
			n.takeChanges(owners)
			if n.persist != nil {
				n.persist.tick(n.store, n.now())
			}
		}
	}
}

// takeChanges queues the changed keys this node owns for their replicas,
// and notes every changed key for the persister; the outbox sends the
// copies (and gives up on a batch after replicaAttempts failed calls: the
// next change sends the key again).
func (n *Node) takeChanges(owners *ownersCache) {
	batches := map[string][]limiter.Snapshot{}
	n.transfers.changedMu.Lock()
	if n.transfers.leaving.Load() {
		n.transfers.changedMu.Unlock()
		return
	}
	self, replicate := n.cfg.NodeName, n.cfg.Replicas > 1
	n.store.Changed(n.now(), func(s limiter.Snapshot) {
		if n.persist != nil {
			n.persist.note(s)
		}
		if !replicate {
			return
		}
		ms := owners.get(ring.RouteHash(s.Name, s.Key))
		if len(ms) == 0 || ms[0].Name != self {
			return // a copy held here, or a key decided without its owner
		}
		for _, m := range ms[1:] {
			batches[m.Name] = append(batches[m.Name], s)
		}
	})
	n.transfers.changedMu.Unlock()
	// A copy carries the parts read with its state, under the key's
	// decide lock, or none (attachConsistent): parts attached later may
	// count hits the state read does not (a stand-in decision recorded
	// or a hand-off merged meanwhile), which a replica, holding the parts
	// as counted, would never count. So the stored hits become this
	// node's own part before that read, and the leases' held hits are
	// charged to the states so read, keeping their parts.
	n.withStoredParts(batches)
	for _, states := range batches {
		n.attachConsistent(states)
	}
	if replicate && n.grants.active() {
		n.withHeldHits(batches, owners)
	}
	if f := n.cfg.afterChangesRead; f != nil {
		f()
	}
	for to, states := range batches {
		if _, ok := n.peers.Get(to); ok { // a member gone is no replica
			n.transfers.outbox.replicate(to, states)
		}
	}
}

// withHeldHits makes the states of batches, the copies for the replicas,
// count the hits that token bucket and GCRA leases of their keys hold
// apart from the bucket (grants.go), and adds the states of the keys
// leased such hits since the last copies: a replica that takes over from
// an owner killed hard then counts the hits the holders may have used,
// which the owner's bucket does not hold until the leases expire. They are
// charged now with what drains until their expiry (grant.enterEarly), and
// the copy names their grants (carry.go), for the replica that takes over
// to take the holders' returns. Hits given back to the owner are not
// taken off the copy (replicas merge by the larger): fewer admitted after
// a failover, never more.
func (n *Node) withHeldHits(batches map[string][]limiter.Snapshot, owners *ownersCache) {
	now := n.now()
	pending := n.grants.takeChanged()
	type copyOf struct {
		s       limiter.Snapshot
		charged bool
	}
	seen := map[uint64]copyOf{} // each key is looked at once, for every replica
	for _, states := range batches {
		for i := range states {
			s := &states[i]
			hash := ring.RouteHash(s.Name, s.Key)
			c, ok := seen[hash]
			if !ok {
				c.s, c.charged = n.heldSnapshot(hash, s, s.Name, s.Key, now)
				seen[hash] = c
				delete(pending, hash)
			}
			if c.charged {
				*s = c.s
			} else {
				n.attachGrants(states[i : i+1])
			}
		}
	}
	for hash, req := range pending {
		ms := owners.get(hash)
		if len(ms) == 0 || ms[0].Name != n.cfg.NodeName {
			continue
		}
		var sp *limiter.Snapshot
		if s, ok := n.store.Snapshot(req.Name, req.Key, now); ok {
			ss := []limiter.Snapshot{s}
			n.attachConsistent(ss)
			sp = &ss[0]
		}
		c, ok := n.heldSnapshot(hash, sp, req.Name, req.Key, now)
		if !ok {
			continue
		}
		for _, m := range ms[1:] {
			batches[m.Name] = append(batches[m.Name], c)
		}
	}
}

// heldSnapshot returns s (nil: a fresh state) of (name, key), of hash,
// with the hits that token bucket and GCRA leases of the key hold apart
// charged at now, and the parts read with s (leased hits are no part's);
// ok is false when none are held.
func (n *Node) heldSnapshot(hash uint64, s *limiter.Snapshot, name, key string, now time.Time) (limiter.Snapshot, bool) {
	mu := n.handover.lock(hash)
	mu.RLock()
	gm := n.grants.lock(hash)
	gm.Lock()
	gs, cur := n.grants.heldCopyLocked(hash)
	var carried []limiter.LeaseGrant
	if len(gs) > 0 {
		carried = n.grants.carryLocked(hash, name, key, now.UnixNano(), now.UnixNano())
	}
	gm.Unlock()
	mu.RUnlock()
	if len(gs) == 0 {
		return limiter.Snapshot{}, false
	}
	if n.heldScratch == nil {
		st, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, MaxEntries: 16, MaxBytes: 1 << 20})
		if err != nil {
			return limiter.Snapshot{}, false
		}
		n.heldScratch = st
	}
	scratch := n.heldScratch
	defer scratch.Forget(name, key)
	if s != nil {
		if _, err := scratch.Merge([]limiter.Snapshot{*s}, now); err != nil {
			return limiter.Snapshot{}, false
		}
	}
	for i := range gs {
		gs[i].enterEarly(scratch, now, &cur)
	}
	c, ok := scratch.Snapshot(name, key, now)
	c.Grants = carried
	if s != nil {
		c.Settle = s.Settle
	}
	return c, ok
}

// attachConsistent reads again, each under its key's decide lock, the
// states of ss whose keys have an entry in the stand-in record (parts of
// any algorithm, or a stand-in decision's reserve), and attaches the
// parts to them (standins.attachParts), for copies of the keys: the only
// parts a copy carries. A stand-in decision counts its hits in the store
// and then records them as its part, under its key's decide lock held
// shared, and a merge of a state with parts charges the store and keeps
// the parts under it held alone: a state read apart from its parts may
// count hits its parts do not (the receiver takes them for history
// before the cut, and a merge that keeps the other history loses them),
// or parts may count hits the state does not, and a receiver charges a
// part at most what the state sent counts while it holds the part as
// counted, so that a state carrying little beside its parts (a stand-in
// that held no copy) lost those hits for good, and a replica holding its
// own part as counted was charged nothing for a state that did not count
// it. Read together, the two count the same hits. A state whose key has
// no entry goes without parts: an entry made after the look comes of a
// decision or a merge the state read does not count either.
func (n *Node) attachConsistent(ss []limiter.Snapshot) { n.attachConsistentParts(ss, false) }

// attachConsistentHandOff is attachConsistent for a hand-off to the keys'
// next owners (standins.attachHandOff). The hand-off pass and a leave
// read their states apart from the decide locks: a state with parts
// merged meanwhile (a copy from the key's owner on this side, which still
// decides it standing in) grew the parts past what the state read counts,
// and the owner, charged a part at most what the state sent counts and
// holding it as counted, lost the difference wherever its own history
// was the larger.
func (n *Node) attachConsistentHandOff(ss []limiter.Snapshot) { n.attachConsistentParts(ss, true) }

// attachConsistentParts reads again, under its key's decide lock, each
// state of ss that carries no settlement and whose key has an entry in
// the stand-in record, and attaches its parts (standins.attachParts).
func (n *Node) attachConsistentParts(ss []limiter.Snapshot, handOff bool) {
	if n.standins.entries.Load() == 0 {
		return
	}
	now := n.now()
	for i := range ss {
		s := &ss[i]
		if s.Settle != nil || !n.standins.hasEntry(s.Name, s.Key) {
			continue
		}
		mu := n.handover.lock(ring.RouteHash(s.Name, s.Key))
		mu.Lock()
		if fresh, ok := n.store.Snapshot(s.Name, s.Key, now); ok && fresh.Algorithm == s.Algorithm {
			*s = fresh
		}
		n.standins.attachParts(ss[i:i+1], handOff)
		mu.Unlock()
	}
}
