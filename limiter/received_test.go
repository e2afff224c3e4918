package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// genuine returns the snapshot of a key of algorithm a that a store wrote
// for one check of 3 hits of 10 per second at now.
func genuine(t *testing.T, a Algorithm, now time.Time) Snapshot {
	t.Helper()
	s := newTestStore(t)
	req := Request{Name: "n", Key: "k", Hits: 3, Limit: 10, Period: time.Second, Algorithm: a}
	mustCheck(t, s, req, now)
	return snapOf(t, s, req, now)
}

// TestMergeRefusesImplausibleTimes: Merge refuses, naming the field, a
// state that lasts longer than any request makes one last or whose times
// are further ahead than the clock skew allows; it keeps what the store
// held for the key; a state at the bound is merged.
func TestMergeRefusesImplausibleTimes(t *testing.T) {
	now := t0
	n := now.UnixNano()
	late := n + int64(MaxClockSkew)
	last := late + int64(MaxStateLife)
	tests := []struct {
		algo  Algorithm
		field string
		set   func(sn *Snapshot, v int64)
		bound int64 // the latest accepted value
	}{
		{TokenBucket, "ExpireAt", func(sn *Snapshot, v int64) { sn.ExpireAt = v }, last},
		{SlidingWindowLog, "ExpireAt", func(sn *Snapshot, v int64) { sn.ExpireAt = v }, last},
		{TokenBucket, "level time", func(sn *Snapshot, v int64) { sn.Words[1] = v }, late},
		{LeakyBucket, "level time", func(sn *Snapshot, v int64) { sn.Words[1] = v }, late},
		{FixedWindow, "window start", func(sn *Snapshot, v int64) { sn.Words[0] = v }, late},
		{SlidingWindowCounter, "window start", func(sn *Snapshot, v int64) { sn.Words[0] = v }, late},
		{GCRA, "TAT", func(sn *Snapshot, v int64) { sn.Words[0], sn.ExpireAt = v, min(v, last) }, last},
		{SlidingWindowLog, "Log[0].At", func(sn *Snapshot, v int64) { sn.Log[0].At = v }, late},
	}
	for _, tt := range tests {
		t.Run(tt.algo.String()+"/"+tt.field, func(t *testing.T) {
			for _, v := range []int64{tt.bound + 1, math.MaxInt64} {
				sn := genuine(t, tt.algo, now)
				tt.set(&sn, v)
				s := newTestStore(t)
				// The store holds a state of the key that the refused
				// one would replace.
				held := genuine(t, tt.algo, now)
				mustMerge(t, s, []Snapshot{held}, now)
				k, err := s.Merge([]Snapshot{sn}, now)
				if k != 0 || !errors.Is(err, ErrInvalidSnapshot) || !strings.Contains(err.Error(), tt.field) {
					t.Fatalf("%s %d: Merge = %d, %v; want ErrInvalidSnapshot naming %s", tt.field, v, k, err, tt.field)
				}
				if got := snapOf(t, s, Request{Name: "n", Key: "k", Algorithm: tt.algo}, now); fmt.Sprint(got) != fmt.Sprint(held) {
					t.Fatalf("the refused state changed the key: %+v, want %+v", got, held)
				}
			}
			sn := genuine(t, tt.algo, now)
			tt.set(&sn, tt.bound)
			if _, err := newTestStore(t).Merge([]Snapshot{sn}, now); err != nil {
				t.Fatalf("at the bound: %v", err)
			}
		})
	}
}

