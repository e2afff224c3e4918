package cluster

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// The owner's side of leases: the grants of each key it leased and that
// are not over yet.
//
// A token bucket or GCRA lease does not consume its hits when granted: the
// owner holds them, apart from the bucket, until the lease expires, and
// every decision on the key meanwhile sees a capacity reduced by the hits
// held. At the lease's expiry the granted hits enter the bucket (the TAT),
// as if all were admitted at that instant, the latest a holder may use
// them; the hits the holder gives back are freed, or refunded once they
// entered. A hit used at any time of the lease thus occupies the bucket
// from the grant on and drains only from the expiry: over any interval T
// the key admits at most Burst + rate*T, leases or not.
//
// A fixed window lease consumes its hits in the window when granted, as a
// check would, and ends with that window; the hits the holder gives back
// within the window are refunded to it, and later ones are dropped.

// grantReturnGrace is how long after a lease expired the hits its holder
// gives back are still taken: returns come at the holder's next sweep.
// A holder cut off from the owner sends its returns when it reaches the
// owner again, as long as a return could still free hits (grant.worth):
// the latest grant of each holder and key is kept grantLateGrace after its
// expiry, time for gossip to tell that the holder is cut off, and every
// grant of a holder that is not a member of the owner's ring (cut off by
// a partition, failed, or back and not admitted yet) is kept while it is
// away, and grantLateGrace after.
const (
	grantReturnGrace = time.Second
	grantLateGrace   = 30 * time.Second
)

// maxGrantKeys bounds the keys with grants per decide shard; beyond it the
// owner refuses leases.
const maxGrantKeys = 4096

// grant is the hits of one key leased to one node.
type grant struct {
	from    string
	req     limiter.Request // the limit (Hits 0)
	hits    int64           // granted and not given back
	granted int64           // Unix ns, the owner's clock: the latest grant
	expires int64           // Unix ns, the owner's clock
	window  int64           // a fixed window lease: the window's end
	settled bool            // the hits entered the bucket, or expired
	// entered is when a token bucket's or GCRA's hits entered the bucket
	// (Unix ns, the owner's clock): at the expiry, earlier when the
	// owner's decisions ended first (flush), or when another node's state
	// counting them was taken (carried). 0 until they do.
	entered int64
	// carried is set on a grant that came with the key's state from
	// another node (carry.go).
	carried bool
	// adopted and cushion are a carried token bucket's or GCRA's: when
	// this node took the grant (Unix ns, its clock), and how many hits
	// beyond the grant's the merge of its state added for what drains
	// until entered (mergeWithGrants). Its hits drain at the key's rate
	// from adopted once they used up the cushion, whatever entered says.
	adopted, cushion int64
	// keep is when a settled grant is forgotten: grantReturnGrace after
	// its expiry, or after its holder was last seen away (settleLocked).
	keep int64
}

// worth reports whether a return of gr's hits at now would still free
// any: a fixed window's before the window ends, a token bucket's or
// GCRA's before they have drained from the bucket at the grant's rate.
func (gr *grant) worth(now int64) bool {
	if gr.hits <= 0 {
		return false
	}
	if !deferred(gr.req.Algorithm) {
		return now < gr.window
	}
	return gr.drained(0, gr.hits, now) < gr.hits
}

// enter settles gr at: a token bucket's or GCRA's held hits enter the
// bucket (the TAT) as hits admitted at that instant, charged under cur, the
// parameters the owner decides the key with now (the grant's own when cur
// is of another algorithm). They are charged whatever the bucket holds
// (limiter.Charge): a larger limit that took the bucket past the grant's
// capacity meanwhile does not drop them, and a smaller one finds them.
func (gr *grant) enter(store *limiter.Store, at time.Time, cur *limiter.Request) {
	gr.settled = true
	if !deferred(gr.req.Algorithm) || gr.hits <= 0 {
		return
	}
	gr.entered = at.UnixNano()
	gr.charge(store, at, gr.entryRequest(cur), gr.hits)
}

// entryRequest is the request gr's hits enter the bucket with: cur's
// parameters when cur is of the grant's key and deferred, else the
// grant's.
func (gr *grant) entryRequest(cur *limiter.Request) limiter.Request {
	r := gr.req
	if cur != nil && deferred(cur.Algorithm) && sameKey(cur, &gr.req) {
		r = *cur
	}
	return r
}

