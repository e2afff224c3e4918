package cluster

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Stand-in owners: a node decides a key as its owner while the member that
// owns the key on the ring with the members cut off (gossip declared them
// failed, or they are back from a partition and not admitted to the ring
// again yet; they did not leave, or left while declared failed) is cut
// off, which is each side of a partition and the new owner after a hard
// kill. Members that joined while members were cut off (newcomers) are
// not on that ring: it is the one the members cut off decide by (update).
// Whether a decision is a
// stand-in's is told with its ownership, under the key's decide lock, so
// the hand-off pass after a heal (which waits for such decisions) sends
// it with its part. It decides from what it
// holds of the key (nothing, or a replica's copy that may lag), so its
// state and the owner's are two histories of one key: merging them by the
// larger state forgets what the smaller one admitted.
//
// So a stand-in records, per key, the hits it admits as a part (its name,
// and a generation new for each record it starts), and every state this
// node sends (hand-off, replication, leave) carries the parts this node
// holds for its key (limiter.Settlement). A receiver that holds parts of
// the key, or is sent some, merges the two as two histories
// (limiter.Store.MergeCharged), as one step: it charges the hits of the
// parts sent that it has not counted (the larger of the parts of one
// origin and generation wins) to its own state, and the hits of its own
// parts the state sent does not count to that state, keeps the larger of
// the two, and keeps the parts. With states b1 + h1 and b2 + h2 (b the
// history before, h the parts), the key ends up with max(b1, b2) plus every
// stand-in hit once. A state from the receiver's own history (a replica's
// copy, the hand-off to a joiner, a leave) carries the parts the receiver
// holds already, which charge nothing: only what was admitted apart is
// added.
//
// Each charge is at most what the state it comes from still counts at the
// receiver's time under the stand-in's rate (hits out of the window or
// drained from the bucket are not charged). The hits enter the
// receiver's live state under the rate and algorithm it was last decided
// at (the owner's current parameters, not the stand-in's), and count even
// past its limit: none is dropped because the two sides checked the key
// under different limits.
//
// The record is bounded: maxDebtBytes in all (as settlement's), an entry
// counted as its name, its key, standinOverhead and each part's origin and
// partOverhead (about the heap it takes), at most limiter.MaxSettleParts
// parts. A full record makes room by forgetting entries whose parts are
// counted elsewhere already: this node's own parts once a hand-off to the
// key's next owner carries them (and they have not grown since), and
// parts it was sent once no member is cut off, which its own state counts
// (forgetting them can only make a state that carries them again be
// charged twice: more counted, never less). A stand-in decision reserves
// its entry before it decides: with no room even so, the stand-in refuses
// the check (SettleStats.StandInRefused) rather than admit hits it could
// not record, and hits PolicyLocal admitted on its store wait in
// settlement's record for room or for the key's owner. A state sent with
// parts this node has no room to keep is charged all the same, its parts
// not kept (counted in SettleStats.StandInDropped): a copy of it that
// comes again is charged again. A record lives as long as its key's state
// on this node, unless forgotten to make room. With Config.DataDir it is
// written with the key's state (persist.go, datadir.go) and restored with
// it (restore): a stand-in restarted before the heal still charges its
// hits to the owner, and a node restarted after one does not charge again
// what it counts already. A key whose parts changed is written at the next
// segment, with its state or without a change of it. A hard kill forgets
// what changed since: a stand-in's hits with its state (the data
// directory's bound), and parts it was sent, which a state sent again then
// charges again, once (more counted, never less).

// standinOverhead is what an entry of the record costs beside its name,
// key and parts (the entry, 144 bytes, and its map slot); partOverhead
// what a part costs beside its origin. TestAtk19StandinRecordHeap holds
// the estimate to the heap the record takes.
const (
	standinOverhead = 224
	partOverhead    = 48
)

// roomSlack is what making room frees below the bound beside what it
// needs, so that a full record is not scanned for each new entry.
const roomSlack = maxDebtBytes / 16

// standinRec is the parts this node holds for one key.
type standinRec struct {
	req   limiter.Request // the last stand-in request's rate, Hits 0
	parts []limiter.SettlePart
	size  int64
	gen   uint64 // this node's own part's generation; 0 when it has none
	// handed is the hits of this node's own parts (the open one and any
	// restored) that a hand-off to the key's next owner carries: once
	// they hold no more, the entry may be forgotten to make room.
	handed int64
	// pins counts the stand-in decisions that reserved the entry and
	// have not recorded their hits yet: it is not forgotten meanwhile.
	pins int
}

