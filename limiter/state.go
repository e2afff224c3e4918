package limiter

import (
	"math"
	"time"
)

// state is one key's state for any algorithm: expireAt and three words,
// which no code but the accessors below reads or writes. The sliding
// window log keeps its entries beside it (see windowLog). The words per
// algorithm:
//
//	TokenBucket, LeakyBucket: level (float64 bits: tokens consumed, or hits
//	                          queued) and levelTime, when it was that level
//	FixedWindow:              windowStart and windowHits, and in the
//	                          third word lastCharge, the instant of the
//	                          last charge that raised the count (in
//	                          microseconds, rounded up to a multiple of
//	                          lastChargeGrain; 0 unknown)
//	SlidingWindowCounter:     windowStart, windowHits and prevWindowHits
//	GCRA:                     tat, the theoretical arrival time, the
//	                          interval (ns per hit) it was computed with,
//	                          and tatLead, how far the TAT was ahead of
//	                          the clock of the decision that wrote it
//
// The top 8 bits of the third word are the state's tag: the Algorithm it
// belongs to (bits 56-61), the changed mark of Store.Changed (bit 62) and
// the received mark of a state merged from another node (bit 63), which
// keeps an entry at 64 bytes; prevWindowHits, tatLead and lastCharge use
// the low 56.
// The zero value is the fresh state of every algorithm. Snapshots carry the
// words without the tag and without tatLead (see snapshotWords).
type state struct {
	// expireAt is the time (Unix ns) from which the state is equivalent to
	// fresh under the parameters of the last request; dropping it then
	// changes no future decision.
	expireAt int64
	words    [3]int64
}

// The layout of the third word.
const (
	tagShift     = 56              // the tag is the bits from here up
	prevHitsMask = 1<<tagShift - 1 // below the tag: prevWindowHits
	algoMask     = 0x3f            // the tag's low 6 bits: the Algorithm
	changedMark  = 1 << 62         // listed for Store.Changed
	receivedMark = math.MinInt64   // bit 63; see clampReceived
)

// freshState is the fresh state of a.
func freshState(a Algorithm) state {
	return state{words: [3]int64{2: int64(a) << tagShift}}
}

// tag is the third word's top bits: the Algorithm and the marks.
func (st *state) tag() int64      { return st.words[2] &^ prevHitsMask }
func (st *state) algo() Algorithm { return Algorithm(uint64(st.words[2]) >> tagShift & algoMask) }

// The changed mark: the state is listed for Store.Changed.
func (st *state) isChanged() bool { return st.words[2]&changedMark != 0 }
func (st *state) setChanged()     { st.words[2] |= changedMark }
func (st *state) clearChanged()   { st.words[2] &^= changedMark }

// The received mark: Store.Merge took the state from another node and no
// decision has bounded it yet (see clampReceived).
func (st *state) isReceived() bool { return st.words[2]&receivedMark != 0 }
func (st *state) setReceived()     { st.words[2] |= receivedMark }
func (st *state) clearReceived()   { st.words[2] &^= receivedMark }

// snapshotWords returns the words as Snapshot.Words carries them: the
// third without the tag, and 0 for GCRA, whose tatLead stays on this node
// (a received state has none; see clampReceived), and for the fixed
// window, whose lastCharge does too (a received state's is unknown).
func (st *state) snapshotWords() [3]int64 {
	w := st.words
	w[2] &= prevHitsMask
	if a := st.algo(); a == GCRA || a == FixedWindow {
		w[2] = 0
	}
	return w
}

// setSnapshotWords sets the words to w, a Snapshot's, keeping the tag. w's
// third word must have no tag bits, as Snapshot.Validate checks.
func (st *state) setSnapshotWords(w [3]int64) {
	tag := st.tag()
	st.words = w
	st.words[2] |= tag
}

// The buckets' words.
func (st *state) level() float64   { return math.Float64frombits(uint64(st.words[0])) }
func (st *state) levelTime() int64 { return st.words[1] }
func (st *state) setLevel(level float64, at int64) {
	st.words[0], st.words[1] = int64(math.Float64bits(level)), at
}

// GCRA's words. An interval of 0 marks the fresh state. tatLead is what
// the last decision wrote, 0 when it left the TAT at its now (a refund, a
// reset, a lease returned: a step back then reads the key as not spent);
// a received state's is 0 until its first decision, which clamps it
// first (clampReceived). It saturates at maxTATLead (about 2.3 years),
// which bounds nothing (see boundTimes).
func (st *state) tat() int64                 { return st.words[0] }
func (st *state) interval() int64            { return st.words[1] }
func (st *state) setTAT(tat, interval int64) { st.words[0], st.words[1] = tat, interval }
func (st *state) tatLead() int64             { return st.words[2] & prevHitsMask }
func (st *state) setTATLead(lead int64)      { st.words[2] = min(lead, maxTATLead) | st.tag() }

// maxTATLead is the largest tatLead, which means at least as much.
const maxTATLead = prevHitsMask

// The windows' words. prevWindowHits is below 2^56: counts are at most
// MaxLimit.
func (st *state) windowStart() int64          { return st.words[0] }
func (st *state) windowHits() int64           { return st.words[1] }
func (st *state) prevWindowHits() int64       { return st.words[2] & prevHitsMask }
func (st *state) setWindow(start, hits int64) { st.words[0], st.words[1] = start, hits }