// forged returns states of algorithm a that pass Merge at now but no
// request like those of TestReceivedClamped could have left: the most
// consumption Validate lets through, as late as the bounds let it be, and
// an expiry in 2116.
func forged(a Algorithm, now int64) []Snapshot {
	late := now + int64(MaxClockSkew)
	last := late + int64(MaxStateLife)
	y2116 := time.Date(2116, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	sn := Snapshot{Name: "n", Key: "k", Algorithm: a, ExpireAt: y2116}
	var out []Snapshot
	add := func(words [3]int64, log ...LogEntry) {
		s := sn
		s.Words, s.Log = words, log
		out = append(out, s)
		s.ExpireAt = last
		out = append(out, s)
	}
	switch a {
	case TokenBucket, LeakyBucket:
		add([3]int64{int64(math.Float64bits(MaxLimit)), late})
		add([3]int64{int64(math.Float64bits(MaxLimit)), now - int64(time.Hour)})
	case FixedWindow, SlidingWindowCounter:
		add([3]int64{late, MaxLimit, 0})
		add([3]int64{now, MaxLimit, 0})
		add([3]int64{now - int64(time.Hour), MaxLimit, 0})
		if a == SlidingWindowCounter {
			add([3]int64{late, MaxLimit, MaxLimit})
			add([3]int64{now - 1, MaxLimit, MaxLimit})
			add([3]int64{now - 1, 0, MaxLimit})
		}
	case GCRA:
		add([3]int64{y2116, 1, 0})
		add([3]int64{last, 1, 0})
		add([3]int64{y2116, int64(MaxPeriod), 0})
	case SlidingWindowLog:
		add([3]int64{}, LogEntry{late, MaxLimit})
		add([3]int64{}, LogEntry{now - 1, MaxLimit / 2}, LogEntry{now, MaxLimit / 2})
		var many []LogEntry
		for i := range MaxSnapshotLog {
			many = append(many, LogEntry{late - int64(MaxSnapshotLog-i)*int64(time.Millisecond), MaxLimit / MaxSnapshotLog})
		}
		add([3]int64{}, many...)
	}
	return out
}

// TestReceivedClamped merges forged states that pass Merge and decides on
// them with requests of various limits: each key is limited at most as long
// as the request's own limit and period allow, that is, RetryAfter and
// ResetAt are at most those of a fresh key that the request consumed whole
// at now; and every decision keeps the invariants of checkInvariants.
func TestReceivedClamped(t *testing.T) {
	now := t0
	reqs := []Request{
		{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second},
		{Name: "n", Key: "k", Hits: 1, Limit: 1, Period: time.Hour},
		{Name: "n", Key: "k", Hits: 5, Limit: 1_000_000, Period: time.Millisecond, Burst: 7},
		{Name: "n", Key: "k", Hits: 0, Limit: 3, Period: time.Minute},
	}
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			for i, sn := range forged(a, now.UnixNano()) {
				for _, req := range reqs {
					req.Algorithm = a
					if a == GCRA && req.Limit > int64(req.Period) {
						continue
					}
					if err := req.Validate(); err != nil {
						t.Fatal(err)
					}
					s := newTestStore(t)
					mustMerge(t, s, []Snapshot{sn}, now)
					d := mustCheck(t, s, req, now)

					full := newTestStore(t)
					if _, _, err := full.TakeAt(req, req.Capacity(), now); err != nil {
						t.Fatal(err)
					}
					want := mustCheck(t, full, req, now)
					// The buckets admit within bucketEpsilon of the
					// capacity, and a received level may be that much
					// above it.
					slack := time.Duration(0)
					if isBucket(a) {
						slack = time.Duration(math.Ceil(2*bucketEpsilon*float64(req.Period)/float64(req.Limit))) + 1
					}
					if d.RetryAfter > want.RetryAfter+slack || d.ResetAt.After(want.ResetAt.Add(slack)) {
						t.Fatalf("forged state %d %+v, request %+v:\n got %+v\nfresh key consumed whole: %+v", i, sn, req, d, want)
					}
					checkInvariants(t, s, req, now, d)
					if req.reads() { // a peek keeps nothing: a check bounds the state
						w := req
						w.Hits = 1
						mustCheck(t, s, w, now)
					}
					if got, ok := s.Snapshot(req.Name, req.Key, now); ok {
						checkBounded(t, got, req, now.UnixNano())
					}
				}
			}
		})
	}
}

// checkBounded fails unless sn is within what req could leave at now: no
// time after now, a bucket level of at most the capacity (within
// bucketEpsilon), a TAT at most Burst*T ahead, window counts and log hits
// of at most Limit.
func checkBounded(t *testing.T, sn Snapshot, req Request, now int64) {
	t.Helper()
	w := sn.Words
	var ok bool
	switch sn.Algorithm {
	case TokenBucket, LeakyBucket:
		ok = math.Float64frombits(uint64(w[0])) <= float64(req.Capacity())+bucketEpsilon && w[1] <= now
	case FixedWindow:
		ok = w[0] <= now && w[1] <= req.Limit
	case SlidingWindowCounter:
		ok = w[0] <= now && w[1] <= req.Limit && w[2] <= req.Limit
	case GCRA:
		ok = w[0] <= now+req.Capacity()*gcraInterval(&req)
	case SlidingWindowLog:
		var hits int64
		ok = true
		for _, e := range sn.Log {
			hits += e.Hits
			ok = ok && e.At <= now
		}
		ok = ok && hits <= req.Limit
	}
	if !ok {
		t.Fatalf("after a decision on a received state, %+v holds more than %+v leaves at now", sn, req)
	}
}

// TestReceived2116: the state that denied a key on every node until 2116,
// a GCRA arrival time 93 years ahead, passes Merge (it is within
// MaxStateLife) but limits the key only as long as its burst takes to
// drain.
func TestReceived2116(t *testing.T) {
	tat := time.Date(2116, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	sn := Snapshot{Name: "api", Key: "victim", Algorithm: GCRA, ExpireAt: tat, Words: [3]int64{tat, int64(time.Second), 0}}
	req := Request{Name: "api", Key: "victim", Hits: 1, Limit: 100, Period: time.Second, Burst: 100, Algorithm: GCRA}
	s := newTestStore(t)
	mustMerge(t, s, []Snapshot{sn}, t0)
	if d := mustCheck(t, s, req, t0); d.Allowed || d.RetryAfter != 10*time.Millisecond || !d.ResetAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("first check: %+v; want denied for one emission interval, fresh a second later", d)
	}
	if d := mustCheck(t, s, req, t0.Add(time.Second)); !d.Allowed || d.Remaining != 99 {
		t.Fatalf("a second later: %+v", d)
	}
}