// enterEarly settles gr at at, before its expiry, as enter does, with as
// many more hits as drain at the key's rate from at to the expiry
// (rounded down): the bucket then holds, at the expiry and after, at
// least what the held hits entering at the expiry would leave, while the
// holder may use its lease until then. gr.entered is its expiry: a
// return frees its hits in full until then, and less what drained after.
// An expired grant enters as enter has it.
func (gr *grant) enterEarly(store *limiter.Store, at time.Time, cur *limiter.Request) {
	early := gr.expires - at.UnixNano()
	if !deferred(gr.req.Algorithm) || gr.hits <= 0 || early <= 0 {
		gr.enter(store, at, cur)
		return
	}
	gr.settled = true
	gr.entered = gr.expires
	r := gr.entryRequest(cur)
	extra := int64(0)
	if r.Period > 0 {
		extra = int64(float64(early) * float64(r.Limit) / float64(r.Period))
	}
	gr.charge(store, at, r, gr.hits+min(max(extra, 0), limiter.MaxLimit))
}

// charge adds hits to r's key at at, whatever its bucket holds
// (limiter.Charge).
func (gr *grant) charge(store *limiter.Store, at time.Time, r limiter.Request, hits int64) {
	r.Behavior, r.Charged = limiter.Charge, limiter.Window{}
	for left := hits; left > 0; left -= r.Hits {
		r.Hits = min(left, r.Capacity()) // Validate's bound on one request
		store.CheckAt(r, at)             //nolint:errcheck // valid: the key's parameters
	}
}

// boundTimes reads gr, when it was granted after now, as granted at now:
// its expiry as far after now as it was after the grant. A fixed window
// grant's hits then count in now's window (see limiter.Request), so the
// hits its holder gives back are no longer refunded.
func (gr *grant) boundTimes(now int64) {
	if gr.granted <= now {
		return
	}
	if gr.entered != 0 {
		gr.entered -= gr.granted - now
	}
	gr.expires -= gr.granted - now
	gr.keep -= gr.granted - now
	gr.granted = now
	if gr.window != 0 {
		gr.window = min(gr.window, now)
	}
}

// deferred reports whether a's leased hits enter the bucket at expiry.
func deferred(a limiter.Algorithm) bool { return a == limiter.TokenBucket || a == limiter.GCRA }

// grantTable holds the grants of the keys this node owns. Shard i is
// guarded by the handover's decide lock i held exclusively (grants,
// returns, sweeps), or held shared together with mu[i] (decisions).
type grantTable struct {
	shards [decideShards]map[uint64]*keyGrants
	mu     [decideShards]sync.Mutex
	keys   atomic.Int64 // keys with grants, all shards
	// away reports whether the node named is not a member of the ring
	// now: its settled grants wait for its returns. nil: none is.
	away func(name string) bool

	changedMu sync.Mutex                 // guards changed and unwritten
	changed   map[uint64]limiter.Request // with replicating set: keys granted held hits since the replicas were sent their states
	// unwritten holds, with persisting set (a DataDir), the keys granted
	// held hits since the last state file was written.
	unwritten               map[stateKey]struct{}
	replicating, persisting bool // set by New before any grant
}

// noteChanged records that req's key, of hash, was granted hits held apart
// from its bucket, for its replicas (heldSnapshot) and the data directory.
func (g *grantTable) noteChanged(hash uint64, req *limiter.Request) {
	g.changedMu.Lock()
	defer g.changedMu.Unlock()
	if g.replicating {
		if g.changed == nil {
			g.changed = map[uint64]limiter.Request{}
		}
		g.changed[hash] = *req
	}
	if g.persisting {
		if g.unwritten == nil {
			g.unwritten = map[stateKey]struct{}{}
		}
		g.unwritten[stateKey{req.Name, req.Key}] = struct{}{}
	}
}

// takeUnwritten returns and forgets the keys noteChanged recorded for the
// data directory.
func (g *grantTable) takeUnwritten() map[stateKey]struct{} {
	g.changedMu.Lock()
	defer g.changedMu.Unlock()
	u := g.unwritten
	g.unwritten = nil
	return u
}

