package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"
	"unicode/utf8"
)

// Snapshot is one key's state, exported so that another node can take it
// over: a node hands its keys to their new owner when membership changes, and
// an owner copies changed keys to its replicas. Words are the algorithm's
// state words as the store keeps them (see the state type); they are only
// meaningful to a Store of the same version, which checks them on Merge.
type Snapshot struct {
	Name, Key string
	Algorithm Algorithm
	// ExpireAt is when the state returns to fresh (Unix ns).
	ExpireAt int64
	Words    [3]int64
	// Log holds the sliding window log's entries, oldest first; empty for
	// the other algorithms.
	Log []LogEntry
	// RateLimit, RateBurst and RatePeriod are the rate the state was
	// last charged under, as a store with StoreConfig.KeepStrictest keeps
	// it (RateBurst the effective burst), so that a receiving store with
	// KeepStrictest decides the key at no laxer rate. A calendar window's
	// rate has RateCalendar, its unit, and RateLocation, its zone (nil:
	// UTC), instead of a RatePeriod, which is then 0. RateLimit 0: unknown
	// (another store, or one without KeepStrictest).
	RateLimit, RateBurst int64
	RatePeriod           time.Duration
	RateCalendar         Calendar
	RateLocation         *time.Location
	// ResetAt and ResetUntil are the mark a Reset of the key's live state
	// left (see Request.Charged): the instant of the reset, and when the
	// state it cleared would have gone fresh; both 0 when none. Until
	// ResetUntil, a refund naming a charge made no later than ResetAt
	// gives nothing back. A store that merges it keeps the later of its
	// own mark and this one. A snapshot with ExpireAt 0 and a mark
	// carries the mark alone (its state is fresh): its Words, Log and
	// rate are zero.
	ResetAt, ResetUntil int64
	// Settle, when set, says which hits the state counts that stand-in
	// owners admitted (see Settlement); Store.Merge ignores it, and
	// Store.MergeCharged charges them. Nil in the snapshots a store
	// returns.
	Settle *Settlement
	// Grants, when set, are the key's lease grants whose hits the state
	// counts and that their holders may still give back (see
	// LeaseGrant), at most MaxLeaseGrants; stores ignore them. Nil in the
	// snapshots a store returns.
	Grants []LeaseGrant
}

// ShiftTimes moves the instants s carries by d, as another node's clock
// that reads d more than the one that wrote s would date them: a bucket's
// level time, a GCRA arrival time, a log's entries and the expiry. A fixed
// window's or a sliding window counter's start stays, as windows are
// aligned to multiples of Period (or calendar units) on every clock: their
// counts stay in the window they were counted in. Times saturate instead
// of wrapping.
func (s *Snapshot) ShiftTimes(d time.Duration) {
	shift := func(t int64) int64 {
		switch {
		case d > 0 && t > math.MaxInt64-int64(d):
			return math.MaxInt64
		case d < 0 && t < math.MinInt64-int64(d):
			return math.MinInt64
		}
		return t + int64(d)
	}
	if s.ResetUntil != 0 {
		// The mark lasts at least as long on the later clock. Its instant
		// stays: the charges a refund names are dated on the clock of the
		// node that reset the key, as the mark is, and so are the epochs
		// it names windows by.
		s.ResetUntil = max(s.ResetUntil, shift(s.ResetUntil))
	}
	if s.MarkOnly() {
		return
	}
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		s.Words[1] = shift(s.Words[1])
	case GCRA:
		s.Words[0] = shift(s.Words[0])
	case SlidingWindowLog:
		for i := range s.Log {
			s.Log[i].At = shift(s.Log[i].At)
		}
	default:
		return // windows: aligned on every clock
	}
	s.ExpireAt = shift(s.ExpireAt)
}

// LogEntry is Hits admitted at one instant (Unix ns) of a sliding window log.
type LogEntry struct {
	At, Hits int64
}

// MaxSnapshotLog is the most log entries a Snapshot carries: MaxLogEntries,
// the most a key's log holds.
const MaxSnapshotLog = MaxLogEntries

// ErrInvalidSnapshot wraps every error of Snapshot.Validate.
var ErrInvalidSnapshot = errors.New("limiter: invalid snapshot")

