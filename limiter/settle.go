package limiter

import (
	"fmt"
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
// bucket, are not charged again) and is made as a DrainOverLimit check,
// never past the capacity. charge's Name, Key and Algorithm must be sn's;
// its Behavior is ignored. Under KeepStrictest each charge is decided as
// a check would be on its state: sn's at the strictest of sn's rate and
// charge's, so that a window's count moves only to one that ends no
// earlier. It reports whether the key changed.
//
// With a store's state of b1 plus stand-in hits h1 and sn of b2 plus h2,
// charging the hits of h2 the store has not counted to the store's state
// and those of h1 sn has not counted to sn, the larger of the two is the
// larger of b1 and b2 plus every stand-in hit, once.
func (s *Store) MergeCharged(sn *Snapshot, charge Request, mine int64, now time.Time) (bool, error) {
	n := now.UnixNano()
	if err := sn.Validate(); err != nil {
		return false, err
	}
	if err := sn.checkTimes(n); err != nil {
		return false, err
	}
	if sn.ExpireAt <= n {
		return false, nil // fresh: it counts none of its hits any more
	}
	theirs := charge.Hits
	charge.Hits, charge.Behavior = 0, 0
	if charge.Name != sn.Name || charge.Key != sn.Key || charge.Algorithm != sn.Algorithm {
		return false, fmt.Errorf("%w: charge of %q/%q (%s) with a state of %q/%q (%s)", ErrInvalidSnapshot, charge.Name, charge.Key, charge.Algorithm, sn.Name, sn.Key, sn.Algorithm)
	}
	if err := charge.Validate(); err != nil {
		return false, err
	}
	in, inLog := snapshotState(sn), snapshotLog(sn)
	if theirs > 0 {
		d := peek(in, inLog, &charge, n)
		theirs = min(theirs, max(charge.Capacity()-d.Remaining, 0))
	}
	var buf [96]byte
	k := appendStoreKey(buf[:0], sn.Name, sn.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	at := sh.readingLocked(n)
	merged := sn
	if mine > 0 {
		// What the store's own state counts, before it is charged.
		if e, ok := sh.m[string(k)]; ok && e.expireAt > at && e.algo() == sn.Algorithm {
			d := peek(e.state, sh.logs[e.key], &charge, at)
			mine = min(mine, max(charge.Capacity()-d.Remaining, 0))
		} else {
			mine = 0
		}
	}
	if mine > 0 {
		r := charge
		r.Hits, r.Behavior = mine, DrainOverLimit
		if sh.rates != nil && sn.RateLimit != 0 {
			// Charged as the store decides a key kept at sn's rate: a
			// window's count moves only to a window that ends no
			// earlier than sn's, so none of sn's hits is released
			// before its own window ends.
			rate := sn.rateRequest()
			if m, none := strictest(chargedOf(&rate), sn.Algorithm, &r, at); !none {
				r = m
			}
		}
		decide(&in, &inLog, &r, at)
		c := stateSnapshot(sn.Name, sn.Key, &in, inLog)
		c.RateLimit, c.RateBurst, c.RatePeriod = sn.RateLimit, sn.RateBurst, sn.RatePeriod
		c.RateCalendar, c.RateLocation = sn.RateCalendar, sn.RateLocation
		merged = &c
	}
	changed := false
	if theirs > 0 {
		charge.Hits, charge.Behavior = theirs, DrainOverLimit
		var d Decision
		s.decideKeyLocked(sh, k, &charge, at, 0, &d)
		changed = true
	}
	return s.mergeLocked(sh, k, merged, at) || changed, nil
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