// takeChanged returns and forgets the keys noteChanged recorded.
func (g *grantTable) takeChanged() map[uint64]limiter.Request {
	g.changedMu.Lock()
	defer g.changedMu.Unlock()
	ch := g.changed
	g.changed = nil
	return ch
}

// heldCopyLocked returns copies of hash's token bucket and GCRA grants
// that have not entered the bucket, and the key's current limit. The
// shard's grants must be held (see grantTable).
func (g *grantTable) heldCopyLocked(hash uint64) ([]grant, limiter.Request) {
	k := g.shards[hash%decideShards][hash]
	if k == nil || k.held == 0 {
		return nil, limiter.Request{}
	}
	var gs []grant
	for _, gr := range k.list {
		if !gr.settled && deferred(gr.req.Algorithm) && gr.hits > 0 {
			gs = append(gs, gr)
		}
	}
	return gs, k.cur
}

// keyGrants is the grants of one key hash, with what decisions read of
// them computed once per change: a decision reads two numbers and, until
// next, changes nothing.
type keyGrants struct {
	list     []grant
	held     int64 // hits of token bucket and GCRA grants not settled
	earliest int64 // their earliest expiry (0: none)
	next     int64 // when settleLocked has something to do
	latest   int64 // the latest grant time: a now before it stepped back
	// cur is the limit (Hits 0) of the key's latest decision, grant or
	// return on this node: the parameters held hits enter under.
	cur limiter.Request
	// rate is the fastest rate (hits per ns) the key was decided, granted
	// or returned at here, or its carried grants' states were taken at,
	// since it has grants: returns free no hits that drained at it.
	rate float64
}

// update recomputes held, earliest, next and latest from list.
func (k *keyGrants) update() {
	k.held, k.earliest, k.next, k.latest = 0, 0, math.MaxInt64, math.MinInt64
	for _, gr := range k.list {
		k.latest = max(k.latest, gr.granted)
		if gr.settled {
			k.next = min(k.next, gr.keep)
			continue
		}
		k.next = min(k.next, gr.expires)
		if deferred(gr.req.Algorithm) {
			k.held += gr.hits
			if k.earliest == 0 || gr.expires < k.earliest {
				k.earliest = gr.expires
			}
		}
	}
}

// lock returns the lock decisions take, beside the shared decide lock, to
// use the grants of hash's shard.
func (g *grantTable) lock(hash uint64) *sync.Mutex { return &g.mu[hash%decideShards] }

// active reports whether any key has grants: when not, decisions skip the
// table.
func (g *grantTable) active() bool { return g.keys.Load() > 0 }

// sameKey reports whether two requests are of one key.
func sameKey(a, b *limiter.Request) bool { return a.Name == b.Name && a.Key == b.Key }

// settleLocked makes the grants of hash's keys that expired by now enter
// the store at their expiry, and drops the settled ones whose returns can
// no longer come. The shard's grants must be held (see grantTable).
//
// A clock that stepped back finds grants made after now: each is read as
// made at now (boundTimes), so that it holds its hits for no longer than
// its TTL from now, as the limiter reads the key's state.
//
// A settled grant is forgotten at its keep time, unless a return could
// still free hits and it is its holder's latest grant of the key (kept
// until grantLateGrace after its expiry), its holder is away from the
// ring, or it was carried here with the key's state (kept grantLateGrace
// more, and looked at again): a holder whose owner failed sends its
// returns here only once that owner is reaped.
//
// req, when not nil, is the request being decided: its parameters become
// the key's current ones (keyGrants.cur), those expired grants enter under.
func (g *grantTable) settleLocked(store *limiter.Store, hash uint64, now int64, req *limiter.Request) {
	k := g.shards[hash%decideShards][hash]
	if k == nil {
		return
	}
	if req != nil && sameKey(req, &k.list[0].req) {
		k.cur = *req
		k.cur.Hits, k.cur.Behavior = 0, 0
		k.cur.Charged = limiter.Window{}
		k.rate = max(k.rate, ratePerNano(req))
	}
	if now < k.next && now >= k.latest {
		return
	}
	gs := k.list
	for i := range gs {
		gs[i].boundTimes(now)
	}
	for i := range gs {
		gr := &gs[i]
		if gr.settled || now < gr.expires {
			continue
		}
		gr.enter(store, time.Unix(0, gr.expires), &k.cur)
	}
	for i := range gs {
		gr := &gs[i]
		if !gr.settled || now < gr.keep || !gr.worth(now) {
			continue
		}
		switch {
		case gr.carried, g.away != nil && g.away(gr.from):
			gr.keep = now + int64(grantLateGrace)
		case now < gr.expires+int64(grantLateGrace) && latest(gs, gr):
			gr.keep = gr.expires + int64(grantLateGrace)
		}
	}
	gs = slices.DeleteFunc(gs, func(gr grant) bool { return gr.settled && now >= gr.keep })
	g.storeLocked(hash, gs)
}