// Validate checks that s could have been exported by a Store: a valid name,
// key and algorithm, and state words in range for the algorithm. A snapshot
// comes from another node and is untrusted.
func (s *Snapshot) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSnapshot, fmt.Sprintf(format, a...))
	}
	switch {
	case s.Name == "" || len(s.Name) > MaxNameLen || !utf8.ValidString(s.Name):
		return bad("Name must be non-empty UTF-8 of at most %d bytes", MaxNameLen)
	case s.Key == "" || len(s.Key) > MaxKeyLen || !utf8.ValidString(s.Key):
		return bad("Key must be non-empty UTF-8 of at most %d bytes", MaxKeyLen)
	case !s.Algorithm.Valid():
		return bad("Algorithm %d", uint8(s.Algorithm))
	case s.Algorithm != SlidingWindowLog && len(s.Log) > 0:
		return bad("%s carries a log", s.Algorithm)
	case len(s.Log) > MaxSnapshotLog:
		return bad("log of %d entries, more than %d", len(s.Log), MaxSnapshotLog)
	case s.ResetAt == 0 && s.ResetUntil == 0:
	case s.ResetAt <= 0 || s.ResetUntil <= s.ResetAt:
		return bad("reset mark at %d until %d: want 0 < at < until", s.ResetAt, s.ResetUntil)
	case s.MarkOnly():
		if s.Words != [3]int64{} || len(s.Log) > 0 || s.RateLimit != 0 || s.RateBurst != 0 || s.RatePeriod != 0 ||
			s.RateCalendar != NoCalendar || s.RateLocation != nil {
			return bad("a reset mark alone (ExpireAt 0) carries a state or a rate")
		}
		return nil
	}
	// The words read as the state reads them, but for the third, which is
	// checked whole: a tag bit set in it makes it negative or above
	// MaxLimit.
	var st state
	st.setSnapshotWords(s.Words)
	third := s.Words[2]
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		level := st.level()
		if math.IsNaN(level) || level < 0 || level > MaxLimit {
			return bad("bucket level %v is outside [0, %d]", level, int64(MaxLimit))
		}
		if third != 0 {
			return bad("%s word 2 is %d, want 0", s.Algorithm, third)
		}
	case FixedWindow:
		if hits := st.windowHits(); hits < 0 || hits > MaxLimit {
			return bad("window count %d is outside [0, %d]", hits, int64(MaxLimit))
		}
		if third != 0 {
			return bad("%s word 2 is %d, want 0", s.Algorithm, third)
		}
	case SlidingWindowCounter:
		if hits := st.windowHits(); hits < 0 || hits > MaxLimit || third < 0 || third > MaxLimit {
			return bad("window counts %d and %d are outside [0, %d]", hits, third, int64(MaxLimit))
		}
	case GCRA:
		if t := st.interval(); t < 1 || t > int64(MaxPeriod) {
			return bad("GCRA interval %d is outside [1, %d]", t, int64(MaxPeriod))
		}
		if third != 0 {
			return bad("%s word 2 is %d, want 0", s.Algorithm, third)
		}
	case SlidingWindowLog:
		if s.Words != [3]int64{} {
			return bad("%s has state words", s.Algorithm)
		}
		var total int64
		for i, e := range s.Log {
			if e.Hits < 1 || e.Hits > MaxLimit {
				return bad("log entry %d has %d hits", i, e.Hits)
			}
			if i > 0 && e.At <= s.Log[i-1].At {
				return bad("log entry %d is not after entry %d", i, i-1)
			}
			if total += e.Hits; total > MaxLimit {
				return bad("log holds more than %d hits", int64(MaxLimit))
			}
		}
	}
	return s.validateRate()
}

// HasResetMark reports whether s carries a Reset's mark (ResetAt and
// ResetUntil).
func (s *Snapshot) HasResetMark() bool { return s.ResetUntil != 0 }

// MarkOnly reports whether s carries a Reset's mark alone: ExpireAt 0,
// the state fresh.
func (s *Snapshot) MarkOnly() bool { return s.ExpireAt == 0 && s.ResetUntil != 0 }

