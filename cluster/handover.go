package cluster

import (
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ring"
)

// Ownership hand-over: a node decides a key as its owner only when its ring
// gives it the key and the key's partition is settled on this node.
//
// A partition is settled when the node is ready (it has joined the cluster
// it was given seeds of, and serf runs) and either
//   - the node owned it, settled, under its previous ring as well, and
//     not as a stand-in for a member that the ring holds again (a member
//     back from a partition, which decided it meanwhile as its owner on
//     its side, and hands it over: standins.stoodInFor): nobody else
//     decided it meanwhile; or
//   - every other member of the node's current membership has confirmed
//     that membership (a HandoffDone transfer carrying its fingerprint):
//     each has adopted it, so decides none of this node's keys any more,
//     and has delivered every key state it owed this node; or
//   - Config.HandoverTimeout has passed since the membership changed, and
//     some member never confirmed (the node says so at warn level).
//
// Every member sends HandoffDone to every other member after the hand-off
// pass of each new membership (handoff.go), after the states of that pass
// were delivered. A key that moves while its previous owner is alive is
// therefore never decided from a state that lacks what the previous owner
// admitted: until its new owner has the previous owner's state and the
// previous owner's word that it stopped, the new owner forwards the key's
// checks to the previous owner (the owner in the ring without this node)
// and, when that one has stopped deciding too, waits. Both are bounded by
// Config.HandoverTimeout, after which the unreachable policy decides.
//
// A node never decides a key its ring does not give it: a forwarded check
// for such a key, or for a key not settled yet, is answered with
// transport.ErrNotOwner, and the sender routes it again once its ring or
// the receiver's hand-over has moved on. The decision itself runs under a
// lock per key hash that also covers the ownership test, and the hand-off
// pass takes every such lock once after the ring changed (barrier), so no
// decision made under the old ring is missed by the pass that sends it.

// maxConfirmations bounds the members whose latest confirmation a node
// keeps.
const maxConfirmations = 4096

// decideShards is the number of locks decisions as owner are made under.
const decideShards = 64

// paddedRWMutex keeps each lock on its own cache line.
type paddedRWMutex struct {
	sync.RWMutex
	_ [40]byte
}

// settledSet is the partitions a node may decide as owner under one
// version of its ring. It is never changed once published.
type settledSet struct {
	version uint64   // the ring version it was computed for
	bits    []uint64 // partition p is settled when bit p is set
}

func (s *settledSet) has(p int) bool { return s.bits[p/64]&(1<<(p%64)) != 0 }

// handover tracks which partitions this node may decide as owner. Safe for
// concurrent use.
type handover struct {
	self    string
	timeout time.Duration
	logger  *slog.Logger

	// locks[i] is held shared by every decision as owner of a key hashing
	// to shard i, with the ownership test, and exclusively by what must
	// not interleave with them: the barrier, lease grants and returns.
	locks   [decideShards]paddedRWMutex
	settled atomic.Pointer[settledSet]

	// ready: joined (or given no seeds), serf running, not leaving. Written
	// under mu, read without it.
	ready atomic.Bool
	// expired counts the memberships whose moved keys the timeout
	// settled (expire).
	expired atomic.Int64

	mu       sync.Mutex        // guards the fields below
	r        *ring.Ring        // the node's ring
	fp       uint64            // fingerprint of the membership r routes over
	awaited  map[string]bool   // members whose confirmation of fp this node still waits for
	lastDone map[string]uint64 // the latest fingerprint each member confirmed
	changeAt time.Time         // when fp was adopted
	// before is the ring before the last change of membership, and
	// without the current one without this node: who decided a key before
	// this node owned it is its owner in before if that is still a member,
	// else its owner in without.
	before, without *ring.Ring
	// changed is closed and replaced whenever the settled partitions or the
	// ring change: waiting checks look again.
	changed chan struct{}
}