// standins is the record, and the ring with the failed members that tells
// a stand-in decision. Safe for concurrent use.
type standins struct {
	self string
	// full is the ring over the members (less the newcomers) and the
	// members cut off; nil while none is.
	full atomic.Pointer[ring.Ring]
	// joined is set, before full, while this node is itself a newcomer:
	// it stands in for the keys full gives to a member cut off.
	joined atomic.Pointer[joinedView]
	// alts is set, before full, while full holds members that left (gone)
	// or leaves out newcomers: the members cut off may have learnt a
	// leave before the cut, or not, and may hold a newcomer's name cut off
	// (a member that left, or failed, and is back under its name): they
	// decide by full without the members that left, or with the
	// newcomers. A key is decided without a part only where each of these
	// rings gives it to this node (to a member of its side, for a
	// newcomer).
	alts atomic.Pointer[altView]
	// failed is the members cut off that full adds, unreachable those of
	// them that serf declared failed (not back and waiting to be admitted
	// again), and newcomers the members full leaves out; rebuild alone
	// touches them.
	failed      map[string]ring.Member
	unreachable map[string]bool
	newcomers   map[string]bool
	// gone is the members of failed that left while cut off (update),
	// published for cutOff: they will not be back.
	gone atomic.Pointer[map[string]bool]
	// goneOnly is set while gone holds a member and no other member is
	// cut off (holdsOnlyGone).
	goneOnly atomic.Bool
	// learned holds the members cut off that this node learned from
	// reports, each until a time (learnedHold after a report last named
	// it); rebuild alone touches it.
	learned     map[string]learnedMember
	learnedHold time.Duration
	// reaped holds the members this node let go of, each with when, for
	// twice learnedHold: those serf reaped here after they failed, and
	// those learned whose hold ended. A report that names one as learned
	// (its sender holds it only for another's report) does not make it
	// cut off again; one that names it as seen failed does. Guarded by
	// reportMu.
	reaped map[string]time.Time
	// learnedOnly holds the members of failed held only because a report
	// named them, which this node's reports name as learned; rebuild
	// alone touches it.
	learnedOnly map[string]bool
	// cut is what this node holds cut off, for its hand-over
	// confirmations (cutReport).
	cut atomic.Pointer[transport.CutOff]

	// reportMu guards reports: the latest CutOff each member's hand-over
	// confirmation carried (learn).
	reportMu sync.Mutex
	reports  map[string]transport.CutOff
	// cutMu guards cutChanged, which is closed and replaced whenever full
	// is published: a wait for the members cut off looks again.
	cutMu      sync.Mutex
	cutChanged chan struct{}

	// mu guards the fields below. It is taken before a store shard's
	// lock, never after.
	mu      sync.Mutex
	m       map[debtKey]*standinRec
	bytes   int64
	nextGen uint64
	// entries is len(m), read without mu: while it is 0, a state sent
	// without a settlement merges without taking mu.
	entries atomic.Int64
	// dirty holds the keys whose parts changed since the persister last
	// took them (takeDirty), so that it writes their states again; nil
	// without Config.DataDir.
	dirty map[debtKey]struct{}

	// roomEpoch changes whenever an entry may have become one to forget
	// (a hand-off carries its part, a pin ends, a ring change); noRoomAt
	// is roomEpoch+1 when making room last found nothing to forget (0:
	// not since), so that a full record is not scanned again in vain.
	roomEpoch atomic.Uint64
	noRoomAt  uint64 // guarded by mu

	recorded, charged, dropped atomic.Int64 // hits
	refundedHits               atomic.Int64 // hits given back off this node's parts
	// leasedStandingIn is set once this node grants a lease of a key it
	// stands in for: refunds lower no part from then on (refunded).
	leasedStandingIn atomic.Bool
	refused          atomic.Int64 // checks
	forgotten        atomic.Int64 // entries forgotten to make room
}

// learnedMember is a member cut off that a report named, held until
// until; known is set when serf listed it when it was learned.
type learnedMember struct {
	m     ring.Member
	until time.Time
	known bool
}

// joinedView is what a newcomer tells its stand-in decisions by: the ring
// full it was built with, and the members cut off.
type joinedView struct {
	full *ring.Ring
	cut  map[string]bool
}

// altView is the rings full without the members that left (gone), with
// the newcomers, or both, for the ring full it was built with.
type altView struct {
	full *ring.Ring
	alts []*ring.Ring
}

func newStandins(self string, now time.Time) *standins {
	// Generations start at the node's start time, so that a node
	// restarted under its name starts new ones.
	return &standins{self: self, m: map[debtKey]*standinRec{}, nextGen: uint64(now.UnixNano()), cutChanged: make(chan struct{})}
}

// update records the members of ms that are cut off from the ring, serf
// declaring them failed or (back from a partition) alive but not admitted
// to the ring again yet, and that were in the ring (prev) or cut off
// already; it publishes the ring over members and every member cut off,
// old and new, for the ring change to come; publish then drops the
// members no longer cut off. A member that joins for the first time is
// not cut off, nor is one that left, unless it left while cut off: it
// handed its keys to the owners on its side, and this node's state of
// them is still a second history, which the heal's hand-off meets, so
// this node stands in for it (gone) while another member is cut off, or
// until ho is handoverSettled: the hand-over of members, the membership it routes over
// unchanged, is over (Node.goneSettled), its states and parts delivered
// both ways. It is then let go for good, and this node decides the keys
// it owns as their only history. Called by rebuild, which serialises
// them.
//
// A node that joins while members are cut off never knew them (memberlist
// ignores the failed members it never knew), and they do not know it: it
// learns them from the hand-over confirmations of the members it joins
// (learn), and holds them cut off as serf holds a member it saw fail
// (learnFrom). Members
// that joined while members were cut off (newcomers: seen joining, told by
// a confirmation, or this node itself when it never knew a member it
// learns) are left out of the ring with the members cut off, which is the
// ring those members decide by: a newcomer is no key's owner in it, and
// decides as a stand-in the keys it gives to a member cut off.
func (t *standins) update(ms []serf.Member, prev, members []ring.Member, cfg ring.Config, now time.Time, ho handoverPhase) {
	was := map[string]bool{}
	for _, m := range prev {
		was[m.Name] = true
	}
	in := map[string]bool{}
	for _, m := range members {
		in[m.Name] = true
	}
	status := make(map[string]serf.MemberStatus, len(ms))
	failed := map[string]ring.Member{}
	unreachable, gone := map[string]bool{}, map[string]bool{}
	// A member that leaves while members are cut off (not only members
	// that left while cut off themselves) is held too: the members cut
	// off do not know it left, and decide by the ring with it. Cut off:
	// declared failed, or learned from a report; not a member alive and
	// not in the ring (a departure serf has not told yet).
	wasGone := map[string]bool{}
	if g := t.gone.Load(); g != nil {
		wasGone = *g
	}
	cutNow := false
	t.reportMu.Lock()
	for name := range t.failed {
		_, learned := t.learned[name]
		cutNow = cutNow || !wasGone[name] && (t.unreachable[name] || learned)
	}
	t.reportMu.Unlock()
	for _, m := range ms {
		status[m.Name] = m.Status
		if m.Name == t.self || in[m.Name] {
			continue
		}
		f, cutOff := t.failed[m.Name]
		left := m.Status == serf.StatusLeaving || m.Status == serf.StatusLeft
		switch {
		case m.Status == serf.StatusFailed || m.Status == serf.StatusAlive:
		case left && t.unreachable[m.Name]:
			failed[m.Name], unreachable[m.Name], gone[m.Name] = f, true, true // left while cut off
			continue
		case left && cutNow && (cutOff || was[m.Name]):
			if !cutOff {
				addr, err := checkGRPCTag(m.Tags[grpcTag])
				if err != nil {
					continue
				}
				f = ring.Member{Name: m.Name, Addr: addr}
			}
			failed[m.Name], unreachable[m.Name], gone[m.Name] = f, true, true // left while members were cut off
			continue
		default:
			continue
		}
		if cutOff {
			failed[m.Name] = f
		} else if was[m.Name] {
			if addr, err := checkGRPCTag(m.Tags[grpcTag]); err == nil {
				failed[m.Name] = ring.Member{Name: m.Name, Addr: addr}
			}
		}
		if _, ok := failed[m.Name]; ok && m.Status == serf.StatusFailed {
			unreachable[m.Name] = true
		}
	}
	// serf forgets a member that left (TombstoneTimeout) before the heal's
	// hand-over may be over: it is held until then all the same.
	for name := range wasGone {
		if _, listed := status[name]; !listed && !in[name] && name != t.self {
			if f, ok := t.failed[name]; ok {
				failed[name], unreachable[name], gone[name] = f, true, true
			}
		}
	}
	selfNew, told, learnedOnly := t.learnFrom(status, in, failed, now)
	if ho == handoverSettled && len(gone) > 0 && len(gone) == len(failed) {
		// No member is cut off but those that left: nothing they
		// handed away is apart from this node's states any more.
		for name := range gone {
			delete(failed, name)
			delete(unreachable, name)
		}
		gone = map[string]bool{}
	}
	old, oldNew := t.failed, t.newcomers
	newcomers := map[string]bool{}
	if len(failed) > 0 {
		for _, m := range members {
			switch {
			case m.Name == t.self:
			case oldNew[m.Name] || told[m.Name]:
				newcomers[m.Name] = true
			case len(old) > 0 && !was[m.Name]:
				if _, back := old[m.Name]; !back {
					newcomers[m.Name] = true // joined while members were cut off
				}
			}
		}
		if selfNew || oldNew[t.self] || told[t.self] {
			newcomers[t.self] = true
		}
	}
	t.failed, t.newcomers, t.unreachable, t.learnedOnly = failed, newcomers, unreachable, learnedOnly
	t.gone.Store(&gone)
	t.goneOnly.Store(len(gone) > 0 && len(gone) == len(failed))
	// Members back from a partition are among members: the ring over
	// members alone then tells the decisions still made under the ring in
	// force, which routes around them, as stand-in decisions.
	t.store(members, cfg, len(old) > 0 || len(failed) > 0, []map[string]bool{oldNew, newcomers}, old, failed)
}

