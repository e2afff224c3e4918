package cluster

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Token leases for hot keys.
//
// A key that this node does not own, checked here more often than
// LeaseConfig.Threshold per second, is hot. For a hot key the node asks the
// owner for a lease: the owner grants up to the wanted hits of the key's
// remaining capacity for a TTL, and counts them as occupying the key from
// then on (grants.go). Until the lease runs out or expires this node admits
// checks of the key from it, without a call; then it forwards again and
// asks for another. Hits it did not use go back to the owner (ReturnLease)
// when the lease expires, or as soon as the node has not used the lease for
// a quarter of a TTL. Every leased hit was counted on the owner before it
// was admitted, so leases never admit more than the limit; what they cost
// is that hits held by one node are not available to another until used
// or returned.
//
// Leases are granted for three algorithms only:
//   - token_bucket and gcra: the owner holds the leased hits apart from the
//     bucket (the TAT), reducing its capacity, and lets them enter it when
//     the lease expires, the latest instant the holder may use them: a hit
//     used at any time of the lease occupies the bucket from the grant on
//     and drains only after the lease, so over any interval T the key
//     admits at most Burst + rate*T, from leases and checks together;
//   - fixed_window: hits are counted in the window they were taken in, and
//     the lease ends with that window, so they are admitted in it; hits
//     given back count again only while that window lasts.
//
// The others are refused: an admitted leaky_bucket hit carries a Delay that
// depends on the moment it was admitted; a sliding_window_log counts hits
// at the instant they were admitted, and a sliding_window_counter weighs a
// window's hits by where in the window they fell, so hits taken at one time
// and admitted at another would be counted at the wrong place.

// ErrLeaseRefused is returned by Node.Lease for a key whose algorithm does
// not allow leases or that this node does not own.
var ErrLeaseRefused = errors.New("cluster: lease refused")

// LeaseConfig configures token leases for hot keys. The zero value (and
// DefaultConfig's) has leases off.
type LeaseConfig struct {
	// Threshold is the rate, in checks per second on this node, of one key
	// another node owns from which this node leases hits of it. 0 turns
	// leases off.
	Threshold int64
	// TTL is how long a lease lasts, at most MaxLeaseTTL; a fixed
	// window lease also ends with its window.
	TTL time.Duration
	// Share bounds one lease to this fraction of the key's capacity (Burst,
	// or Limit for fixed windows), in (0, 1]. Within that bound a lease asks
	// for the hits this node checks in about one TTL at its observed rate.
	Share float64
}

// DefaultLeaseConfig returns leases off, with a 100 ms TTL and leases of at
// most a tenth of a key's capacity once Threshold is set.
func DefaultLeaseConfig() LeaseConfig {
	return LeaseConfig{TTL: 100 * time.Millisecond, Share: 0.1}
}

// Validate reports the first invalid field; errors wrap ErrInvalidConfig.
func (c *LeaseConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: Lease."+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Threshold < 0:
		return bad("Threshold %d is negative (0 turns leases off)", c.Threshold)
	case c.Threshold == 0:
		return nil
	case c.TTL < time.Millisecond || c.TTL > transport.MaxLeaseTTL:
		return bad("TTL %v is outside [1ms, %v]", c.TTL, transport.MaxLeaseTTL)
	case !(c.Share > 0 && c.Share <= 1): // NaN too
		return bad("Share %v is outside (0, 1]", c.Share)
	}
	return nil
}

// LeaseStats counts a node's leases.
type LeaseStats struct {
	Requested    int64 // lease requests sent to owners
	Granted      int64 // requests granted at least one hit
	HitsLeased   int64 // hits granted to this node
	Local        int64 // checks admitted here from a lease
	Denied       int64 // checks denied here after the owner granted no hits
	HitsReturned int64 // unused hits given back to their owners
	Served       int64 // leases of at least one hit this node granted as owner
}

// leasable reports whether the owner grants leases for a.
func leasable(a limiter.Algorithm) bool {
	return a == limiter.TokenBucket || a == limiter.FixedWindow || a == limiter.GCRA
}

var (
	_ transport.Leaser        = (*Node)(nil)
	_ transport.LeaseReturner = (*Node)(nil)
)