// latest reports whether gr is the latest of gs granted to its holder for
// its key.
func latest(gs []grant, gr *grant) bool {
	for i := range gs {
		if o := &gs[i]; o != gr && o.from == gr.from && sameKey(&o.req, &gr.req) && o.granted > gr.granted {
			return false
		}
	}
	return true
}

// storeLocked makes gs the grants of hash.
func (g *grantTable) storeLocked(hash uint64, gs []grant) {
	i := hash % decideShards
	k := g.shards[i][hash]
	if len(gs) == 0 {
		if k != nil {
			delete(g.shards[i], hash)
			g.keys.Add(-1)
		}
		return
	}
	if k == nil {
		if g.shards[i] == nil {
			g.shards[i] = map[uint64]*keyGrants{}
		}
		k = &keyGrants{}
		g.shards[i][hash] = k
		g.keys.Add(1)
	}
	k.list = gs
	k.update()
}

// grantsLocked returns the grants of hash.
func (g *grantTable) grantsLocked(hash uint64) []grant {
	if k := g.shards[hash%decideShards][hash]; k != nil {
		return k.list
	}
	return nil
}

// heldLocked returns the hits of hash's keys held by token bucket and GCRA
// leases that have not entered the bucket, and the earliest expiry among
// them (0: none). Two keys of one 64-bit hash would count each other's
// hits: fewer admitted, never more.
func (g *grantTable) heldLocked(hash uint64) (held, earliest int64) {
	if k := g.shards[hash%decideShards][hash]; k != nil {
		return k.held, k.earliest
	}
	return 0, 0
}

// full reports whether the shard of hash holds no more keys.
func (g *grantTable) fullLocked(hash uint64) bool {
	m := g.shards[hash%decideShards]
	_, ok := m[hash]
	return !ok && len(m) >= maxGrantKeys
}

// addLocked records hits of req's key granted to from at now until
// expires, merged with from's grant of the key that is not over: the holder
// adds the hits to its lease and keeps the later expiry, so the owner does
// too. settleLocked has bounded the grants by now.
func (g *grantTable) addLocked(hash uint64, from string, req *limiter.Request, hits, now, expires, window int64) {
	gs := g.grantsLocked(hash)
	for i := range gs {
		gr := &gs[i]
		if gr.from == from && !gr.settled && sameKey(&gr.req, req) && sameLimit(&gr.req, req) && gr.window == window {
			gr.hits += hits
			gr.granted = max(gr.granted, now)
			gr.expires = max(gr.expires, expires)
			gr.keep = gr.expires + int64(grantReturnGrace)
			g.storeLocked(hash, gs)
			return
		}
	}
	r := *req
	r.Hits, r.Behavior = 0, 0
	r.Charged = limiter.Window{}
	g.storeLocked(hash, append(gs, grant{from: from, req: r, hits: hits, granted: now, expires: expires, window: window, keep: expires + int64(grantReturnGrace)}))
	if k := g.shards[hash%decideShards][hash]; k.cur.Name == "" {
		k.cur = r
	}
}

// rechargeReset takes again from req's key, at now, the hits of its fixed
// window grants whose window has not ended: a Reset cleared them from the
// key's count, and their holders still admit them. Their holders' returns
// refund them as before. The reset key admits them unless the Reset
// lowered its limit below them; what it cannot take, the holders admit
// past that limit. Called with the key's decide lock held shared, after
// the Reset was decided. It returns the hits taken.
func (g *grantTable) rechargeReset(store *limiter.Store, hash uint64, req *limiter.Request, now time.Time) int64 {
	gm := g.lock(hash)
	gm.Lock()
	defer gm.Unlock()
	var taken int64
	for _, gr := range g.grantsLocked(hash) {
		if deferred(gr.req.Algorithm) || !sameKey(&gr.req, req) || now.UnixNano() >= gr.window {
			continue
		}
		took, _, _ := store.TakeAt(*req, gr.hits, now) //nolint:errcheck // valid: the request was decided
		taken += took
	}
	return taken
}

