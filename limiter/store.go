package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// Shards is the number of independently locked shards, a power of two.
	Shards int
	// MaxEntries bounds the number of keys held. When a new key would pass
	// it, the least recently used key of its shard is evicted (the bound is
	// enforced per shard, MaxEntries/Shards each, rounded down). 0 means no
	// bound.
	MaxEntries int
	// MaxBytes bounds the memory of the keys held, counted thus: each key
	// costs its store key (1+len(Name)+len(Key) bytes, rounded up as the
	// allocator does) plus EntryOverhead, and a sliding window log
	// LogOverhead plus LogEntryBytes for each entry its array has room
	// for, and a Reset's mark ResetMarkOverhead while it lasts. When an
	// insert, a log's growth or a mark would pass it, the
	// least recently used keys of the shard are evicted until it fits (the
	// bound is enforced per shard, MaxBytes/Shards each, rounded down,
	// which must be at least MaxKeyBytes so that every key fits). 0 means
	// no bound.
	MaxBytes int64
	// TrackChanges makes the store remember which keys each decision or
	// Merge changed, for Changed (replication). It costs one mark per
	// decision.
	TrackChanges bool
	// KeepStrictest makes a key's live state keep the strictest rate any
	// request has charged it under since it was fresh: a request whose
	// Algorithm, Limit, Period, Calendar or Burst differ from that rate is
	// decided with the state's algorithm and the strictest of both rates
	// (see the package comment), so that no request that may not reset a
	// key lowers what it counts by changing its parameters: a fixed
	// window's or sliding window counter's hits stay counted until the
	// end of every window they were charged under. A cut takes
	// effect at once; anything laxer (a raise, a shorter Period, another
	// Algorithm) once the key's state is fresh, or after a Reset.
	KeepStrictest bool
}

// DefaultStoreConfig returns 128 shards, at most 1,000,000 entries and at
// most 128 MiB as MaxBytes counts them: about 930,000 keys of up to 16
// bytes, 116,000 keys of 1 KB, or 2,000 sliding window logs full at
// MaxLogEntries. The heap that the keys and logs take is within 1/16 of
// the count (TestMaxBytesHeap measures it), about 135 MB at most; with
// TrackChanges, the lists of changed keys add 8 bytes per change, at most
// 64 MiB, and the entries (not their keys) dropped since the last Changed.
func DefaultStoreConfig() StoreConfig {
	return StoreConfig{Shards: 128, MaxEntries: 1_000_000, MaxBytes: 128 << 20}
}

// The memory MaxBytes counts. The figures are those of the Go runtime on
// 64-bit platforms; TestMaxBytesHeap checks them against the heap.
const (
	// EntryOverhead is what a key costs besides its store key: its
	// 64-byte entry and its slot in the shard's map (a 16-byte string
	// header, an 8-byte pointer and a control byte, in a table at least
	// 7/16 full: at most 58 bytes with the table's own header), rounded
	// up.
	EntryOverhead = 128
	// LogOverhead is what a sliding window log costs besides its entries:
	// its 48-byte header and its slot in the shard's map of logs.
	LogOverhead = 112
	// LogEntryBytes is the memory of one entry of a log's array, which
	// grows by doubling to at most MaxLogEntries entries.
	LogEntryBytes = 16
	// RateOverhead is what KeepStrictest adds to each key: the rate
	// its state was charged under (32 bytes) in a map by entry, whose
	// slot with its 8-byte pointer and control byte takes at most 94
	// bytes in a table at least 7/16 full.
	RateOverhead = 96
	// ResetMarkOverhead is what a key costs while a Reset's mark on it
	// lasts (a reset of a live state leaves one, and so does a decision
	// after a clock stepped back, or a drop mark; see Request.Charged):
	// the mark's 16 bytes in a map by entry, whose slot with its 8-byte
	// pointer and control byte takes at most 48 bytes in a table at
	// least 7/16 full.
	ResetMarkOverhead = 64
	// MaxKeyBytes is the most one key costs: the longest store key, 1153
	// bytes in a 1280-byte allocation, and a log full at MaxLogEntries.
	MaxKeyBytes = 1280 + EntryOverhead + RateOverhead + ResetMarkOverhead + LogOverhead + MaxLogEntries*LogEntryBytes
)

// allocSize is n bytes rounded up to a size the allocator may give them:
// to 16 bytes up to 128, and beyond to an eighth of the next power of two.
// The allocator's size classes are at least that fine up to MaxKeyBytes.
func allocSize(n int) int64 {
	if n <= 128 {
		return int64(n+15) &^ 15
	}
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return int64(n+step-1) &^ int64(step-1)
}

