package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Hand-off: when the ring changes, a node sends the state of every key whose
// owner changed, that it owned or held as a replica and no longer owns, to
// the key's new owner, which merges it (the more consumed state wins, so a
// state sent twice or late changes nothing), and then confirms the new
// membership to every other member (handover.go). A node that becomes a
// key's owner, or whose key gets a new replica, copies the key to its new
// replicas. A graceful Leave hands everything off first (leaveHandoff).
// All of it goes through the outbox (outbox.go): one queue and worker per
// peer, one retry policy.

// TransferStats counts key states sent to and taken from other nodes.
type TransferStats struct {
	HandedOff  int64 // key states delivered to their new owner
	Replicated int64 // key states delivered to replicas
	Failures   int64 // Transfer calls that failed
	GivenUp    int64 // hand-off states not delivered in time, given up
	Merged     int64 // states received that changed this node's store
	Rejected   int64 // states received that were invalid
	// HandoffPasses counts hand-off passes run after ring changes.
	HandoffPasses int64
}

// transfers is the state hand-off and replication share.
type transfers struct {
	// ctx is cancelled by Close: it ends the transfers in flight.
	ctx    context.Context
	cancel context.CancelFunc
	// wake holds one pending ring change for the hand-off loop, which
	// coalesces any number of changes into one pass.
	wake chan struct{}
	// prev is the ring membership the last hand-off pass planned against;
	// only the hand-off loop touches it.
	prev []ring.Member
	// adopted holds the ring memberships this node adopted since the last
	// hand-off pass took them (noteAdopted, takeAdopted), each once, at
	// most maxAdopted: a pass that coalesces several ring changes plans
	// from each of them too, since this node may have decided keys as
	// their owner under one of them (a partition that heals before the
	// pass runs: the ring is the previous pass's again).
	adoptedMu sync.Mutex
	adopted   [][]ring.Member
	// passed is the fingerprint of the membership the last hand-off pass
	// planned against, set once it queued its states, and 0 while a pass
	// runs: until it is the ring's, a pass is to come (handingOff).
	passed atomic.Uint64
	// outbox carries hand-off states, copies and confirmations to each
	// peer.
	outbox *outbox

	// foreign holds hand-off states received for keys this node's ring
	// gives another node (a leaving node's ring was older than this
	// one's), for the hand-off loop to pass on; on a leaving node, every
	// hand-off state it received, for Leave to pass on.
	foreignMu sync.Mutex
	foreign   []foreignState
	// sealed is set, under foreignMu, once a leaving node has passed on
	// the last of the states it held: it refuses hand-off states from
	// then on, and their senders send them elsewhere (leaveHandoff).
	sealed bool

	// changedMu serialises calls to Store.Changed.
	changedMu sync.Mutex
	// leaving is set when Leave begins, under changedMu: from then on
	// Leave alone hands off, to the owners on the ring without this node,
	// and takes the store's changes.
	leaving atomic.Bool
	// lastPass is set, under passMu, when Leave is about to send its last
	// states: the hand-off loop, which runs its passes during a leave
	// under passMu, sends nothing more, and what its passes left to pass
	// on is Leave's.
	passMu   sync.Mutex
	lastPass atomic.Bool

	handedOff, replicated, failures, givenUp, merged, rejected, passes atomic.Int64
}

