package limiter

import (
	"fmt"
	"time"
)

// A state merged from another node is untrusted: Merge refuses one whose
// times no node could have written (checkTimes), and marks the others
// received, so that the first decision on the key bounds the state by what
// that decision's own request could have left (clampReceived).
const (
	// MaxClockSkew is how far ahead of this node's clock a received
	// state's times may be: further, Merge refuses the state. It matches
	// the skew peers' authentication allows.
	MaxClockSkew = 5 * time.Minute
	// MaxStateLife is the longest one valid request makes a state last:
	// MaxDrain for a full burst, plus up to MaxLimit ns that GCRA's
	// interval, rounded up to whole nanoseconds, adds to it, and float64
	// rounding; an hour covers both. The windows last at most two periods.
	MaxStateLife = MaxDrain + time.Hour
)

// checkTimes reports the first time of s that is implausible at now (Unix
// ns) on this node: an expiry or a GCRA arrival time more than
// MaxStateLife+MaxClockSkew after now, or a bucket level's time, a window's
// start, a log entry or a reset mark's instant more than MaxClockSkew after
// now, or the mark's end more than MaxStateLife+MaxClockSkew after now.
func (s *Snapshot) checkTimes(now int64) error {
	late := addSat(now, int64(MaxClockSkew))
	last := addSat(late, int64(MaxStateLife))
	future := func(field string, at, bound int64, by time.Duration) error {
		if at <= bound {
			return nil
		}
		return fmt.Errorf("%w: %s %s is more than %v after now (%s)", ErrInvalidSnapshot, field,
			nsTime(at).UTC().Format(time.RFC3339Nano), by, nsTime(now).UTC().Format(time.RFC3339Nano))
	}
	if err := future("ExpireAt", s.ExpireAt, last, MaxStateLife+MaxClockSkew); err != nil {
		return err
	}
	if s.HasResetMark() {
		if err := future("ResetAt", s.ResetAt, late, MaxClockSkew); err != nil {
			return err
		}
		if err := future("ResetUntil", s.ResetUntil, last, MaxStateLife+MaxClockSkew); err != nil {
			return err
		}
		if s.MarkOnly() {
			return nil
		}
	}
	var st state
	st.setSnapshotWords(s.Words)
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		return future("level time (Words[1])", st.levelTime(), late, MaxClockSkew)
	case FixedWindow, SlidingWindowCounter:
		return future("window start (Words[0])", st.windowStart(), late, MaxClockSkew)
	case GCRA:
		return future("TAT (Words[0])", st.tat(), last, MaxStateLife+MaxClockSkew)
	case SlidingWindowLog:
		if n := len(s.Log); n > 0 { // in time order: the last is the latest
			return future(fmt.Sprintf("Log[%d].At", n-1), s.Log[n-1].At, late, MaxClockSkew)
		}
	}
	return nil
}

// clampReceived bounds st, a received state of req's algorithm that is
// live at now, by what req could have left at now, and clears its mark:
// its times as boundTimes bounds every state's, then a bucket level of at
// most the burst, a TAT at most Burst*T after now, window counts and log
// hits in the window of at most Limit. A state that req's own parameters
// wrote on another node at or before now is within these bounds already and
// decides as it would have there.
func clampReceived(st *state, lg *windowLog, req *Request, now int64) {
	boundTimes(st, lg, req, now)
	switch req.Algorithm {
	case TokenBucket, LeakyBucket:
		// An admitted level is at most the capacity plus the tolerance.
		capacity := float64(req.burst()) + bucketEpsilon
		st.setLevel(min(st.level(), capacity), st.levelTime())
	case FixedWindow, SlidingWindowCounter:
		// decide resets a fixed window that is over; the counter places
		// each count by the window's start and the state's expiry, in
		// now's window, the previous one or none: each is at most Limit.
		st.setWindow(st.windowStart(), min(st.windowHits(), req.Limit))
		if req.Algorithm == SlidingWindowCounter {
			st.setPrevWindowHits(min(st.prevWindowHits(), req.Limit))
		}
	case GCRA:
		// A received state carries no tatLead: bound its TAT by the
		// request's tolerance.
		t := gcraInterval(req)
		if behind := gcraBehind(st, t, now); behind > 0 {
			st.setTAT(now+min(behind, req.burst()*t), t)
		}
	case SlidingWindowLog:
		if lg != nil {
			lg.clampReceived(now, int64(req.Period), req.Limit)
		}
	}
	st.clearReceived()
}

// clampReceived drops the entries outside the window (now-p, now] of a log
// whose times boundTimes has bounded, and keeps the newest limit hits of
// the rest, which decide as all of them would under limit.
func (l *windowLog) clampReceived(now, p, limit int64) {
	l.expire(now - p)
	if l.total() > limit {
		l.base = l.entries[len(l.entries)-1].cum - limit
		for l.entries[l.head].cum <= l.base {
			l.head++
		}
	}
}