// entryBytes is what MaxBytes counts for a key of keyLen bytes.
func entryBytes(keyLen int) int64 { return allocSize(keyLen) + EntryOverhead }

// entryBytes is what MaxBytes counts for a key of keyLen bytes in sh,
// with its rate under KeepStrictest.
func (sh *shard) entryBytes(keyLen int) int64 {
	if sh.rates != nil {
		return entryBytes(keyLen) + RateOverhead
	}
	return entryBytes(keyLen)
}

// logBytes is what MaxBytes counts for a log (nil: none). The array's
// capacity is a power of two, which the allocator gives exactly.
func logBytes(lg *windowLog) int64 {
	if lg == nil {
		return 0
	}
	return LogOverhead + int64(cap(lg.entries))*LogEntryBytes
}

// ErrInvalidStoreConfig wraps every error of StoreConfig.Validate.
var ErrInvalidStoreConfig = errors.New("limiter: invalid store config")

// Validate reports the first invalid field.
func (c StoreConfig) Validate() error {
	switch {
	case c.Shards < 1 || c.Shards > 1<<16 || c.Shards&(c.Shards-1) != 0:
		return fmt.Errorf("%w: Shards %d is not a power of two in [1, 65536]", ErrInvalidStoreConfig, c.Shards)
	case c.MaxEntries < 0:
		return fmt.Errorf("%w: MaxEntries %d is negative", ErrInvalidStoreConfig, c.MaxEntries)
	case c.MaxEntries > 0 && c.MaxEntries < c.Shards:
		return fmt.Errorf("%w: MaxEntries %d is below Shards %d", ErrInvalidStoreConfig, c.MaxEntries, c.Shards)
	case c.MaxBytes < 0:
		return fmt.Errorf("%w: MaxBytes %d is negative", ErrInvalidStoreConfig, c.MaxBytes)
	case c.MaxBytes > 0 && c.MaxBytes/int64(c.Shards) < MaxKeyBytes:
		return fmt.Errorf("%w: MaxBytes %d leaves each of the %d shards less than MaxKeyBytes (%d), the most one key costs",
			ErrInvalidStoreConfig, c.MaxBytes, c.Shards, MaxKeyBytes)
	}
	return nil
}

// StoreStats counts what a Store holds and has dropped.
type StoreStats struct {
	Entries   int64 // keys held now
	Bytes     int64 // memory of the keys held, as MaxBytes counts it
	Evictions int64 // keys evicted by MaxEntries or MaxBytes while their state was live
	Expired   int64 // keys dropped because their state had returned to fresh
	// ChangesDropped counts changes not remembered for Changed because a
	// shard already held its most (see TrackChanges).
	ChangesDropped int64
}

// Store is a concurrent in-memory store of per-key limiter state. It is safe
// for concurrent use. It starts no goroutines: its owner calls Sweep.
type Store struct {
	shards   []shard
	mask     uint64
	perShard int   // max entries per shard, 0 = no bound
	perBytes int64 // max bytes per shard, 0 = no bound
	track    bool  // StoreConfig.TrackChanges

	entries        atomic.Int64
	bytes          atomic.Int64 // the sum of the shards' bytes
	evictions      atomic.Int64
	expired        atomic.Int64
	changesDropped atomic.Int64
}

// entry is one key in a shard's map and LRU list.
type entry struct {
	key        string // the store key: len(name), name, key
	prev, next *entry // LRU list, most recent first
	state
}

type shard struct {
	mu sync.Mutex // guards m, logs, head, tail, changed and bytes, and the entries in them
	m  map[string]*entry
	// logs holds the sliding window logs of the entries that have one.
	logs map[string]*windowLog
	// rates holds, under KeepStrictest (nil otherwise), the rate each
	// entry's state was last charged under.
	rates map[*entry]charged
	// resets holds what a Reset left of the live state it cleared, per
	// entry, until that state would have gone fresh (see resetMark), and
	// the drop marks (see dropMarkAtLocked); nil until the shard's first.
	resets map[*entry]resetMark
	// head is the most recently used entry, tail the least.
	head, tail *entry
	// changed lists the entries marked changed since the last Changed;
	// an entry may appear twice, and only its mark counts.
	changed []*entry
	// bytes is what MaxBytes counts for the entries and logs held.
	bytes int64
	// latest is the latest clock reading a decision in the shard was
	// made at (see readingLocked).
	latest int64
	// dropped is the latest reading at which Sweep or an eviction
	// removed a key of the shard, 0 for none (nor any before 1970; see
	// droppedMark).
	dropped int64
	_       [64]byte // keep shards on separate cache lines
}

