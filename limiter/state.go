package limiter

import "math"

// state is one key's state for any algorithm, in four words: expireAt and
// the three words of w, which the accessors below name. The sliding window
// log keeps its entries beside it (see windowLog). The words per algorithm:
//
//	TokenBucket, LeakyBucket: level (float64 bits: tokens consumed, or hits
//	                          queued) and levelTime, when it was that level
//	FixedWindow:              windowStart and windowHits
//	SlidingWindowCounter:     windowStart, windowHits and prevWindowHits
//	GCRA:                     tat, the theoretical arrival time, and the
//	                          interval (ns per hit) it was computed with
//
// The top 8 bits of the third word hold the Algorithm the state belongs to
// (bits 56-61), the changed mark of Store.Changed (bit 62) and the received
// mark of a state merged from another node (bit 63), which keeps an entry
// at 64 bytes; prevWindowHits uses the low 56. The zero value is the fresh
// state of every algorithm. Snapshots carry the words as they are (see
// Snapshot).
type state struct {
	// expireAt is the time (Unix ns) from which the state is equivalent to
	// fresh under the parameters of the last request; dropping it then
	// changes no future decision.
	expireAt int64
	w        [3]int64
}

const (
	algoShift = 56
	lowBits   = 1<<algoShift - 1
	// changedBit, above the algorithm, marks an entry listed for
	// Store.Changed.
	changedBit = 1 << 62
	// receivedBit marks a state that Store.Merge took from another node
	// and that no decision has bounded yet (see clampReceived).
	receivedBit = math.MinInt64 // bit 63
)

func (st *state) algo() Algorithm { return Algorithm(uint64(st.w[2]) >> algoShift & 0x3f) }

func (st *state) isChanged() bool { return st.w[2]&changedBit != 0 }
func (st *state) setChanged()     { st.w[2] |= changedBit }
func (st *state) clearChanged()   { st.w[2] &^= changedBit }

func (st *state) isReceived() bool { return st.w[2]&receivedBit != 0 }
func (st *state) setReceived()     { st.w[2] |= receivedBit }

// The buckets' words.
func (st *state) level() float64   { return math.Float64frombits(uint64(st.w[0])) }
func (st *state) levelTime() int64 { return st.w[1] }
func (st *state) setLevel(level float64, at int64) {
	st.w[0], st.w[1] = int64(math.Float64bits(level)), at
}

// GCRA's words. An interval of 0 marks the fresh state.
func (st *state) tat() int64                 { return st.w[0] }
func (st *state) interval() int64            { return st.w[1] }
func (st *state) setTAT(tat, interval int64) { st.w[0], st.w[1] = tat, interval }

// The windows' words. prevWindowHits is below 2^56: counts are at most
// MaxLimit.
func (st *state) windowStart() int64          { return st.w[0] }
func (st *state) windowHits() int64           { return st.w[1] }
func (st *state) prevWindowHits() int64       { return st.w[2] & lowBits }
func (st *state) setWindow(start, hits int64) { st.w[0], st.w[1] = start, hits }
func (st *state) setPrevWindowHits(hits int64) {
	st.w[2] = hits | st.w[2]&^lowBits
}

// decide applies req (already validated) to st at now (Unix ns) and returns
// the decision. st is updated in place, including expireAt. lg is the key's
// sliding window log, used and allocated only by SlidingWindowLog.
func decide(st *state, lg **windowLog, req *Request, now int64) Decision {
	if st.algo() != req.Algorithm || st.expireAt <= now || req.Behavior&Reset != 0 {
		*st = state{w: [3]int64{2: int64(req.Algorithm) << algoShift}}
		if *lg != nil {
			(*lg).clear()
		}
	} else if st.isReceived() {
		clampReceived(st, *lg, req, now)
	}
	if req.Behavior&Refund != 0 {
		refund(st, *lg, req, now)
		peek := *req
		peek.Hits, peek.Behavior = 0, 0
		req = &peek
	}
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
