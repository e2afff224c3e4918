package limiter

import (
	"testing"
	"time"

	_ "time/tzdata" // the calendar tests need zones whatever the host has
)

// t0 is the tests' fixed origin: 2023-11-14 22:00:00 UTC, a whole hour, so
// windows of a millisecond, a second, a minute or an hour start at t0.
var t0 = time.Unix(1_699_999_200, 0)

// unchecked marks a step's wanted duration that the step does not compare.
const unchecked = time.Duration(-1 << 63)

// step is one request of a table and what its decision must be. Zero
// limit, period and burst mean the table's.
type step struct {
	at       time.Duration // since t0
	hits     int64
	behavior Behavior
	limit    int64
	period   time.Duration
	burst    int64

	wantAllowed    bool
	wantRemaining  int64
	wantRetryAfter time.Duration // unchecked: not compared
	wantResetAt    time.Duration // since t0; unchecked: not compared
	wantDelay      time.Duration // unchecked: not compared
}

// runSteps runs steps in order on one key of a new store, starting from
// base, and checks each decision against its row and against
// checkInvariants.
func runSteps(t *testing.T, base Request, steps []step) {
	t.Helper()
	s := newTestStore(t)
	for i, st := range steps {
		req := base
		req.Hits, req.Behavior = st.hits, st.behavior
		if st.limit != 0 {
			req.Limit = st.limit
		}
		if st.period != 0 {
			req.Period = st.period
		}
		if st.burst != 0 {
			req.Burst = st.burst
		}
		now := t0.Add(st.at)
		d, err := s.CheckAt(req, now)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		bad := d.Allowed != st.wantAllowed || d.Remaining != st.wantRemaining ||
			(st.wantRetryAfter != unchecked && d.RetryAfter != st.wantRetryAfter) ||
			(st.wantResetAt != unchecked && !d.ResetAt.Equal(t0.Add(st.wantResetAt))) ||
			(st.wantDelay != unchecked && d.Delay != st.wantDelay)
		if bad {
			t.Errorf("step %d (at %v, hits %d, behavior %d, limit %d, period %v, burst %d):\n got allowed %v remaining %d retryAfter %v resetAt %v delay %v\nwant allowed %v remaining %d retryAfter %v resetAt %v delay %v",
				i, st.at, req.Hits, req.Behavior, req.Limit, req.Period, req.Burst,
				d.Allowed, d.Remaining, d.RetryAfter, d.ResetAt.Sub(t0), d.Delay,
				st.wantAllowed, st.wantRemaining, show(st.wantRetryAfter), show(st.wantResetAt), show(st.wantDelay))
		}
		checkInvariants(t, s, req, now, d)
	}
}

func show(d time.Duration) any {
	if d == unchecked {
		return "-"
	}
	return d
}

func newTestStore(t testing.TB) *Store {
	t.Helper()
	s, err := NewStore(StoreConfig{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stateCopy is a copy of one key's state, to decide on without touching the
// store.
type stateCopy struct {
	st state
	lg *windowLog
}

func cloneLog(l *windowLog) *windowLog {
	if l == nil {
		return nil
	}
	return l.clone()
}

// readingOf is the instant s decides req's key at for a reading of n
// (see shard.readingLocked), without recording n.
func readingOf(s *Store, req *Request, n int64) int64 {
	sh := s.shardFor(appendStoreKey(nil, req.Name, req.Key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.readingAtLocked(n)
}

// copyState copies what s holds for req's key (the fresh state if none).
func copyState(s *Store, req *Request) stateCopy {
	k := appendStoreKey(nil, req.Name, req.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[string(k)]
	if !ok {
		return stateCopy{}
	}
	return stateCopy{st: e.state, lg: cloneLog(sh.logs[e.key])}
}

// decideAt is the decision the store would make for req at now (Unix ns),
// leaving the copy as it is.
func (sn stateCopy) decideAt(req Request, now int64) Decision {
	st, lg := sn.st, cloneLog(sn.lg)
	return decide(&st, &lg, &req, now)
}

// apply decides req at now on the copy itself, as a check that keeps
// what it computes would.
func (sn *stateCopy) apply(req Request, now int64) {
	decide(&sn.st, &sn.lg, &req, now)
}

// isBucket reports whether a keeps a float level.
func isBucket(a Algorithm) bool { return a == TokenBucket || a == LeakyBucket }

// checkInvariants checks what every decision d for req at now must satisfy,
// probing copies of the state that s holds after it:
//   - RetryAfter is exact: the same request is admitted at now+RetryAfter
//     and not at now+RetryAfter-1ns (zero when admitted);
//   - Remaining is exact: Remaining hits are admitted right now and
//     Remaining+1 are not (when Remaining+1 fits the capacity);
//   - ResetAt is when the state is fresh again: a peek then sees the whole
//     capacity, and, but for the buckets (whose level may come within
//     bucketEpsilon of empty a little earlier), a peek 1ns earlier does not;
//   - Delay is set only on admitted leaky-bucket decisions.
func checkInvariants(t testing.TB, s *Store, req Request, now time.Time, d Decision) {
	t.Helper()
	n := now.UnixNano()
	c := req.Capacity()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%v at %v (t0%+v), request %+v, decision %+v: "+format,
			append([]any{req.Algorithm, now.UTC(), now.Sub(t0), req, d}, args...)...)
	}
	if d.Limit != req.Limit {
		fail("Limit %d", d.Limit)
	}
	if d.Remaining < 0 || d.Remaining > c {
		fail("Remaining outside [0, %d]", c)
	}
	if d.ResetAt.Before(now) {
		fail("ResetAt before now")
	}
	if d.Allowed != (d.RetryAfter == 0) {
		fail("RetryAfter must be zero exactly when admitted")
	}
	if d.Delay < 0 || (d.Delay != 0 && (!d.Allowed || req.Algorithm != LeakyBucket)) {
		fail("Delay only for admitted leaky-bucket requests")
	}
	sn := copyState(s, &req)
	if req.reads() {
		// A peek answers for the state as its parameters read it now
		// (the state a check of 0 hits with them would keep), which the
		// store does not keep.
		sn.apply(req, readingOf(s, &req, n))
	}
	same := req
	same.Behavior &^= Reset
	if !d.Allowed {
		at := n + int64(d.RetryAfter)
		if !sn.decideAt(same, at).Allowed {
			fail("not admitted at now+RetryAfter")
		}
		if sn.decideAt(same, at-1).Allowed {
			fail("admitted at now+RetryAfter-1ns")
		}
	}
	plain := req
	plain.Behavior = 0
	if d.Remaining > 0 {
		plain.Hits = d.Remaining
		if !sn.decideAt(plain, n).Allowed {
			fail("Remaining hits not admitted")
		}
	}
	if d.Remaining < c {
		plain.Hits = d.Remaining + 1
		if sn.decideAt(plain, n).Allowed {
			fail("Remaining+1 hits admitted")
		}
	}
	plain.Hits = 0
	r := d.ResetAt.UnixNano()
	if got := sn.decideAt(plain, r); got.Remaining != c {
		fail("a peek at ResetAt sees Remaining %d, not the capacity %d", got.Remaining, c)
	}
	if r > n && !isBucket(req.Algorithm) {
		if got := sn.decideAt(plain, r-1); got.Remaining == c {
			fail("a peek 1ns before ResetAt already sees the whole capacity")
		}
	}
}