// TestReceivedMark: Merge marks what it merges received; the mark is
// neither exported nor kept past the key's first decision, a peek
// included; a later merge marks the key again.
func TestReceivedMark(t *testing.T) {
	for _, a := range Algorithms {
		s, err := NewStore(StoreConfig{Shards: 1, TrackChanges: true})
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: a}
		mark := func() bool {
			k := appendStoreKey(nil, req.Name, req.Key)
			sh := s.shardFor(k)
			sh.mu.Lock()
			defer sh.mu.Unlock()
			return sh.m[string(k)].isReceived()
		}
		sn := genuine(t, a, t0)
		mustMerge(t, s, []Snapshot{sn}, t0)
		if !mark() {
			t.Fatalf("%v: a merged state is not marked received", a)
		}
		s.Changed(t0, func(got Snapshot) {
			if err := got.Validate(); err != nil || got.checkTimes(t0.UnixNano()) != nil || fmt.Sprint(got) != fmt.Sprint(sn) {
				t.Errorf("%v: a received state exported as %+v (%v), merged as %+v", a, got, err, sn)
			}
		})
		mustCheck(t, s, req, t0) // a peek keeps nothing
		if !mark() {
			t.Fatalf("%v: a peek took the mark", a)
		}

		newer := genuine(t, a, t0.Add(time.Millisecond))
		if a == SlidingWindowLog {
			newer.Log[0].Hits++
		} else {
			newer.Words[1]++ // more consumed, whatever the algorithm
		}
		if _, err := s.Merge([]Snapshot{newer}, t0.Add(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if !mark() {
			t.Fatalf("%v: a state merged into a received one is not marked", a)
		}
		req.Hits = 1
		mustCheck(t, s, req, t0.Add(time.Millisecond))
		if mark() {
			t.Fatalf("%v: a check left the mark", a)
		}
	}
}

// TestMergeGenuineDecidesAsOriginal is a differential test of hand-off: a
// random trace runs on one store; at a random point its key's snapshot is
// merged into another store that holds nothing for the key, an older
// snapshot of it, or an expired state of another algorithm; from then on
// both stores take the same random checks, peeks, takes, refunds, resets
// and DrainOverLimit, and decide them exactly alike.
func TestMergeGenuineDecidesAsOriginal(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(2116, uint64(a)))
			for trace := range traceCount() / 2 {
				req := randomRequest(t, rng, a)
				orig, cp := newTestStore(t), newTestStore(t)
				now := randomStart(rng)
				into := rng.IntN(3)
				if into == 1 && isBucket(a) {
					// Merge keeps the bucket level that expires later,
					// to the nanosecond; a level drains up to
					// Limit/Period hits in one, and an older level,
					// drained in float64 from another instant, may
					// round to the same expiry as the newer one or one
					// a nanosecond later, and decide otherwise.
					into = 0
				}
				if into == 2 { // an expired state of another algorithm
					other := randomRequest(t, rng, Algorithms[(int(a)+rng.IntN(5))%len(Algorithms)])
					other.Hits = 1
					mustCheck(t, cp, other, nsTime(now-int64(5*other.Period)-1))
				}
				step := func(s *Store, r Request, at int64, take int64) string {
					if take > 0 {
						got, d, err := s.TakeAt(r, take, nsTime(at))
						if err != nil {
							t.Fatal(err)
						}
						return fmt.Sprintf("took %d: %+v", got, d)
					}
					return fmt.Sprintf("%+v", mustCheck(t, s, r, nsTime(at)))
				}
				random := func(plain bool) (Request, int64) {
					r := req
					r.Hits = randomHits(rng, req.Capacity())
					if x := rng.IntN(20); !plain && x == 0 {
						r.Behavior = Refund
					} else if !plain && x == 1 {
						r.Behavior = Reset
					} else if x == 2 {
						r.Behavior = DrainOverLimit
					} else if x == 3 {
						return r, 1 + rng.Int64N(req.Capacity())
					}
					return r, 0
				}
				// Before the hand-off: plain consumption, so that a
				// later snapshot has consumed at least what an earlier
				// one has.
				steps := 1 + rng.IntN(20)
				older := rng.IntN(steps)
				for i := range steps {
					r, take := random(true)
					step(orig, r, now, take)
					if i == older && into == 1 {
						if sn, ok := orig.Snapshot(req.Name, req.Key, nsTime(now)); ok {
							mustMerge(t, cp, []Snapshot{sn}, nsTime(now))
						}
					}
					now += randomGap(rng, req)
				}
				if sn, ok := orig.Snapshot(req.Name, req.Key, nsTime(now)); ok {
					mustMerge(t, cp, []Snapshot{sn}, nsTime(now))
				}
				for i := range 15 {
					r, take := random(false)
					want, got := step(orig, r, now, take), step(cp, r, now, take)
					if got != want {
						t.Fatalf("trace %d (into %d, request %+v) step %d (%+v, take %d): original %s, copy %s",
							trace, into, req, i, r, take, want, got)
					}
					now += randomGap(rng, req)
				}
			}
		})
	}
}