// Lease grants up to want hits of req's key, which this node must own, for
// ttl. A token bucket or GCRA lease holds its hits apart from the key's
// bucket until it expires, when they enter it (grants.go); a fixed window
// lease takes them off the window's count at once and ends with the
// window. It is how the Peer service answers Lease; errors wrap
// ErrLeaseRefused, a limiter sentinel, or are ErrClosed.
func (n *Node) Lease(ctx context.Context, from string, req limiter.Request, want int64, ttl time.Duration) (Lease, error) {
	if n.closed.Load() {
		return transport.Lease{}, ErrClosed
	}
	if !leasable(req.Algorithm) {
		return transport.Lease{}, fmt.Errorf("%w: %s hits cannot be leased (only token_bucket, fixed_window and gcra)", ErrLeaseRefused, req.Algorithm)
	}
	if ttl <= 0 || ttl > transport.MaxLeaseTTL {
		return transport.Lease{}, fmt.Errorf("%w: ttl %v is outside (0, %v]", ErrLeaseRefused, ttl, transport.MaxLeaseTTL)
	}
	// Read before and after the ownership, as decideAsOwner reads it.
	standingIn := n.standins.standingIn(ring.RouteHash(req.Name, req.Key))
	hash, now, unlock, err := n.lockOwnedKey(&req)
	if err != nil {
		return transport.Lease{}, err
	}
	defer unlock()
	standingIn = standingIn || n.standins.standingIn(hash)
	if n.grants.fullLocked(hash) {
		return transport.Lease{}, fmt.Errorf("%w: %s holds leases of too many keys", ErrLeaseRefused, n.cfg.NodeName)
	}
	var (
		took int64
		d    limiter.Decision
	)
	exp := now.Add(ttl)
	if deferred(req.Algorithm) {
		took, d, err = n.grantHeldLocked(&req, hash, want, now)
	} else {
		took, d, err = n.store.TakeAt(req, want, now)
		if took > 0 && d.ResetAt.Before(exp) {
			exp = d.ResetAt // the window's end
		}
	}
	if err != nil {
		return transport.Lease{}, err
	}
	if took > 0 {
		if standingIn {
			// Its hits count in the key's state with no part: a refund
			// may give them back, which must then lower no part.
			n.standins.leasedStandingIn.Store(true)
		}
		var window int64 // a fixed window lease's hits count until it ends
		if !deferred(req.Algorithm) {
			window = d.ResetAt.UnixNano()
		}
		n.grants.addLocked(hash, from, &req, took, now.UnixNano(), exp.UnixNano(), window)
		n.leases.served.Add(1)
		if deferred(req.Algorithm) {
			n.grants.noteChanged(hash, &req)
		}
	}
	return transport.Lease{Granted: took, ExpiresAt: exp, ValidFor: exp.Sub(now), Decision: d}, nil
}

// lockOwnedKey takes req's decide lock exclusively, for a grant or a
// return that no decision of the key may interleave with, when this node
// is the key's settled owner (an error wrapping ErrLeaseRefused
// otherwise), and settles the key's expired grants. The caller calls
// unlock.
func (n *Node) lockOwnedKey(req *limiter.Request) (hash uint64, now time.Time, unlock func(), err error) {
	hash = ring.RouteHash(req.Name, req.Key)
	mu := n.handover.lock(hash)
	mu.Lock()
	if st, o := n.handover.stateOf(hash); st != owned {
		mu.Unlock()
		return 0, time.Time{}, nil, fmt.Errorf("%w: %s does not decide the key now (owner %s)", ErrLeaseRefused, n.cfg.NodeName, o.Name)
	}
	now = n.now()
	n.grants.settleLocked(n.store, hash, now.UnixNano(), req)
	return hash, now, mu.Unlock, nil
}

// grantHeldLocked sizes a token bucket or GCRA lease of up to want hits:
// what the key admits now with its capacity reduced by the hits other
// leases hold. Nothing is consumed; the caller records the grant. The
// decision is for the hits granted, or for one hit when none are.
func (n *Node) grantHeldLocked(req *limiter.Request, hash uint64, want int64, now time.Time) (int64, limiter.Decision, error) {
	r := *req
	r.Hits, r.Behavior = 0, 0
	r.Charged = limiter.Window{}
	if err := r.Validate(); err != nil {
		return 0, limiter.Decision{}, err
	}
	out, earliest := n.grants.heldLocked(hash)
	r.Burst = r.Capacity() - out
	if r.Burst < 1 {
		wait := time.Duration(earliest - now.UnixNano())
		return 0, limiter.Decision{Limit: r.Limit, RetryAfter: wait, ResetAt: now.Add(wait)}, nil
	}
	d, err := n.store.CheckAt(r, now) // a peek: what is free now
	if err != nil {
		return 0, limiter.Decision{}, err
	}
	took := min(want, d.Remaining)
	if took == 0 {
		r.Hits = 1 // denied: says when a hit is free
		d, err = n.store.CheckAt(r, now)
		return 0, d, err
	}
	d.Allowed, d.Remaining = true, d.Remaining-took
	return took, d, nil
}