// markLasts reports whether s carries a Reset's mark that lasts at now
// (Unix ns; before 1970 too, where no mark is: a valid mark's instants
// are positive).
func (s *Snapshot) markLasts(now int64) bool { return s.ResetUntil != 0 && s.ResetUntil > now }

// validateRate checks the rate s carries, if any: one a valid request of
// s's algorithm could have.
func (s *Snapshot) validateRate() error {
	switch {
	case s.RateLimit == 0 && s.RateBurst == 0 && s.RatePeriod == 0 && s.RateCalendar == NoCalendar && s.RateLocation == nil:
		return nil
	case s.RateCalendar != NoCalendar && s.RatePeriod != 0:
		return fmt.Errorf("%w: rate period %v with calendar unit %s, want 0", ErrInvalidSnapshot, s.RatePeriod, s.RateCalendar)
	case s.RateCalendar == NoCalendar && s.RateLocation != nil:
		return fmt.Errorf("%w: rate zone %q without a calendar unit", ErrInvalidSnapshot, s.RateLocation)
	}
	r := s.rateRequest()
	if r.burst() != s.RateBurst {
		return fmt.Errorf("%w: rate burst %d, want %d for %s with limit %d", ErrInvalidSnapshot, s.RateBurst, r.burst(), s.Algorithm, s.RateLimit)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: rate: %w", ErrInvalidSnapshot, err)
	}
	return nil
}

// rateRequest is a peek of s's key at the rate s carries.
func (s *Snapshot) rateRequest() Request {
	r := Request{Name: s.Name, Key: s.Key, Algorithm: s.Algorithm, Limit: s.RateLimit, Period: s.RatePeriod,
		Calendar: s.RateCalendar, Location: s.RateLocation}
	if s.Algorithm.HasBurst() {
		r.Burst = s.RateBurst
	}
	return r
}

// snapshotLocked exports e at now; its shard's lock must be held.
func (sh *shard) snapshotLocked(e *entry, now int64) Snapshot {
	name, key := splitStoreKey(e.key)
	s := Snapshot{Name: name, Key: key, Algorithm: e.algo(), ExpireAt: e.expireAt, Words: e.snapshotWords()}
	if c := sh.rates[e]; c.known() {
		s.RateLimit, s.RateBurst = c.limit, c.burst
		if c.period > 0 {
			s.RatePeriod = time.Duration(c.period)
		} else {
			s.RateCalendar, s.RateLocation = Calendar(-c.period), c.loc
			if c.loc == time.UTC {
				s.RateLocation = nil
			}
		}
	}
	if s.Algorithm == SlidingWindowLog {
		s.Words = [3]int64{}
		if lg := sh.logs[e.key]; lg != nil {
			s.Log = lg.export()
		}
	}
	if m, ok := sh.resets[e]; ok && (!m.drop() || m.at > now) {
		// A drop mark after now on a live state (see decideKeyLocked)
		// travels as a reset's mark at its instant, lasting at least
		// until then: the states dropped at it had gone fresh by then.
		s.ResetAt, s.ResetUntil = m.exported(now)
	}
	return s
}

// exported returns m's instant and end as a snapshot taken at now carries
// them: the instant at most now, as the state's own times are read. A
// mark made at a reading a clock has since stepped back from (a reset
// with the clock ahead, a drop there: see droppedAtLocked) may lie
// further ahead, and a node whose clock is behind this one's, within
// MaxClockSkew, would refuse the state with it (checkTimes): it takes the
// state with a mark at now, under which a refund of a charge named
// between now and the instant may give hits back, rather than count none
// of the key's hits. The end is at most MaxStateLife after now: no
// refund finds hits of a charge named at or before the instant (now)
// later than that, and a node whose clock is right would refuse an end
// further ahead (a sweep or a reset made with the clock years ahead) as
// it would the instant.
func (m resetMark) exported(now int64) (at, until int64) {
	return min(m.at, now), min(m.until, addSat(now, int64(MaxStateLife)))
}