// NewStore returns an empty store.
func NewStore(cfg StoreConfig) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		shards: make([]shard, cfg.Shards),
		mask:   uint64(cfg.Shards - 1),
		track:  cfg.TrackChanges,
	}
	if cfg.MaxEntries > 0 {
		// Rounded down, so that the shards together never hold more
		// than MaxEntries. Validate ensures at least one per shard.
		s.perShard = cfg.MaxEntries / cfg.Shards
	}
	s.perBytes = cfg.MaxBytes / int64(cfg.Shards)
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
		s.shards[i].logs = make(map[string]*windowLog)
		if cfg.KeepStrictest {
			s.shards[i].rates = make(map[*entry]charged)
		}
	}
	return s, nil
}

// appendStoreKey appends the store key of (name, key) to b: a length byte,
// the name and the key. MaxNameLen < 256, so one byte joins them
// unambiguously.
func appendStoreKey(b []byte, name, key string) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	return append(b, key...)
}

func (s *Store) shardFor(k []byte) *shard {
	h := xxhash.Sum64(k)
	return &s.shards[(h^h>>32)&s.mask]
}

// Check decides req at time.Now().
func (s *Store) Check(req Request) (Decision, error) { return s.CheckAt(req, time.Now()) }

// CheckAt validates req and decides it at now, updating the key's state.
func (s *Store) CheckAt(req Request, now time.Time) (Decision, error) {
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	var d Decision
	s.decideKey(&req, now.UnixNano(), 0, &d)
	return d, nil
}

// RefundAt decides req at now as CheckAt does and returns, beside the
// decision, the whole hits that req, a Refund without Charged, gave back
// to the key's state: never more than the state counts fewer for it (a
// bucket's or GCRA's fraction of a hit is not counted), 0 when it gave
// nothing back or req is another request. A node that records the hits it
// admits apart from the key's state lowers that record by them.
func (s *Store) RefundAt(req Request, now time.Time) (Decision, int64, error) {
	if err := req.Validate(); err != nil {
		return Decision{}, 0, err
	}
	var d Decision
	gave := s.decideKey(&req, now.UnixNano(), 0, &d)
	return d, gave, nil
}

