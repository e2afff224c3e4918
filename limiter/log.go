package limiter

import (
	"cmp"
	"slices"
	"sort"
	"time"
)

// MaxLogEntries is the most entries one key's sliding window log holds.
// A log that would pass it merges its entries into coarser ones, each into
// the latest of its run, so that hits expire later than exactly, never
// earlier (see the package comment for the precision).
const MaxLogEntries = 4096

// logEntry is the last instant of a run of admitted hits.
type logEntry struct {
	at int64 // Unix ns
	// cum counts the hits of this entry and of every entry before it,
	// back to the one whose cum is the log's base.
	cum int64
}

// windowLog is the sliding window log of one key, kept beside its state in
// the shard (only this algorithm needs one): entries in time order, live
// from head. Hits admitted at the same instant share an entry, and so do,
// once the log has filled, hits admitted within one multiple of quantum
// nanoseconds; every entry holds at least one hit, so there are never more
// entries than Limit, nor than MaxLogEntries.
//
// Counts are cumulative, so that merging an entry into the next one is
// dropping it, the total is one subtraction and the entry where the oldest
// hits add up to a number is a binary search.
type windowLog struct {
	entries []logEntry
	head    int
	// base is the cum of the last entry dropped from the front: the
	// entry at head holds entries[head].cum-base hits.
	base int64
	// quantum is 0 (exact) until the log first fills, then a power of
	// two; it returns to 0 when the log empties.
	quantum int64
}

// total is the number of hits in the log.
func (l *windowLog) total() int64 {
	if n := len(l.entries); n > l.head {
		return l.entries[n-1].cum - l.base
	}
	return 0
}

// hits is the number of hits of entry i, a live one.
func (l *windowLog) hits(i int) int64 {
	if i == l.head {
		return l.entries[i].cum - l.base
	}
	return l.entries[i].cum - l.entries[i-1].cum
}

// clear empties the log. A large array is released rather than kept for
// a log that may stay small.
func (l *windowLog) clear() {
	if cap(l.entries) > 64 {
		l.entries = nil
	} else {
		l.entries = l.entries[:0]
	}
	l.head, l.base, l.quantum = 0, 0, 0
}

// clone returns a copy of l with entries of its own, of the same
// capacity, so that the copy grows and coarsens as l would.
func (l *windowLog) clone() *windowLog {
	entries := append(make([]logEntry, 0, cap(l.entries)), l.entries...)
	return &windowLog{entries: entries, head: l.head, base: l.base, quantum: l.quantum}
}

// expire drops the entries admitted at or before cutoff. It moves the
// head and the base, never an entry: a peek expires a copy of the log
// that shares its entries (see peek).
func (l *windowLog) expire(cutoff int64) {
	for l.head < len(l.entries) && l.entries[l.head].at <= cutoff {
		l.base = l.entries[l.head].cum
		l.head++
	}
	if l.head == len(l.entries) {
		l.clear()
	}
}

// compact moves the live entries to the front of the array once half of
// it is expired.
func (l *windowLog) compact() {
	if l.head > 32 && l.head*2 >= len(l.entries) {
		l.moveTo(l.entries)
	}
}

// moveTo copies the live entries to the front of dst, which may be
// l.entries itself, rebased so that base is 0, and makes dst the log's
// array.
func (l *windowLog) moveTo(dst []logEntry) {
	dst = dst[:0]
	for _, e := range l.entries[l.head:] {
		dst = append(dst, logEntry{e.at, e.cum - l.base})
	}
	l.entries, l.head, l.base = dst, 0, 0
}

// joinsLast reports whether hits admitted at at go into the newest entry:
// at is not after it (the same instant, or the clock stepped back), or it
// is in the same multiple of quantum.
func (l *windowLog) joinsLast(at int64) bool {
	n := len(l.entries)
	if n == l.head {
		return false
	}
	last := l.entries[n-1].at
	return at <= last || l.quantum > 0 && floorDiv(at, l.quantum) == floorDiv(last, l.quantum)
}