// exportLocked exports e if it must travel at now: its state as
// snapshotLocked exports it while live, else the reset mark alone
// (Snapshot.MarkOnly) while that lasts. sh.mu must be held.
func (sh *shard) exportLocked(e *entry, now int64) (Snapshot, bool) {
	if e.expireAt > now {
		return sh.snapshotLocked(e, now), true
	}
	if m, ok := sh.resets[e]; ok && m.until > now && !m.drop() {
		name, key := splitStoreKey(e.key)
		at, until := m.exported(now)
		return Snapshot{Name: name, Key: key, Algorithm: e.algo(), ResetAt: at, ResetUntil: until}, true
	}
	return Snapshot{}, false
}

// export returns the live entries of l, at most MaxLogEntries.
func (l *windowLog) export() []LogEntry {
	live := l.entries[l.head:]
	out := make([]LogEntry, len(live))
	prev := l.base
	for i, e := range live {
		out[i] = LogEntry{At: e.at, Hits: e.cum - prev}
		prev = e.cum
	}
	return out
}

// splitStoreKey inverts appendStoreKey.
func splitStoreKey(k string) (name, key string) {
	n := int(k[0])
	return k[1 : 1+n], k[1+n:]
}

// Snapshot returns the state of (name, key), with its reset mark if any,
// and false when the store holds none that is live at now.
// It changes nothing, not even the key's place in the LRU order.
func (s *Store) Snapshot(name, key string, now time.Time) (sn Snapshot, ok bool) {
	s.withEntry(name, key, func(sh *shard, e *entry) {
		if ok = e.expireAt > now.UnixNano(); ok {
			sn = sh.snapshotLocked(e, now.UnixNano())
		}
	})
	return sn, ok
}

// withEntry calls fn with the entry of (name, key) and its shard, locked,
// when the store holds one.
func (s *Store) withEntry(name, key string, fn func(sh *shard, e *entry)) {
	if name == "" || len(name) > MaxNameLen {
		return
	}
	var buf [96]byte
	k := appendStoreKey(buf[:0], name, key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[string(k)]; ok {
		fn(sh, e)
	}
}

// Range calls fn with the snapshot of every key whose state is live at now,
// and the reset mark alone (Snapshot.MarkOnly) of every other key whose
// mark lasts at now, one shard at a time, until fn returns false. fn runs
// with the shard locked and must not call the store.
func (s *Store) Range(now time.Time, fn func(Snapshot) bool) {
	n := now.UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for e := sh.head; e != nil; e = e.next {
			if sn, ok := sh.exportLocked(e, n); ok && !fn(sn) {
				sh.mu.Unlock()
				return
			}
		}
		sh.mu.Unlock()
	}
}

// Changed calls fn with the snapshot of every key decided or merged since
// the last call, when StoreConfig.TrackChanges is set, and returns how many
// it reported. Keys since dropped or fresh again are skipped, but for
// those whose reset mark lasts, reported as the mark alone (see Range). fn runs with
// the key's shard locked and must not call the store.
func (s *Store) Changed(now time.Time, fn func(Snapshot)) int {
	n := now.UnixNano()
	reported := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j, e := range sh.changed {
			sh.changed[j] = nil
			if !e.isChanged() || sh.m[e.key] != e {
				continue // reported already, or no longer held
			}
			e.clearChanged()
			if sn, ok := sh.exportLocked(e, n); ok {
				fn(sn)
				reported++
			}
		}
		sh.changed = sh.changed[:0]
		sh.mu.Unlock()
	}
	return reported
}

// markChangedLocked records that e changed, for Changed. Its shard's lock
// must be held.
func (s *Store) markChangedLocked(sh *shard, e *entry) {
	if !s.track || e.isChanged() {
		return
	}
	if len(sh.changed) >= maxChangedPerShard {
		s.changesDropped.Add(1)
		return
	}
	e.setChanged()
	sh.changed = append(sh.changed, e)
}

// maxChangedPerShard bounds the changes a shard remembers between two calls
// of Changed; past it, changes are counted in StoreStats.ChangesDropped.
const maxChangedPerShard = 1 << 16

