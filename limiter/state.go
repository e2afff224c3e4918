package limiter

// state is one key's state for any algorithm, in four words; the sliding
// window log keeps its entries beside it (see windowLog). What the words hold:
//
//	TokenBucket, LeakyBucket: w[0] float64 bits of the level (tokens consumed,
//	                          or hits queued), w[1] time of the level (ns)
//	FixedWindow:              w[0] window start (ns), w[1] hits in the window
//	SlidingWindowCounter:     w[0] current window start, w[1] its hits,
//	                          w[2] the previous window's hits (low 56 bits)
//	GCRA:                     w[0] theoretical arrival time (ns), w[1] the
//	                          emission interval it was computed with (ns)
//
// The top 8 bits of w[2] hold the Algorithm the state belongs to and the
// changed mark of Store.Changed, which keeps an entry at 64 bytes. The zero value is the fresh state of every algorithm.
type state struct {
	// expireAt is the time (Unix ns) from which the state is equivalent to
	// fresh under the parameters of the last request; dropping it then
	// changes no future decision.
	expireAt int64
	w        [3]int64
}

const (
	algoShift = 56
	// changedBit, above the algorithm, marks an entry listed for
	// Store.Changed.
	changedBit = 1 << 62
)

func (st *state) algo() Algorithm { return Algorithm(uint64(st.w[2]) >> algoShift & 0x3f) }

func (st *state) isChanged() bool { return st.w[2]&changedBit != 0 }
func (st *state) setChanged()     { st.w[2] |= changedBit }
func (st *state) clearChanged()   { st.w[2] &^= changedBit }

// third returns w[2] without the algorithm bits.
func (st *state) third() int64 { return st.w[2] & (1<<algoShift - 1) }

// setThird stores v (< 2^56; counts are at most MaxLimit) in w[2].
func (st *state) setThird(v int64) { st.w[2] = v | st.w[2]&^(1<<algoShift-1) }

// decide applies req (already validated) to st at now (Unix ns) and returns
// the decision. st is updated in place, including expireAt. lg is the key's
// sliding window log, used and allocated only by SlidingWindowLog.
func decide(st *state, lg **windowLog, req *Request, now int64) Decision {
	if st.algo() != req.Algorithm || st.expireAt <= now || req.Behavior&Reset != 0 {
		*st = state{w: [3]int64{2: int64(req.Algorithm) << algoShift}}
		if *lg != nil {
			(*lg).clear()
		}
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