func newHandover(self string, r *ring.Ring, timeout time.Duration, logger *slog.Logger) *handover {
	h := &handover{self: self, r: r, timeout: timeout, logger: logger,
		lastDone: map[string]uint64{}, changed: make(chan struct{})}
	h.settled.Store(&settledSet{version: ^uint64(0), bits: make([]uint64, (r.Config().PartitionCount+63)/64)})
	return h
}

// lock returns the lock of decisions as owner of keys hashing to hash.
func (h *handover) lock(hash uint64) *sync.RWMutex { return &h.locks[hash%decideShards].RWMutex }

// barrier returns once every decision that began before it has ended.
func (h *handover) barrier() {
	for i := range h.locks {
		h.locks[i].Lock()
		h.locks[i].Unlock() //nolint:staticcheck // an empty critical section is the point
	}
}

// ownerState says whether this node decides the key of hash now.
type ownerState uint8

const (
	owned   ownerState = iota // owner and settled: decide
	moved                     // the ring gives the key to another node
	pending                   // owner, not settled yet
)

// stateOf tells whether this node decides the key of hash now. Callers
// deciding on the answer hold lock(hash).
func (h *handover) stateOf(hash uint64) (ownerState, ring.Member) {
	m, version, ok := h.r.OwnerAndVersion(hash)
	if !ok {
		return pending, m
	}
	if m.Name != h.self {
		return moved, m
	}
	s := h.settled.Load()
	if s.version != version {
		// The ring changed and its settled partitions are being
		// computed, under mu: wait for them rather than call a partition
		// that stays settled pending meanwhile.
		h.mu.Lock()
		s = h.settled.Load()
		m, version, ok = h.r.OwnerAndVersion(hash)
		h.mu.Unlock()
		if !ok {
			return pending, m
		}
		if m.Name != h.self {
			return moved, m
		}
	}
	if s.version != version || !s.has(h.r.Partition(hash)) {
		return pending, m
	}
	return owned, m
}

// previous returns who decided the key of hash before this node owned it,
// and false when no other member is known.
func (h *handover) previous(hash uint64) (string, bool) {
	h.mu.Lock()
	before, without := h.before, h.without
	h.mu.Unlock()
	if before != nil {
		if m, ok := before.OwnerOfHash(hash); ok && m.Name != h.self && h.isMember(m.Name) {
			return m.Name, true
		}
	}
	if without == nil {
		return "", false
	}
	m, ok := without.OwnerOfHash(hash)
	return m.Name, ok
}

// isMember reports whether the ring routes over a member named name.
func (h *handover) isMember(name string) bool {
	return slices.ContainsFunc(h.r.Members(), func(m ring.Member) bool { return m.Name == name })
}

// wake returns a channel closed at the next change of the settled
// partitions or of the ring.
func (h *handover) wake() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// setReady records whether the node may decide as owner at all, and
// settles again.
func (h *handover) setReady(ready bool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready.Load() == ready {
		return
	}
	h.ready.Store(ready)
	h.adoptLocked(nil, now)
	h.publishLocked(false)
}

// adopt sets the node's ring to members and settles again. It is the one
// place the ring changes, under mu, so that no confirmation or expiry
// settles partitions of the new ring with the old membership's
// confirmations. A partition this node owned, settled, under the ring
// replaced stays settled unless unkeep (nil: none) reports its hash: this
// node decided it as a stand-in for a member now back in the ring. On an
// error the ring is unchanged.
func (h *handover) adopt(members []ring.Member, now time.Time, unkeep func(hash uint64) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	before, prev := h.r.Version(), h.r.Members()
	if err := h.r.SetMembers(members); err != nil {
		return err
	}
	h.adoptLocked(prev, now)
	// What was settled stays so only if it was computed for the ring just
	// replaced.
	h.publishUnkept(h.settled.Load().version == before, unkeep)
	return nil
}