// Merge takes over the state in snaps at now, each merged with what the
// store holds for its key so that nothing consumed is forgotten: the state
// that has consumed more wins (per algorithm: the later bucket level or GCRA
// arrival time, the later window or the larger count in the same window, the
// larger counts of a sliding window counter, the log holding more hits in
// its window at now).
// A snapshot's reset mark is merged with the store's mark of its key: the
// later instant and the later end of both, which only ever keeps more
// refunds from giving hits back; the key's state is untouched by it.
// Snapshots already fresh at now are skipped, but for their marks while
// those last. It returns how many keys it
// changed and the first invalid snapshot's error; valid ones are merged
// whatever the others hold.
//
// A snapshot is untrusted: besides Validate, Merge refuses one whose
// ExpireAt or GCRA arrival time is more than MaxStateLife+MaxClockSkew
// after now, or whose bucket level time, window start, newest log entry
// or reset mark's instant is more than MaxClockSkew after now, or whose
// mark ends more than MaxStateLife+MaxClockSkew after now. A merged state is marked received,
// and the first decision on its key bounds it by that decision's request
// (see the package comment).
func (s *Store) Merge(snaps []Snapshot, now time.Time) (int, error) {
	n := now.UnixNano()
	var firstErr error
	changed := 0
	for i := range snaps {
		sn := &snaps[i]
		err := sn.Validate()
		if err == nil {
			err = sn.checkTimes(n)
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("snapshot %d: %w", i, err)
			}
			continue
		}
		if sn.ExpireAt <= n && !sn.markLasts(n) {
			continue
		}
		if s.merge(sn, n) {
			changed++
		}
	}
	return changed, firstErr
}

