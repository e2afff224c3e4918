package cluster

import (
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
	budget := before.Remaining - after.Remaining
	for _, lg := range sn.Grants {
		// A token bucket's or GCRA's hits that entered at lg.Entered,
		// after now, were charged with what drains until then
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
		g := lg.Request
		g.Hits, g.Behavior = 0, 0
		g.Charged = limiter.Window{}
		n.grants.adoptLocked(hash, &lg, &g, hits, ahead, window, at)
		budget -= hits + ahead
	}
	if k := n.grants.shards[hash%decideShards][hash]; k != nil {
		k.rate = max(k.rate, rate)
	}
	return changed, nil
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