// learnFrom adds to failed the members cut off that this node learned
// from the reports of the members of ms (by name, their status) and does
// not hold cut off itself: not in its ring (in), not gone from serf's list
// after it knew them, not left, and returns those it adds (learnedOnly),
// which its own reports name as learned. A member a report names as seen
// failed is held for learnedHold from then, as serf holds a failed
// member, so that it stays cut off when the member that reported it
// leaves; one a report names as learned is held for learnedHold from the
// first such report, never renewed, and not at all by a node that let it
// go (reaped): two members that each hold a member for the other's report
// do not keep it for good. selfNew is set when
// this node did not know one of them (serf did not list it when it was
// learned), told holds the newcomers the reports name. Reports of members
// that left are dropped; those of members not in ms are passed over (a
// confirmation may come before gossip tells of its sender).
func (t *standins) learnFrom(status map[string]serf.MemberStatus, in map[string]bool, failed map[string]ring.Member, now time.Time) (selfNew bool, told, learnedOnly map[string]bool) {
	t.reportMu.Lock()
	defer t.reportMu.Unlock()
	named := map[string]bool{} // as seen failed, by a report of a member that has not left
	for from, rep := range t.reports {
		st, ok := status[from]
		if ok && st != serf.StatusAlive && st != serf.StatusFailed {
			delete(t.reports, from)
			continue
		}
		if !ok {
			continue
		}
		for _, c := range rep.Members {
			// A member named as learned, the sender holding it only for
			// another's report, is taken only by a node that did not let
			// it go (a joiner that never saw it), and never renews a
			// hold: two nodes that each hold a member for the other's
			// report let it go when their holds end.
			if _, letGo := t.reaped[c.Name]; c.Name == t.self || c.Learned && letGo {
				continue
			}
			addr, err := checkGRPCTag(c.GRPCAddr)
			if err != nil {
				continue
			}
			l, had := t.learned[c.Name]
			_, known := status[c.Name]
			if !had {
				if t.learned == nil {
					t.learned = map[string]learnedMember{}
				}
				l = learnedMember{m: ring.Member{Name: c.Name, Addr: addr}, known: known, until: now.Add(t.learnedHold)}
			}
			if !c.Learned {
				l.until = now.Add(t.learnedHold)
				named[c.Name] = true
			}
			t.learned[c.Name] = l
		}
		for _, name := range rep.Newcomers {
			if told == nil {
				told = map[string]bool{}
			}
			told[name] = true
		}
	}
	for name, l := range t.learned {
		st, listed := status[name]
		switch {
		case in[name]:
			// Back in the ring.
			delete(t.learned, name)
			continue
		case now.After(l.until):
			// Held long enough: let go.
			delete(t.learned, name)
			t.letGo(name, now)
			continue
		case named[name]:
			// A member that left (or that serf forgot) while members
			// were cut off is reported as long as they are: the members
			// cut off decide by the ring with it.
		case listed && st != serf.StatusFailed && st != serf.StatusAlive, l.known && !listed:
			// Left, or reaped.
			delete(t.learned, name)
			continue
		}
		if _, ok := failed[name]; !ok {
			failed[name] = l.m
			if learnedOnly == nil {
				learnedOnly = map[string]bool{}
			}
			learnedOnly[name] = true
		}
		if !l.known {
			selfNew = true
		}
	}
	return selfNew, told, learnedOnly
}