func (s *Store) merge(sn *Snapshot, now int64) bool {
	var buf [96]byte
	k := appendStoreKey(buf[:0], sn.Name, sn.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.mergeLocked(sh, k, sn, now)
}

// mergeLocked is merge's work on k, the key of sn, in sh: its state if
// live at now, then its reset mark if that lasts. sh.mu must be held.
func (s *Store) mergeLocked(sh *shard, k []byte, sn *Snapshot, now int64) bool {
	changed := false
	if sn.ExpireAt > now {
		changed = s.mergeStateLocked(sh, k, sn, now)
	}
	if !sn.markLasts(now) {
		return changed
	}
	e, ok := sh.m[string(k)]
	if !ok {
		e = s.insertLocked(sh, string(k), freshState(sn.Algorithm), nil, now)
	}
	if s.mergeMarkLocked(sh, e, sn, now) {
		s.markChangedLocked(sh, e)
		changed = true
	}
	return changed
}

// mergeMarkLocked merges the reset mark of sn, which lasts at now, into
// e's: the later instant and the later end of both (a mark of e's that
// has lapsed counts as none). It reports whether e's mark changed. sh.mu
// must be held.
func (s *Store) mergeMarkLocked(sh *shard, e *entry, sn *Snapshot, now int64) bool {
	m, had := sh.resets[e]
	merged := resetMark{at: sn.ResetAt, until: sn.ResetUntil}
	if had && m.until > now {
		merged = resetMark{at: max(m.at, merged.at), until: max(m.until, merged.until)}
	}
	if had && merged == m {
		return false
	}
	if sh.resets == nil {
		sh.resets = make(map[*entry]resetMark)
	}
	sh.resets[e] = merged
	if !had {
		// e first, so that the keys evicted to make room are others.
		sh.touchLocked(e)
		s.resizeLocked(sh, e, ResetMarkOverhead, now)
	}
	return true
}

// mergeStateLocked merges the state of sn, live at now, into k's in sh.
// sh.mu must be held.
func (s *Store) mergeStateLocked(sh *shard, k []byte, sn *Snapshot, now int64) bool {
	e, ok := sh.m[string(k)]
	if !ok {
		e = s.insertLocked(sh, string(k), snapshotState(sn), snapshotLog(sn), now)
		sh.takeRateLocked(e, sn, now)
		s.markChangedLocked(sh, e)
		return true
	}
	var lg *windowLog
	if e.algo() == SlidingWindowLog {
		lg = sh.logs[e.key]
	}
	before := logBytes(lg)
	if e.expireAt > now && e.algo() == sn.Algorithm {
		sh.takeRateLocked(e, sn, now)
		if !mergeInto(&e.state, lg, sn, now) {
			sh.touchLocked(e)
			return false
		}
	} else if e.expireAt > now {
		// A live state of another algorithm: neither can be read in the
		// other's terms without the rate of the request that reads it,
		// and replacing it could count fewer hits. Keep it; the next
		// decision reads it as its own algorithm does.
		sh.touchLocked(e)
		return false
	} else {
		wasChanged := e.isChanged()
		e.state = snapshotState(sn)
		delete(sh.rates, e) // unknown unless sn carries it
		sh.takeRateLocked(e, sn, now)
		if wasChanged {
			e.setChanged()
		}
		if lg = snapshotLog(sn); lg != nil {
			sh.logs[e.key] = lg
		} else if before != 0 {
			delete(sh.logs, e.key)
		}
	}
	e.setReceived()
	sh.touchLocked(e)
	s.resizeLocked(sh, e, logBytes(lg)-before, now)
	s.markChangedLocked(sh, e)
	return true
}

// sameDrain reports whether two bucket states drain at one rate, as their
// levels and expiries tell it (within a millionth): a state lasts until
// its level has drained.
func sameDrain(a, b *state) bool {
	ra, rb := drainRate(a), drainRate(b)
	return ra == rb || math.Abs(ra-rb) <= 1e-6*max(ra, rb)
}

// drainRate is a bucket state's rate in hits per nanosecond, read from
// its level and expiry; 0 when it tells none.
func drainRate(st *state) float64 {
	if d := st.expireAt - st.levelTime(); d > 0 && st.level() > 0 {
		return st.level() / float64(d)
	}
	return 0
}

// takeRateLocked records, under KeepStrictest, the rate sn carries as
// the one e's state was charged under: the strictest of it and the rate
// e has (see strictest: for the windows, the one whose window ends
// later, which the joined count lasts until), which reads neither state
// as counting less. A snapshot without a rate changes nothing. sh.mu must
// be held.
func (sh *shard) takeRateLocked(e *entry, sn *Snapshot, now int64) {
	if sh.rates == nil || sn.RateLimit == 0 {
		return
	}
	r := sn.rateRequest()
	if c := sh.rates[e]; c.known() {
		r, _, _ = strictest(c, e.algo(), &r, now)
	}
	sh.rates[e] = chargedOf(&r)
}

// mergeInto merges sn into st, both live at now and of sn's algorithm, and
// reports whether st changed. lg is st's log for the sliding window log.
func mergeInto(st *state, lg *windowLog, sn *Snapshot, now int64) bool {
	switch sn.Algorithm {
	case TokenBucket, LeakyBucket:
		theirs := snapshotState(sn)
		if sameDrain(st, &theirs) {
			// Both drain at the same rate, so the level that lasts
			// longer is the larger one.
			if sn.ExpireAt <= st.expireAt {
				return false
			}
			st.expireAt = sn.ExpireAt
			st.setSnapshotWords(sn.Words)
			break
		}
		// Charged at different rates: the one that lasts longer may
		// hold less. The larger level at the later time is at least
		// what either holds, read at any rate.
		level, at := max(st.level(), theirs.level()), max(st.levelTime(), theirs.levelTime())
		if level == st.level() && at == st.levelTime() && st.expireAt >= sn.ExpireAt {
			return false
		}
		st.setLevel(level, at)
		st.expireAt = max(st.expireAt, sn.ExpireAt)
	case GCRA:
		// The later TAT at the shorter interval counts at least the hits
		// of either (outstanding time over interval), and lasts as long.
		theirs := snapshotState(sn)
		tat, interval := max(st.tat(), theirs.tat()), min(st.interval(), theirs.interval())
		if tat == st.tat() && interval == st.interval() && st.expireAt >= sn.ExpireAt {
			return false
		}
		st.setTAT(tat, interval)
		st.expireAt = max(st.expireAt, sn.ExpireAt)
	case FixedWindow:
		// Both windows are live, so they start together unless they
		// were charged at different Periods (or on skewed clocks): the
		// later start with the larger count, which reads neither as
		// counting less.
		theirs := snapshotState(sn)
		start, hits := max(theirs.windowStart(), st.windowStart()), max(theirs.windowHits(), st.windowHits())
		if start == st.windowStart() && hits == st.windowHits() && st.expireAt >= sn.ExpireAt {
			return false
		}
		st.setWindow(start, hits)
		st.setLastCharge(0) // theirs may count later charges
		st.expireAt = max(st.expireAt, sn.ExpireAt)
	case SlidingWindowCounter:
		// Align both to the later window: a count one window older
		// becomes that window's previous count, older ones are over.
		theirs := snapshotState(sn)
		start := max(theirs.windowStart(), st.windowStart())
		cur, prev := alignCounter(theirs.windowStart(), theirs.windowHits(), theirs.prevWindowHits(), theirs.expireAt, start)
		mine, minePrev := alignCounter(st.windowStart(), st.windowHits(), st.prevWindowHits(), st.expireAt, start)
		nc, np := max(cur, mine), max(prev, minePrev)
		if start == st.windowStart() && nc == st.windowHits() && np == st.prevWindowHits() {
			return false
		}
		st.setWindow(start, nc)
		st.setPrevWindowHits(np)
		st.expireAt = max(st.expireAt, sn.ExpireAt)
	case SlidingWindowLog:
		if lg == nil {
			return false
		}
		mine := lg.export()
		joined := joinLogs(mine, sn.Log)
		if slices.Equal(joined, mine) && st.expireAt >= sn.ExpireAt {
			return false
		}
		lg.clear()
		for _, e := range joined {
			lg.add(e.At, e.Hits)
		}
		st.expireAt = max(st.expireAt, sn.ExpireAt)
	}
	return true
}

// joinLogs returns the log that counts, after each instant, the larger of
// what a and b (each in time order) count after it: at any later time its
// window holds the larger of both windows' hits, whatever the Period, so
// that neither log is read as counting less (a maximum, not a sum: a copy
// joined with itself is itself).
func joinLogs(a, b []LogEntry) []LogEntry {
	out := make([]LogEntry, 0, max(len(a), len(b)))
	i, j := len(a)-1, len(b)-1
	var sa, sb, joined int64
	for i >= 0 || j >= 0 {
		var at int64
		switch {
		case j < 0 || i >= 0 && a[i].At > b[j].At:
			at = a[i].At
		default:
			at = b[j].At
		}
		if i >= 0 && a[i].At == at {
			sa += a[i].Hits
			i--
		}
		if j >= 0 && b[j].At == at {
			sb += b[j].Hits
			j--
		}
		if m := max(sa, sb); m > joined {
			out = append(out, LogEntry{At: at, Hits: m - joined})
			joined = m
		}
	}
	slices.Reverse(out)
	return out
}

// alignCounter returns the current and previous counts of a sliding window
// counter whose current window began at ws, as they stand in the window
// beginning at start >= ws. The period is not stored: the state expires two
// periods after ws when cur > 0, one period after otherwise. A window that
// start does not follow by whole periods (another Period's) is placed as
// the sliding window counter's Period change places it: not over at start,
// it stays the current one; over, it is the previous one for a period.
func alignCounter(ws, cur, prev, expireAt, start int64) (int64, int64) {
	if ws == start {
		return cur, prev
	}
	p := expireAt - ws
	if cur > 0 {
		p /= 2
	}
	switch d := start - ws; {
	case d < p:
		// Its window is not over at start: charged at another Period
		// (or on a skewed clock), its counts stay where they are.
		return cur, prev
	case d < 2*p:
		return 0, cur
	}
	return 0, 0
}

// snapshotState is the state a snapshot describes, marked received.
func snapshotState(sn *Snapshot) state {
	st := freshState(sn.Algorithm)
	st.expireAt = sn.ExpireAt
	st.setSnapshotWords(sn.Words)
	st.setReceived()
	return st
}

// snapshotLog is the log a snapshot describes, or nil for the algorithms
// without one. Its array is a power of two entries long, as add keeps it.
func snapshotLog(sn *Snapshot) *windowLog {
	if sn.Algorithm != SlidingWindowLog {
		return nil
	}
	lg := &windowLog{}
	if n := len(sn.Log); n > 0 {
		lg.entries = make([]logEntry, 0, 1<<bits.Len(uint(n-1)))
	}
	for _, le := range sn.Log {
		lg.add(le.At, le.Hits)
	}
	return lg
}