// add records hits admitted at at.
func (l *windowLog) add(at, hits int64) {
	if !l.joinsLast(at) && len(l.entries) == cap(l.entries) {
		l.makeRoom()
	}
	if l.joinsLast(at) { // again: makeRoom may have coarsened the quantum
		last := &l.entries[len(l.entries)-1]
		last.at = max(last.at, at)
		last.cum += hits
		return
	}
	l.entries = append(l.entries, logEntry{at, l.base + l.total() + hits})
}

// makeRoom frees room for one more entry in a full array: it slides the
// live entries to the front when a quarter of the array is expired, else
// moves them to an array twice the size (at most MaxLogEntries), else
// coarsens the quantum. Arrays are a power of two entries long, which is
// the size the allocator gives them.
func (l *windowLog) makeRoom() {
	c := cap(l.entries)
	switch {
	case l.head > 0 && l.head >= c/4:
		l.moveTo(l.entries)
	case c < MaxLogEntries:
		l.moveTo(make([]logEntry, 0, min(max(2*c, 4), MaxLogEntries)))
	default:
		l.coarsen()
	}
}

// coarsen merges the entries of each multiple of a quantum into the latest
// of them, doubling the quantum until at most MaxLogEntries/2 entries are
// left. The first quantum tried is the least power of two that is at least
// twice the previous one and of which MaxLogEntries/2-1 multiples span the
// live entries.
func (l *windowLog) coarsen() {
	l.moveTo(l.entries)
	span := l.entries[len(l.entries)-1].at - l.entries[0].at
	q := max(2*l.quantum, 1)
	for q < span/(MaxLogEntries/2-1) && q < 1<<61 {
		q *= 2
	}
	for {
		kept := l.entries[:1]
		for _, e := range l.entries[1:] {
			if floorDiv(e.at, q) == floorDiv(kept[len(kept)-1].at, q) {
				kept[len(kept)-1] = e // the later entry's cum counts both
			} else {
				kept = append(kept, e)
			}
		}
		l.entries, l.quantum = kept, q
		if len(kept) <= MaxLogEntries/2 || q >= 1<<61 {
			return
		}
		q *= 2
	}
}

// oldestReaching returns the index of the oldest entry by which the log,
// counted from its oldest hit, holds need hits (0 < need <= total).
func (l *windowLog) oldestReaching(need int64) int {
	i, _ := slices.BinarySearchFunc(l.entries[l.head:], l.base+need, func(e logEntry, target int64) int {
		return cmp.Compare(e.cum, target)
	})
	return l.head + i
}

// hitsAfter is the number of hits admitted after cutoff.
func (l *windowLog) hitsAfter(cutoff int64) int64 {
	live := l.entries[l.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].at > cutoff })
	if i == 0 {
		return l.total()
	}
	return l.total() - (live[i-1].cum - l.base)
}

// decideSlidingLog admits at most Limit hits in any (now-Period, now].
func decideSlidingLog(st *state, l *windowLog, req *Request, now int64) Decision {
	p := int64(req.Period)
	l.expire(now - p)
	if req.Hits > 0 { // only a decision that writes moves entries
		l.compact()
	}
	probe := max(req.Hits, 1)
	total := l.total()
	d := Decision{Limit: req.Limit}
	if total+probe <= req.Limit {
		d.Allowed = true
		if req.Hits > 0 {
			l.add(now, req.Hits)
			total += req.Hits
			// The entry the hits went into, later than now if the
			// clock stepped back.
			at := l.entries[len(l.entries)-1].at
			d.Window = Window{at, at}
		}
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && total < req.Limit {
			l.add(now, req.Limit-total)
			total = req.Limit
		}
		// Wait until enough of the oldest entries expire: probe <= Limit,
		// so 0 < need <= total.
		e := l.entries[l.oldestReaching(total+probe-req.Limit)]
		d.RetryAfter = time.Duration(e.at + p - now)
	}
	d.Remaining = max(req.Limit-total, 0)
	st.expireAt = now
	if n := len(l.entries); n > l.head {
		st.expireAt = addSat(l.entries[n-1].at, p)
	}
	d.ResetAt = nsTime(st.expireAt)
	return d
}