// ReturnLease takes back hits of req's key that the node named from was
// granted and did not use: hits of a lease that has not expired are freed;
// hits of one that expired and entered the bucket are refunded; a fixed
// window's hits are refunded while their window lasts. The grants are
// this node's own and those carried here with the key's state from the
// owner that granted them (carry.go). Hits beyond what from was granted
// change nothing. A stand-in that holds no grant of from's refuses the
// return (the owner it stands in for takes it once reachable), and so
// does a node that leaves (its states, and the grants with them, are on
// their way to the keys' new owners, which take the returns). Errors wrap
// ErrLeaseRefused or are ErrClosed.
func (n *Node) ReturnLease(ctx context.Context, from string, req limiter.Request, hits int64) error {
	if n.closed.Load() {
		return ErrClosed
	}
	if n.transfers.leaving.Load() {
		return fmt.Errorf("%w: %s is leaving", ErrLeaseRefused, n.cfg.NodeName)
	}
	hash, now, unlock, err := n.lockOwnedKey(&req)
	if err != nil {
		return err
	}
	defer unlock()
	standingIn := n.standins.standingIn(hash)
	_, settled, inWindow, took := n.grants.giveBackLocked(hash, from, &req, hits, now.UnixNano(), standingIn)
	if took == 0 && standingIn {
		return fmt.Errorf("%w: %s stands in for the key's owner, which takes its returns", ErrLeaseRefused, n.cfg.NodeName)
	}
	refund := settled
	if !deferred(req.Algorithm) {
		refund = inWindow // a window's hits were counted when granted
	}
	if refund > 0 {
		r := req
		r.Hits, r.Behavior = min(refund, r.Capacity()), limiter.Refund
		if _, err := n.store.CheckAt(r, now); err != nil {
			return err
		}
	}
	return nil
}

const (
	leaseShards = 64
	// leaseInterval is how often a key's rate is measured.
	leaseInterval = 100 * time.Millisecond
	// Bounds per shard: keys counted in one interval, hot keys tracked.
	maxCountedKeys = 4096
	maxHotKeys     = 256
	// maxReturns bounds the returns waiting to be sent.
	maxReturns = 4096
	// maxReturnWait bounds how long a return is tried again.
	maxReturnWait = 24 * time.Hour
	// returnRetry is how often returns not sent are tried again.
	returnRetry = 100 * time.Millisecond
	// returnRefusedWait is how long an owner that refuses a return (in
	// hand-over, or the key moved) is asked again.
	returnRefusedWait = 10 * time.Second
)

// leaseTable is a node's side of leasing: the rate of every key it
// forwards, the hot keys and their leases. Safe for concurrent use.
type leaseTable struct {
	enabled     bool // Config.Lease.Threshold > 0
	cfg         LeaseConfig
	maxSkew     time.Duration // Config.MaxClockSkew: for owners without ValidFor
	perInterval int64         // checks in one interval that make a key hot
	seed        maphash.Seed
	shards      [leaseShards]leaseShard

	fetches        chan leaseFetch // to the lease loop; never blocks the hot path
	kick           chan struct{}   // wakes the lease loop to send returns
	sendingReturns atomic.Bool     // a goroutine is sending returns

	returnsMu sync.Mutex // guards returns
	returns   []leaseReturn

	requested, granted, hitsLeased, local, denied, returned, served atomic.Int64
	// afterHandoff counts the returns held back until this node's
	// hand-off states to their owner were delivered (leaseCalls.giveBack).
	afterHandoff atomic.Int64
}

type leaseShard struct {
	mu     sync.Mutex // guards since, until, counts and hot
	since  int64      // start of the current interval, Unix ns
	until  int64      // its end
	counts map[uint64]int32
	hot    map[uint64]*hotKey
	_      [64]byte // keeps shards' locks on separate cache lines
}

// hotKey is a key over the threshold and its lease, if any. Its fields are
// guarded by its shard's mu.
type hotKey struct {
	name, key   string
	count, prev int64 // eligible checks in this interval and the last one
	asking      bool  // a lease request is in flight (one per key)
	notBefore   int64 // no lease request before this, after a refusal
	// After a lease of no hits: checks are denied here until deniedUntil,
	// when the owner said the limit admits the next hit.
	deniedUntil int64
	deniedReset time.Time

	// The lease, when expires != 0.
	owner   string
	req     limiter.Request // its limit parameters (Hits 0)
	left    int64           // hits not used yet
	last    int64           // hits of the last grant
	expires int64           // Unix ns, this node's clock
	usedAt  int64           // when a check last used it (or it came)
	resetAt time.Time       // the owner's ResetAt
}

// leaseFetch is one lease request for the lease loop to make.
type leaseFetch struct {
	hot   *hotKey
	hash  uint64
	owner string
	req   limiter.Request
	want  int64
}

// leaseReturn is unused leased hits to give back: req.Hits of them, tried
// again until until (Unix ns, this node's clock) while the owner cannot
// take them.
type leaseReturn struct {
	owner string
	req   limiter.Request
	until int64
	// refusedAt is when the owner first refused it (0: never), refused
	// that it did just now: an owner that keeps refusing no longer decides
	// the key, and is asked again for returnRefusedWait at most.
	refusedAt int64
	refused   bool
}

func newLeaseTable(cfg LeaseConfig, maxSkew time.Duration) *leaseTable {
	t := &leaseTable{enabled: cfg.Threshold > 0, cfg: cfg, maxSkew: maxSkew, seed: maphash.MakeSeed()}
	if !t.enabled {
		return t
	}
	t.perInterval = max(1, int64(math.Ceil(float64(cfg.Threshold)*leaseInterval.Seconds())))
	t.fetches = make(chan leaseFetch, 256)
	t.kick = make(chan struct{}, 1)
	for i := range t.shards {
		t.shards[i].counts = make(map[uint64]int32)
		t.shards[i].hot = make(map[uint64]*hotKey)
	}
	return t
}

