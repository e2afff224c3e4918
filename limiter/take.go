package limiter

import (
	"fmt"
	"time"
)

// TakeAt consumes up to want hits of req's key at now, in one step: as many
// as the limit admits right now, at most want (and at most req.Capacity()).
// req.Hits and req.Behavior are ignored. It returns how many hits it took
// (0 when the limit admits none) and the decision for them; when it took
// none, the decision is that of one hit and says when to retry.
//
// A node leasing tokens of a hot key uses it on the key's owner: the hits
// taken are counted there at once, whoever admits them later.
func (s *Store) TakeAt(req Request, want int64, now time.Time) (int64, Decision, error) {
	req.Hits, req.Behavior = 0, 0
	if err := req.Validate(); err != nil {
		return 0, Decision{}, err
	}
	if want < 1 {
		return 0, Decision{}, fmt.Errorf("%w: want %d is below 1", ErrInvalidHits, want)
	}
	var buf [96]byte
	k := appendStoreKey(buf[:0], req.Name, req.Key)
	sh := s.shardFor(k)
	ns := now.UnixNano()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[string(k)]
	var st state
	var lg *windowLog
	if ok {
		st = e.state
		if req.Algorithm == SlidingWindowLog || e.algo() == SlidingWindowLog {
			lg = sh.logs[e.key]
		}
	}
	// A peek changes nothing that matters (it only brings the state up to
	// now), so it can run on the real state.
	peek := decide(&st, &lg, &req, ns)
	take := min(want, peek.Remaining, req.Capacity())
	d := peek
	if take > 0 {
		req.Hits = take
		d = decide(&st, &lg, &req, ns)
		if !d.Allowed { // cannot happen: Remaining said it fits
			return 0, Decision{}, fmt.Errorf("limiter: %s did not admit the %d hits it reported remaining", req.Algorithm, take)
		}
	}
	switch {
	case ok:
		e.state = st
		if lg != nil && req.Algorithm == SlidingWindowLog {
			sh.logs[e.key] = lg
		} else if lg != nil {
			delete(sh.logs, e.key)
		}
		sh.touchLocked(e)
		s.markChangedLocked(sh, e)
	case st.expireAt > ns:
		e = s.insertLocked(sh, string(k), st, ns)
		if lg != nil {
			sh.logs[e.key] = lg
		}
		s.markChangedLocked(sh, e)
	}
	return take, d, nil
}