func newTransfers() transfers {
	ctx, cancel := context.WithCancel(context.Background())
	return transfers{ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
}

// wakeHandoff tells the hand-off loop that the ring changed. It never
// blocks.
func (t *transfers) wakeHandoff() {
	select {
	case t.wake <- struct{}{}:
	default: // a pass is already pending and will see this change
	}
}

// maxForeign bounds the hand-off states held for other nodes.
const maxForeign = 100_000

// maxAdopted bounds the memberships a hand-off pass plans from beside its
// previous one; beyond it the oldest are dropped.
const maxAdopted = 32

// noteAdopted records members, a membership the ring adopted, for the
// next hand-off pass.
func (t *transfers) noteAdopted(members []ring.Member) {
	t.adoptedMu.Lock()
	defer t.adoptedMu.Unlock()
	for _, ms := range t.adopted {
		if slices.Equal(ms, members) {
			return
		}
	}
	if len(t.adopted) >= maxAdopted {
		t.adopted = slices.Delete(t.adopted, 0, 1)
	}
	t.adopted = append(t.adopted, members)
}

// adoptedPending reports whether memberships wait for a hand-off pass.
func (t *transfers) adoptedPending() bool {
	t.adoptedMu.Lock()
	defer t.adoptedMu.Unlock()
	return len(t.adopted) > 0
}

// handingOff reports whether this node may still hand the member named
// to a key state it holds: a ring change waits for its hand-off pass, or
// states queued for to are not delivered yet. A closed node hands off
// nothing more.
func (n *Node) handingOff(to string) bool {
	if n.closed.Load() {
		return false
	}
	// In this order: a pass clears passed before it takes the adopted
	// memberships, and queues its states before it sets passed.
	return n.transfers.adoptedPending() ||
		n.transfers.passed.Load() != ring.Fingerprint(n.ring.Members()) ||
		n.transfers.outbox.handingOff(to)
}

// takeAdopted returns the memberships noteAdopted recorded other than
// prev and cur, and forgets them all.
func (t *transfers) takeAdopted(prev, cur []ring.Member) [][]ring.Member {
	t.adoptedMu.Lock()
	defer t.adoptedMu.Unlock()
	via := slices.DeleteFunc(t.adopted, func(ms []ring.Member) bool {
		return slices.Equal(ms, prev) || slices.Equal(ms, cur)
	})
	t.adopted = nil
	return via
}

// foreignState is a hand-off state received from the node named from for a
// key this node's ring gives another node.
type foreignState struct {
	from  string
	state limiter.Snapshot
}

// addForeign keeps states for the hand-off loop to pass on, and wakes it
// when wake is set. States beyond maxForeign are dropped: the receiver
// merged them, and its ring may yet give it their keys.
func (t *transfers) addForeign(states []foreignState, wake bool) {
	t.foreignMu.Lock()
	k := min(len(states), maxForeign-len(t.foreign))
	t.foreign = append(t.foreign, states[:max(k, 0)]...)
	t.foreignMu.Unlock()
	if wake {
		t.wakeHandoff()
	}
}

// holdOrphans keeps hand-off states the outbox could not give to a member
// that left, for the hand-off loop to send to their keys' owners now.
func (t *transfers) holdOrphans(states []limiter.Snapshot, wake bool) {
	if len(states) == 0 {
		return
	}
	held := make([]foreignState, len(states))
	for i, s := range states {
		held[i] = foreignState{state: s}
	}
	t.addForeign(held, wake)
}

// takeForeign returns the states held for other nodes and forgets them.
func (t *transfers) takeForeign() []foreignState {
	t.foreignMu.Lock()
	defer t.foreignMu.Unlock()
	f := t.foreign
	t.foreign = nil
	return f
}

// takeForeignOrSeal is takeForeign for a leaving node's last passes: when
// no state is held it seals the node, which takes no hand-off state
// after that (holdLeaving); with seal set it seals in any case.
func (t *transfers) takeForeignOrSeal(seal bool) []foreignState {
	t.foreignMu.Lock()
	defer t.foreignMu.Unlock()
	f := t.foreign
	t.foreign = nil
	if len(f) == 0 || seal {
		t.sealed = true
	}
	return f
}

// holdLeaving keeps the hand-off states a leaving node takes for its last
// passes to pass on, all of them, whatever its ring says. It holds
// nothing and says why once the node is sealed (the states would be lost
// with it) or would hold more than maxForeign: the sender keeps them.
func (t *transfers) holdLeaving(states []foreignState) error {
	t.foreignMu.Lock()
	defer t.foreignMu.Unlock()
	switch {
	case t.sealed:
		return errors.New("it is leaving and has passed on its last key states")
	case len(t.foreign)+len(states) > maxForeign:
		return fmt.Errorf("it is leaving and holds %d key states to pass on, at most %d", len(t.foreign), maxForeign)
	}
	t.foreign = append(t.foreign, states...)
	return nil
}

// foreignToSend returns the held states whose key the ring gives neither
// this node nor the node that sent them, and holds the others back: a key
// the ring still gives its sender, a leaving node, waits until the ring
// drops the sender; one it gives this node is merged already.
func (n *Node) foreignToSend() []limiter.Snapshot {
	var send []limiter.Snapshot
	var stay []foreignState
	for _, f := range n.transfers.takeForeign() {
		switch o, ok := n.ring.Owner(f.state.Name, f.state.Key); {
		case !ok || o.Name == n.cfg.NodeName:
		case o.Name == f.from:
			stay = append(stay, f)
		default:
			send = append(send, f.state)
		}
	}
	if len(stay) > 0 {
		n.transfers.addForeign(stay, false)
	}
	return send
}

func (t *transfers) stats() TransferStats {
	return TransferStats{
		HandedOff:     t.handedOff.Load(),
		Replicated:    t.replicated.Load(),
		Failures:      t.failures.Load(),
		GivenUp:       t.givenUp.Load(),
		Merged:        t.merged.Load(),
		Rejected:      t.rejected.Load(),
		HandoffPasses: t.passes.Load(),
	}
}

// startTransfers starts the hand-off loop and, with replicas or a data
// directory, the changes loop.
func (n *Node) startTransfers() {
	n.goFunc(n.handoffLoop)
	if n.cfg.Replicas > 1 || n.persist != nil {
		n.goFunc(n.changesLoop)
	}
}

func (n *Node) handoffLoop() {
	var expire *clocks.Timer // the hand-over's timeout, on the node's clock
	never := make(chan struct{})
	expired := func() <-chan struct{} {
		if expire == nil {
			return never
		}
		return expire.C
	}
	defer func() { expire.Stop() }()
	// While members' confirmations are awaited, they are asked for again
	// on the system's timer, whatever the node's clock does (liveness):
	// reaskFirst after the membership changed, then at intervals doubling
	// to reaskMax. Other wakes leave a running wait as it is.
	var (
		ask      *time.Timer
		askFP    uint64
		askEvery time.Duration
	)
	asked := func() <-chan time.Time {
		if ask == nil {
			return nil
		}
		return ask.C
	}
	stopAsk := func() {
		if ask != nil {
			ask.Stop()
			ask = nil
		}
	}
	defer stopAsk()
	armAsk := func(fired bool) {
		if fp := n.handover.fingerprint(); fp != askFP {
			stopAsk()
			askFP, askEvery = fp, reaskFirst
		} else if fired {
			ask, askEvery = nil, min(2*askEvery, reaskMax)
		}
		switch {
		case len(n.handover.unconfirmed()) == 0:
			stopAsk()
		case ask == nil:
			ask = time.NewTimer(askEvery)
		}
	}
	armExpire := func() {
		expire.Stop()
		expire = nil
		if at := n.handover.expire(n.now()); !at.IsZero() {
			expire = clocks.NewTimer(n.clock, at.Sub(n.now()))
		}
	}
	// While members that left while cut off alone are held (update),
	// a confirmation that settles the membership, or the outbox's
	// hand-off draining, may let it go (releaseGone).
	goneWake := func() (<-chan struct{}, <-chan struct{}) {
		if !n.standins.holdsOnlyGone() {
			return nil, nil
		}
		_, drained := n.transfers.outbox.pendingHandoff()
		return n.handover.wake(), drained
	}
	for {
		n.releaseGone()
		settledWake, drainedWake := goneWake()
		select {
		case <-n.shutdown:
			return
		case <-settledWake:
		case <-drainedWake:
		case <-n.transfers.wake:
			if n.transfers.leaving.Load() {
				// Leave hands off every state on its own; a membership
				// that changes meanwhile (a join during a leave) still
				// gets what moved and this node's confirmation, so that
				// its new owners need not wait for the leave to end,
				// until Leave's last pass.
				n.transfers.passMu.Lock()
				if !n.transfers.lastPass.Load() {
					n.handoffPass(nil)
				}
				n.transfers.passMu.Unlock()
			} else {
				n.handoffPass(n.foreignToSend())
			}
			armExpire()
			armAsk(false)
		case <-expired():
			armExpire()
			armAsk(false)
		case <-asked():
			n.askConfirmations()
			armAsk(true)
		}
	}
}

// releaseGone rebuilds the ring, so that standins.update lets the members
// that left while cut off go, once it holds only those and the hand-over of the
// current membership is settled (goneSettled).
func (n *Node) releaseGone() {
	if n.standins.holdsOnlyGone() && n.goneSettled(n.ring.Members()) {
		n.rebuild(0)
	}
}

// goneSettled reports whether the hand-over of members, the membership
// the node routes over, is over: the hand-off pass of members has queued
// its states (with their parts) and the outbox delivered them, and every
// other member confirmed members, having delivered every state it owed
// this node (not the hand-over's timeout: the states may not have come).
// The states of keys that a member which left while cut off
// handed to the members of its side are then merged with this node's, as
// two histories: from then on this node's state of each key it owns is
// the key's only history, and the member need not be stood in for.
func (n *Node) goneSettled(members []ring.Member) bool {
	if n.transfers.passed.Load() != ring.Fingerprint(members) || n.handover.fingerprint() != ring.Fingerprint(members) {
		return false
	}
	if queued, _ := n.transfers.outbox.pendingHandoff(); queued > 0 {
		return false
	}
	return n.handover.confirmedByAll() && n.handover.ownsAllSettled()
}

// reaskFirst and reaskMax bound the interval, on the system's timer, at
// which a node asks the members it awaits for their hand-over
// confirmation again.
const (
	reaskFirst = time.Second
	reaskMax   = 30 * time.Second
)

// askConfirmations sends each member whose confirmation of the current
// membership this node awaits this node's own confirmation again, asking
// for theirs back (stateSink.HandoffDone): a member that delivered its
// confirmation while this node routed over another membership, which set
// it aside, sends it again. Only a confirmation this node delivered, with
// nothing given up since, is sent again.
func (n *Node) askConfirmations() {
	fp := n.handover.fingerprint()
	for _, name := range n.handover.unconfirmed() {
		n.transfers.outbox.reconfirm(name, fp, true)
	}
}

// byOwner groups states by their owner on the current ring, leaving out
// those this node owns now; later holds those whose owner is leaving or
// gone, to be sent once the ring has moved on.
func (n *Node) byOwner(states []limiter.Snapshot) (out map[string][]limiter.Snapshot, later []limiter.Snapshot) {
	out = map[string][]limiter.Snapshot{}
	departing := map[string]bool{}
	for _, s := range states {
		o, ok := n.ring.Owner(s.Name, s.Key)
		if !ok || o.Name == n.cfg.NodeName {
			continue
		}
		d, seen := departing[o.Name]
		if !seen {
			d = n.departing(o.Name)
			departing[o.Name] = d
		}
		if d {
			later = append(later, s)
			continue
		}
		out[o.Name] = append(out[o.Name], s)
	}
	return out, later
}

// handoffPass plans against the membership of the previous pass, those
// the ring adopted since, and the current one and queues, for each other
// member, the states of the keys that moved to it (and states received for
// another node's keys, to their owners now), then the confirmation of the
// current membership: the outbox sends a member's confirmation only after
// its states.
//
// The pass begins with a barrier: every decision made as owner under the
// previous ring has ended, and later ones see the current ring, so the
// states it reads hold everything this node admitted as their owner.
func (n *Node) handoffPass(received []limiter.Snapshot) {
	if f := n.cfg.beforeHandoffPass; f != nil {
		f()
	}
	// A pass under way is a pass to come, until its states are queued.
	n.transfers.passed.Store(0)
	cur := n.ring.Members()
	prev := n.transfers.prev
	via := n.transfers.takeAdopted(prev, cur)
	handoff, later := n.byOwner(received)
	n.holdFor(later)
	defer n.transfers.passed.Store(ring.Fingerprint(cur))
	if slices.Equal(prev, cur) && len(via) == 0 {
		for to, states := range handoff {
			n.transfers.outbox.handOff(to, states)
		}
		return
	}
	n.transfers.prev = cur
	defer n.transfers.passes.Add(1)
	n.handover.barrier()
	n.grants.flush(n.handover, n.store, n.now())
	if len(prev) > 0 && len(cur) > 0 {
		oldR, err := n.ringOf(prev)
		var newR *ring.Ring
		if err == nil {
			newR, err = n.ringOf(cur)
		}
		viaR := make([]*ring.Ring, 0, len(via))
		for _, ms := range via {
			if err != nil || len(ms) == 0 {
				continue
			}
			var r *ring.Ring
			if r, err = n.ringOf(ms); err == nil {
				viaR = append(viaR, r)
			}
		}
		if err != nil {
			n.logger.Error("cluster: hand-off skipped: cannot rebuild ring", "err", err)
		} else {
			moved, replica := n.planHandoff(oldR, newR, viaR)
			n.withStoredParts(moved, replica)
			if f := n.cfg.afterHandoffRead; f != nil {
				f()
			}
			for to, states := range moved {
				n.attachConsistentHandOff(states)
				n.attachGrants(states)
				handoff[to] = append(handoff[to], states...)
			}
			for to, states := range replica {
				n.attachConsistent(states)
				n.attachGrants(states)
				n.transfers.outbox.replicate(to, states)
			}
		}
	}
	fp := ring.Fingerprint(cur)
	for _, m := range cur {
		if m.Name != n.cfg.NodeName {
			n.transfers.outbox.handOff(m.Name, handoff[m.Name])
			n.transfers.outbox.confirmTo(m.Name, fp, n.handover.awaits(m.Name, fp))
		}
	}
}

// holdFor keeps states whose key's owner is leaving until the ring drops
// it (see foreignToSend).
func (n *Node) holdFor(states []limiter.Snapshot) {
	if len(states) == 0 {
		return
	}
	held := make([]foreignState, 0, len(states))
	for _, s := range states {
		if o, ok := n.ring.Owner(s.Name, s.Key); ok {
			held = append(held, foreignState{from: o.Name, state: s})
		}
	}
	n.transfers.addForeign(held, false)
}

// ringOf builds a ring over members with the node's ring config.
func (n *Node) ringOf(members []ring.Member) (*ring.Ring, error) {
	r, err := ring.New(n.cfg.Ring)
	if err != nil {
		return nil, err
	}
	return r, r.SetMembers(members)
}

// planHandoff returns, by member name, the states to hand off to new owners
// and those to copy to new replicas, going from oldR and the rings of
// via, adopted in between, to newR:
//   - a key whose owner changed and that this node owned or held as a
//     replica in oldR or in a ring of via, and does not own in newR, goes
//     to its new owner;
//   - a key this node owns in newR goes to its replicas in newR that were
//     not among its owner and replicas in oldR.
func (n *Node) planHandoff(oldR, newR *ring.Ring, via []*ring.Ring) (handoff, replica map[string][]limiter.Snapshot) {
	handoff, replica = map[string][]limiter.Snapshot{}, map[string][]limiter.Snapshot{}
	self, r := n.cfg.NodeName, n.cfg.Replicas
	olds, news := newOwnersCache(oldR, r), newOwnersCache(newR, r)
	vias := make([]*ownersCache, len(via))
	for i, v := range via {
		vias[i] = newOwnersCache(v, r)
	}
	// moved reports whether the key of h, of owners now in newR, had
	// another owner in c, this node among its owners and replicas there.
	moved := func(c *ownersCache, h uint64, now []ring.Member) bool {
		was := c.get(h)
		return len(was) > 0 && was[0].Name != now[0].Name && hasMember(was, self)
	}
	n.store.Range(n.now(), func(s limiter.Snapshot) bool {
		h := ring.RouteHash(s.Name, s.Key)
		now := news.get(h)
		if now[0].Name == self {
			was := olds.get(h)
			for _, m := range now[1:] {
				if !hasMember(was, m.Name) {
					replica[m.Name] = append(replica[m.Name], s)
				}
			}
			return true
		}
		if moved(olds, h, now) {
			handoff[now[0].Name] = append(handoff[now[0].Name], s)
			return true
		}
		for _, c := range vias {
			if moved(c, h, now) {
				handoff[now[0].Name] = append(handoff[now[0].Name], s)
				break
			}
		}
		return true
	})
	return handoff, replica
}

// ownersCache answers ring.OwnersOfHash(h, n) of one ring version once per
// partition: owners depend on the partition only.
type ownersCache struct {
	r       *ring.Ring
	n       int
	version uint64
	parts   [][]ring.Member
}

func newOwnersCache(r *ring.Ring, n int) *ownersCache {
	return &ownersCache{r: r, n: n, version: r.Version(), parts: make([][]ring.Member, r.Config().PartitionCount)}
}

// get returns the owner and replicas of the partition of h: at least one
// member when the ring has any, nil otherwise.
func (c *ownersCache) get(h uint64) []ring.Member {
	if v := c.r.Version(); v != c.version { // the ring changed: start over
		c.version = v
		clear(c.parts)
	}
	p := h % uint64(len(c.parts))
	if c.parts[p] == nil {
		c.parts[p] = c.r.OwnersOfHash(h, c.n)
	}
	return c.parts[p]
}

func hasMember(ms []ring.Member, name string) bool {
	return slices.ContainsFunc(ms, func(m ring.Member) bool { return m.Name == name })
}

// outboxNode makes the outbox's calls through the node's peer clients.
type outboxNode struct{ n *Node }

var _ outboxCalls = outboxNode{}

func (o outboxNode) transfer(ctx context.Context, to string, reason transport.TransferReason, states []limiter.Snapshot) error {
	c, ok := o.n.peers.Get(to)
	if !ok {
		return fmt.Errorf("%w: no client for member %s", transport.ErrUnavailable, to)
	}
	_, rejected, err := c.Transfer(ctx, reason, states)
	if err != nil {
		o.n.logger.Warn("cluster: transfer failed", "to", to, "reason", reason, "states", len(states), "err", err)
		return err
	}
	if rejected > 0 {
		o.n.logger.Warn("cluster: peer rejected key states", "to", to, "reason", reason, "rejected", rejected)
	}
	return nil
}

func (o outboxNode) confirm(ctx context.Context, to string, fp uint64, wantBack bool) error {
	c, ok := o.n.peers.Get(to)
	if !ok {
		return fmt.Errorf("%w: no client for member %s", transport.ErrUnavailable, to)
	}
	if err := c.HandoffDone(ctx, fp, wantBack, o.n.standins.cutReport()); err != nil {
		o.n.logger.Warn("cluster: hand-over confirmation failed", "to", to, "err", err)
		return err
	}
	return nil
}

// leaveHandoff hands every key this node holds to its owner on the ring
// without this node, then leaves serf. Pass 1 sends every live key while
// the node still serves. Then the node stops deciding: local checks get
// ErrClosed and forwarded ones transport.ErrNotOwner, which their senders
// route again once their rings have dropped this node; a barrier lets the
// decisions in progress end. Pass 2 sends what changed since pass 1 (every
// live key again when the store does not track changes), and only then
// does the node leave serf and stop serving peers, so no other node
// decides one of its keys before the key's whole state has reached the new
// owner. Both passes run within Config.LeaveTimeout. Hand-off states
// other nodes send it meanwhile (another node leaving at the same time)
// it passes on last, and once it has none left it refuses more, so that
// their senders send them to the owners without it. A pass that finds no
// other member in the ring while members are cut off (declared failed for
// a moment as a partition heals, say) waits for one within LeaveTimeout
// too (awaitOthers).
//
// A node whose ring holds itself alone while members it routed to are cut
// off (a partition, or members killed hard) is not the cluster's last
// member: its states, and the stand-in parts they carry, belong to those
// members. It first waits, serving as before, until one of them is a
// member of its ring again (awaitCutOff), and then hands off as any node
// does; all of it within LeaveTimeout.
//
// What may still be lost: states whose transfer failed or did not finish
// within LeaveTimeout (the error wraps ErrHandoff), states with no member
// left to go to unless Config.DataDir keeps them (with members cut off
// until LeaveTimeout ended, the error wraps ErrHandoff and names them, with
// DataDir or without), and checks that reach this node after its gRPC
// server stopped, which their senders decide under their unreachable
// policy.
func (n *Node) leaveHandoff() error {
	ctx, cancel := clocks.WithTimeout(n.transfers.ctx, n.clock, n.cfg.LeaveTimeout)
	defer cancel()
	n.awaitCutOff(ctx)
	track := n.cfg.Replicas > 1
	n.transfers.changedMu.Lock()
	n.transfers.leaving.Store(true)
	if track {
		n.store.Changed(n.now(), func(limiter.Snapshot) {}) // pass 1 covers these
	}
	n.transfers.changedMu.Unlock()
	// A stand-in decision records its hits after its store counts them:
	// one in progress now may have changed its key before the changes
	// were taken above, and pass 2 would not send the key again. Pass 1
	// reads the states once such decisions have ended, and their parts
	// with them.
	n.handover.barrier()

	givenUp := n.transfers.givenUp.Load()
	var lost int
	// Each pass sends to the owners on the ring of the members other than
	// this node at that time: one that left meanwhile gets nothing.
	var unrouted int // states with no member to go to
	var cut []string // the members cut off when states had none
	// sentTo is the members of the last pass's target ring, and one
	// whether every pass since the last of all states had that target.
	var sentTo []ring.Member
	one := true
	// A pass of this node's own states (own) makes them carry the hits
	// its store admitted without their owners (withStoredParts).
	pass := func(own bool, collect func(add func(s limiter.Snapshot, not string))) {
		others := n.awaitOthers(ctx)
		if sentTo != nil && !slices.Equal(sentTo, others) {
			one = false
		}
		sentTo = others
		var target *ring.Ring
		if len(others) > 0 {
			var err error
			if target, err = n.ringOf(others); err != nil {
				n.logger.Error("cluster: leave without hand-off: cannot build ring", "err", err)
				target = nil
			}
		}
		if target == nil {
			before := unrouted
			collect(func(limiter.Snapshot, string) { unrouted++ })
			if unrouted > before {
				cut = n.cutOff(n.ring.Members())
			}
			return
		}
		batches := map[string][]limiter.Snapshot{}
		// A state received from a member that the target ring gives
		// its key goes to the owner on the ring without that member
		// too: it came from a node that is leaving as well (else it
		// would not have sent it here), which would send it back.
		without := map[string]*ring.Ring{}
		collect(func(s limiter.Snapshot, not string) {
			o, ok := target.Owner(s.Name, s.Key)
			if ok && o.Name == not && len(others) > 1 {
				r, seen := without[not]
				if !seen {
					r, _ = n.ringOf(slices.DeleteFunc(slices.Clone(others), func(m ring.Member) bool { return m.Name == not }))
					without[not] = r
				}
				if r != nil {
					o, ok = r.Owner(s.Name, s.Key)
				}
			}
			if ok {
				batches[o.Name] = append(batches[o.Name], s)
			}
		})
		if own {
			n.withStoredParts(batches)
		}
		for to, states := range batches {
			n.attachConsistentHandOff(states)
			n.attachGrants(states)
			n.transfers.outbox.handOff(to, states)
		}
		lost = n.transfers.outbox.waitHandedOff(ctx)
	}
	n.grants.flush(n.handover, n.store, n.now())
	all := func(f func(limiter.Snapshot, string)) {
		n.store.Range(n.now(), func(s limiter.Snapshot) bool { f(s, ""); return true })
	}
	pass(true, all)
	// Whether this node alone decided the keys it owns: then, once its
	// states are delivered, they are whole on their new owners.
	sole := n.handover.ownsAllSettled()
	// Stop deciding: local checks get ErrClosed, and forwarded ones
	// ErrNotOwner, so that their senders route them again once their
	// rings have dropped this node, to owners that hold its states.
	n.closed.Store(true)
	n.handover.setReady(false, n.now())
	n.handover.barrier()
	n.grants.flush(n.handover, n.store, n.now())
	if track {
		pass(true, func(f func(limiter.Snapshot, string)) {
			n.transfers.changedMu.Lock()
			defer n.transfers.changedMu.Unlock()
			n.store.Changed(n.now(), func(s limiter.Snapshot) { f(s, "") })
		})
	} else {
		pass(true, all)
	}
	n.transfers.passMu.Lock()
	n.transfers.lastPass.Store(true)
	n.transfers.passMu.Unlock()
	// A member that joined or left meanwhile (the passes went to owners on
	// different rings, or the ring changed since the last one): every
	// state goes again to the owners on the ring without this node now,
	// which the departure below confirms. A state sent to an owner on an
	// older ring reaches the owner on the new one only through the
	// receiver's own hand-off, which a departure must not wait for.
	for range 3 {
		if ctx.Err() != nil || (one && !n.ringChangedSince(sentTo)) {
			break
		}
		sentTo, one = nil, true
		pass(true, all)
	}
	// States the outbox took back from members that left meanwhile, and
	// states other nodes handed here, go to their owners on the target
	// ring too, until none is held: then the node is sealed and refuses
	// hand-off states, which their senders keep until their rings drop
	// this node and send to the owners without it. What is still held
	// when LeaveTimeout ends is lost.
	for ctx.Err() == nil {
		held := n.transfers.takeForeignOrSeal(false)
		if len(held) == 0 {
			break
		}
		pass(false, func(f func(limiter.Snapshot, string)) {
			for _, h := range held {
				f(h.state, h.from)
			}
		})
	}
	lost += len(n.transfers.takeForeignOrSeal(true)) + int(n.transfers.givenUp.Load()-givenUp)
	if sole && one && lost == 0 && ctx.Err() == nil && !n.ringChangedSince(sentTo) {
		n.confirmDeparture(ctx, sentTo)
	}
	var cutErr error
	switch {
	case unrouted > 0 && len(cut) > 0:
		// Not the last member: the members cut off own these states.
		kept := ", lost"
		if n.persist != nil {
			kept = ", kept in the data directory" // Close writes them
		}
		cutErr = fmt.Errorf("%w: %d key states not delivered to members cut off until the leave timeout: %s%s",
			ErrHandoff, unrouted, strings.Join(cut, ", "), kept)
		n.logger.Warn("cluster: leave: members cut off until the leave timeout; key states not delivered",
			"states", unrouted, "members", cut, "data_dir", n.persist != nil)
	case n.persist == nil:
		lost += unrouted
	case unrouted > 0:
		// The last member: Close writes them to the data directory.
		n.logger.Info("cluster: no member left to hand key states to; they stay in the data directory", "states", unrouted)
	}
	err := n.serfLeave()
	stopGRPC(n.grpc, n.cfg.LeaveTimeout)
	if lost > 0 {
		err = errors.Join(err, fmt.Errorf("%w: %d key states not delivered", ErrHandoff, lost))
	}
	return errors.Join(err, cutErr)
}

// awaitCutOff waits, until ctx ends, while this node's ring holds no
// other member and members it routed to are cut off from it (standins):
// it is then no last member, and the states it holds, with the hits it
// admitted standing in for those members, are theirs. The node serves as
// before meanwhile, and joins the members it remembers (rejoinLoop): once
// one of them is back in its ring, the hand-off pass of that ring and
// the leave's own passes deliver the states.
func (n *Node) awaitCutOff(ctx context.Context) {
	logged := false
	for {
		ringChanged, cutChanged := n.handover.wake(), n.standins.cutWake()
		members := n.ring.Members()
		if slices.ContainsFunc(members, func(m ring.Member) bool { return m.Name != n.cfg.NodeName }) {
			return
		}
		cut := n.cutOff(members)
		if len(cut) == 0 {
			return // the last member
		}
		if !logged {
			logged = true
			n.logger.Info("cluster: leave: alone while members are cut off; waiting for one of them to hand key states to", "members", cut)
		}
		select {
		case <-ctx.Done():
			return
		case <-ringChanged:
		case <-cutChanged:
		}
	}
}

// cutOff returns the members cut off from this node that are not among
// members, less those that confirmed their departure (serf may not have
// told their leave yet).
func (n *Node) cutOff(members []ring.Member) []string {
	return slices.DeleteFunc(n.standins.cutOff(members), n.departures.has)
}

// awaitOthers returns the ring's members other than this node, once
// there are some, or no member is cut off (awaitCutOff), or ctx ended. A
// pass of a leave finds none in its ring in the middle of the leave when
// gossip declares the members of its side failed for a moment, as the
// gossip of a healing partition may: taking itself for the last member
// then, it would drop every state it holds, its own and those handed to
// it.
func (n *Node) awaitOthers(ctx context.Context) []ring.Member {
	n.awaitCutOff(ctx)
	return slices.DeleteFunc(n.ring.Members(), func(m ring.Member) bool { return m.Name == n.cfg.NodeName })
}

// ringChangedSince reports whether the ring's members other than this
// node are no longer others.
func (n *Node) ringChangedSince(others []ring.Member) bool {
	now := slices.DeleteFunc(n.ring.Members(), func(m ring.Member) bool { return m.Name == n.cfg.NodeName })
	return !slices.Equal(now, others)
}

// confirmDeparture sends every member of others, the membership this
// leaving node handed all its states to, the confirmation of that
// membership, and waits until they are delivered or ctx ends. A member
// takes the confirmation of a membership without its sender as the
// sender's departure (handover.confirm): the sender decides nothing any
// more and decided alone the keys it owned, whose whole states are on
// their owners in others. So each member decides at once the keys that
// move to it when it drops the sender, and confirms nothing else first.
// It is sent only when this node had every key it owned settled (no
// other node decided them meanwhile) and delivered every state.
func (n *Node) confirmDeparture(ctx context.Context, others []ring.Member) {
	fp := ring.Fingerprint(others)
	for _, m := range others {
		n.transfers.outbox.confirmTo(m.Name, fp, false)
	}
	if k := n.transfers.outbox.waitConfirmed(ctx); k > 0 {
		n.logger.Warn("cluster: leave: departure not confirmed to every member", "members", k)
	}
}

// stateSink takes key states other nodes send to this one, and their
// hand-over confirmations.
type stateSink struct{ n *Node }

var (
	_ transport.StateSink    = stateSink{}
	_ transport.HandoverSink = stateSink{}
)

// HandoffDone records a member's hand-over confirmation (handover.go).
// A sender that waits for this node's confirmation of the membership this
// node routes over gets it again, if it was delivered before: the sender
// set it aside when it adopted another membership meanwhile. What the
// sender holds cut off is learned first (standins.learn), so that this
// node, if it joined while members were cut off, decides as a stand-in
// once the confirmation settles the keys it took.
func (s stateSink) HandoffDone(_ context.Context, from string, fp uint64, wantBack bool, cut transport.CutOff) {
	if s.n.standins.learn(from, cut) {
		s.n.rebuild(0)
	}
	if wantBack && fp == s.n.handover.fingerprint() {
		s.n.transfers.outbox.reconfirm(from, fp, false)
	}
	if s.n.handover.confirm(from, fp) && s.n.departures.add(from) {
		// The member left with every state handed over: the ring drops
		// it now, without waiting for gossip to say it left, and the
		// sender's wait for this answer covers the rebuild.
		s.n.rebuild(0)
	}
}

// departures are the members that confirmed their departure
// (confirmDeparture) and that serf has not reported gone or back since:
// the ring leaves them out. Safe for concurrent use.
type departures struct {
	mu    sync.Mutex // guards names
	names map[string]bool
}

// add marks name departed, and reports whether it was not already; it
// keeps at most maxDeparted names, the rest wait for serf.
func (d *departures) add(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.names[name] || len(d.names) >= maxDeparted {
		return false
	}
	if d.names == nil {
		d.names = map[string]bool{}
	}
	d.names[name] = true
	return true
}

// forget unmarks the members serf reported an event of other than an
// update: they left, failed or came back, so serf's word on them holds.
func (d *departures) forget(kind MemberEventKind, changed []serf.Member) {
	if kind == 0 || kind == MemberUpdated {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range changed {
		delete(d.names, m.Name)
	}
}

// has reports whether name is marked departed.
func (d *departures) has(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.names[name]
}

// without returns members less the departed ones.
func (d *departures) without(members []ring.Member) []ring.Member {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.names) == 0 {
		return members
	}
	return slices.DeleteFunc(members, func(m ring.Member) bool { return d.names[m.Name] })
}

// TakeStates merges states into the store at the node's time, one at a
// time so that every invalid one is counted.
//
// With reason Reset, the sender reset the keys as their owner: this
// node's copies of them are dropped where its ring gives the key to the
// sender, and the reset's marks they carry are kept (dropCopies). A
// reset delayed past a ring change that made this node the owner leaves
// the state it admitted, with the copy the reset cleared: a peer that
// does not own a key cannot lower its count.
//
// A leaving node holds every hand-off state it takes, to pass on in its
// last passes (leaveHandoff), and refuses them once it has passed on the
// last: the sender keeps them.
func (s stateSink) TakeStates(ctx context.Context, from string, reason transport.TransferReason, states []limiter.Snapshot) (merged, rejected int, err error) {
	if reason == transport.Reset {
		merged, rejected = s.n.dropCopies(from, states)
		s.n.transfers.rejected.Add(int64(rejected))
		return merged, rejected, nil
	}
	leaving := reason == transport.Handoff && s.n.transfers.leaving.Load()
	if leaving {
		held := make([]foreignState, len(states))
		for i, st := range states {
			held[i] = foreignState{from: from, state: st}
		}
		if err := s.n.transfers.holdLeaving(held); err != nil {
			return 0, 0, fmt.Errorf("cluster: node %s refuses %d key states: %w", s.n.cfg.NodeName, len(states), err)
		}
	}
	now := s.n.now()
	var firstErr error
	for i := range states {
		k := 0
		var (
			changed bool
			err     error
		)
		if len(states[i].Grants) > 0 {
			changed, err = s.n.mergeWithGrants(&states[i], now)
		} else {
			changed, err = s.n.mergeState(&states[i], now)
		}
		if changed {
			k = 1
		}
		if err != nil {
			if rejected++; firstErr == nil {
				firstErr = err
			}
			continue
		}
		merged += k
	}
	s.n.transfers.merged.Add(int64(merged))
	s.n.transfers.rejected.Add(int64(rejected))
	if reason == transport.Handoff && !leaving {
		var foreign []foreignState
		for _, st := range states {
			if o, ok := s.n.ring.Owner(st.Name, st.Key); ok && o.Name != s.n.cfg.NodeName {
				foreign = append(foreign, foreignState{from: from, state: st})
			}
		}
		if len(foreign) > 0 {
			s.n.transfers.addForeign(foreign, true)
		}
	}
	if rejected > 0 {
		s.n.logger.Warn("cluster: rejected key states", "from", from, "reason", reason, "rejected", rejected, "err", firstErr)
	}
	return merged, rejected, nil
}

// serfLeave tells the members this node leaves, unless Close has shut
// serf down meanwhile; a Close that comes during the leave shuts serf down
// once it ends (serf must not be shut down in the middle of a leave).
func (n *Node) serfLeave() error {
	n.serfMu.Lock()
	defer n.serfMu.Unlock()
	if n.serfDown {
		return ErrClosed
	}
	return n.serf.Leave()
}

// mergeState merges sn into the store (standins.merge). A state that
// carries parts, or of a key this node holds parts of, is merged under
// its key's decide lock: a stand-in decision between its store's count
// and its record would otherwise leave the merged state without its hits
// (the merge charges the state sent the parts recorded so far) while its
// part counts them. So is a state merged while this node holds hits it
// admitted on its store without their owner (PolicyLocal), after any
// settle round under way: a state of their key that counts more would
// otherwise replace the one that counts them, and once this node decides
// the key they would be settled as counted in its store (settle).
func (n *Node) mergeState(sn *limiter.Snapshot, now time.Time) (bool, error) {
	local := n.debts.mayHoldStored()
	if sn.Settle == nil && n.standins.entries.Load() == 0 && !local {
		return n.standins.merge(n.store, sn, now)
	}
	if local {
		n.debts.rounding.Lock()
		defer n.debts.rounding.Unlock()
	}
	mu := n.handover.lock(ring.RouteHash(sn.Name, sn.Key))
	mu.Lock()
	defer mu.Unlock()
	return n.standins.mergeLocal(n.store, sn, now, n.debts.storedOf(debtKey{sn.Name, sn.Key}))
}