// startLeases sets up leasing: the counters, their metrics and, when
// leases are on, the lease loop.
func (n *Node) startLeases() error {
	n.leases = newLeaseTable(n.cfg.Lease, n.cfg.MaxClockSkew)
	if reg := n.cfg.Registerer; reg != nil {
		t := n.leases
		for _, c := range []struct {
			name, help string
			v          *atomic.Int64
		}{
			{"sluice_lease_requests_total", "Lease requests sent to the owners of hot keys.", &t.requested},
			{"sluice_leases_granted_total", "Lease requests granted at least one hit.", &t.granted},
			{"sluice_lease_hits_total", "Hits leased from owners.", &t.hitsLeased},
			{"sluice_lease_checks_total", "Checks admitted on this node from a lease.", &t.local},
			{"sluice_lease_denied_checks_total", "Checks denied on this node because their owner had just granted no hits.", &t.denied},
			{"sluice_lease_returned_hits_total", "Unused leased hits given back to their owners.", &t.returned},
			{"sluice_leases_served_total", "Leases of at least one hit granted by this node as owner.", &t.served},
		} {
			v := c.v
			f := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help}, func() float64 { return float64(v.Load()) })
			if err := reg.Register(f); err != nil {
				return fmt.Errorf("cluster: register metrics: %w", err)
			}
		}
	}
	if n.leases.enabled {
		t, stop, clock, timeout, logger := n.leases, n.shutdown, n.clock, n.cfg.Peer.Timeout, n.logger
		n.goFunc(func() { t.loop(stop, leaseCalls{n}, clock, timeout, logger) })
	}
	return nil
}

func (n *Node) leaseStats() LeaseStats {
	t := n.leases
	if t == nil {
		return LeaseStats{}
	}
	return LeaseStats{
		Requested:    t.requested.Load(),
		Granted:      t.granted.Load(),
		HitsLeased:   t.hitsLeased.Load(),
		Local:        t.local.Load(),
		Denied:       t.denied.Load(),
		HitsReturned: t.returned.Load(),
		Served:       t.served.Load(),
	}
}

func (t *leaseTable) hash(name, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(name)
	h.WriteByte(0)
	h.WriteString(key)
	return h.Sum64()
}

// sameLimit reports whether a and b have the same limit parameters.
func sameLimit(a, b *limiter.Request) bool {
	return a.Limit == b.Limit && a.Period == b.Period && a.Burst == b.Burst &&
		a.Algorithm == b.Algorithm && a.Calendar == b.Calendar &&
		(a.Location == b.Location || a.Location.String() == b.Location.String())
}

