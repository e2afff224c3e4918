package cluster

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Settlement: the hits a node admits without a key's owner (the
// unreachable policies local and allow) are recorded here, per key, and
// charged to the owner's state once the owner decides again
// (settleCharge): a token bucket's, a leaky bucket's or GCRA's with
// limiter.Charge, which counts them past the capacity, a capacity a round;
// a window's as a check with DrainOverLimit, which consumes them, or what
// remains when they are more. A key that this node owns by then is
// settled where it is: hits admitted under PolicyLocal are in its store
// already, and those admitted under PolicyAllow are charged to it.
//
// Decisions a node makes as the owner of a key because the key's owner
// failed (each side of a partition) are recorded apart (standin.go) and
// travel with the key's state: the two sides' states meet by hand-off when
// the partition heals, each charged what the other admitted. Hits
// admitted on this node's store without the owner that are settled here
// while this node stands in for the owner go to that record too, and so
// do those of a key whose state this node sends before they are settled
// (withStoredParts): the state counts them, and carries them as a part.
//
// The record is bounded: maxDebtBytes in all, an entry counted as its
// name, its key and debtOverhead. Past the bound, the hits of a key not
// recorded yet are not recorded, and counted in SettleStats.Dropped: the
// owner never learns of them, as before settlement existed.

// maxDebtBytes bounds the record of hits to settle.
const maxDebtBytes = 1 << 20

// debtOverhead is what an entry of the record costs beside its name and
// key.
const debtOverhead = 160

// settleInterval is how often a node tries to settle what it holds.
const settleInterval = 50 * time.Millisecond

// debt is what a node admitted of one key without its owner.
type debt struct {
	req   limiter.Request // the key's last request; Hits is the hits to charge
	local bool            // some were admitted on this node's store (PolicyLocal)
	// stored is the hits of req.Hits admitted on this node's store, at
	// most req.Hits: a state of the key this node sends counts them
	// (takeStored).
	stored int64
}

type debtKey struct{ name, key string }

// debts is the record. Safe for concurrent use.
type debts struct {
	mu    sync.Mutex
	m     map[debtKey]*debt // guarded by mu
	bytes int64             // guarded by mu

	// storedKeys counts the entries of m with hits admitted on this
	// node's store (debt.stored); written under mu.
	storedKeys atomic.Int64
	// rounding is held by a settle round from the debts it takes to those
	// it puts back: a charge in flight is in no entry of m meanwhile.
	rounding sync.Mutex
	// inRound is set while a settle round runs, from before it takes the
	// debts: a state sent meanwhile waits for rounding (withStoredParts).
	inRound atomic.Bool

	wake                       chan struct{} // a debt was recorded
	recorded, settled, dropped atomic.Int64  // hits
}

func newDebts() *debts {
	return &debts{m: map[debtKey]*debt{}, wake: make(chan struct{}, 1)}
}