// adoptLocked starts waiting for the confirmations of the ring's
// membership when it is new; prev is the membership before it (nil: the
// ring did not change).
func (h *handover) adoptLocked(prev []ring.Member, now time.Time) {
	members := h.r.Members()
	fp := ring.Fingerprint(members)
	if fp == h.fp && h.awaited != nil {
		return
	}
	h.fp, h.changeAt = fp, now
	// A confirmation counts for one adoption of a membership: one of an
	// earlier time this node routed over the same members (A, B, A) may
	// predate what that member decided meanwhile.
	for name, done := range h.lastDone {
		if done != fp {
			delete(h.lastDone, name)
		}
	}
	h.awaited = map[string]bool{}
	others := slices.DeleteFunc(slices.Clone(members), func(m ring.Member) bool { return m.Name == h.self })
	for _, m := range others {
		if h.lastDone[m.Name] != fp {
			h.awaited[m.Name] = true
		}
	}
	h.without, h.before = h.ringOf(others), nil
	if prev != nil {
		h.before = h.ringOf(prev)
	}
}

// ringOf returns a ring over ms, or nil when there are none.
func (h *handover) ringOf(ms []ring.Member) *ring.Ring {
	if len(ms) == 0 {
		return nil
	}
	r, err := ring.New(h.r.Config())
	if err != nil || r.SetMembers(ms) != nil {
		return nil
	}
	return r
}

// confirm records that the member from has adopted the membership of
// fingerprint fp and delivered what it owed this node. departed is set
// when fp is the membership without from: from has left it (leaveHandoff),
// and the ring should drop it now.
func (h *handover) confirm(from string, fp uint64) (departed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, known := h.lastDone[from]; !known && len(h.lastDone) >= maxConfirmations {
		// Keep the members of the current membership only: a
		// confirmation may come before the member is in the ring, but
		// names are bounded.
		members := h.r.Members()
		for name := range h.lastDone {
			if !slices.ContainsFunc(members, func(m ring.Member) bool { return m.Name == name }) {
				delete(h.lastDone, name)
			}
		}
		if len(h.lastDone) >= maxConfirmations {
			return false
		}
	}
	h.lastDone[from] = fp
	member := h.isMember(from)
	departed = member && fp != h.fp && fp == h.departureOf(from)
	switch {
	case fp == h.fp && !member:
		// A member that left this membership confirmed it: the keys it
		// owned are settled here (publishLocked).
		h.publishLocked(true)
	case fp == h.fp || departed:
		// A member's departure (leaveHandoff) also confirms the
		// membership it leaves: it decides none of its keys any more and
		// has delivered every state it held.
		if h.awaited[from] {
			delete(h.awaited, from)
			h.publishLocked(true)
		}
	}
	return departed
}

// departureOf returns the fingerprint of the ring's membership without
// name: the confirmation a member sends when it leaves (leaveHandoff).
func (h *handover) departureOf(name string) uint64 {
	return ring.Fingerprint(slices.DeleteFunc(h.r.Members(), func(m ring.Member) bool { return m.Name == name }))
}

// maxDeparted bounds the departed members whose keys one publication
// settles.
const maxDeparted = 8

// departedLocked returns, for each member that left the current
// membership and confirmed it when it left (at most maxDeparted), the
// ring over the membership and that member: the partitions the member
// owns there are those it handed to their owners here, where they may be
// decided at once. h.mu must be held.
func (h *handover) departedLocked() []*ring.Ring {
	var out []*ring.Ring
	members := h.r.Members()
	for name, done := range h.lastDone {
		if done != h.fp || slices.ContainsFunc(members, func(m ring.Member) bool { return m.Name == name }) {
			continue
		}
		if r := h.ringOf(append(slices.Clone(members), ring.Member{Name: name})); r != nil {
			out = append(out, r)
		}
		if len(out) == maxDeparted {
			break
		}
	}
	return out
}