// learn keeps cut, what the member from holds cut off (its hand-over
// confirmation's), and reports whether it names a member cut off or a
// newcomer that this node does not hold so, or no longer names a member
// its last report named (the member reaped it, or it is back): the caller
// then rebuilds the ring, before it takes the confirmation. The rest
// waits for the next rebuild.
func (t *standins) learn(from string, cut transport.CutOff) bool {
	t.reportMu.Lock()
	defer t.reportMu.Unlock()
	prev, had := t.reports[from]
	if len(cut.Members) == 0 && len(cut.Newcomers) == 0 {
		delete(t.reports, from)
		return had && len(prev.Members) > 0
	}
	if !had && len(t.reports) >= maxConfirmations {
		return false
	}
	if t.reports == nil {
		t.reports = map[string]transport.CutOff{}
	}
	t.reports[from] = cut
	for _, m := range prev.Members {
		if !slices.ContainsFunc(cut.Members, func(c transport.CutOffMember) bool { return c.Name == m.Name }) {
			return true
		}
	}
	held := t.cutReport()
	for _, m := range cut.Members {
		if m.Name != t.self && !slices.ContainsFunc(held.Members, func(h transport.CutOffMember) bool { return h.Name == m.Name }) {
			return true
		}
	}
	for _, name := range cut.Newcomers {
		if !slices.Contains(held.Newcomers, name) {
			return true
		}
	}
	return false
}

// learnedLook is the least wait for the end of a learned member's hold
// (Node.eventLoop), and how long after it the rebuild comes.
const learnedLook = 50 * time.Millisecond

// learnedExpiry returns when the earliest hold of a member learned from a
// report ends, and false when none is held.
func (t *standins) learnedExpiry() (time.Time, bool) {
	t.reportMu.Lock()
	defer t.reportMu.Unlock()
	var first time.Time
	for _, l := range t.learned {
		if first.IsZero() || l.until.Before(first) {
			first = l.until
		}
	}
	return first, !first.IsZero()
}

// noteReaped records that this node let go of the members of ms that
// serf reaped after they failed (not those that left: a member that left
// while members were cut off is held as gone), and forgets the records
// older than twice learnedHold and those of members serf lists again
// (they joined again). listed is serf's members now. Called by rebuild,
// before update.
func (t *standins) noteReaped(ms, listed []serf.Member, now time.Time) {
	t.reportMu.Lock()
	defer t.reportMu.Unlock()
	for name, at := range t.reaped {
		if now.Sub(at) > 2*t.learnedHold || slices.ContainsFunc(listed, func(m serf.Member) bool { return m.Name == name }) {
			delete(t.reaped, name)
		}
	}
	for _, m := range ms {
		if m.Status != serf.StatusFailed || m.Name == t.self {
			continue
		}
		t.letGo(m.Name, now)
	}
}

// letGo records that this node let go of the member name at now (see
// reaped), keeping at most maxConfirmations records, the latest. The
// caller holds reportMu.
func (t *standins) letGo(name string, now time.Time) {
	if t.reaped == nil {
		t.reaped = map[string]time.Time{}
	}
	if _, ok := t.reaped[name]; !ok && len(t.reaped) >= maxConfirmations {
		oldest, at := "", now
		for n, when := range t.reaped {
			if !when.After(at) {
				oldest, at = n, when
			}
		}
		delete(t.reaped, oldest)
	}
	t.reaped[name] = now
}

// sameCutOff reports whether a and b name the same members cut off and
// the same newcomers, in the same order (cutReport sorts both).
func sameCutOff(a, b transport.CutOff) bool {
	return slices.Equal(a.Members, b.Members) && slices.Equal(a.Newcomers, b.Newcomers)
}

// cutReport returns what this node holds cut off, for its hand-over
// confirmations.
func (t *standins) cutReport() transport.CutOff {
	if c := t.cut.Load(); c != nil {
		return *c
	}
	return transport.CutOff{}
}

// publish publishes the ring over members and the failed members.
func (t *standins) publish(members []ring.Member, cfg ring.Config) {
	t.store(members, cfg, false, []map[string]bool{t.newcomers}, t.failed)
}

