package limiter

import (
	"errors"
	"fmt"
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
	// TrackChanges makes the store remember which keys each decision or
	// Merge changed, for Changed (replication). It costs one mark per
	// decision.
	TrackChanges bool
}

// DefaultStoreConfig returns 128 shards and at most 1,000,000 entries
// (about 120 MB for the window algorithms, GCRA and the token bucket).
func DefaultStoreConfig() StoreConfig {
	return StoreConfig{Shards: 128, MaxEntries: 1_000_000}
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
	}
	return nil
}

// StoreStats counts what a Store holds and has dropped.
type StoreStats struct {
	Entries   int64 // keys held now
	Evictions int64 // keys evicted by MaxEntries while their state was live
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
	perShard int  // max entries per shard, 0 = no bound
	track    bool // StoreConfig.TrackChanges

	entries        atomic.Int64
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
	mu sync.Mutex // guards m, logs, head and tail, and the entries in them
	m  map[string]*entry
	// logs holds the sliding window logs of the entries that have one.
	logs map[string]*windowLog
	// head is the most recently used entry, tail the least.
	head, tail *entry
	// changed lists the entries marked changed since the last Changed;
	// an entry may appear twice, and only its mark counts.
	changed []*entry
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
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
		s.shards[i].logs = make(map[string]*windowLog)
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
	return s.decide(&req, now.UnixNano()), nil
}

func (s *Store) decide(req *Request, now int64) Decision {
	_, d := s.decideKey(req, now, 0)
	return d
}

// decideKey decides req (want 0) or takes up to want hits (see TakeAt) on
// the state of req's key, under its shard's lock, and keeps the result:
// the entry is updated, or inserted when its state is not fresh, and
// marked changed unless nothing was consumed or given back.
func (s *Store) decideKey(req *Request, now, want int64) (int64, Decision) {
	var buf [96]byte // most keys fit on the stack; longer ones allocate
	k := appendStoreKey(buf[:0], req.Name, req.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	var lg *windowLog
	if e, ok := sh.m[string(k)]; ok {
		if req.Algorithm == SlidingWindowLog || e.algo() == SlidingWindowLog {
			lg = sh.logs[e.key]
		}
		var took int64
		var d Decision
		if want == 0 {
			d = decide(&e.state, &lg, req, now)
		} else {
			took, d = take(&e.state, &lg, req, now, want)
		}
		if lg != nil && req.Algorithm != SlidingWindowLog {
			delete(sh.logs, e.key) // the key moved to another algorithm
		} else if lg != nil && sh.logs[e.key] == nil {
			sh.logs[e.key] = lg
		}
		sh.touchLocked(e)
		if req.Hits > 0 || req.Behavior != 0 || took > 0 { // a peek changes nothing
			s.markChangedLocked(sh, e)
		}
		sh.mu.Unlock()
		return took, d
	}
	var st state
	var took int64
	var d Decision
	if want == 0 {
		d = decide(&st, &lg, req, now)
	} else {
		took, d = take(&st, &lg, req, now, want)
	}
	if st.expireAt > now { // only state that is not fresh is worth keeping
		key := string(k)
		e := s.insertLocked(sh, key, st, now)
		if lg != nil {
			sh.logs[key] = lg
		}
		s.markChangedLocked(sh, e)
	}
	sh.mu.Unlock()
	return took, d
}

// take peeks with req (Hits 0) and takes as many hits as the peek says
// remain, at most want and the capacity, returning how many with the
// decision for them (the peek's when none). A peek changes nothing that
// matters (it only brings the state up to now), so both run on the real
// state.
func take(st *state, lg **windowLog, req *Request, now, want int64) (int64, Decision) {
	d := decide(st, lg, req, now)
	n := min(want, d.Remaining, req.Capacity())
	if n == 0 {
		return 0, d
	}
	r := *req
	r.Hits = n
	return n, decide(st, lg, &r, now)
}

// insertLocked adds a key to sh, evicting its least recently used key first
// when the shard is full, and returns its entry. sh.mu must be held.
func (s *Store) insertLocked(sh *shard, key string, st state, now int64) *entry {
	if s.perShard > 0 && len(sh.m) >= s.perShard {
		victim := sh.tail
		if victim.expireAt > now {
			s.evictions.Add(1)
		} else {
			s.expired.Add(1)
		}
		sh.removeLocked(victim)
		s.entries.Add(-1)
	}
	e := &entry{key: key, state: st}
	sh.m[key] = e
	sh.pushFrontLocked(e)
	s.entries.Add(1)
	return e
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

func (sh *shard) removeLocked(e *entry) {
	sh.unlinkLocked(e)
	delete(sh.m, e.key)
	if e.algo() == SlidingWindowLog {
		delete(sh.logs, e.key)
	}
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
		d := 0
		for _, e := range sh.m {
			if e.expireAt <= n {
				sh.removeLocked(e)
				d++
			}
		}
		// Counted under the lock, as inserts are, so that Entries never
		// runs ahead of the maps (nor past MaxEntries) during a sweep.
		s.entries.Add(int64(-d))
		s.expired.Add(int64(d))
		sh.mu.Unlock()
		dropped += d
	}
	return dropped
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.entries.Load()) }

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Entries:        s.entries.Load(),
		Evictions:      s.evictions.Load(),
		Expired:        s.expired.Load(),
		ChangesDropped: s.changesDropped.Load(),
	}
}
