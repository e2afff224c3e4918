package limiter

import (
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// MaxSettleParts bounds the parts of a Settlement.
const MaxSettleParts = 8

// Settlement names the hits of a key's state that stand-in owners
// admitted: nodes that decided the key as its owner while the owner they
// stood in for was cut off, from a state that lacked what that owner
// admitted. A cluster sends it beside the state so that a receiver whose
// state comes from another history (the owner's side of a healed
// partition) charges those hits to its own state before it merges this
// one (Store.MergeCharged), instead of keeping the larger of the two.
type Settlement struct {
	// Request is the rate the hits were admitted at: the last request a
	// stand-in decided. Its Hits and Behavior are ignored.
	Request Request
	// Parts holds, per stand-in period (Origin, Gen), the hits admitted
	// in it that the state counts.
	Parts []SettlePart
}

// SettlePart is the hits one stand-in owner admitted in one period of
// standing in.
type SettlePart struct {
	Origin string // the stand-in node's name
	Gen    uint64 // which period of standing in, on that node
	Hits   int64
}

// Validate checks st as a settlement of sn's key: its request valid (with
// Hits 0) for sn's name, key and algorithm, at most MaxSettleParts parts,
// each with a valid name of at most MaxNameLen bytes and Hits in [1,
// MaxLimit], no two of one (Origin, Gen). Errors wrap ErrInvalidSnapshot.
func (st *Settlement) Validate(sn *Snapshot) error {
	r := st.Request
	r.Hits, r.Behavior = 0, 0
	switch {
	case r.Name != sn.Name || r.Key != sn.Key || r.Algorithm != sn.Algorithm:
		return fmt.Errorf("%w: settlement request of %q/%q (%s) for a state of %q/%q (%s)", ErrInvalidSnapshot, r.Name, r.Key, r.Algorithm, sn.Name, sn.Key, sn.Algorithm)
	case len(st.Parts) > MaxSettleParts:
		return fmt.Errorf("%w: settlement of %d parts, more than %d", ErrInvalidSnapshot, len(st.Parts), MaxSettleParts)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: settlement request: %w", ErrInvalidSnapshot, err)
	}
	for i, p := range st.Parts {
		switch {
		case p.Origin == "" || len(p.Origin) > MaxNameLen || !utf8.ValidString(p.Origin):
			return fmt.Errorf("%w: settlement part %d: origin of %d bytes is empty, longer than %d or not UTF-8", ErrInvalidSnapshot, i, len(p.Origin), MaxNameLen)
		case p.Hits < 1 || p.Hits > MaxLimit:
			return fmt.Errorf("%w: settlement part %d: hits %d outside [1, %d]", ErrInvalidSnapshot, i, p.Hits, int64(MaxLimit))
		}
		for _, q := range st.Parts[:i] {
			if q.Origin == p.Origin && q.Gen == p.Gen {
				return fmt.Errorf("%w: settlement part %d repeats %q/%d", ErrInvalidSnapshot, i, p.Origin, p.Gen)
			}
		}
	}
	return nil
}

// MergeCharged merges sn into the store as two histories of one key
// that each admitted hits the other did not count: it charges charge.Hits
// to the store's state and mine hits to sn, then keeps the larger of the
// two (as Merge does), all as one step under the key's lock. Each charge
// is at most what the state it comes from still counts at now under
// charge's rate (hits that have left its window, or drained from its
// bucket, are not charged again). charge's Name, Key and Algorithm must be
// sn's; its Behavior is ignored. It returns how many of charge.Hits the
// store counts by it (at most what sn still counts of them: none when sn
// has expired) and whether the key changed.
//
// The hits enter the store's live state under the rate that state was
// last decided at, in its own algorithm, whatever charge's rate (that of
// the node that admitted them), and whatever the state counts already:
// past its limit they count as consumption above the limit, and nothing
// is dropped. sn, when of the store state's algorithm, is read at that
// rate too before the two are merged, so that neither is read as
// counting more for being written at another rate. The store's live
// state merged so, or charged, is not marked received, as Merge marks a
// state (or it is unmarked, though an earlier Merge marked it): the next
// decision keeps what it counts past its limit. A store that holds no live state of the key counts none of it:
// sn, which counts its parts, is merged as it is, and marked received.
//
// With a store's state of b1 plus stand-in hits h1 and sn of b2 plus h2,
// charging the hits of h2 the store has not counted to the store's state
// and those of h1 sn has not counted to sn, the larger of the two is the
// larger of b1 and b2 plus every stand-in hit, once.
func (s *Store) MergeCharged(sn *Snapshot, charge Request, mine int64, now time.Time) (charged int64, changed bool, err error) {
	n := now.UnixNano()
	if err := sn.Validate(); err != nil {
		return 0, false, err
	}
	if err := sn.checkTimes(n); err != nil {
		return 0, false, err
	}
	if sn.ExpireAt <= n {
		// Fresh: it counts none of its hits any more, but its reset
		// mark may last.
		return 0, sn.markLasts(n) && s.merge(sn, n), nil
	}
	theirs := charge.Hits
	charge.Hits, charge.Behavior = 0, 0
	if charge.Name != sn.Name || charge.Key != sn.Key || charge.Algorithm != sn.Algorithm {
		return 0, false, fmt.Errorf("%w: charge of %q/%q (%s) with a state of %q/%q (%s)", ErrInvalidSnapshot, charge.Name, charge.Key, charge.Algorithm, sn.Name, sn.Key, sn.Algorithm)
	}
	if err := charge.Validate(); err != nil {
		return 0, false, err
	}
	in, inLog := snapshotState(sn), snapshotLog(sn)
	if theirs > 0 {
		theirs = min(theirs, consumed(&in, inLog, &charge, n))
	}
	var buf [96]byte
	k := appendStoreKey(buf[:0], sn.Name, sn.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	at := sh.readingLocked(n)
	e, ok := sh.m[string(k)]
	theirs = max(theirs, 0)
	if !ok || e.expireAt <= at {
		// sn, which counts theirs, is adopted, unless the store keeps
		// what it holds (a reset mark that sn predates).
		if !s.mergeLocked(sh, k, sn, at) {
			return 0, false, nil
		}
		return theirs, true, nil
	}
	var lg *windowLog
	if e.algo() == SlidingWindowLog {
		lg = sh.logs[e.key]
	}
	merged := sn
	// Two histories of the key that this store reads at its own state's
	// rate: what the merge counts past the limit is consumption, not a
	// copy to bound by the next request's limit (clampReceived).
	own := e.algo() == sn.Algorithm
	if e.algo() == sn.Algorithm {
		reRate(&in, &e.state, at)
		if mine = min(mine, consumed(&e.state, lg, &charge, at)); mine > 0 {
			chargeOwn(&in, inLog, mine, &charge, at)
		}
		c := stateSnapshot(sn.Name, sn.Key, &in, inLog)
		c.RateLimit, c.RateBurst, c.RatePeriod = sn.RateLimit, sn.RateBurst, sn.RatePeriod
		c.RateCalendar, c.RateLocation = sn.RateCalendar, sn.RateLocation
		c.ResetAt, c.ResetUntil = sn.ResetAt, sn.ResetUntil
		merged = &c
	}
	if theirs > 0 {
		before := logBytes(lg)
		chargeOwn(&e.state, lg, theirs, &charge, at)
		sh.touchLocked(e)
		if after := logBytes(lg); after != before {
			s.resizeLocked(sh, e, after-before, at)
		}
		s.markChangedLocked(sh, e)
		changed = true
	}
	if !s.mergeLocked(sh, k, merged, at) {
		if changed {
			// The state charged may have been marked received by an
			// earlier Merge: the hits charged past its limit are
			// consumption, which a decision's clamp must not drop.
			e.clearReceived()
		}
		return theirs, changed, nil
	}
	if own {
		e.clearReceived()
		if e.algo() == GCRA {
			// As far ahead of this reading as the merge left it, which
			// checkTimes has bounded.
			e.setTATLead(max(e.tat()-at, 0))
		}
	}
	return theirs, true, nil
}

// chargeOwn adds hits, admitted at now, to st, a live state, and to its
// log lg (the sliding window log's), at the rate the state was last
// decided at, as the state itself tells it: a bucket's drain from its
// level to empty at its expiry, GCRA's interval, a window's end, a
// counter's Period (see counterPeriod), a log's Period from its newest
// entry to its expiry. Where the state tells none, fallback's rate is
// used. The hits count whatever the state counts already: past the
// limit, a bucket's level, a TAT, a count or a log holds them all. Counts
// saturate at MaxLimit.
func chargeOwn(st *state, lg *windowLog, hits int64, fallback *Request, now int64) {
	switch st.algo() {
	case TokenBucket, LeakyBucket:
		level, last, end := st.level(), st.levelTime(), st.expireAt
		// The level drains linearly to empty at its expiry, which a
		// decision rounded up and a merge took the later of: the rate
		// read from them is at most the rate written, so the level read
		// at now is at least what it was.
		var perHit float64 // ns per hit
		if level > bucketEpsilon && end > last {
			perHit = float64(end-last) / level
		} else {
			perHit = float64(periodOf(fallback, now)) / float64(fallback.Limit)
		}
		if now > last {
			level = max(level-float64(now-last)/perHit, 0)
			last = now
		}
		level = min(level+float64(hits), MaxLimit)
		st.setLevel(level, last)
		drain := level * perHit
		if drain >= math.MaxInt64 {
			st.expireAt = horizon(now)
		} else {
			st.expireAt = max(st.expireAt, min(addSat(last, int64(math.Ceil(drain))), horizon(now)))
		}
	case GCRA:
		t := st.interval()
		if t <= 0 {
			t = gcraInterval(fallback)
		}
		behind := max(st.tat()-now, 0)
		ahead := horizon(now) - now
		if hits > (ahead-behind)/t {
			behind = ahead
		} else {
			behind += hits * t
		}
		st.setTAT(now+behind, t)
		st.setTATLead(behind)
		st.expireAt = now + behind
	case FixedWindow:
		// A live count is its window's, which ends at the expiry. Hits
		// admitted elsewhere were charged at instants unknown here.
		st.setWindow(st.windowStart(), min(st.windowHits()+hits, MaxLimit))
		st.setLastCharge(0)
	case SlidingWindowCounter:
		p := counterPeriod(st, periodOf(fallback, now))
		if p <= 0 {
			p = periodOf(fallback, now)
		}
		ws, cur, prev := st.windowStart(), st.windowHits(), st.prevWindowHits()
		if start := floorDiv(now, p) * p; start > ws {
			// Live, so now is within a period of its window's end.
			prev, cur, ws = cur, 0, start
			if start-p != st.windowStart() {
				prev = 0
			}
		}
		cur = min(cur+hits, MaxLimit)
		st.setWindow(ws, cur)
		st.setPrevWindowHits(prev)
		st.expireAt = max(st.expireAt, counterExpiry(ws, cur, prev, p, now))
	case SlidingWindowLog:
		if lg == nil {
			return
		}
		p := periodOf(fallback, now)
		if newest := lg.newest(); newest != math.MinInt64 && st.expireAt > newest {
			p = st.expireAt - newest
		}
		if hits = min(hits, MaxLimit-lg.total()); hits > 0 {
			lg.add(now, hits)
		}
		st.expireAt = max(st.expireAt, addSat(lg.newest(), p))
	}
}

// reRate reads in, a live state of own's algorithm written at another
// rate, at own's: GCRA's outstanding hits at own's interval (rounded up),
// so that a merge, which keeps the later TAT at the shorter interval,
// does not read either as counting more. The other algorithms keep
// counts or levels that merge as they are.
func reRate(in, own *state, now int64) {
	if in.algo() != GCRA || own.algo() != GCRA {
		return
	}
	t := own.interval()
	if t <= 0 || in.interval() == t {
		return
	}
	behind := gcraBehind(in, t, now)
	in.setTAT(now+behind, t)
	in.expireAt = now + behind
}

// stateSnapshot returns the snapshot of st, with its log lg, as the key
// (name, key)'s.
func stateSnapshot(name, key string, st *state, lg *windowLog) Snapshot {
	s := Snapshot{Name: name, Key: key, Algorithm: st.algo(), ExpireAt: st.expireAt, Words: st.snapshotWords()}
	if s.Algorithm == SlidingWindowLog {
		s.Words = [3]int64{}
		if lg != nil {
			s.Log = lg.export()
		}
	}
	return s
}