// store publishes the ring over members, less the newcomers named in
// leftOut, and the members of failed that are not among them; nil when
// there are none, unless keep. The view of a newcomer (joined) holds every
// member of failed.
func (t *standins) store(members []ring.Member, cfg ring.Config, keep bool, leftOut []map[string]bool, failed ...map[string]ring.Member) {
	out := func(name string) bool {
		for _, l := range leftOut {
			if l[name] {
				return true
			}
		}
		return false
	}
	all := make([]ring.Member, 0, len(members))
	in := map[string]bool{}
	for _, m := range members {
		in[m.Name] = true
		if !out(m.Name) {
			all = append(all, m)
		}
	}
	cut := map[string]bool{}
	report := transport.CutOff{}
	for _, f := range failed {
		for name, m := range f {
			cut[name] = true
			if !in[name] {
				in[name] = true
				all = append(all, m)
			}
		}
	}
	// Members that left while cut off are reported while another member
	// is: to a joiner on this side, they are cut off. Alone, they are
	// held only for the heal's hand-over, which a member that learnt them
	// would hold as cut off until learnedHold.
	var gone map[string]bool
	if g := t.gone.Load(); g != nil && len(*g) == len(t.failed) {
		gone = *g
	}
	for name, m := range t.failed {
		if !gone[name] {
			report.Members = append(report.Members, transport.CutOffMember{Name: name, GRPCAddr: m.Addr, Learned: t.learnedOnly[name]})
		}
	}
	for name := range t.newcomers {
		report.Newcomers = append(report.Newcomers, name)
	}
	slices.SortFunc(report.Members, func(a, b transport.CutOffMember) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(report.Newcomers)
	t.cut.Store(&report)
	defer t.roomEpoch.Add(1)
	defer t.signalCut()
	if len(cut) == 0 && !keep {
		t.joined.Store(nil)
		t.alts.Store(nil)
		t.full.Store(nil)
		return
	}
	r, err := ring.New(cfg)
	if err == nil {
		err = r.SetMembers(all)
	}
	if err != nil || len(all) == 0 {
		r = nil
	}
	if out(t.self) && r != nil {
		t.joined.Store(&joinedView{full: r, cut: cut})
	} else {
		t.joined.Store(nil)
	}
	t.alts.Store(nil)
	if r != nil {
		var gone map[string]bool
		if g := t.gone.Load(); g != nil {
			gone = *g
		}
		noGone := slices.DeleteFunc(slices.Clone(all), func(m ring.Member) bool { return gone[m.Name] })
		var newcomers []ring.Member
		for _, m := range members {
			if out(m.Name) {
				newcomers = append(newcomers, m)
			}
		}
		var sets [][]ring.Member
		if len(noGone) < len(all) {
			sets = append(sets, noGone)
		}
		if len(newcomers) > 0 {
			sets = append(sets, append(slices.Clone(all), newcomers...))
			if len(noGone) < len(all) {
				sets = append(sets, append(slices.Clone(noGone), newcomers...))
			}
		}
		var alts []*ring.Ring
		for _, ms := range sets {
			if len(ms) == 0 {
				continue
			}
			if a, err := ring.New(cfg); err == nil && a.SetMembers(ms) == nil {
				alts = append(alts, a)
			}
		}
		if len(alts) > 0 {
			t.alts.Store(&altView{full: r, alts: alts})
		}
	}
	t.full.Store(r)
}

// standingIn reports whether this node, deciding the key of hash as its
// owner, stands in for a failed member.
func (t *standins) standingIn(hash uint64) bool {
	if t.full.Load() == nil {
		return false
	}
	v := t.view()
	if _, stood := v.stoodInFor(hash, v.full); stood {
		return true
	}
	for _, a := range v.alts {
		if _, stood := v.stoodInFor(hash, a); stood {
			return true
		}
	}
	return false
}

// standinView is what told stand-in decisions at one time: the ring with
// the members cut off, the newcomer's view built with it, and the rings
// without the members that left or with the newcomers (alts).
type standinView struct {
	self   string
	full   *ring.Ring
	joined *joinedView
	alts   []*ring.Ring
}

// view returns what tells stand-in decisions now. rebuild, which alone
// publishes them, reads it before it changes them.
func (t *standins) view() standinView {
	v := standinView{self: t.self, full: t.full.Load(), joined: t.joined.Load()}
	if a := t.alts.Load(); a != nil && v.full != nil && a.full == v.full {
		v.alts = a.alts
	}
	return v
}

// stoodInFor returns the member that r, v's full ring or one of its alts, gives the
// key of hash to, and whether this node, deciding the key as its owner,
// stands in for it by r.
func (v standinView) stoodInFor(hash uint64, r *ring.Ring) (string, bool) {
	if v.full == nil || r == nil {
		return "", false
	}
	m, ok := r.OwnerOfHash(hash)
	if !ok {
		return "", false
	}
	if v.joined != nil && v.joined.full == v.full {
		// A newcomer, unknown to the members cut off: the key's history
		// on this side is its owner's here unless the ring gives it to
		// one of them.
		return m.Name, v.joined.cut[m.Name]
	}
	return m.Name, m.Name != v.self
}

// stoodInForBack returns whether this node, deciding the key of a hash as
// its owner by v, stood in for a member that members holds and prev, the
// ring's members before, did not: a member back from a partition, which
// decided the key meanwhile as its owner on its side.
func (v standinView) stoodInForBack(prev, members []ring.Member) func(hash uint64) bool {
	if v.full == nil {
		return nil
	}
	back := func(hash uint64, r *ring.Ring) bool {
		m, stood := v.stoodInFor(hash, r)
		return stood && hasMember(members, m) && !hasMember(prev, m)
	}
	return func(hash uint64) bool {
		if back(hash, v.full) {
			return true
		}
		for _, a := range v.alts {
			if back(hash, a) {
				return true
			}
		}
		return false
	}
}

// signalCut wakes the waits for the members cut off (cutWake).
func (t *standins) signalCut() {
	t.cutMu.Lock()
	defer t.cutMu.Unlock()
	close(t.cutChanged)
	t.cutChanged = make(chan struct{})
}

// cutWake returns a channel closed when the ring with the members cut off
// is next published.
func (t *standins) cutWake() <-chan struct{} {
	t.cutMu.Lock()
	defer t.cutMu.Unlock()
	return t.cutChanged
}

// handoverPhase tells update whether the hand-over of the membership the
// node routes over is over (handoverSettled, Node.goneSettled).
type handoverPhase int

const (
	handoverUnder handoverPhase = iota
	handoverSettled
)

// holdsOnlyGone reports whether members that left while cut off are held
// cut off (update), and no other member is: the hand-over's end lets them
// go.
func (t *standins) holdsOnlyGone() bool { return t.goneOnly.Load() }

// cutOff returns the names, sorted, of the members cut off from this node
// (update) that are not among members, less those that left while cut off
// (they will not be back); nil when there are none.
func (t *standins) cutOff(members []ring.Member) []string {
	r := t.full.Load()
	if r == nil {
		return nil
	}
	var gone map[string]bool
	if g := t.gone.Load(); g != nil {
		gone = *g
	}
	var out []string
	for _, m := range r.Members() {
		if m.Name != t.self && !hasMember(members, m.Name) && !gone[m.Name] {
			out = append(out, m.Name)
		}
	}
	return out
}

// entrySize is what an entry of the key of req with no parts costs.
func entrySize(name, key string) int64 { return int64(len(name)+len(key)) + standinOverhead }

// entryLocked returns the entry of k, creating it when there is room (or
// room can be made); nil when there is none. t.mu must be held.
func (t *standins) entryLocked(k debtKey) *standinRec {
	if e, ok := t.m[k]; ok {
		return e
	}
	size := entrySize(k.name, k.key)
	if !t.roomLocked(size, nil) {
		return nil
	}
	e := &standinRec{size: size}
	t.m[k] = e
	t.bytes += size
	t.entries.Store(int64(len(t.m)))
	return e
}

// roomLocked reports whether size more bytes fit the bound, forgetting
// entries other than keep that may be forgotten (forgettableLocked) to
// make room, and roomSlack more. t.mu must be held.
func (t *standins) roomLocked(size int64, keep *standinRec) bool {
	if t.bytes+size <= maxDebtBytes {
		return true
	}
	epoch := t.roomEpoch.Load()
	if t.noRoomAt == epoch+1 {
		return false // nothing to forget since the last look
	}
	cutOff := t.full.Load() != nil
	for k, e := range t.m {
		if t.bytes+size <= maxDebtBytes-roomSlack {
			break
		}
		if e != keep && t.forgettableLocked(e, cutOff) {
			t.removeLocked(k, e)
			t.forgotten.Add(1)
		}
	}
	if t.bytes+size <= maxDebtBytes {
		return true
	}
	t.noRoomAt = epoch + 1
	return false
}

// forgettableLocked reports whether e may be forgotten to make room: no
// decision holds it, this node's own part is carried by a hand-off to the
// key's next owner, and the parts it was sent are counted by its state
// while no member is cut off (cutOff false). Forgotten, a part that comes
// again with a state is charged again: more counted, never less. t.mu must
// be held.
func (t *standins) forgettableLocked(e *standinRec, cutOff bool) bool {
	if e.pins > 0 {
		return false
	}
	if t.ownHits(e.parts) > e.handed {
		return false
	}
	for _, p := range e.parts {
		if p.Origin != t.self && p.Hits > 0 && cutOff {
			return false
		}
	}
	return true
}

// ownHits returns the hits of this node's own parts in ps.
func (t *standins) ownHits(ps []limiter.SettlePart) int64 {
	var n int64
	for _, p := range ps {
		if p.Origin == t.self {
			n += p.Hits
		}
	}
	return n
}

// addPartLocked adds a part of origin and gen with hits to e, or raises
// its hits to hits when larger (add: adds them instead); false when there
// is no room for a new part. t.mu must be held.
func (t *standins) addPartLocked(e *standinRec, origin string, gen uint64, hits int64, add bool) bool {
	for i := range e.parts {
		p := &e.parts[i]
		if p.Origin == origin && p.Gen == gen {
			if add {
				p.Hits = min(p.Hits+hits, limiter.MaxLimit)
			} else {
				p.Hits = max(p.Hits, hits)
			}
			return true
		}
	}
	size := int64(len(origin)) + partOverhead
	if len(e.parts) >= limiter.MaxSettleParts || !t.roomLocked(size, e) {
		return false
	}
	e.parts = append(e.parts, limiter.SettlePart{Origin: origin, Gen: gen, Hits: min(hits, limiter.MaxLimit)})
	e.size += size
	t.bytes += size
	return true
}

// reserve makes room for this node's own part of the key of req before a
// stand-in decision of it, and holds the entry until record (which the
// caller must call, with the hits admitted, 0 for none); false when there
// is no room: the decision must not admit hits, which would go unrecorded.
func (t *standins) reserve(req *limiter.Request) bool {
	k := debtKey{req.Name, req.Key}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entryLocked(k)
	if e == nil {
		return false
	}
	if e.gen == 0 {
		t.nextGen++
		e.gen = t.nextGen
	}
	if !t.addPartLocked(e, t.self, e.gen, 0, true) {
		if !hasHits(e.parts) && e.pins == 0 {
			t.removeLocked(k, e)
		}
		return false
	}
	e.pins++
	return true
}

// addStoredLocked adds hits of req, admitted on this node's store
// without the key's owner and counted by a state of the key this node
// is about to send, to this node's own part of the key, as a stand-in's
// (withStoredParts); false when there is no room for them, or the record
// holds parts of the key under another algorithm. t.mu must be held.
func (t *standins) addStoredLocked(k debtKey, req *limiter.Request, hits int64) bool {
	e := t.entryLocked(k)
	if e == nil {
		return false
	}
	if e.req.Name != "" && e.req.Algorithm != req.Algorithm && hasHits(e.parts) {
		return false
	}
	if e.gen == 0 {
		t.nextGen++
		e.gen = t.nextGen
	}
	if !t.addPartLocked(e, t.self, e.gen, hits, true) {
		if !hasHits(e.parts) && e.pins == 0 {
			t.removeLocked(k, e)
		}
		return false
	}
	t.markDirtyLocked(k)
	e.req = *req
	e.req.Hits, e.req.Behavior = 0, 0
	t.recorded.Add(hits)
	return true
}

// hasHits reports whether some part of ps holds hits.
func hasHits(ps []limiter.SettlePart) bool {
	for _, p := range ps {
		if p.Hits > 0 {
			return true
		}
	}
	return false
}

// sendable returns a copy of the parts of ps that hold hits; nil when
// none does.
func sendable(ps []limiter.SettlePart) []limiter.SettlePart {
	var out []limiter.SettlePart
	for _, p := range ps {
		if p.Hits > 0 {
			if out == nil {
				out = make([]limiter.SettlePart, 0, len(ps))
			}
			out = append(out, p)
		}
	}
	return out
}

// record adds hits of req, admitted by this node standing in for the
// key's owner, to this node's part of the key, and ends the hold of a
// reserve before the decision, if any.
func (t *standins) record(req *limiter.Request, hits int64) {
	k := debtKey{req.Name, req.Key}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, pinned := t.m[k]
	if pinned && e.pins > 0 {
		e.pins--
		if e.pins == 0 {
			t.roomEpoch.Add(1)
		}
	}
	if hits <= 0 {
		if pinned && e.pins == 0 && !hasHits(e.parts) {
			t.removeLocked(k, e)
		}
		return
	}
	if e = t.entryLocked(k); e == nil {
		t.dropped.Add(hits)
		return
	}
	if e.gen == 0 {
		t.nextGen++
		e.gen = t.nextGen
	}
	if !t.addPartLocked(e, t.self, e.gen, hits, true) {
		t.dropped.Add(hits)
		return
	}
	t.markDirtyLocked(k)
	e.req = *req
	e.req.Hits, e.req.Behavior = 0, 0
	t.recorded.Add(hits)
}

// refunded lowers this node's open part of the key of req (its own part
// of the current period of standing in) by up to gave hits that a refund
// of req, decided by this node standing in for the key's owner, gave back
// to the key's state: the state and its part then count the same
// stand-in hits, and the owner is charged the hits kept, not those given
// back. Hits given back past the part (counted before the partition, by
// another stand-in's part, or by a part restored from before a restart)
// lower nothing: more counted, never less. Once this node has granted a
// lease standing in (leasedStandingIn), whose hits its state counts with
// no part, no refund lowers a part: the hits given back may be those. A
// part sent before keeps its larger count wherever it was sent.
func (t *standins) refunded(req *limiter.Request, gave int64) {
	if gave <= 0 || t.entries.Load() == 0 || t.leasedStandingIn.Load() {
		return
	}
	k := debtKey{req.Name, req.Key}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[k]
	if !ok || e.gen == 0 || e.req.Algorithm != req.Algorithm {
		return
	}
	for i := range e.parts {
		p := &e.parts[i]
		if p.Origin != t.self || p.Gen != e.gen || p.Hits <= 0 {
			continue
		}
		back := min(p.Hits, gave)
		p.Hits -= back
		t.refundedHits.Add(back)
		t.markDirtyLocked(k)
		return
	}
}

// hasEntry reports whether the record holds an entry of the key of name
// and key: parts, of any algorithm, or a stand-in decision's reserve.
func (t *standins) hasEntry(name, key string) bool {
	if t.entries.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[debtKey{name, key}]
	return ok
}

// attachHandOff sets the settlement of every state of ss whose key has
// parts, for a hand-off to the keys' next owners: the states carry this
// node's own parts from now on, so that the record may forget them to
// make room.
func (t *standins) attachHandOff(ss []limiter.Snapshot) { t.attachParts(ss, true) }

func (t *standins) attachParts(ss []limiter.Snapshot, handOff bool) {
	if t.entries.Load() == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == 0 {
		return
	}
	for i := range ss {
		s := &ss[i]
		if s.Settle != nil {
			continue // passed on as it was sent
		}
		e, ok := t.m[debtKey{s.Name, s.Key}]
		if !ok {
			continue
		}
		parts := sendable(e.parts)
		if parts == nil {
			continue
		}
		// Parts charged to a state of another algorithm than the
		// stand-in's go with it all the same, at the stand-in's rate in
		// the state's algorithm: without them a receiver that meets the
		// stand-in's own state later charges them a second time.
		req := e.req
		if req.Algorithm != s.Algorithm {
			req.Algorithm, req.Burst = s.Algorithm, 0
		}
		s.Settle = &limiter.Settlement{Request: req, Parts: parts}
		if handOff {
			if own := t.ownHits(parts); own > e.handed {
				e.handed = own
				t.roomEpoch.Add(1)
			}
		}
	}
}

// settlements returns a copy of the settlement of every key with parts,
// as attach would set it; nil when there is none. The persister reads it
// before it reads the store's states, as mu comes before a shard's lock.
func (t *standins) settlements() map[debtKey]*limiter.Settlement {
	if t.entries.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out map[debtKey]*limiter.Settlement
	for k, e := range t.m {
		parts := sendable(e.parts)
		if parts == nil {
			continue
		}
		if out == nil {
			out = map[debtKey]*limiter.Settlement{}
		}
		out[k] = &limiter.Settlement{Request: e.req, Parts: parts}
	}
	return out
}

// markDirtyLocked notes that the parts of k changed, for the persister.
// t.mu must be held.
func (t *standins) markDirtyLocked(k debtKey) {
	if t.dirty != nil {
		t.dirty[k] = struct{}{}
	}
}

// keepDirty makes the record note the keys whose parts change, for
// takeDirty. Called by New, before any traffic.
func (t *standins) keepDirty() { t.dirty = map[debtKey]struct{}{} }

// takeDirty returns the keys whose parts changed since the last call: a
// part can grow after its state was taken for the persister (a stand-in
// records its hits after its decision), or without the state changing
// (parts sent with a state this node counts already).
func (t *standins) takeDirty() []debtKey {
	if t.entries.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.dirty) == 0 {
		return nil
	}
	keys := make([]debtKey, 0, len(t.dirty))
	for k := range t.dirty {
		keys = append(keys, k)
	}
	clear(t.dirty)
	return keys
}

