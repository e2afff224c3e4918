package limiter

import (
	"math"
	"time"
)

// convert carries st, a live state of another algorithm than req's, into
// req's: the state that req's algorithm has after taking, from fresh at
// now, the hits st still counts at now (consumed), at most req's capacity.
// Nothing is discarded: with the same Limit and Burst, Remaining after the
// conversion is at most what st's own algorithm had left at now, and a
// spent key stays spent. lg is the key's log, emptied when st was a log and
// allocated when req's algorithm keeps one.
func convert(st *state, lg **windowLog, req *Request, now int64) {
	c := consumed(st, *lg, req, now)
	*st = freshState(req.Algorithm)
	if *lg != nil {
		(*lg).clear()
	}
	if c == 0 {
		return
	}
	seed := *req
	seed.Hits, seed.Behavior = min(c, req.Capacity()), 0
	decideAlgorithm(st, lg, &seed, now) // admitted: a fresh state takes its capacity
}

// consumed is how many hits st, a live state of its own algorithm, still
// counts at now, read with req's rate where the state does not keep one,
// as a change of Limit or Period reads it: a bucket's level drained at
// req's rate since it was stored, rounded up; a fixed window's count; the
// sliding window counter's estimate cur + prev*(Period-elapsed)/Period
// over req's Period, rounded up; the hits of a log within req's Period;
// GCRA's outstanding time at its own interval, in hits rounded up. It is
// at most MaxLimit.
func consumed(st *state, lg *windowLog, req *Request, now int64) int64 {
	p := periodOf(req, now)
	var c int64
	switch st.algo() {
	case TokenBucket, LeakyBucket:
		level := bucketLevelAt(st.level(), st.levelTime(), now, float64(req.Limit), float64(p))
		if level -= bucketEpsilon; level > 0 {
			c = int64(min(math.Ceil(level), MaxLimit))
		}
	case FixedWindow:
		c = st.windowHits()
	case SlidingWindowCounter:
		// The counter's own rule, with room for every hit: what it has
		// left below MaxLimit is what it counts.
		probe := Request{Limit: MaxLimit, Period: time.Duration(p), Algorithm: SlidingWindowCounter}
		cp := *st
		c = MaxLimit - decideSlidingCounter(&cp, &probe, now).Remaining
	case GCRA:
		if t := st.interval(); t > 0 && st.tat() > now {
			c = mul(st.tat()-now, 1).divCeil(t)
		}
	case SlidingWindowLog:
		if lg != nil {
			c = lg.hitsAfter(now - p)
		}
	}
	return min(max(c, 0), MaxLimit)
}

// periodOf is req's Period, or with a Calendar the length of the calendar
// unit that holds now.
func periodOf(req *Request, now int64) int64 {
	if req.Calendar == NoCalendar {
		return int64(req.Period)
	}
	start, end := windowBounds(req, now)
	return end - start
}