// decideKey decides req (want 0) or takes up to want hits (see TakeAt) on
// the state of req's key, under its shard's lock, and keeps the result:
// the entry is updated, or inserted when its state is not fresh, and
// marked changed unless nothing was consumed or given back. A request that
// only reads (Request.reads) is decided on a copy and keeps nothing. The
// decision is written to d, in place, as decideKeyLocked's is. It returns
// the hits taken, or given back by a refund without Charged (want 0).
func (s *Store) decideKey(req *Request, now, want int64, d *Decision) int64 {
	var buf [96]byte // most keys fit on the stack; longer ones allocate
	k := appendStoreKey(buf[:0], req.Name, req.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	at := sh.readingLocked(now)
	took := s.decideKeyLocked(sh, k, req, at, want, d)
	sh.mu.Unlock()
	if late := time.Duration(at - now); late > 0 {
		// Decided as at the later reading: the waits start from the
		// caller's own.
		if d.RetryAfter > 0 {
			d.RetryAfter += late
		}
		if d.Delay > 0 {
			d.Delay += late
		}
	}
	return took
}

// decideKeyLocked is decideKey's work on k, the key of req, in sh, at now:
// it writes the decision to d (in place: a Decision returned goes
// through every frame) and returns the hits taken, or given back by a
// refund without Charged (want 0, see decideGave). sh.mu must be held.
func (s *Store) decideKeyLocked(sh *shard, k []byte, req *Request, now, want int64, d *Decision) int64 {
	e, found := sh.m[string(k)]
	var lg *windowLog
	if found && (req.Algorithm == SlidingWindowLog || e.algo() == SlidingWindowLog) {
		lg = sh.logs[e.key]
	}
	if sh.rates != nil && found && e.expireAt > now && req.Behavior&Reset == 0 {
		if c := sh.rates[e]; c.known() {
			m, none, moved := strictest(c, e.algo(), req, now)
			req = &m
			charges := want > 0 || req.Hits > 0 && req.Behavior&Refund == 0
			if want == 0 && req.Hits > req.Capacity() || none && charges {
				sh.touchLocked(e)
				*d = overCapacity(e.state, lg, req, now)
				return 0
			}
			// A fixed window's count moved to req's window would hold,
			// until that window ends, hits all charged before it began
			// (the last charge was), under windows that end sooner: a
			// decision that charges nothing leaves it where it is, as a
			// peek does, so that two rates whose windows never end
			// together do not hold the key's hits for ever by denying
			// each other's checks. A charge moves it.
			if moved && want == 0 && req.Hits > 0 && req.Behavior&(DrainOverLimit|Refund) == 0 &&
				e.algo() == FixedWindow && e.state.lastCharge() != 0 && e.state.lastCharge() < windowStart(req, now) {
				if pd := peek(e.state, lg, req, now); !pd.Allowed {
					sh.touchLocked(e)
					*d = pd
					return 0
				}
			}
		}
	}
	// A live state that holds times after now (the clock stepped back)
	// is read as written at now (boundTimes): its hits are then charges
	// that a refund cannot tell by their instant or window from the
	// earlier ones the state no longer counts (it went fresh on the clock
	// ahead, or a reset cleared them). Such a decision marks the key as a
	// reset at now does (see resetMark).
	//
	// A decision before the reading at which the key may have been
	// dropped reads its refunds as after a reset at that reading, and
	// leaves the key that reading's drop mark, which later decisions
	// before it read alike (chargedSinceResetLocked, epochLocked) and
	// which a snapshot carries as a reset's mark while the state is live
	// (snapshotLocked): once the state is fresh, the shard's dropped
	// reading, if not before the mark, tells as much (liveLocked).
	var step, kept *resetMark
	if found && e.expireAt > now && req.Behavior&Reset == 0 && timesAfter(e.state, req, now) {
		at := stepMarkAt(&e.state, req, now)
		step = &resetMark{at: at, until: stepMarkUntil(req, at)}
		kept = step
	} else if at := sh.droppedAtLocked(e, found, now); at > 0 && now < at {
		step = &resetMark{at: at, until: dropMarkUntil(req, now, at)}
		kept = &resetMark{at: at, until: at}
	}
	// A write that finds the key's state gone fresh, or its mark (a
	// reset's or a drop mark) lapsed, at now, and leaves it so, drops
	// them but leaves a drop mark (see droppedAtLocked): a state fresh on
	// a clock ahead may hold charges that a clock set right still counts.
	// An entry with no state and no mark (math.MinInt64: as good as
	// dropped) holds nothing to drop.
	discarded := false
	if found && e.expireAt <= now {
		m, ok := sh.resets[e]
		discarded = ok && m.until <= now || !ok && e.expireAt != math.MinInt64
	}
	if found && req.chargedRefund() {
		if w, ok := sh.chargedSinceResetLocked(e, req, now, step); ok && w != req.Charged && req.chargedAt() && lg != nil && !lg.holds(w.Start) {
			// A log's charge named by the reset's epoch is at the
			// reset's instant or one microsecond after it: both hold
			// only hits charged after the reset.
		} else if !ok {
			p := *req
			p.Hits = 0 // cleared by the reset: gives nothing back
			req = &p
		} else if w != req.Charged {
			p := *req
			p.Charged = w
			req = &p
		}
	}
	if want == 0 && req.chargedRefund() && (req.Hits == 0 || !found || e.expireAt <= now || !refundCharged(&e.state, lg, req, now, false)) {
		// Nothing of the key's state is the refund's: it gives
		// nothing back and is decided as a peek, which keeps nothing.
		p := *req
		p.Hits, p.Behavior, p.Charged = 0, 0, Window{}
		req = &p
	}
	if want == 0 && req.reads() {
		var st state
		if found {
			st = e.state
			sh.touchLocked(e)
		}
		*d = peek(st, lg, req, now)
		return 0
	}
	if found {
		if req.Behavior&Reset != 0 {
			s.markResetLocked(sh, e, now)
		} else if kept != nil {
			// Set once the decision has written e's expiry (below).
		} else if m, ok := sh.resets[e]; ok && m.until <= now {
			// Lapsed: dropped by the first decision that writes, as
			// redislimit drops it, so that a clock set back does not
			// find it again.
			s.dropMarkLocked(sh, e)
		}
		had, before := lg != nil, logBytes(lg)
		var took int64
		if want == 0 {
			*d, took = decideGave(&e.state, &lg, req, now)
		} else {
			took, *d = take(&e.state, &lg, req, now, want)
		}
		if lg != nil && e.algo() != SlidingWindowLog {
			delete(sh.logs, e.key) // the key moved to another algorithm
			lg = nil
		} else if lg != nil && !had {
			sh.logs[e.key] = lg
		}
		sh.touchLocked(e)
		if after := logBytes(lg); after != before {
			s.resizeLocked(sh, e, after-before, now)
		}
		if want == 0 || took > 0 {
			sh.chargeLocked(e, req)
			s.markChangedLocked(sh, e)
		}
		if kept != nil {
			s.markStepLocked(sh, e, now, *kept)
		}
		if m, ok := sh.resets[e]; e.expireAt <= now && (!ok || m.until <= now) {
			// Fresh at now and unmarked: as good as dropped, as
			// redislimit deletes the key, so that a clock set back
			// finds no state rather than this one's times after it.
			e.expireAt = math.MinInt64
			if discarded && now > 0 {
				s.dropMarkAtLocked(sh, e, now)
			}
		}
		sh.epochLocked(e, &d.Window, now)
		return took
	}
	var st state
	var took int64
	if want == 0 {
		*d = decide(&st, &lg, req, now)
	} else {
		took, *d = take(&st, &lg, req, now, want)
	}
	if st.expireAt > now { // only state that is not fresh is worth keeping
		e := s.insertLocked(sh, string(k), st, lg, now)
		sh.chargeLocked(e, req)
		s.markChangedLocked(sh, e)
		if kept != nil {
			s.markStepLocked(sh, e, now, *kept)
			sh.epochLocked(e, &d.Window, now)
		}
	}
	return took
}

// droppedAtLocked returns the latest reading at which e's key (found, or
// not) may have been dropped while it held a state that a decision at now
// finds no longer: the shard's dropped reading, at which Sweep or an
// eviction removed a key of it, or the drop mark e has, the reading of a
// write that found e's state gone fresh and left it so (dropMarkAtLocked).
// 0 when the key holds a live state, or none is known. A decision before
// that reading (a clock that has since stepped back) finds nothing that
// tells the charges the dropped state counted from those made since, so if
// it writes it marks the key as a reset at that reading would
// (dropMarkUntil): a refund of a charge named at or before it gives
// nothing back. A key whose state is not live loses nothing by it: no
// charge made before the mark is counted. sh.mu must be held.
func (sh *shard) droppedAtLocked(e *entry, found bool, now int64) int64 {
	if found && e.expireAt > now {
		return 0
	}
	at := sh.dropped
	if found {
		if m, ok := sh.resets[e]; ok && m.drop() {
			at = max(at, m.at)
		}
	}
	return at
}

// dropMarkAtLocked leaves on e, whose state a write at now found gone
// fresh and left so, the drop mark of now: a resetMark whose until is its
// at, which no decision at or after now reads (it has lapsed) and which
// keeps the entry, with no state, until then. A decision before now that
// writes turns it into a reset's mark (droppedAtLocked). redislimit keeps
// the key alike. sh.mu must be held.
func (s *Store) dropMarkAtLocked(sh *shard, e *entry, now int64) {
	_, had := sh.resets[e]
	if sh.resets == nil {
		sh.resets = make(map[*entry]resetMark)
	}
	sh.resets[e] = resetMark{at: now, until: now}
	if !had {
		s.resizeLocked(sh, e, ResetMarkOverhead, now)
	}
}

// dropMarkUntil is how long the mark of a decision of req at now, on a key
// that may have been dropped at the later reading at, lasts: as long as a
// refund at req's rate of a charge made before at could find hits, had
// the state counted it. For a fixed window or sliding window counter, 3
// of now's periods after at, which holds the end of the window after
// at's whatever the calendar (a month, a year or a day across a change of
// time, against another); for the buckets and GCRA, at plus the drain
// time of req's capacity. redislimit computes the same.
func dropMarkUntil(req *Request, now, at int64) int64 {
	switch req.Algorithm {
	case FixedWindow, SlidingWindowCounter:
		p := periodOf(req, now)
		return addSat(addSat(addSat(at, p), p), p)
	case GCRA:
		return addSat(at, req.Capacity()*gcraInterval(req))
	}
	return addSat(at, drainTime(float64(req.Capacity()), float64(req.Limit), float64(periodOf(req, now))))
}

// resetMark is what a Reset leaves of the live state it cleared: the
// instant of the reset, and when that state would have gone fresh. Until
// then, a refund naming a charge (Request.Charged) whose window or
// instant is not after the reset gives nothing back: the reset cleared
// its hits, and what the key counts now is other requests'. A charge
// made before the reset still counts nowhere once the cleared state
// would have gone fresh: its window has ended, or, of a bucket or GCRA,
// what a refund may give back of it (its hits less what has drained since
// the charge) is no more than the level it left, which has drained by
// then. The mark keeps its entry (and its bytes, ResetMarkOverhead)
// until then.
type resetMark struct{ at, until int64 }

// drop reports whether m is a drop mark (dropMarkAtLocked, or a
// decision's before the key's dropped reading), which a snapshot carries
// only on a live state and after now (snapshotLocked).
func (m resetMark) drop() bool { return m.at == m.until }

// markResetLocked records that a Reset at now clears e: the mark lasts
// until e's state, if live, would have gone fresh, or until the mark e
// has already would have lapsed. sh.mu must be held.
func (s *Store) markResetLocked(sh *shard, e *entry, now int64) {
	m, had := sh.resets[e]
	until, at := int64(0), now
	if had && m.until > now {
		// A mark after now (made with the clock ahead) keeps its
		// instant: the charges it cleared may be named up to it.
		until, at = m.until, max(m.at, now)
		if m.at > now {
			// The charges made since with the clock set right are
			// named by the mark's epoch (epochLocked), and so would
			// those after this reset be: it clears them too, and
			// moves the instant one epoch later, so that they name
			// the old epoch, which is not after it, and the charges
			// after it the new one.
			at = addSat(m.at, epochAfter)
			until = max(until, addSat(at, epochAfter))
		}
	}
	if e.expireAt > now {
		until = max(until, e.expireAt)
	}
	if until == 0 {
		if had {
			s.dropMarkLocked(sh, e)
		}
		return
	}
	if sh.resets == nil {
		sh.resets = make(map[*entry]resetMark)
	}
	sh.resets[e] = resetMark{at: at, until: until}
	if !had {
		// e first, so that the keys evicted to make room are others,
		// down to the least recently used.
		sh.touchLocked(e)
		s.resizeLocked(sh, e, ResetMarkOverhead, now)
	}
}

// markStepLocked records step, the mark of a decision at now that read
// e's state as written at now (timesAfter), or the drop mark of a
// decision before the reading e's key may have been dropped at, merged
// with the mark e has while it lasts; it lasts at least as long as e's
// state. sh.mu must be held.
func (s *Store) markStepLocked(sh *shard, e *entry, now int64, step resetMark) {
	m, had := sh.resets[e]
	if had && m.until > now {
		step.at, step.until = max(m.at, step.at), max(m.until, step.until)
	}
	step.until = max(step.until, e.expireAt)
	if sh.resets == nil {
		sh.resets = make(map[*entry]resetMark)
	}
	sh.resets[e] = step
	if !had {
		s.resizeLocked(sh, e, ResetMarkOverhead, now)
	}
}

// stepMarkAt is the instant of the mark of a decision of req at now that
// reads st's times after now (timesAfter): now, or, for a bucket or GCRA
// request on a state that tells the reading it was last written at (a
// bucket's level time, GCRA's TAT less its lead), an epoch before that
// reading. The state may count none of the charges named before it (it
// went fresh on the clock ahead, and a later charge there wrote it), so a
// refund of one gives nothing back; the charges of that last write are
// named after the mark, or by its epoch, and give theirs back.
func stepMarkAt(st *state, req *Request, now int64) int64 {
	if !req.Algorithm.HasBurst() {
		return now
	}
	at := now
	switch st.algo() {
	case TokenBucket, LeakyBucket:
		at = st.levelTime()
	case GCRA:
		if lead := st.tatLead(); !st.isReceived() && lead < maxTATLead {
			at = st.tat() - lead
		}
	}
	return max(now, at-epochAfter)
}

// stepMarkUntil is how long the mark of a decision of req at now that
// read a state's times after now lasts: as long as a refund at req's rate
// of a charge made before now could find hits to give back, had the state
// counted it: the end of the window after now's for a fixed window or
// sliding window counter (a counter's previous window is named until its
// end), and now plus the drain time of req's capacity for the buckets and
// GCRA (at GCRA's interval, rounded up).
func stepMarkUntil(req *Request, now int64) int64 {
	switch req.Algorithm {
	case FixedWindow, SlidingWindowCounter:
		_, end := windowBounds(req, now)
		return addSat(end, periodOf(req, now))
	case GCRA:
		// Capacity × interval is at most the burst's drain time
		// (Validate): it does not overflow.
		return addSat(now, req.Capacity()*gcraInterval(req))
	}
	return addSat(now, drainTime(float64(req.Capacity()), float64(req.Limit), float64(periodOf(req, now))))
}

// dropMarkLocked drops e's reset mark. sh.mu must be held.
func (s *Store) dropMarkLocked(sh *shard, e *entry) {
	delete(sh.resets, e)
	sh.bytes -= ResetMarkOverhead
	s.bytes.Add(-ResetMarkOverhead)
}

// A window of a fixed window or sliding window counter that holds a
// reset is two windows to a refund: the charges before the reset, which
// name it, and those after, which name it with Start epochAfter the
// reset (epochLocked), the window's epoch since the reset.

// epochAfter is how long after a reset the epoch it starts begins: a
// microsecond, the unit of redislimit's times, so that both name it
// alike.
const epochAfter = int64(time.Microsecond)

// chargedSinceResetLocked returns the window or instant a refund req
// (Request.chargedRefund) of e gives hits back to, and false when a reset
// has cleared them while its mark lasts: a charge at an instant, or in a
// window begun, no later than the reset. A window named by its epoch
// since the reset (epochLocked) is returned as the window itself, which
// the key's state names. sh.mu must be held.
func (sh *shard) chargedSinceResetLocked(e *entry, req *Request, now int64, step *resetMark) (Window, bool) {
	w := req.Charged
	m, ok := sh.resets[e]
	if ok && m.until <= now {
		ok = false
	}
	switch {
	case step != nil && ok:
		m = resetMark{at: max(m.at, step.at), until: max(m.until, step.until)}
	case step != nil:
		m, ok = *step, true
	}
	if !ok {
		return w, true
	}
	switch {
	case w.Start == m.at+epochAfter && req.chargedAt():
		return Window{m.at, m.at}, true
	case w.Start == m.at+epochAfter:
		if start, end := windowBounds(req, m.at); end == w.End {
			return Window{start, end}, true
		}
	case w.End == m.at+epochAfter && w.Start < m.at && req.Algorithm.instantAlgorithm():
		return Window{w.Start, w.Start}, true
	case w.End == m.at+epochAfter && w.Start < m.at:
		if start, end := windowBounds(req, w.Start); start == w.Start && end <= m.at {
			return Window{start, end}, true
		}
	}
	return w, w.Start > m.at
}

// epochLocked names w, a window a decision on e counted hits in or gave
// them back to, by its epoch since e's last reset, if it holds that
// reset and the reset's mark lasts. sh.mu must be held.
func (sh *shard) epochLocked(e *entry, w *Window, now int64) {
	if sh.resets == nil || w.IsZero() {
		return
	}
	m, ok := sh.resets[e]
	switch {
	case !ok || m.until <= now:
	case w.Start == w.End && w.Start == m.at:
		// A charge at the reset's instant, made after it (a Reset with
		// Hits, say): its instant's epoch since the reset.
		w.Start, w.End = m.at+epochAfter, m.at+epochAfter
	case w.Start == w.End && w.Start < m.at:
		// A charge made after a reset at an instant before it (the
		// reset was made with the clock ahead): the instant, ending at
		// the reset's epoch.
		w.End = m.at + epochAfter
	case w.Start <= m.at && m.at+epochAfter < w.End:
		w.Start = m.at + epochAfter
	case w.End <= m.at:
		// A window that ended by the reset, on the clock it was made
		// with: the window, ending at the reset's epoch.
		w.End = m.at + epochAfter
	}
}

// liveLocked reports whether e must stay: its state is live at now, or
// a reset's mark on it lasts, or a drop mark after the shard's dropped
// reading. A drop mark at or before that reading tells no more than the
// reading does: a decision before it on a key with no live state, kept
// or not, reads it as the mark (droppedAtLocked). sh.mu must be held.
func (sh *shard) liveLocked(e *entry, now int64) bool {
	if e.expireAt > now {
		return true
	}
	m, ok := sh.resets[e]
	return ok && m.until > now && !(m.drop() && m.at <= sh.dropped)
}

// chargeLocked records req's rate as the one e's state was charged
// under, under KeepStrictest. sh.mu must be held.
func (sh *shard) chargeLocked(e *entry, req *Request) {
	if sh.rates != nil {
		sh.rates[e] = chargedOf(req)
	}
}

// lateReading is how far behind the latest reading of its shard a
// caller's clock reading may be and still be read as that latest reading.
const lateReading = int64(100 * time.Millisecond)

// readingLocked returns the instant a decision at now is made at. Callers
// read the clock before they wait for the shard's lock, so a reading
// slightly older than one already decided at is no step of the clock: it
// is read as the latest, and a window that began since stays the window
// its count is in (deciding it at the older reading would move that count
// back into the window before, and the next window would admit it all
// again). A reading further behind is a clock that stepped back, which
// boundTimes bounds. sh.mu must be held.
func (sh *shard) readingLocked(now int64) int64 {
	at := sh.readingAtLocked(now)
	sh.latest = at
	return at
}

// readingAtLocked is the instant readingLocked returns for now, without
// recording it. sh.mu must be held.
func (sh *shard) readingAtLocked(now int64) int64 {
	if now < sh.latest && sh.latest-now <= lateReading {
		return sh.latest
	}
	return now
}

// take peeks with req (Hits 0) and takes as many hits as the peek says
// remain, at most want and the capacity, returning how many with the
// decision for them (the peek's when none). The peek keeps nothing, so a
// take of none changes nothing.
func take(st *state, lg **windowLog, req *Request, now, want int64) (int64, Decision) {
	d := peek(*st, *lg, req, now)
	n := min(want, d.Remaining, req.Capacity())
	if n == 0 {
		return 0, d
	}
	r := *req
	r.Hits = n
	return n, decide(st, lg, &r, now)
}

// insertLocked adds a key with its log (nil: none) to sh, evicting its
// least recently used keys first while the shard has no room for it, and
// returns its entry. sh.mu must be held.
func (s *Store) insertLocked(sh *shard, key string, st state, lg *windowLog, now int64) *entry {
	need := sh.entryBytes(len(key)) + logBytes(lg)
	for sh.tail != nil && (s.perShard > 0 && len(sh.m) >= s.perShard || s.perBytes > 0 && sh.bytes+need > s.perBytes) {
		s.evictLocked(sh, sh.tail, now)
	}
	e := &entry{key: key, state: st}
	sh.m[key] = e
	if lg != nil {
		sh.logs[key] = lg
	}
	sh.pushFrontLocked(e)
	sh.bytes += need
	s.bytes.Add(need)
	s.entries.Add(1)
	return e
}

// resizeLocked counts delta more bytes for e, whose log changed size, and
// evicts the least recently used keys of sh other than e while the shard
// holds more than its bytes. sh.mu must be held.
func (s *Store) resizeLocked(sh *shard, e *entry, delta, now int64) {
	sh.bytes += delta
	s.bytes.Add(delta)
	for s.perBytes > 0 && sh.bytes > s.perBytes && sh.tail != e {
		s.evictLocked(sh, sh.tail, now)
	}
}

// evictLocked drops victim from sh to make room, counting it as evicted if
// its state was live at now and as expired otherwise. sh.mu must be held.
func (s *Store) evictLocked(sh *shard, victim *entry, now int64) {
	sh.dropped = max(sh.dropped, now)
	if victim.expireAt > now {
		s.evictions.Add(1)
	} else {
		s.expired.Add(1)
	}
	s.bytes.Add(-sh.removeLocked(victim))
	s.entries.Add(-1)
}

func (sh *shard) pushFrontLocked(e *entry) {
	e.prev, e.next = nil, sh.head
	if sh.head != nil {
		sh.head.prev = e
	}
	sh.head = e
	if sh.tail == nil {
		sh.tail = e
	}
}

func (sh *shard) unlinkLocked(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (sh *shard) touchLocked(e *entry) {
	if sh.head != e {
		sh.unlinkLocked(e)
		sh.pushFrontLocked(e)
	}
}

// removeLocked drops e and its log from sh and returns the bytes they
// were counted for.
func (sh *shard) removeLocked(e *entry) int64 {
	sh.unlinkLocked(e)
	delete(sh.m, e.key)
	freed := sh.entryBytes(len(e.key))
	delete(sh.rates, e)
	if _, ok := sh.resets[e]; ok {
		delete(sh.resets, e)
		freed += ResetMarkOverhead
	}
	if e.algo() == SlidingWindowLog {
		freed += logBytes(sh.logs[e.key])
		delete(sh.logs, e.key)
	}
	sh.bytes -= freed
	if e.isChanged() {
		// sh.changed keeps e until the next Changed, which skips it;
		// the key need not wait with it.
		e.key = ""
	}
	return freed
}

// Sweep drops every key whose state has returned to fresh by now, so that
// dropping it changes no decision, and returns how many it dropped. It locks
// one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	n := now.UnixNano()
	dropped := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		at := sh.readingLocked(n)
		d, freed := 0, int64(0)
		for _, e := range sh.m {
			if !sh.liveLocked(e, at) {
				freed += sh.removeLocked(e)
				d++
			}
		}
		if d > 0 {
			sh.dropped = max(sh.dropped, at)
		}
		// Counted under the lock, as inserts are, so that Entries never
		// runs ahead of the maps (nor past MaxEntries) during a sweep.
		s.entries.Add(int64(-d))
		s.bytes.Add(-freed)
		s.expired.Add(int64(d))
		sh.mu.Unlock()
		dropped += d
	}
	return dropped
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.entries.Load()) }

// Bytes returns the memory of the keys held, as MaxBytes counts it.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Entries:        s.entries.Load(),
		Bytes:          s.bytes.Load(),
		Evictions:      s.evictions.Load(),
		Expired:        s.expired.Load(),
		ChangesDropped: s.changesDropped.Load(),
	}
}