// settle sets the settlement of s from sets (settlements) when its key
// has parts of its algorithm.
func settle(s *limiter.Snapshot, sets map[debtKey]*limiter.Settlement) {
	if st, ok := sets[debtKey{s.Name, s.Key}]; ok && st.Request.Algorithm == s.Algorithm {
		s.Settle = st
	}
}

// restore records the parts that restored states of a data directory
// carry: this node's own, from before its restart, and those
// it was sent, as it held them when it wrote the states. They charge the
// key's owner as they would have before the restart. Its own parts are
// closed: what it admits as a stand-in from now on is a new part, whose
// generation is above every restored one. As every part, they charge at
// most what their state still counts when they are charged: nothing of a
// fixed window that has ended, what a sliding window counter's previous
// window still weighs.
func (t *standins) restore(states []limiter.Snapshot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range states {
		s := &states[i]
		st := s.Settle
		if st == nil {
			continue
		}
		e := t.entryLocked(debtKey{s.Name, s.Key})
		if e == nil {
			for _, p := range st.Parts {
				t.dropped.Add(p.Hits)
			}
			continue
		}
		for _, p := range st.Parts {
			if p.Origin == t.self {
				t.nextGen = max(t.nextGen, p.Gen)
			}
			if !t.addPartLocked(e, p.Origin, p.Gen, p.Hits, false) {
				t.dropped.Add(p.Hits)
			}
		}
		e.req = st.Request
		e.req.Hits, e.req.Behavior = 0, 0
		if len(e.parts) == 0 {
			t.removeLocked(debtKey{s.Name, s.Key}, e)
		}
	}
}

