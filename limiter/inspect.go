package limiter

import "time"

// StateView is a Snapshot's state words read by name, for operators who
// inspect a key: only the fields of the snapshot's algorithm are set.
// It is derived from the snapshot alone; a decision on the key also
// depends on the parameters of the request that makes it.
type StateView struct {
	Algorithm Algorithm
	// ExpireAt is when the state returns to fresh.
	ExpireAt time.Time

	// TokenBucket and LeakyBucket: Level is the tokens consumed (hits
	// queued) as they stood at LevelAt; they drain from then on.
	Level   float64
	LevelAt time.Time

	// FixedWindow and SlidingWindowCounter: the current window began at
	// WindowStart and has admitted WindowHits; PrevWindowHits is the
	// previous window's count (SlidingWindowCounter only).
	WindowStart    time.Time
	WindowHits     int64
	PrevWindowHits int64

	// GCRA: the theoretical arrival time and the emission interval it was
	// computed with.
	TAT      time.Time
	Interval time.Duration

	// SlidingWindowLog: the log's entries and the hits they hold, over
	// every entry the snapshot carries (some may be older than the
	// window of the next request). A valid snapshot holds at most
	// MaxLimit hits.
	LogEntries int
	LogHits    int64
}

// View returns s's state read by name.
func (s *Snapshot) View() StateView {
	st := freshState(s.Algorithm)
	st.setSnapshotWords(s.Words)
	v := StateView{Algorithm: s.Algorithm, ExpireAt: nsTime(s.ExpireAt)}
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		v.Level, v.LevelAt = st.level(), nsTime(st.levelTime())
	case FixedWindow:
		v.WindowStart, v.WindowHits = nsTime(st.windowStart()), st.windowHits()
	case SlidingWindowCounter:
		v.WindowStart, v.WindowHits, v.PrevWindowHits = nsTime(st.windowStart()), st.windowHits(), st.prevWindowHits()
	case GCRA:
		v.TAT, v.Interval = nsTime(st.tat()), time.Duration(st.interval())
	case SlidingWindowLog:
		v.LogEntries = len(s.Log)
		for _, e := range s.Log {
			v.LogHits += e.Hits
		}
	}
	return v
}

// Forget drops the state of (name, key), live or not, and reports whether
// the store held any: the key is fresh from then on. A node drops its copy
// of a key this way when the key's owner resets it.
func (s *Store) Forget(name, key string) (held bool) {
	s.withEntry(name, key, func(sh *shard, e *entry) {
		s.bytes.Add(-sh.removeLocked(e))
		s.entries.Add(-1)
		held = true
	})
	return held
}

// ResetMark returns the mark a Reset left on (name, key) alone
// (Snapshot.MarkOnly), and false when the store holds none that lasts at
// now. It changes nothing, not even the key's place in the LRU order.
func (s *Store) ResetMark(name, key string, now time.Time) (sn Snapshot, ok bool) {
	n := now.UnixNano()
	s.withEntry(name, key, func(sh *shard, e *entry) {
		if m, has := sh.resets[e]; has && m.until > n && !m.drop() {
			at, until := m.exported(n)
			sn = Snapshot{Name: name, Key: key, Algorithm: e.algo(), ResetAt: at, ResetUntil: until}
			ok = true
		}
	})
	return sn, ok
}

// ResetRequest returns the request that resets (name, key) to fresh,
// whatever the algorithm and parameters of its state, and consumes
// nothing: Hits 0 and Behavior Reset, with parameters (a fixed window of 1
// hit per second) that only shape the decision on the fresh state. The
// fixed window holds no hits apart from its state, as a cluster's leases
// of a bucket do, so the reset clears the whole state.
func ResetRequest(name, key string) Request {
	return Request{Name: name, Key: key, Hits: 0, Limit: 1, Period: time.Second, Algorithm: FixedWindow, Behavior: Reset}
}