// add records hits of req admitted without the owner; local says they
// were admitted on this node's store.
func (t *debts) add(req *limiter.Request, hits int64, local bool) {
	if hits <= 0 {
		return
	}
	k := debtKey{req.Name, req.Key}
	t.mu.Lock()
	d, ok := t.m[k]
	if !ok {
		size := int64(len(k.name)+len(k.key)) + debtOverhead
		if t.bytes+size > maxDebtBytes {
			t.mu.Unlock()
			t.dropped.Add(hits)
			return
		}
		t.bytes += size
		d = &debt{}
		t.m[k] = d
	}
	owed := d.req.Hits
	d.req = *req
	d.req.Hits = owed + hits
	d.local = d.local || local
	if local {
		if d.stored == 0 {
			t.storedKeys.Add(1)
		}
		d.stored += hits
	}
	t.mu.Unlock()
	t.recorded.Add(hits)
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// take removes and returns every debt.
func (t *debts) take() []debt {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == 0 {
		return nil
	}
	out := make([]debt, 0, len(t.m))
	for k, d := range t.m {
		out = append(out, *d)
		delete(t.m, k)
	}
	t.bytes = 0
	t.storedKeys.Store(0)
	return out
}

// putBack records again debts that could not be settled.
func (t *debts) putBack(ds []debt) {
	for i := range ds {
		d := &ds[i]
		stored := min(d.stored, d.req.Hits)
		t.add(&d.req, stored, true)
		t.add(&d.req, d.req.Hits-stored, false)
		t.recorded.Add(-d.req.Hits) // recorded once already
	}
}

// takeStored removes from the debt of k the hits admitted on this
// node's store (PolicyLocal) and returns them with the key's last
// request; 0 when there are none. The rest of the debt, hits admitted
// without the store (PolicyAllow), stays to be charged to the owner.
func (t *debts) takeStored(k debtKey) (limiter.Request, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[k]
	if !ok || d.stored <= 0 {
		return limiter.Request{}, 0
	}
	hits := min(d.stored, d.req.Hits)
	req := d.req
	req.Hits = hits
	d.req.Hits -= hits
	d.stored, d.local = 0, false
	t.storedKeys.Add(-1)
	if d.req.Hits <= 0 {
		delete(t.m, k)
		t.bytes -= int64(len(k.name)+len(k.key)) + debtOverhead
	}
	return req, hits
}

// mayHoldStored reports whether some debt may hold hits admitted on this
// node's store, recorded or in a settle round's charges.
func (t *debts) mayHoldStored() bool { return t.storedKeys.Load() > 0 || t.inRound.Load() }

// SettleStats counts the hits admitted without their key's owner.
type SettleStats struct {
	Recorded int64 // hits recorded to be charged to their owner
	Settled  int64 // hits charged to their owner (or found in this node's store as the owner)
	Dropped  int64 // hits not recorded: the record was full
	// StandIn counts hits this node admitted standing in for a failed
	// owner, recorded to be charged wherever its state meets the owner's
	// (standin.go); Charged the hits of other nodes' stand-in records
	// that this node's store counts by a merge on receipt: at most what
	// the state that carried them still counted (a bucket's drained
	// hits, or a window's that have left it, are not), none of a state
	// expired on arrival, and a record seen again adds only its new hits;
	// StandInDropped the hits of stand-in records not kept, the record
	// being full (a part sent is charged all the same).
	StandIn, Charged, StandInDropped int64
	// StandInRefused counts the checks refused, standing in, because
	// the stand-in record had no room for their key (rather than admit
	// hits that would go uncounted); StandInForgotten the record's
	// entries forgotten to make room, whose parts were counted elsewhere.
	StandInRefused, StandInForgotten int64
	// StandInRefunded counts the hits that refunds through this node,
	// standing in, gave back off its own stand-in parts: the owner is
	// not charged them.
	StandInRefunded int64
}

func (t *debts) stats() SettleStats {
	return SettleStats{Recorded: t.recorded.Load(), Settled: t.settled.Load(), Dropped: t.dropped.Load()}
}

// settleStats returns the node's settlement counters, its stand-in
// record's (standin.go) included.
func (n *Node) settleStats() SettleStats {
	s := n.debts.stats()
	s.StandIn, s.Charged, s.StandInDropped = n.standins.counts()
	s.StandInRefused, s.StandInForgotten = n.standins.refusals()
	s.StandInRefunded = n.standins.refundedHits.Load()
	return s
}

// settleLoop settles the record every settleInterval while it holds
// anything, until the node closes.
func (n *Node) settleLoop() {
	for {
		select {
		case <-n.shutdown:
			return
		case <-n.debts.wake:
		}
		for {
			t := clocks.NewTimer(n.clock, settleInterval)
			select {
			case <-n.shutdown:
				t.Stop()
				return
			case <-t.C:
			}
			if n.settle() == 0 {
				break
			}
		}
	}
}

// settleHere settles hits of req that this node admitted on its store
// without the key's owner, now that it decides the key: as a decision,
// under the key's decide lock, so that a hand-off pass sees them. Standing
// in for the owner, it records them as its own (the owner's history lacks
// them as it lacks the stand-in's decisions). false: this node does not
// decide the key (any more), or stands in for its owner without room in
// its stand-in record: the debt waits for room or for the owner.
func (n *Node) settleHere(req *limiter.Request, hash uint64) bool {
	mu := n.handover.lock(hash)
	mu.RLock()
	defer mu.RUnlock()
	standingIn := n.standins.standingIn(hash) // before and after the ownership, as decideOwned
	if st, _ := n.handover.stateOf(hash); st != owned {
		return false
	}
	if standingIn || n.standins.standingIn(hash) {
		if !n.standins.reserve(req) {
			return false
		}
		n.standins.record(req, req.Hits)
	}
	return true
}

// maxSettleCapacities bounds the hits of a token bucket's, a leaky
// bucket's or GCRA's debt that are charged, in capacities of the key: past
// it, the key's state is held long enough (what more there is counts in
// SettleStats.Dropped).
const maxSettleCapacities = 64

// settleCharge returns the check that charges hits of req, a debt, to its
// key's owner in one round, the hits left for the next rounds, and those
// past maxSettleCapacities capacities, which are not charged. A token
// bucket's, a leaky bucket's or GCRA's goes with limiter.Charge, which
// counts them past the capacity, a capacity a round (a request holds no
// more); an owner of a build that does not know Charge drains the key
// instead. A window's goes with DrainOverLimit, at most the capacity in
// all: what a window counts past its limit admits nothing less.
func settleCharge(req *limiter.Request) (charge limiter.Request, rest, over int64) {
	charge = *req
	charge.Charged = limiter.Window{}
	c := max(charge.Capacity(), 1)
	if charge.Algorithm.HasBurst() {
		hits := charge.Hits
		if bound := c * maxSettleCapacities; hits > bound {
			over, hits = hits-bound, bound
		}
		charge.Hits = min(hits, c)
		charge.Behavior = limiter.Charge
		return charge, hits - charge.Hits, over
	}
	charge.Hits = min(charge.Hits, c) // more drains no more
	charge.Behavior = (charge.Behavior &^ (limiter.Reset | limiter.Refund)) | limiter.DrainOverLimit
	return charge, 0, 0
}

// charged counts the hits of d settled by a charge that leaves rest of
// them, and returns again with a debt of the rest appended.
func (n *Node) charged(d debt, rest int64, again []debt) []debt {
	n.debts.settled.Add(d.req.Hits - rest)
	if rest > 0 {
		d.req.Hits = rest
		again = append(again, d)
	}
	return again
}

// settle charges every debt to its key's owner and returns how many are
// still owed. A debt is charged only where the router sends checks now
// without waiting: here as the settled owner, or the owner's peer when its
// breaker lets a call through; the others wait for the next round. The
// charges are background traffic, counted in SettleStats only, not in the
// checks' counts and metrics.
func (n *Node) settle() int {
	n.debts.rounding.Lock()
	defer n.debts.rounding.Unlock()
	n.debts.inRound.Store(true)
	defer n.debts.inRound.Store(false)
	ds := n.debts.take()
	if len(ds) == 0 {
		return 0
	}
	type group struct {
		pick  pick
		reqs  []limiter.Request
		debts []debt
		rests []int64
	}
	var (
		groups map[string]*group
		again  []debt
	)
	for _, d := range ds {
		hash := ring.RouteHash(d.req.Name, d.req.Key)
		charge, rest, over := settleCharge(&d.req)
		if over > 0 {
			n.debts.dropped.Add(over)
			d.req.Hits -= over
		}
		p := n.router.pick(hash)
		if p.way == wayOwner && d.stored > 0 && n.standins.standsIn(hash, p.peer) && n.handStoredTo(p.peer, &d, hash) {
			if d.req.Hits <= 0 {
				n.router.release(&p)
				continue
			}
			charge, rest, _ = settleCharge(&d.req)
		}
		switch p.way {
		case wayHere:
			if d.local { // in this node's store already
				if !n.settleHere(&d.req, hash) {
					again = append(again, d)
					continue
				}
				n.debts.settled.Add(d.req.Hits)
				continue
			}
			// Standing in with no room in the stand-in record, the
			// charge waits: counted here unrecorded, it would be lost
			// when this state meets the owner's.
			if _, err, how := n.decideAsOwner(&charge, hash); how == decidedHere && err == nil {
				again = n.charged(d, rest, again)
				continue
			}
			again = append(again, d)
			continue
		case wayOwner:
		default:
			n.router.release(&p)
			again = append(again, d)
			continue
		}
		g := groups[p.peer]
		if g != nil {
			n.router.release(&p) // the group's call is the probe, if any
		} else {
			if groups == nil {
				groups = map[string]*group{}
			}
			g = &group{pick: p}
			groups[p.peer] = g
		}
		g.reqs = append(g.reqs, charge)
		g.debts = append(g.debts, d)
		g.rests = append(g.rests, rest)
	}
	ctx, cancel := clocks.WithTimeout(context.Background(), n.clock, n.cfg.HandoverTimeout)
	defer cancel()
	for _, g := range groups {
		rs := g.pick.client.CheckMany(ctx, g.reqs)
		n.router.done(&g.pick, batchErr(rs))
		for i, r := range rs {
			switch {
			case r.Err == nil && !r.Allowed && g.reqs[i].Behavior&limiter.Charge != 0:
				// A Charge is always admitted, unless refused by an owner
				// standing in with no room in its stand-in record.
				again = append(again, g.debts[i])
				continue
			case r.Err == nil:
			case errors.Is(r.Err, transport.ErrUnavailable), errors.Is(r.Err, transport.ErrNotOwner), callerGone(r.Err):
				again = append(again, g.debts[i])
				continue
			default: // the owner refused the request: it never will take it
				n.debts.dropped.Add(g.debts[i].req.Hits)
				continue
			}
			again = n.charged(g.debts[i], g.rests[i], again)
		}
	}
	n.debts.putBack(again)
	return len(again)
}

// withStoredParts makes the states of batches, read from this node's
// store to be sent (a hand-off, a copy for replicas, a leave), carry the
// hits of their keys that this node admitted on its store without the
// key's owner and has not settled yet (PolicyLocal): such a state counts
// them, and a charge to the owner or a part recorded later would count
// them again wherever the state wins a merge. For each such key, under
// its decide lock held exclusively (the policy admits on the store and
// records the debt under it shared, in unreachable), it takes those hits
// out of the record, reads the key's state again, which counts them, and
// adds them to this node's own part of the key (standins.addStoredLocked)
// before the parts are attached: the receiver merges the state as
// another history of the key, and every such hit counts once. It waits
// for a settle round under way, whose charges are in no debt meanwhile.
// A key whose hits find no room in the stand-in record keeps its debt,
// and its state is sent as read: counted twice, never lost.
func (n *Node) withStoredParts(batches ...map[string][]limiter.Snapshot) {
	if !n.debts.mayHoldStored() {
		return
	}
	n.debts.rounding.Lock()
	defer n.debts.rounding.Unlock()
	if n.debts.storedKeys.Load() == 0 {
		return
	}
	now := n.now()
	fresh := map[debtKey]*limiter.Snapshot{} // nil: sent as read
	for _, b := range batches {
		for _, states := range b {
			for i := range states {
				s := &states[i]
				if s.Settle != nil {
					continue // passed on as it was sent
				}
				k := debtKey{s.Name, s.Key}
				f, seen := fresh[k]
				if !seen {
					f = n.storedPart(k, now)
					fresh[k] = f
				}
				if f != nil {
					*s = *f
				}
			}
		}
	}
}

// storedPart moves the hits of k admitted on this node's store without
// the owner from the settlement record to this node's own stand-in part
// of k, and returns the key's state read with them; nil when k holds no
// such hits or they stay in the record (no room for the part, or the
// state is gone or of another algorithm). n.debts.rounding must be held.
func (n *Node) storedPart(k debtKey, now time.Time) *limiter.Snapshot {
	if n.debts.storedKeys.Load() == 0 {
		return nil
	}
	mu := n.handover.lock(ring.RouteHash(k.name, k.key))
	mu.Lock()
	defer mu.Unlock()
	t := n.standins
	t.mu.Lock()
	defer t.mu.Unlock()
	req, hits := n.debts.takeStored(k)
	if hits <= 0 {
		return nil
	}
	s, ok := n.store.Snapshot(k.name, k.key, now)
	if !ok || s.Algorithm != req.Algorithm || !t.addStoredLocked(k, &req, hits) {
		n.debts.putBack([]debt{{req: req, local: true, stored: hits}})
		return nil
	}
	n.debts.settled.Add(hits)
	return &s
}

// standsIn reports whether peer, the owner of the key of hash on this
// node's ring, decides it standing in for a member cut off, as this node
// sees the members cut off: the ring with them gives the key to another.
func (t *standins) standsIn(hash uint64, peer string) bool {
	r := t.full.Load()
	if r == nil {
		return false
	}
	m, ok := r.OwnerOfHash(hash)
	return ok && m.Name != peer
}

// handStoredTo settles the hits of d admitted on this node's store
// (d.stored) by handing the key's state to peer, the key's owner, which
// stands in for a member cut off: the hits go to this node's own part of
// the key (as withStoredParts does for a state sent), and the state,
// which counts them, carries the part. A charge would make them peer's
// own stand-in part, while this node's state counts them with no part:
// wherever that state met a history holding peer's part (peer's own, or
// the owner's after the heal), the part would be charged to it, and the
// hits counted twice. Handed with the part, they count once wherever the
// two meet. d keeps the rest of its hits (admitted without the store),
// to charge. false: the store holds no state of the key under the debt's
// algorithm (it counts the hits no more), or no room for the part (the
// charge may count them twice, never lose them); d is unchanged, to
// charge. n.debts.rounding must be held.
func (n *Node) handStoredTo(peer string, d *debt, hash uint64) bool {
	hits := min(d.stored, d.req.Hits)
	k := debtKey{d.req.Name, d.req.Key}
	mu := n.handover.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	s, ok := n.store.Snapshot(k.name, k.key, n.now())
	if !ok || s.Algorithm != d.req.Algorithm {
		return false
	}
	req := d.req
	req.Hits = hits
	t := n.standins
	t.mu.Lock()
	ok = t.addStoredLocked(k, &req, hits)
	t.mu.Unlock()
	if !ok {
		return false
	}
	states := []limiter.Snapshot{s}
	t.attachHandOff(states)
	n.attachGrants(states)
	n.transfers.outbox.handOff(peer, states)
	n.debts.settled.Add(hits)
	d.req.Hits -= hits
	d.stored, d.local = 0, false
	return true
}

// storedOf returns the key's last request with Hits set to the hits of k
// admitted on this node's store without the owner and not settled yet,
// which no other history of the key counts; nil when there are none.
// Read under the key's decide lock held exclusively, after any settle
// round under way (n.debts.rounding held), it is what the store counts
// of them: the policy admits and records under the lock held shared.
func (t *debts) storedOf(k debtKey) *limiter.Request {
	if t.storedKeys.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[k]
	if !ok || d.stored <= 0 {
		return nil
	}
	req := d.req
	req.Hits = min(d.stored, d.req.Hits)
	return &req
}