// merge merges sn into store at now. When sn carries a settlement or this
// node holds parts of its key, sn and the store's state are two histories
// of the key: it charges the hits of sn's parts this node has not counted
// to the store's state, and those of this node's parts sn does not count
// to sn, merges (limiter.Store.MergeCharged), and keeps the parts. Without
// room for the key's parts it charges sn's all the same, and keeps none.
func (t *standins) merge(store *limiter.Store, sn *limiter.Snapshot, now time.Time) (bool, error) {
	return t.mergeLocal(store, sn, now, nil)
}

// mergeLocal is merge, where local, when not nil, holds in Hits the hits
// of the key that this node's store counts and no other history does
// (admitted on it without the owner and not settled yet, debts.storedOf),
// at local's rate: they are charged to sn too, so that a merge by the
// larger keeps them.
func (t *standins) mergeLocal(store *limiter.Store, sn *limiter.Snapshot, now time.Time, local *limiter.Request) (bool, error) {
	var stored int64
	if local != nil && local.Algorithm == sn.Algorithm && local.Name == sn.Name && local.Key == sn.Key {
		stored = local.Hits
	}
	if sn.Settle == nil && t.entries.Load() == 0 { // no stand-in anywhere in sight
		return mergeStored(store, sn, now, local, stored)
	}
	k := debtKey{sn.Name, sn.Key}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, held := t.m[k]
	if held && (!hasHits(e.parts) || e.req.Algorithm != sn.Algorithm) {
		held = false
	}
	if sn.Settle == nil && !held {
		return mergeStored(store, sn, now, local, stored)
	}
	if !held {
		if e = t.entryLocked(k); e == nil {
			// No room to keep them: charged all the same (a copy that
			// comes again is charged again, more counted, never less).
			return t.chargeUnkeptLocked(store, sn, now, stored)
		}
	}
	var theirs, mine int64
	var in []limiter.SettlePart
	charge := e.req
	if st := sn.Settle; st != nil {
		in = st.Parts
		charge = st.Request
	}
	for _, p := range in {
		theirs += max(p.Hits-partHits(e.parts, p.Origin, p.Gen), 0)
	}
	for _, q := range e.parts {
		mine += max(q.Hits-partHits(in, q.Origin, q.Gen), 0)
	}
	mine += stored
	charge.Hits = min(theirs, limiter.MaxLimit)
	charged, changed, err := store.MergeCharged(sn, charge, min(mine, limiter.MaxLimit), now)
	if err != nil {
		if len(e.parts) == 0 && e.pins == 0 {
			t.removeLocked(k, e)
		}
		return false, err
	}
	t.charged.Add(charged)
	for _, p := range in {
		if !t.addPartLocked(e, p.Origin, p.Gen, p.Hits, false) {
			t.dropped.Add(p.Hits) // charged, not kept
		}
	}
	if len(in) > 0 {
		t.markDirtyLocked(k)
	}
	if e.req.Name == "" {
		e.req = charge
		e.req.Hits = 0
	}
	return changed, nil
}

