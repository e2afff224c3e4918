package cluster

import (
	"slices"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Lease grants carried with key states.
//
// The hits an owner leased and that their holders have not used stay
// counted in the key's state: a fixed window's from the grant, a token
// bucket's or GCRA's once they entered the bucket (grants.go). When the
// state goes to another node, handed to a new owner or copied to a
// replica, the grants whose hits it counts go with it
// (limiter.Snapshot.Grants), their times as durations from the sending,
// so that the node that decides the key next takes back what a holder
// gives back, as the owner that granted them would have. The holder
// sends its returns to the key's owner on its ring with the members cut
// off (Node.returnTo): a new owner after a join or a leave, the owner
// that granted them otherwise. A stand-in refuses a return it holds no
// grant of its own for, and a leaving node every return.
//
// A receiver keeps a carried grant as a settled one of its own: a return
// frees its hits in the key's state, less what has drained since they
// entered (grant.drained), a fixed window's while the window lasts. A
// grant of one holder, key and limit that it holds already is merged with
// the carried one by the larger, so that a state sent twice frees nothing
// twice. The carried grants of a state free at most what merging the
// state added to the key's count: whatever a peer sends, its grants and
// the returns against them never leave a key counting less than it did
// before the state came.
//
// A state whose grants name a holder this node holds hits apart for (an
// open token bucket or GCRA grant of its own) counts them: a replica's
// copy counts the held hits as entered (withHeldHits), and a replica that
// stood in from that copy hands it back. Merged by the larger, it would
// count them, and the grant's expiry would enter them again: the open
// grants of that holder and key enter the bucket at once, before the
// state is merged.

// carryLocked returns the grants of (name, key), of hash, whose hits a
// state of the key counts and that a return could still free at now: a
// fixed window's until its window ends, a token bucket's or GCRA's once
// they entered the bucket, and with heldAt set the open ones too, as
// entered at their expiry (a replica's copy charges them at heldAt, with
// what drains until the expiry: grant.enterEarly). At most
// limiter.MaxLeaseGrants. The shard's grants must be held (see
// grantTable).
func (g *grantTable) carryLocked(hash uint64, name, key string, now, heldAt int64) []limiter.LeaseGrant {
	k := g.shards[hash%decideShards][hash]
	if k == nil {
		return nil
	}
	var out []limiter.LeaseGrant
	for i := range k.list {
		gr := &k.list[i]
		if gr.hits <= 0 || gr.req.Name != name || gr.req.Key != key || len(out) == limiter.MaxLeaseGrants {
			continue
		}
		lg := limiter.LeaseGrant{Holder: gr.from, Hits: gr.hits, Request: gr.req, Expires: gr.expires, Window: gr.window}
		switch {
		case !deferred(gr.req.Algorithm):
			if now >= gr.window {
				continue
			}
			lg.Entered = gr.granted
		case gr.settled && gr.entered != 0:
			if !gr.worth(now) {
				continue
			}
			lg.Entered = gr.entered
		case !gr.settled && heldAt != 0:
			lg.Entered = max(heldAt, gr.expires) // see grant.enterEarly
		default:
			continue // held apart: the state does not count them
		}
		out = append(out, lg)
	}
	return out
}

// attachGrants sets on each of states, handed to the keys' new owners,
// the grants of its key whose hits it counts (carryLocked).
func (n *Node) attachGrants(states []limiter.Snapshot) {
	if !n.grants.active() {
		return
	}
	now := n.now().UnixNano()
	for i := range states {
		s := &states[i]
		if !leasable(s.Algorithm) {
			continue
		}
		hash := ring.RouteHash(s.Name, s.Key)
		mu := n.handover.lock(hash)
		mu.RLock()
		gm := n.grants.lock(hash)
		gm.Lock()
		gs := n.grants.carryLocked(hash, s.Name, s.Key, now, 0)
		gm.Unlock()
		mu.RUnlock()
		if len(gs) > 0 {
			s.Grants = gs
		}
	}
}

// mergeWithGrants merges sn, which carries grants, into the store at now
// under its key's decide lock, held exclusively (see the comment above):
// first this node's open grants of the key to the holders sn's grants
// name enter the bucket (sn counts their hits), then sn is merged, then
// its grants are kept as settled grants of this node's. They free at most
// what the merge added to the key's count (budget), so that neither
// taking them nor the returns against them leave the key counting less
// than it did before sn came, and only while the keys with grants leave
// room for the leases this node grants (crowdedLocked): beyond, the
// holders' returns free nothing here, fewer admitted, never more.
func (n *Node) mergeWithGrants(sn *limiter.Snapshot, now time.Time) (bool, error) {
	if n.debts.mayHoldStored() { // see mergeState
		n.debts.rounding.Lock()
		defer n.debts.rounding.Unlock()
	}
	hash := ring.RouteHash(sn.Name, sn.Key)
	mu := n.handover.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	at := now.UnixNano()
	n.grants.settleLocked(n.store, hash, at, nil)
	if k := n.grants.shards[hash%decideShards][hash]; k != nil && k.held > 0 {
		for i := range k.list {
			gr := &k.list[i]
			if !gr.settled && gr.hits > 0 && gr.req.Name == sn.Name && gr.req.Key == sn.Key && namesHolder(sn.Grants, gr.from) {
				gr.enterEarly(n.store, now, &k.cur)
			}
		}
		k.update()
	}
	r := sn.Grants[0].Request
	r.Hits, r.Behavior = 0, 0
	r.Charged = limiter.Window{}
	before, _ := n.store.CheckAt(r, now) // a peek: what the key counts
	rate := n.grants.fastestRateLocked(hash, sn, &r)
	if local, ok := n.store.Snapshot(sn.Name, sn.Key, now); ok && local.RatePeriod > 0 {
		rate = max(rate, float64(local.RateLimit)/float64(local.RatePeriod)) // the rate callers decided it at here
	}
	changed, err := n.standins.mergeLocal(n.store, sn, now, n.debts.storedOf(debtKey{sn.Name, sn.Key}))
	if err != nil || n.grants.crowdedLocked(hash) {
		return changed, err
	}
	after, err := n.store.CheckAt(r, now)
	if err != nil {
		return changed, nil
	}
	n.grants.adoptAllLocked(hash, sn.Grants, after, before.Remaining-after.Remaining, rate, at)
	return changed, nil
}

// adoptAllLocked keeps gs, the grants of a state of hash's key merged
// at at, as settled grants of this node's (adoptLocked), together
// freeing at most budget, the hits the merge added to the key's count;
// after is the key's peek after the merge, rate the fastest the key is
// known to drain at (fastestRateLocked). The key's decide lock must be
// held exclusively, or nothing else run yet (restore).
func (g *grantTable) adoptAllLocked(hash uint64, gs []limiter.LeaseGrant, after limiter.Decision, budget int64, rate float64, at int64) {
	for _, lg := range gs {
		// A token bucket's or GCRA's hits that entered at lg.Entered,
		// after at, were charged with what drains until then
		// (grant.enterEarly): the merge must have added that too, for a
		// return to free them in full until then (grant.drained).
		ahead := int64(0)
		if deferred(lg.Request.Algorithm) {
			ahead = aheadDrain(lg.Entered-at, max(rate, ratePerNano(&lg.Request)))
		}
		hits := min(lg.Hits, budget-ahead)
		if hits <= 0 {
			continue
		}
		window := lg.Window
		if window != 0 {
			window = min(window, after.ResetAt.UnixNano()) // the window's end here
			if at >= window {
				continue
			}
		}
		r := lg.Request
		r.Hits, r.Behavior = 0, 0
		r.Charged = limiter.Window{}
		g.adoptLocked(hash, &lg, &r, hits, ahead, window, at)
		budget -= hits + ahead
	}
	if k := g.shards[hash%decideShards][hash]; k != nil {
		k.rate = max(k.rate, rate)
	}
}

// ratePerNano is r's rate in hits per nanosecond (0 without a period).
func ratePerNano(r *limiter.Request) float64 {
	if r.Period <= 0 {
		return 0
	}
	return float64(r.Limit) / float64(r.Period)
}

// fastestRateLocked is the fastest of the rates hash's key is known to
// drain at: its grants' here (keyGrants.rate), the rate sn's state was
// decided at, and r's. The shard's grants must be held.
func (g *grantTable) fastestRateLocked(hash uint64, sn *limiter.Snapshot, r *limiter.Request) float64 {
	rate := ratePerNano(r)
	if k := g.shards[hash%decideShards][hash]; k != nil {
		rate = max(rate, k.rate)
	}
	if sn.RatePeriod > 0 {
		rate = max(rate, float64(sn.RateLimit)/float64(sn.RatePeriod))
	}
	return rate
}

// aheadDrain is how many hits drain at rate (per ns) in d ns, rounded
// down as grant.enterEarly charges them; 0 when d is not positive, at
// most limiter.MaxLimit.
func aheadDrain(d int64, rate float64) int64 {
	if d <= 0 {
		return 0
	}
	return int64(min(float64(d)*rate, float64(limiter.MaxLimit)))
}

func namesHolder(gs []limiter.LeaseGrant, holder string) bool {
	for i := range gs {
		if gs[i].Holder == holder {
			return true
		}
	}
	return false
}

// adoptLocked keeps lg, carried with a state of req's key, as a settled
// grant of hits (window: a fixed window's end here), merged by the larger
// with the grant of its holder, key, limit and window this node holds.
// The shard's grants must be held exclusively.
func (g *grantTable) adoptLocked(hash uint64, lg *limiter.LeaseGrant, req *limiter.Request, hits, cushion, window, now int64) {
	keep := max(lg.Expires, now) + int64(grantLateGrace)
	entered := min(lg.Entered, max(lg.Expires, now))
	gs := g.grantsLocked(hash)
	for i := range gs {
		gr := &gs[i]
		if gr.from != lg.Holder || !sameKey(&gr.req, req) || !sameLimit(&gr.req, req) || !sameWindow(gr.window, window, req) {
			continue
		}
		if deferred(req.Algorithm) && !gr.settled {
			continue // held apart here: not counted in the state
		}
		gr.hits = max(gr.hits, hits)
		gr.expires = max(gr.expires, lg.Expires)
		if deferred(req.Algorithm) {
			gr.entered = min(gr.entered, entered)
			if gr.carried {
				gr.adopted, gr.cushion = min(gr.adopted, now), min(gr.cushion, cushion)
			}
		}
		gr.keep = max(gr.keep, keep)
		g.storeLocked(hash, gs)
		return
	}
	if carriedCount(gs) >= maxCarriedPerKey {
		return // fewer freed, never more
	}
	gr := grant{from: lg.Holder, req: *req, hits: hits, granted: min(entered, now), expires: lg.Expires, window: window, keep: keep, carried: true}
	if deferred(req.Algorithm) {
		gr.settled, gr.entered = true, entered
		gr.adopted, gr.cushion = now, cushion
	} else {
		gr.settled = now >= gr.expires
	}
	g.storeLocked(hash, append(gs, gr))
	if k := g.shards[hash%decideShards][hash]; k.cur.Name == "" {
		k.cur = *req
	}
}

// maxCarriedPerKey bounds the carried grants a node keeps of one key
// hash: a key's honest grants are a few per holder (one per limit and
// window), and every change of the key's grants walks them all. Beyond
// it, carried grants are dropped: their holders' returns free nothing.
const maxCarriedPerKey = 4 * limiter.MaxLeaseGrants

// carriedCount returns how many of gs were carried here.
func carriedCount(gs []grant) int {
	n := 0
	for i := range gs {
		if gs[i].carried {
			n++
		}
	}
	return n
}

// sameWindow reports whether two fixed window ends, each read on one
// node's clock, are of one window of req: within half a window (a
// second for a calendar window) of each other. Both 0 for the other
// algorithms.
func sameWindow(a, b int64, req *limiter.Request) bool {
	if a == 0 || b == 0 {
		return a == b
	}
	half := int64(time.Second)
	if req.Period > 0 {
		half = min(half, int64(req.Period)/2)
	}
	return a-b < half && b-a < half
}

// crowdedLocked reports whether the shard of hash holds no new key's
// carried grants: half of maxGrantKeys is left to this node's own.
func (g *grantTable) crowdedLocked(hash uint64) bool {
	m := g.shards[hash%decideShards]
	_, ok := m[hash]
	return !ok && len(m) >= maxGrantKeys/2
}

// Grants kept in the data directory (persist.go): the state files hold
// each state with the grants carryLocked returns for it, so that a node
// restarted from its DataDir takes the holders' returns as it would have
// before.

// persistedGrants returns, by key, the grants whose hits the states of
// keys count and that a return could still free at now (carryLocked), of
// every key with grants when keys is nil, for the state files. Each key's
// are read under its decide lock held shared, before the states are read
// (the decide locks come before the store's). Fewer keys than have
// grants are looked up one by one; more, the table is walked.
func (n *Node) persistedGrants(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey][]limiter.LeaseGrant {
	if n.handover == nil || !n.grants.active() {
		return nil
	}
	at := now.UnixNano()
	out := map[stateKey][]limiter.LeaseGrant{}
	if keys != nil && int64(len(keys)) <= n.grants.keys.Load() {
		for k, s := range keys {
			if !leasable(s.Algorithm) {
				continue
			}
			hash := ring.RouteHash(k.name, k.key)
			mu := n.handover.lock(hash)
			mu.RLock()
			gm := n.grants.lock(hash)
			gm.Lock()
			if gs := n.grants.carryLocked(hash, k.name, k.key, at, 0); len(gs) > 0 {
				out[k] = gs
			}
			gm.Unlock()
			mu.RUnlock()
		}
		return out
	}
	for i := range n.grants.shards {
		n.handover.locks[i].RLock()
		n.grants.mu[i].Lock()
		for hash, kg := range n.grants.shards[i] {
			for j := range kg.list {
				r := &kg.list[j].req
				k := stateKey{r.Name, r.Key}
				if _, ok := keys[k]; keys != nil && !ok {
					continue
				}
				if out[k] == nil {
					out[k] = n.grants.carryLocked(hash, r.Name, r.Key, at, 0)
				}
			}
		}
		n.grants.mu[i].Unlock()
		n.handover.locks[i].RUnlock()
	}
	return out
}

// persistedHeld returns, by key, the states of keys (of every key when
// keys is nil) whose hits token bucket and GCRA leases hold apart from the
// bucket, with those hits charged as a replica's copy has them
// (heldSnapshot: entered at the leases' expiry, with what drains until
// then) and their grants named, for the state files: a node restarted
// from them counts the hits its holders may have used, and takes their
// returns.
func (n *Node) persistedHeld(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey]limiter.Snapshot {
	if n.handover == nil || !n.grants.active() {
		return nil
	}
	type heldKey struct {
		hash uint64
		k    stateKey
	}
	var found []heldKey
	for i := range n.grants.shards {
		n.handover.locks[i].RLock()
		n.grants.mu[i].Lock()
		for hash, kg := range n.grants.shards[i] {
			if kg.held == 0 {
				continue
			}
			for j := range kg.list {
				gr := &kg.list[j]
				k := stateKey{gr.req.Name, gr.req.Key}
				if _, ok := keys[k]; (keys == nil || ok) && !gr.settled && deferred(gr.req.Algorithm) && gr.hits > 0 && !slices.Contains(found, heldKey{hash, k}) {
					found = append(found, heldKey{hash, k})
				}
			}
		}
		n.grants.mu[i].Unlock()
		n.handover.locks[i].RUnlock()
	}
	out := make(map[stateKey]limiter.Snapshot, len(found))
	for _, f := range found {
		var sp *limiter.Snapshot
		if s, ok := n.store.Snapshot(f.k.name, f.k.key, now); ok {
			sp = &s
		}
		if c, ok := n.heldSnapshot(f.hash, sp, f.k.name, f.k.key, now); ok {
			out[f.k] = c
		}
	}
	return out
}

// maxRestoredGrantAge bounds how long before a node's start a restored
// grant's hits entered its state or its lease ended, and how far after it
// its window ends, as a Transfer's grants are bounded.
const maxRestoredGrantAge = 24 * time.Hour

// restoredGrants is a restored state that carries grants, and its key's
// peek before the state was merged.
type restoredGrants struct {
	s      *limiter.Snapshot
	before limiter.Decision
}

// grantsBefore keeps, of the grants of restored's states, those whose
// times lie within what a Transfer's may at now (a file written with
// the clock far off, or long ago, frees nothing), and returns the states
// that still carry some with their keys' peeks in store, before restored
// is merged into it.
func grantsBefore(store *limiter.Store, restored []limiter.Snapshot, now time.Time) []restoredGrants {
	var out []restoredGrants
	at := now.UnixNano()
	for i := range restored {
		s := &restored[i]
		s.Grants = slices.DeleteFunc(s.Grants, func(g limiter.LeaseGrant) bool { return !restoredGrantTimesOK(&g, at) })
		if len(s.Grants) == 0 {
			s.Grants = nil
			continue
		}
		before, err := store.CheckAt(grantPeek(s), now)
		if err != nil {
			s.Grants = nil
			continue
		}
		out = append(out, restoredGrants{s, before})
	}
	return out
}

// restoredGrantTimesOK reports whether g's times are within their bounds
// at now, those of a Transfer's grants (internal/transport).
func restoredGrantTimesOK(g *limiter.LeaseGrant, now int64) bool {
	age, ttl := int64(maxRestoredGrantAge), int64(MaxLeaseTTL)
	switch {
	case g.Entered < now-age || g.Entered > now+ttl:
		return false
	case g.Expires < now-age || g.Expires > now+ttl:
		return false
	case g.Window != 0 && (g.Window <= now || g.Window > now+age):
		return false
	}
	return true
}

// grantPeek is the peek (Hits 0) of s's key at its first grant's rate.
func grantPeek(s *limiter.Snapshot) limiter.Request {
	r := s.Grants[0].Request
	r.Hits, r.Behavior = 0, 0
	r.Charged = limiter.Window{}
	return r
}

// restore keeps the grants of the restored states in granted as carried
// grants (adoptAllLocked), each state's freeing at most what its merge
// added to its key's count. New calls it once the store holds the
// restored states, before anything else runs.
func (g *grantTable) restore(store *limiter.Store, granted []restoredGrants, now time.Time) {
	at := now.UnixNano()
	for _, rg := range granted {
		s := rg.s
		hash := ring.RouteHash(s.Name, s.Key)
		if g.crowdedLocked(hash) {
			continue
		}
		r := grantPeek(s)
		after, err := store.CheckAt(r, now)
		if err != nil {
			continue
		}
		g.adoptAllLocked(hash, s.Grants, after, rg.before.Remaining-after.Remaining, g.fastestRateLocked(hash, s, &r), at)
	}
}