// lastCharge is a fixed window's instant (Unix ns, a whole microsecond)
// of the last charge that raised its count, rounded up to lastChargeGrain
// microseconds, so no earlier than that charge;
// 0 when unknown (a fresh or received state, settled hits, an instant
// before 1970 or within lastChargeGrain of 2^53 microseconds or past it,
// 2255-06-05, where Redis's numbers are not whole).
func (st *state) lastCharge() int64 {
	return st.words[2] & prevHitsMask * int64(time.Microsecond)
}

// lastChargeGrain is the grain, in microseconds, a fixed window's last
// charge is rounded up to (2^20, about a second): Redis's state binds the
// count to it in the spare low bits (redislimit's decide.lua).
const lastChargeGrain = 1 << 20

// setLastCharge records a charge at now, or with now 0 forgets it.
func (st *state) setLastCharge(now int64) {
	us := (now + int64(time.Microsecond) - 1) / int64(time.Microsecond)
	us = (us + lastChargeGrain - 1) / lastChargeGrain * lastChargeGrain
	if now <= 0 || us+lastChargeGrain >= 1<<53 {
		us = 0
	}
	st.words[2] = us | st.tag()
}
func (st *state) setPrevWindowHits(hits int64) {
	st.words[2] = hits | st.tag()
}

// decide applies req (already validated) to st at now (Unix ns) and returns
// the decision. st is updated in place, including expireAt. lg is the key's
// sliding window log, used and allocated only by SlidingWindowLog. A live
// state of another algorithm is converted first (see convert).
func decide(st *state, lg **windowLog, req *Request, now int64) Decision {
	d, _ := decideGave(st, lg, req, now)
	return d
}

// decideGave is decide, returning beside the decision the whole hits a
// refund without Charged gave back (see refund); 0 for any other request.
func decideGave(st *state, lg **windowLog, req *Request, now int64) (Decision, int64) {
	if req.chargedRefund() {
		return decideChargedRefund(st, lg, req, now), 0
	}
	switch {
	case st.expireAt <= now || req.Behavior&Reset != 0:
		*st = freshState(req.Algorithm)
		if *lg != nil {
			(*lg).clear()
		}
	default:
		// Times after now (a clock set back, a peer's ahead) are bounded
		// as the state's own algorithm reads them, before a conversion
		// counts what it holds.
		own := ownRequest(st, req, now)
		if st.isReceived() {
			clampReceived(st, *lg, own, now)
		} else {
			boundTimes(st, *lg, own, now)
		}
		if st.algo() != req.Algorithm {
			convert(st, lg, req, now)
		}
	}
	var gave int64
	if req.Behavior&Refund != 0 {
		gave = refund(st, *lg, req, now)
		peek := *req
		peek.Hits, peek.Behavior = 0, 0
		req = &peek
	}
	return decideAlgorithm(st, lg, req, now), gave
}

// ownRequest is req as st's own algorithm reads st: req itself, or with
// st's algorithm, and a calendar's Period at now unless that is a fixed
// window.
func ownRequest(st *state, req *Request, now int64) *Request {
	if st.algo() == req.Algorithm {
		return req
	}
	r := *req
	r.Algorithm = st.algo()
	if r.Algorithm != FixedWindow && r.Calendar != NoCalendar {
		r.Period, r.Calendar = time.Duration(periodOf(req, now)), NoCalendar
	}
	return &r
}

// decideChargedRefund is decide for a refund with Charged
// (Request.chargedRefund): it gives the hits back to the charge when the
// state still counts it, then decides as a peek.
func decideChargedRefund(st *state, lg **windowLog, req *Request, now int64) Decision {
	gave := Window{}
	// The charge is found on the state as stored: before its times are
	// bounded, before any conversion.
	if req.Hits > 0 && st.expireAt > now && refundCharged(st, *lg, req, now, true) {
		gave = req.Charged
	}
	p := *req
	p.Hits, p.Behavior, p.Charged = 0, 0, Window{}
	d := decide(st, lg, &p, now)
	if !gave.IsZero() {
		d.Window = gave
	}
	return d
}

// decideAlgorithm is the decision of req's algorithm on st, a state of it.
func decideAlgorithm(st *state, lg **windowLog, req *Request, now int64) Decision {
	switch req.Algorithm {
	case TokenBucket:
		return decideBucket(st, req, now, false)
	case LeakyBucket:
		return decideBucket(st, req, now, true)
	case FixedWindow:
		return decideFixedWindow(st, req, now)
	case SlidingWindowCounter:
		return decideSlidingCounter(st, req, now)
	case GCRA:
		return decideGCRA(st, req, now)
	default: // SlidingWindowLog; Validate rejected anything else
		if *lg == nil {
			*lg = &windowLog{}
		}
		return decideSlidingLog(st, *lg, req, now)
	}
}

// peek decides req, which only reads (Request.reads), on copies of st and
// lg, so that nothing it computes (a conversion, a clamp, a drain at
// another rate, expired log entries) is kept. The copy of lg shares its
// entries, which a reading decision never writes, unless a clamp of a
// received log would.
func peek(st state, lg *windowLog, req *Request, now int64) Decision {
	if lg != nil {
		// Clamping and bounding by now move entries; the others only
		// move the copy's head.
		if st.isReceived() || lg.newest() > now {
			lg = lg.clone()
		} else {
			c := *lg
			lg = &c
		}
	}
	return decide(&st, &lg, req, now)
}