// mergeStored merges sn, of a key with no parts on either side, into
// store at now, charging sn the stored hits that only this node's store
// counts, at local's rate (mergeLocal).
func mergeStored(store *limiter.Store, sn *limiter.Snapshot, now time.Time, local *limiter.Request, stored int64) (bool, error) {
	if stored <= 0 {
		n, err := store.Merge([]limiter.Snapshot{*sn}, now)
		return n > 0, err
	}
	charge := *local
	charge.Hits = 0
	_, changed, err := store.MergeCharged(sn, charge, stored, now)
	return changed, err
}

// chargeUnkeptLocked merges sn, sent with parts that this node has no room
// to keep, charging the store's state all of them (at most what sn still
// counts), as a receiver that holds none of them does, and sn the stored
// hits only this node's store counts (mergeLocal). t.mu must be held.
func (t *standins) chargeUnkeptLocked(store *limiter.Store, sn *limiter.Snapshot, now time.Time, stored int64) (bool, error) {
	charge := sn.Settle.Request
	var theirs int64
	for _, p := range sn.Settle.Parts {
		theirs += max(p.Hits, 0)
	}
	charge.Hits = min(theirs, limiter.MaxLimit)
	charged, changed, err := store.MergeCharged(sn, charge, stored, now)
	if err != nil {
		return false, err
	}
	t.charged.Add(charged)
	t.dropped.Add(charge.Hits)
	return changed, nil
}

// partHits returns the hits of the part of origin and gen in ps, 0 when
// there is none.
func partHits(ps []limiter.SettlePart, origin string, gen uint64) int64 {
	for _, p := range ps {
		if p.Origin == origin && p.Gen == gen {
			return p.Hits
		}
	}
	return 0
}

// removeLocked forgets the entry e of k. t.mu must be held.
func (t *standins) removeLocked(k debtKey, e *standinRec) {
	delete(t.m, k)
	delete(t.dirty, k)
	t.bytes -= e.size
	t.entries.Store(int64(len(t.m)))
}

// prune forgets the parts of keys whose state store no longer holds live
// at now: they count nothing any more.
func (t *standins) prune(store *limiter.Store, now time.Time) {
	if t.entries.Load() == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.m {
		if _, ok := store.Snapshot(k.name, k.key, now); !ok && e.pins == 0 {
			t.removeLocked(k, e)
		}
	}
}

// counts returns the stand-in counters of SettleStats.
func (t *standins) counts() (recorded, charged, dropped int64) {
	return t.recorded.Load(), t.charged.Load(), t.dropped.Load()
}

// refusals returns the checks refused for want of room, and the entries
// forgotten to make room.
func (t *standins) refusals() (refused, forgotten int64) {
	return t.refused.Load(), t.forgotten.Load()
}