// handedOver reports whether the partition of hash belonged to one of
// departed (departedLocked), which handed its keys here when it left.
func handedOver(departed []*ring.Ring, hash uint64, members []ring.Member) bool {
	for _, r := range departed {
		if m, ok := r.OwnerOfHash(hash); ok && !slices.ContainsFunc(members, func(x ring.Member) bool { return x.Name == m.Name }) {
			return true
		}
	}
	return false
}

// ownsAllSettled reports whether this node decides every key its ring
// gives it: no partition it owns is waiting for its hand-over.
func (h *handover) ownsAllSettled() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ready.Load() {
		return false
	}
	s := h.settled.Load()
	if s.version != h.r.Version() {
		return false
	}
	for p := range h.r.Config().PartitionCount {
		if m, ok := h.r.OwnerOfHash(uint64(p)); ok && m.Name == h.self && !s.has(p) {
			return false
		}
	}
	return true
}

// expire settles every owned partition once HandoverTimeout has passed
// since the membership changed, naming the members that never confirmed.
// It returns when it should be called again (zero: not needed).
func (h *handover) expire(now time.Time) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.awaited) == 0 || !h.ready.Load() {
		return time.Time{}
	}
	at := h.changeAt.Add(h.timeout)
	if now.Before(at) {
		return at
	}
	names := slices.Sorted(maps.Keys(h.awaited))
	h.logger.Warn("cluster: deciding moved keys without the hand-over confirmation of some members", "members", names, "after", h.timeout)
	clear(h.awaited)
	before := h.settled.Load()
	h.publishLocked(true)
	if !slices.Equal(before.bits, h.settled.Load().bits) {
		h.expired.Add(1) // keys that were waiting are decided now
	}
	return time.Time{}
}

// publishLocked computes and publishes the settled partitions of the
// current ring: every partition this node owns when it is ready and no
// member is waited for, otherwise those it owned, settled, before (when
// keep is set: the ring changed, or a confirmation came, but nothing
// unsettled it), and those that a member which left this membership
// owned and handed here (departedLocked).
func (h *handover) publishLocked(keep bool) { h.publishUnkept(keep, nil) }

// publishUnkept is publishLocked, keeping no partition whose hash unkeep
// reports (nil: none). h.mu must be held.
func (h *handover) publishUnkept(keep bool, unkeep func(hash uint64) bool) {
	old := h.settled.Load()
	version := h.r.Version()
	bits := make([]uint64, len(old.bits))
	if h.ready.Load() {
		all := len(h.awaited) == 0
		var departed []*ring.Ring
		if !all {
			departed = h.departedLocked()
		}
		members := h.r.Members()
		parts := h.r.Config().PartitionCount
		for p := range parts {
			m, ok := h.r.OwnerOfHash(uint64(p))
			if !ok || m.Name != h.self {
				continue
			}
			kept := keep && old.has(p) && (unkeep == nil || !unkeep(uint64(p)))
			if all || kept || handedOver(departed, uint64(p), members) {
				bits[p/64] |= 1 << (p % 64)
			}
		}
	}
	h.settled.Store(&settledSet{version: version, bits: bits})
	close(h.changed)
	h.changed = make(chan struct{})
}

// unconfirmed returns the members whose hand-over confirmation of the
// current membership this node still waits for, sorted.
func (h *handover) unconfirmed() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.awaited))
}

// confirmedByAll reports whether every other member of the membership the
// node routes over confirmed it: unlike an empty unconfirmed, not when the
// timeout settled it (expire).
func (h *handover) confirmedByAll() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.r.Members() {
		if m.Name != h.self && h.lastDone[m.Name] != h.fp {
			return false
		}
	}
	return true
}

// awaits reports whether this node waits for the confirmation of the
// membership of fingerprint fp, the current one, from the member named
// name.
func (h *handover) awaits(name string, fp uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fp == h.fp && h.awaited[name]
}

// fingerprint returns the fingerprint of the membership the node routes
// over.
func (h *handover) fingerprint() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fp
}