// decide answers req, a valid request for a key that owner owns, from this
// node's lease of the key when it holds one with enough hits; ok is false
// when req must be forwarded. On the way it counts the key's checks and,
// when the key is hot and its lease missing or running low, has the lease
// loop ask the owner for one.
func (t *leaseTable) decide(req *limiter.Request, owner string, now int64) (d sluice.Decision, ok bool) {
	if req.Hits < 1 || req.Behavior != 0 || !leasable(req.Algorithm) {
		return d, false
	}
	hash := t.hash(req.Name, req.Key)
	sh := &t.shards[hash%leaseShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t.rollLocked(sh, now)
	h := sh.hot[hash]
	if h == nil {
		c, counted := sh.counts[hash]
		if !counted && len(sh.counts) >= maxCountedKeys {
			return d, false
		}
		c++
		if int64(c) < t.perInterval || len(sh.hot) >= maxHotKeys {
			sh.counts[hash] = c
			return d, false
		}
		delete(sh.counts, hash)
		h = &hotKey{name: req.Name, key: req.Key, count: int64(c) - 1}
		sh.hot[hash] = h
	} else if h.name != req.Name || h.key != req.Key {
		return d, false // a hash collision: this key is not leased
	}
	h.count++
	t.boundLocked(h, now)
	if h.expires != 0 {
		switch {
		case h.owner != owner, // the ring changed: the old owner's hits are void here
			!sameLimit(&h.req, req), // hits of another limit
			now >= h.expires:
			t.retireLocked(h, now)
		}
	}
	if h.expires != 0 && h.left >= req.Hits {
		h.left -= req.Hits
		h.usedAt = now
		t.local.Add(1)
		d = sluice.Decision{Decision: limiter.Decision{Allowed: true, Limit: req.Limit, Remaining: h.left, ResetAt: h.resetAt}, Owner: h.owner}
		ok = true
	} else if now < h.deniedUntil && sameLimit(&h.req, req) && h.owner == owner {
		t.denied.Add(1)
		return sluice.Decision{Decision: limiter.Decision{Limit: req.Limit, ResetAt: h.deniedReset, RetryAfter: time.Duration(h.deniedUntil - now)}, Owner: h.owner}, true
	}
	ttl := int64(t.cfg.TTL)
	low := h.expires == 0 || h.left*4 <= h.last || now >= h.expires-ttl/4
	if low && !h.asking && now >= h.notBefore {
		f := leaseFetch{hot: h, hash: hash, owner: owner, req: *req, want: t.wantLocked(sh, h, req, now)}
		f.req.Hits = 0
		select {
		case t.fetches <- f:
			h.asking = true
		default: // the loop is busy or gone: ask on a later check
		}
	}
	return d, ok
}

// noteDenied records that the owner denied req, a hot key's check whose
// answer came at recv: like a lease of no hits, it makes this node deny the
// key itself until the owner said a hit is admitted again (at least 100µs,
// at most a TTL), rather than forward every check meanwhile. The wait runs
// from recv, a little after the owner decided, so the node may deny a hit
// the owner would have admitted in between (the limit is reached: other
// nodes take it), never admit one it would not. Keys that are not hot are
// left alone.
func (t *leaseTable) noteDenied(req *limiter.Request, owner string, d *limiter.Decision, recv int64) {
	if d.Allowed || req.Hits < 1 || req.Behavior != 0 || !leasable(req.Algorithm) {
		return
	}
	hash := t.hash(req.Name, req.Key)
	sh := &t.shards[hash%leaseShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	h := sh.hot[hash]
	if h == nil || h.name != req.Name || h.key != req.Key {
		return
	}
	if h.expires != 0 && (h.owner != owner || !sameLimit(&h.req, req)) {
		return // the lease's limit is not this one
	}
	t.denyLocked(h, owner, req, d, recv)
}

// denyLocked makes h denied here until sent plus the owner's RetryAfter
// in d, within [100µs, TTL]; its shard's lock must be held.
func (t *leaseTable) denyLocked(h *hotKey, owner string, req *limiter.Request, d *limiter.Decision, sent int64) {
	wait := min(max(int64(d.RetryAfter), int64(100*time.Microsecond)), int64(t.cfg.TTL))
	h.notBefore = max(h.notBefore, sent+wait)
	h.deniedUntil, h.deniedReset = sent+wait, d.ResetAt
	if h.expires == 0 { // what the denial applies to
		h.owner, h.req = owner, *req
		h.req.Hits = 0
	}
}

// wantLocked sizes a lease of h: the hits checked here in one TTL at the
// rate of this interval or the last, within Share of the capacity.
func (t *leaseTable) wantLocked(sh *leaseShard, h *hotKey, req *limiter.Request, now int64) int64 {
	elapsed := max(now-sh.since, int64(leaseInterval)/10)
	rate := max(float64(h.count)/float64(elapsed), float64(h.prev)/float64(leaseInterval)) // per ns
	want := int64(math.Ceil(rate * float64(t.cfg.TTL)))
	limit := max(int64(t.cfg.Share*float64(req.Capacity())), 1)
	return min(max(want, 1), limit)
}

// rollLocked starts a new interval when the current one is over: counts
// restart, expired leases are retired, and keys gone cold that hold no
// lease are forgotten. It visits at most maxHotKeys keys.
func (t *leaseTable) rollLocked(sh *leaseShard, now int64) {
	if now < sh.until && now >= sh.since { // before since: the clock stepped back
		return
	}
	clear(sh.counts)
	for k, h := range sh.hot {
		t.boundLocked(h, now)
		h.prev, h.count = h.count, 0
		if h.expires != 0 && now >= h.expires {
			t.retireLocked(h, now)
		}
		if h.prev < t.perInterval && h.expires == 0 && !h.asking {
			delete(sh.hot, k)
		}
	}
	sh.since, sh.until = now, now+int64(leaseInterval)
}

// boundLocked reads the times of h that are further ahead of now than a
// TTL, which only a clock that stepped back finds, as set at now: the
// lease, a denial and the wait before the next lease request last at most
// a TTL from now, so that a step back holds no key here longer than that.
// Its shard's lock must be held.
func (t *leaseTable) boundLocked(h *hotKey, now int64) {
	late := now + int64(t.cfg.TTL)
	if h.expires > late {
		h.expires = late
	}
	h.deniedUntil = min(h.deniedUntil, late)
	h.notBefore = min(h.notBefore, late)
	h.usedAt = min(h.usedAt, now)
}

// retireLocked ends h's lease, whatever ends it (its expiry, disuse, a
// new owner or limit of its key, the node closing), queueing its unused
// hits for return to the owner that granted them (sent to the key's new
// owner when the key moved: leaseCalls.giveBack) while they still count:
// for a fixed window, only within the window they were taken in (as far
// as MaxClockSkew lets this node tell). The owner frees only hits it
// granted this node and has not taken back (grants.go), so a return sent
// to an owner that no longer decides the key, or sent twice, frees
// nothing more.
func (t *leaseTable) retireLocked(h *hotKey, now int64) {
	if h.left > 0 && (h.req.Algorithm != limiter.FixedWindow || now < h.resetAt.UnixNano()+int64(t.maxSkew)) {
		r := h.req
		r.Hits = min(h.left, r.Capacity()) // the hits to give back
		t.queueReturn(leaseReturn{owner: h.owner, req: r, until: t.returnUntil(h, r.Hits, now)})
	}
	h.left, h.last, h.expires = 0, 0, 0
}

// returnUntil is how long this node tries to give back hits of h's lease
// that its owner cannot take now (cut off, failed, or in hand-over): as
// long as they would still free anything there. A fixed window's hits
// count until the window ends; a bucket's drain from the lease's expiry at
// the key's rate. MaxClockSkew is added for the owner's clock.
func (t *leaseTable) returnUntil(h *hotKey, hits, now int64) int64 {
	if h.req.Algorithm == limiter.FixedWindow {
		return h.resetAt.UnixNano() + int64(t.maxSkew)
	}
	drain := time.Duration(float64(hits) / float64(h.req.Limit) * float64(h.req.Period))
	return max(h.expires, now) + int64(min(drain, maxReturnWait)) + int64(t.maxSkew)
}

// queueReturn queues r and wakes the lease loop. Returns beyond maxReturns
// are dropped: those hits stay consumed, which never over-admits.
func (t *leaseTable) queueReturn(r leaseReturn) {
	t.returnsMu.Lock()
	if len(t.returns) < maxReturns {
		t.returns = append(t.returns, r)
	}
	t.returnsMu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// expiry is when the lease l, asked for at sent, ends on this node's clock:
// its ValidFor (at most a TTL) counted from sent, which is before the owner
// granted it, less leaseMargin. The owner's clock is never read, so the
// lease ends before the owner's expiry (a fixed window's end) whatever the
// offset between the clocks, by the request's transit at least. An owner
// that predates ValidFor gives only its clock's ExpiresAt: the lease then
// also ends MaxClockSkew before it, as read here.
func (t *leaseTable) expiry(l *transport.Lease, sent int64) int64 {
	ttl := int64(t.cfg.TTL)
	valid := min(int64(l.ValidFor), ttl)
	if l.ValidFor <= 0 {
		valid = min(l.ExpiresAt.UnixNano()-int64(t.maxSkew)-sent, ttl)
	}
	return sent + valid - leaseMargin(valid)
}

// leaseMargin is how much earlier than its duration says a lease of valid
// ns ends on the holder: a thousandth, for clocks that run at rates a
// thousandth apart (ordinary quartz drifts within a ten-thousandth), and
// at least 100µs.
func leaseMargin(valid int64) int64 {
	return max(valid/1000, int64(100*time.Microsecond))
}

// install records the answer to f, made with the request sent at sent.
func (t *leaseTable) install(f *leaseFetch, l transport.Lease, err error, sent, now int64) {
	sh := &t.shards[f.hash%leaseShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	h := sh.hot[f.hash]
	if h != f.hot { // forgotten meanwhile: give the hits back
		if err == nil && l.Granted > 0 {
			h = &hotKey{owner: f.owner, req: f.req, left: l.Granted, expires: t.expiry(&l, sent), resetAt: l.Decision.ResetAt}
			t.retireLocked(h, now)
		}
		return
	}
	h.asking = false
	ttl := int64(t.cfg.TTL)
	switch {
	case err != nil:
		h.notBefore = now + ttl
		return
	case l.Granted == 0:
		// The limit is reached: deny here, and ask again, once the owner
		// said it admits a hit (counted from when it was asked, which is
		// earlier than when it answered), within a TTL.
		t.denyLocked(h, f.owner, &f.req, &l.Decision, sent)
		return
	}
	exp := t.expiry(&l, sent)
	if h.expires != 0 {
		same := h.owner == f.owner && sameLimit(&h.req, &f.req) && now < h.expires &&
			(f.req.Algorithm != limiter.FixedWindow || h.resetAt.Equal(l.Decision.ResetAt))
		if same { // the same hits: add to them
			h.left += l.Granted
			h.last = l.Granted
			h.usedAt = now
			h.expires = max(h.expires, exp)
			h.resetAt = l.Decision.ResetAt
			return
		}
		t.retireLocked(h, now)
	}
	h.owner, h.req, h.left, h.last, h.expires, h.resetAt = f.owner, f.req, l.Granted, l.Granted, exp, l.Decision.ResetAt
	h.usedAt = now
	if exp <= now { // arrived too late to be used
		t.retireLocked(h, now)
	}
}

// leaseOwners is how the lease table reaches the owners of the keys it
// leases: the Node, through its router and peer clients. Safe for
// concurrent use.
type leaseOwners interface {
	// ownerOf returns the owner of (name, key) in this node's ring.
	ownerOf(name, key string) (string, bool)
	// lease asks owner for up to want hits of req's key for ttl, on the
	// route a check of the key takes (router.pick); an owner that cannot
	// be called now gives an error wrapping transport.ErrUnavailable, and
	// one that is not the key's settled owner an error wrapping
	// ErrLeaseRefused, without a call.
	lease(ctx context.Context, owner string, req limiter.Request, want int64, ttl time.Duration) (transport.Lease, error)
	// giveBack returns hits of req's key to owner. The error wraps
	// errReturnNotSent when owner certainly did not take them: it is not
	// in this node's ring, cannot be called now, or refused them; also
	// transport.ErrUnavailable when it cannot be reached now.
	giveBack(ctx context.Context, owner string, req limiter.Request, hits int64) error
}

// errReturnNotSent marks the returns of leased hits that their owner did
// not take, to send again.
var errReturnNotSent = errors.New("cluster: lease return not taken")

// loop makes the lease requests the hot path asks for, sends unused hits
// back, and retires expired leases, leases unused for a quarter of a TTL
// and leases whose owner changed, until stop is closed. Then it returns
// every outstanding lease, within returnTimeout. clock is the node's.
func (t *leaseTable) loop(stop <-chan struct{}, owners leaseOwners, clock Clock, returnTimeout time.Duration, logger *slog.Logger) {
	now := clock.Now
	ctx, cancel := context.WithCancel(context.Background())
	var work sync.WaitGroup // lease requests and returns in flight
	defer func() {
		cancel()
		work.Wait()
		t.returnAll(owners, clock, returnTimeout)
	}()
	tick := clocks.NewTicker(clock, max(t.cfg.TTL/4, time.Millisecond))
	defer tick.Stop()
	// Returns not sent are tried again at least every returnRetry,
	// whatever the TTL: their owner may be back long before it ends.
	retry := clocks.NewTicker(clock, returnRetry)
	defer retry.Stop()
	sendReturns := func() {
		if t.sendingReturns.CompareAndSwap(false, true) {
			work.Add(1)
			go func() {
				defer work.Done()
				defer t.sendingReturns.Store(false)
				t.requeue(t.sendReturns(ctx, owners), now().UnixNano())
			}()
		}
	}
	for {
		select {
		case <-stop:
			return
		case f := <-t.fetches:
			work.Add(1)
			go func() {
				defer work.Done()
				sent := now().UnixNano()
				err := t.fetch(ctx, &f, owners, sent, now)
				if err != nil {
					logger.Debug("cluster: lease request failed", "owner", f.owner, "key", f.req.Key, "err", err)
				}
			}()
		case <-t.kick:
			sendReturns()
		case <-retry.C:
			if t.returnsPending() {
				sendReturns()
			}
		case <-tick.C:
			t.sweep(now().UnixNano(), owners)
			sendReturns()
		}
	}
}

// fetch asks f's owner for a lease, sent at sent, and installs the answer
// at now(); it returns the request's error.
func (t *leaseTable) fetch(ctx context.Context, f *leaseFetch, owners leaseOwners, sent int64, now func() time.Time) error {
	t.requested.Add(1)
	l, err := owners.lease(ctx, f.owner, f.req, f.want, t.cfg.TTL)
	if err == nil && l.Granted > 0 {
		t.granted.Add(1)
		t.hitsLeased.Add(l.Granted)
	}
	t.install(f, l, err, sent, now().UnixNano())
	return err
}

// sweep rolls every shard's interval, retires expired leases, gives back
// the hits of leases not used for a quarter of a TTL, and drops leases
// whose key the ring now gives to another owner.
func (t *leaseTable) sweep(now int64, owners leaseOwners) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		t.rollLocked(sh, now)
		for _, h := range sh.hot {
			if h.expires == 0 {
				continue
			}
			t.boundLocked(h, now)
			switch o, ok := owners.ownerOf(h.name, h.key); {
			case !ok || o != h.owner, now >= h.expires:
				t.retireLocked(h, now)
			case now-h.usedAt >= int64(t.cfg.TTL)/4:
				// Not used for a quarter of a TTL: the node stopped
				// checking the key; its hits go back before the TTL
				// ends, to be of use elsewhere.
				t.retireLocked(h, now)
			}
		}
		sh.mu.Unlock()
	}
}

// sendReturns gives the queued returns back to their owners, one call
// each, the owners in parallel, and returns those that were not sent (or
// that the owner refused without taking them: errReturnNotSent). The
// others are done: a return that failed once it may have been taken is
// never sent again, since the owner takes back up to what this node holds
// of the key's grants, and a second return would free hits it used.
func (t *leaseTable) sendReturns(ctx context.Context, owners leaseOwners) []leaseReturn {
	t.returnsMu.Lock()
	rs := t.returns
	t.returns = nil
	t.returnsMu.Unlock()
	byOwner := make(map[string][]leaseReturn)
	for _, r := range rs {
		byOwner[r.owner] = append(byOwner[r.owner], r)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // guards notSent
		notSent []leaseReturn
	)
	for owner, rs := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, r := range rs {
				err := owners.giveBack(ctx, owner, r.req, r.req.Hits)
				switch {
				case err == nil:
					t.returned.Add(r.req.Hits)
					continue
				case !errors.Is(err, errReturnNotSent):
					continue
				}
				r.refused = !errors.Is(err, transport.ErrUnavailable)
				mu.Lock()
				notSent = append(notSent, r)
				if ctx.Err() == nil && !r.refused {
					notSent = append(notSent, rs[i+1:]...) // the owner cannot be reached now
					mu.Unlock()
					return
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return notSent
}

// returnsPending reports whether returns wait to be sent.
func (t *leaseTable) returnsPending() bool {
	t.returnsMu.Lock()
	defer t.returnsMu.Unlock()
	return len(t.returns) > 0
}

// requeue queues again the returns of rs to try until later than now,
// those refused for less than returnRefusedWait.
func (t *leaseTable) requeue(rs []leaseReturn, now int64) {
	t.returnsMu.Lock()
	defer t.returnsMu.Unlock()
	for _, r := range rs {
		if r.refused {
			if r.refusedAt == 0 {
				r.refusedAt = now
			}
			r.refused = false
			if now-r.refusedAt >= int64(returnRefusedWait) {
				continue
			}
		}
		if now < r.until && len(t.returns) < maxReturns {
			t.returns = append(t.returns, r)
		}
	}
}

// returnAll retires every lease now and sends the unused hits back,
// within timeout on clock. The node is closing: nothing leases any more.
func (t *leaseTable) returnAll(owners leaseOwners, clock Clock, timeout time.Duration) {
	now := clock.Now().UnixNano()
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, h := range sh.hot {
			if h.expires != 0 {
				t.retireLocked(h, now)
			}
		}
		sh.mu.Unlock()
	}
	ctx, cancel := clocks.WithTimeout(context.Background(), clock, timeout)
	defer cancel()
	t.sendReturns(ctx, owners) // what is not sent now is lost: fewer admitted
}

// leaseCalls is the Node's side of leaseOwners.
type leaseCalls struct{ n *Node }

var _ leaseOwners = leaseCalls{}

func (c leaseCalls) ownerOf(name, key string) (string, bool) {
	o, ok := c.n.ring.Owner(name, key)
	return o.Name, ok
}

// lease takes a check's route: the router picks where req's key is
// decided now, as it does for every check (check.go's plan), and the
// request goes only to a settled owner that is owner: a key this node
// decides, one in hand-over, one whose owner changed since the lease
// was asked for, or whose owner cannot be called now (its breaker is
// open), is not leased, and the loop asks again later. The call's outcome
// feeds the owner's breaker as a forwarded check's does.
func (c leaseCalls) lease(ctx context.Context, owner string, req limiter.Request, want int64, ttl time.Duration) (transport.Lease, error) {
	r := c.n.router
	p := r.pick(ring.RouteHash(req.Name, req.Key))
	if p.way != wayOwner || p.peer != owner {
		r.release(&p)
		if p.way == wayDown || p.way == wayNotReady {
			return transport.Lease{}, fmt.Errorf("%w: %s", transport.ErrUnavailable, owner)
		}
		return transport.Lease{}, fmt.Errorf("%w: %s does not decide %s/%s now", ErrLeaseRefused, owner, req.Name, req.Key)
	}
	l, err := p.client.Lease(ctx, req, want, ttl)
	r.done(&p, err)
	return l, err
}

// giveBack calls owner only when it is in this node's ring, the
// connection to it is ready, and every key state this node may hand it
// has been delivered: a call that fails then may have been taken, and is
// not sent again. An owner that refuses (not the key's settled owner now,
// in hand-over) took nothing.
//
// A state this node hands the owner may hold the leased hits: a copy of
// the owner's state it merged as a replica, or while it stood in for the
// owner cut off. Merged after the return, by the larger, it would take
// back the hits the return freed; merged before, the return frees them
// from the merged state.
//
// The hits go to the node that decides the key now in place of owner
// (returnTo), which took owner's grants with the key's state.
func (c leaseCalls) giveBack(ctx context.Context, owner string, req limiter.Request, hits int64) error {
	owner = c.n.returnTo(owner, &req)
	if owner == c.n.cfg.NodeName {
		if err := c.n.ReturnLease(ctx, owner, req, hits); err != nil {
			return fmt.Errorf("%w: %w", errReturnNotSent, err)
		}
		return nil
	}
	cl, ok := c.n.peers.Get(owner)
	if !ok || !c.n.inRing(owner) || !cl.Ready() {
		return fmt.Errorf("%w: %w: %s", errReturnNotSent, transport.ErrUnavailable, owner)
	}
	if c.n.handingOff(owner) {
		c.n.leases.afterHandoff.Add(1)
		return fmt.Errorf("%w: %w: key states for %s not handed off yet", errReturnNotSent, transport.ErrUnavailable, owner)
	}
	err := cl.ReturnLease(ctx, req, hits)
	if status.Code(err) == codes.FailedPrecondition {
		return fmt.Errorf("%w: %w", errReturnNotSent, err)
	}
	return err
}

// returnTo returns the node that takes back hits of req's key that owner
// granted: the key's owner on this node's ring with the members cut off
// (standins), which is owner unless the key moved (a member joined, or
// owner left or was reaped after it failed), its state and grants with
// it. A stand-in is not one: an owner cut off takes its returns once
// reachable again.
func (n *Node) returnTo(owner string, req *limiter.Request) string {
	var (
		m  ring.Member
		ok bool
	)
	if r := n.standins.full.Load(); r != nil {
		m, ok = r.OwnerOfHash(ring.RouteHash(req.Name, req.Key))
	} else {
		m, ok = n.ring.Owner(req.Name, req.Key)
	}
	if !ok {
		return owner
	}
	return m.Name
}