// giveBackLocked takes back up to hits of from's grants of req's key, the
// earliest expiring first, and returns how many it took from grants that
// had not settled and from grants that had (less what of them has drained
// since: see drained), and of all those how many were of a fixed window
// that has not ended at now; took is every hit taken. With
// skipCarried, grants carried here with the key's state (adoptLocked)
// are left alone: a stand-in's copies of them are not the owner's.
func (g *grantTable) giveBackLocked(hash uint64, from string, req *limiter.Request, hits, now int64, skipCarried bool) (open, settled, inWindow, took int64) {
	gs := g.grantsLocked(hash)
	rate := ratePerNano(req)
	if k := g.shards[hash%decideShards][hash]; k != nil {
		rate = max(rate, k.rate)
	}
	slices.SortFunc(gs, func(a, b grant) int { return int(min(max(a.expires-b.expires, -1), 1)) })
	for i := range gs {
		gr := &gs[i]
		if hits == 0 {
			break
		}
		if gr.from != from || !sameKey(&gr.req, req) || (skipCarried && gr.carried) {
			continue
		}
		k := min(hits, gr.hits)
		gr.hits -= k
		hits -= k
		took += k
		if gr.settled {
			settled += k - gr.drained(rate, k, now)
		} else {
			open += k
		}
		if now < gr.window {
			inWindow += k
		}
	}
	g.storeLocked(hash, slices.DeleteFunc(gs, func(gr grant) bool { return gr.hits == 0 }))
	return open, settled, inWindow, took
}

// sweep settles the grants of every key that expired by now, and forgets
// those whose returns can no longer come, under each decide lock in turn.
func (g *grantTable) sweep(h *handover, store *limiter.Store, now int64) {
	if !g.active() {
		return
	}
	for i := range g.shards {
		h.locks[i].Lock()
		for hash := range g.shards[i] {
			g.settleLocked(store, hash, now, nil)
		}
		h.locks[i].Unlock()
	}
}

// flush makes the grants of every key this node no longer decides as its
// settled owner enter the store now, before their expiry, with what
// drains until then (grant.enterEarly). The hand-off pass and Leave call
// it after the ring changed (or the node stopped deciding), under every
// decide lock in turn, before they read the store: the states they send
// then hold the leased hits, and name their grants (carry.go).
func (g *grantTable) flush(h *handover, store *limiter.Store, now time.Time) {
	if !g.active() {
		return
	}
	for i := range g.shards {
		h.locks[i].Lock()
		for hash, k := range g.shards[i] {
			if st, _ := h.stateOf(hash); st == owned {
				continue
			}
			for j := range k.list {
				if !k.list[j].settled {
					k.list[j].enterEarly(store, now, &k.cur)
				}
			}
			k.update()
		}
		h.locks[i].Unlock()
	}
}

// drained is how many of k hits that entered the bucket when gr expired
// (or earlier: see grant.entered)
// have drained by now, at the faster of the grant's rate and rate (hits
// per ns), at most k; a carried grant's, no fewer than have drained since
// it was adopted less its cushion. Refunding only the rest never gives back room that others have
// taken since: the hits that entered raise the level by at most k less
// what has drained since, whatever else was admitted.
func (gr *grant) drained(rate float64, k, now int64) int64 {
	from := gr.expires
	if gr.entered != 0 {
		from = gr.entered
	}
	elapsed := now - from
	if !deferred(gr.req.Algorithm) || (elapsed <= 0 && gr.adopted == 0) {
		return 0
	}
	rate = max(ratePerNano(&gr.req), rate)
	d := float64(max(elapsed, 0)) * rate
	if gr.adopted != 0 {
		d = max(d, float64(now-gr.adopted)*rate-float64(gr.cushion))
	}
	if d < float64(k) {
		return int64(max(d, 0))
	}
	return k
}
