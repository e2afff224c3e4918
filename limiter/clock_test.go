package limiter

import (
	"fmt"
	"testing"
	"time"
)

// clockShapes are the limits the clock tables run with for algorithm a: a
// burst of Limit at 10/s and 100/min, a burst above Limit where a has one,
// and a calendar day in a zone with DST for the fixed window.
func clockShapes(t *testing.T, a Algorithm) []Request {
	t.Helper()
	shapes := []Request{{Limit: 10, Period: time.Second}, {Limit: 100, Period: time.Minute}}
	if a.HasBurst() {
		shapes = append(shapes, Request{Limit: 10, Period: time.Second, Burst: 25})
	}
	if a == FixedWindow {
		ny, err := time.LoadLocation("America/New_York")
		if err != nil {
			t.Fatal(err)
		}
		shapes = append(shapes, Request{Limit: 5, Calendar: Day, Location: ny})
	}
	for i := range shapes {
		shapes[i].Name, shapes[i].Key, shapes[i].Algorithm = "api", "k", a
	}
	return shapes
}

// clockStep is one check of a clock table.
type clockStep struct {
	at         time.Duration // since t0; ignored when afterRetry
	afterRetry bool          // at the previous step's now plus its RetryAfter
	hits       int64
	wantDenied bool // else admitted
}

// spentBy says where the key's capacity was spent, ahead of the clock that
// decides next.
type spentBy int

const (
	spentHere spentBy = iota // on this store, its clock ahead
	spentPeer                // on a peer whose clock is ahead; merged here
)

// runClockSteps spends the whole capacity of req's key at t0+ahead (on the
// store, or on a peer and merged at t0), then runs steps, and checks that
// each decision is the one a key whose capacity was spent at t0 gets from
// the same steps: the key is held exactly as long as its own limit holds a
// key spent at now (at most lateReading longer for a step back of at most
// lateReading, read as a late reading). Every decision also passes checkInvariants (RetryAfter
// exact), admits or denies as the step says, and a denial's RetryAfter is
// at most span, the longest the limit holds a key spent at now.
func runClockSteps(t *testing.T, req Request, ahead time.Duration, by spentBy, span time.Duration, steps []clockStep) {
	t.Helper()
	s, ref := newTestStore(t), newTestStore(t)
	spend := req
	spend.Hits = req.Capacity()
	switch by {
	case spentHere:
		if d := mustCheck(t, s, spend, t0.Add(ahead)); !d.Allowed {
			t.Fatalf("spending at t0+%v: %+v", ahead, d)
		}
	case spentPeer:
		peer := newTestStore(t)
		mustCheck(t, peer, spend, t0.Add(ahead))
		mustMerge(t, s, []Snapshot{snapOf(t, peer, spend, t0.Add(ahead))}, t0)
	}
	// A step back of at most lateReading is read as a late reading: the
	// store decides at the reading it spent at until the clock passes it,
	// and its waits count from the caller's reading.
	absorbed := by == spentHere && ahead <= time.Duration(lateReading)
	spentAt := t0
	if absorbed {
		spentAt = t0.Add(ahead)
	}
	mustCheck(t, ref, spend, spentAt)
	now, retry := t0, time.Duration(0)
	for i, st := range steps {
		if st.afterRetry {
			now = now.Add(retry)
		} else {
			now = t0.Add(st.at)
		}
		r := req
		r.Hits = st.hits
		d := mustCheck(t, s, r, now)
		refAt := now
		if now.Before(spentAt) {
			refAt = spentAt
		}
		want := mustCheck(t, ref, r, refAt)
		shift := refAt.Sub(now)
		if want.RetryAfter > 0 {
			want.RetryAfter += shift
		}
		if want.Delay > 0 {
			want.Delay += shift
		}
		where := fmt.Sprintf("step %d at t0%+v (spent at t0%+v)", i, now.Sub(t0), ahead)
		if d.Allowed != want.Allowed || d.Remaining != want.Remaining || d.RetryAfter != want.RetryAfter ||
			!d.ResetAt.Equal(want.ResetAt) || d.Delay != want.Delay {
			t.Fatalf("%s: %+v, a key spent at t0 gets %+v", where, d, want)
		}
		if d.Allowed == st.wantDenied {
			t.Fatalf("%s: allowed %v, want %v", where, d.Allowed, !st.wantDenied)
		}
		if d.RetryAfter > span+shift {
			t.Fatalf("%s: RetryAfter %v, longer than the %v the limit holds a key spent at now", where, d.RetryAfter, span)
		}
		checkInvariants(t, s, r, now, d)
		retry = d.RetryAfter
	}
}

// holdSpan is the longest req holds a key whose capacity was spent at t0:
// a burst's drain for the buckets and GCRA, a window for the fixed window
// and the log, a window and a hit's share of the next for the counter.
func holdSpan(req Request) time.Duration {
	if req.Calendar != NoCalendar {
		return 25 * time.Hour // a day, which DST may lengthen
	}
	switch req.Algorithm {
	case SlidingWindowCounter:
		return req.Period + req.Period/time.Duration(req.Limit) + 1
	case FixedWindow, SlidingWindowLog:
		return req.Period
	}
	return time.Duration(req.Capacity()) * ((req.Period + time.Duration(req.Limit) - 1) / time.Duration(req.Limit))
}

// TestClockStepBack spends a key with the clock ahead (an hour, an hour
// and 300ms, which puts the windows out of phase, a second, 20ms), steps
// the clock back, and checks that the key is released as a key spent at
// now is, for every algorithm and shape: denied at first, admitted at
// now+RetryAfter, and after the clock steps forward again. A peer whose
// clock is ahead (within MaxClockSkew) is held to the same.
func TestClockStepBack(t *testing.T) {
	const h = time.Hour
	steps := func(ahead, span time.Duration) []clockStep {
		return []clockStep{
			{at: 0, hits: 1, wantDenied: true},
			{at: 0, hits: 0, wantDenied: true},
			{afterRetry: true, hits: 1},
			{at: ahead + 2*span, hits: 1}, // forward again
		}
	}
	for _, a := range Algorithms {
		for _, req := range clockShapes(t, a) {
			name := fmt.Sprintf("%v/%d per %v burst %d %v", a, req.Limit, req.Period, req.Burst, req.Calendar)
			t.Run(name, func(t *testing.T) {
				for _, tt := range []struct {
					ahead time.Duration
					by    spentBy
				}{
					{h, spentHere}, {h + 300*time.Millisecond, spentHere}, {time.Second, spentHere},
					{20 * time.Millisecond, spentHere},
					{MaxClockSkew, spentPeer}, {20 * time.Millisecond, spentPeer},
				} {
					span := holdSpan(req)
					runClockSteps(t, req, tt.ahead, tt.by, span, steps(tt.ahead, span))
				}
			})
		}
	}
}

// TestClockStepBackPeekWritesNothing peeks at a key spent with the clock an
// hour ahead once the clock is back: the peek decides as a check would and
// leaves the state as it was, so that a later check decides as it would
// have without the peek.
func TestClockStepBackPeekWritesNothing(t *testing.T) {
	for _, a := range Algorithms {
		for _, req := range clockShapes(t, a) {
			name := fmt.Sprintf("%v/%d per %v burst %d %v", a, req.Limit, req.Period, req.Burst, req.Calendar)
			t.Run(name, func(t *testing.T) {
				s, other := newTestStore(t), newTestStore(t)
				spend := req
				spend.Hits = req.Capacity()
				for _, st := range []*Store{s, other} {
					mustCheck(t, st, spend, t0.Add(time.Hour))
				}
				before := copyState(s, &req)
				peek := req
				peek.Hits = 0
				if d := mustCheck(t, s, peek, t0); d.Allowed || d.RetryAfter > holdSpan(req) {
					t.Fatalf("peek: %+v", d)
				}
				after := copyState(s, &req)
				if after.st != before.st || fmt.Sprint(exportLog(after.lg)) != fmt.Sprint(exportLog(before.lg)) {
					t.Fatalf("the peek wrote the state: %+v %v, was %+v %v", after.st, exportLog(after.lg), before.st, exportLog(before.lg))
				}
				check := req
				check.Hits = 1
				later := t0.Add(holdSpan(req) / 2)
				if d, want := mustCheck(t, s, check, later), mustCheck(t, other, check, later); d != want {
					t.Fatalf("after the peek: %+v, without it %+v", d, want)
				}
			})
		}
	}
}

func exportLog(l *windowLog) []LogEntry {
	if l == nil {
		return nil
	}
	return l.export()
}

// admitted runs a client that, every P/20 of real time for 8 periods, takes
// single hits of req's key until one is denied, on a clock that reads real
// time plus offset(real), and returns how many it was admitted at each
// tick.
func admitted(t *testing.T, req Request, offset func(real time.Duration) time.Duration) []int64 {
	t.Helper()
	s := newTestStore(t)
	req.Hits = 1
	tick := req.Period / 20
	var out []int64
	for real := time.Duration(0); real < 8*req.Period; real += tick {
		now := t0.Add(real + offset(real))
		n := int64(0)
		for n <= req.Capacity() && mustCheck(t, s, req, now).Allowed {
			n++
		}
		out = append(out, n)
	}
	return out
}

// window sums are the most admitted in any 20 consecutive ticks (a period
// of real time) and the total.
func windowSums(ticks []int64) (most, total int64) {
	for i := range ticks {
		var sum int64
		for _, n := range ticks[i:min(i+20, len(ticks))] {
			sum += n
		}
		most = max(most, sum)
		total += ticks[i]
	}
	return most, total
}

// TestClockStepAdmitsWithinBound runs a greedy client against a clock
// that steps, and compares what it is admitted over any period of real
// time, and in all, with what a clock that never steps admits. A clock that
// ran an hour (and 0.3 periods) ahead and is set back admits no more than
// the clock that never stepped, but for the windows, which admit at most
// one Limit more: the count of the window the clock stepped out of counts
// in now's window, which may end sooner. A clock that steps forward, then
// back, admits at most one capacity more besides: to the limiter, the step
// forward is time that passed.
func TestClockStepAdmitsWithinBound(t *testing.T) {
	off := time.Hour
	for _, a := range Algorithms {
		for _, req := range clockShapes(t, a)[:1] {
			if a.HasBurst() {
				req.Burst = 25
			}
			t.Run(a.String(), func(t *testing.T) {
				ahead := off + 3*req.Period/10
				back := int64(0)
				if a == FixedWindow || a == SlidingWindowCounter {
					back = req.Limit
				}
				baseMost, baseTotal := windowSums(admitted(t, req, func(time.Duration) time.Duration { return 0 }))
				for _, tt := range []struct {
					name   string
					offset func(real time.Duration) time.Duration
					extra  int64
				}{
					{"ahead then set back", func(real time.Duration) time.Duration {
						if real < 4*req.Period {
							return ahead
						}
						return 0
					}, back},
					{"forward then back", func(real time.Duration) time.Duration {
						if real >= 2*req.Period && real < 5*req.Period {
							return ahead
						}
						return 0
					}, back + req.Capacity()},
				} {
					most, total := windowSums(admitted(t, req, tt.offset))
					t.Logf("%s: at most %d in a period, %d in all; without steps %d and %d", tt.name, most, total, baseMost, baseTotal)
					if most > baseMost+tt.extra || total > baseTotal+tt.extra {
						t.Errorf("%s: at most %d in a period and %d in all; a clock that never steps admits %d and %d, plus %d allowed",
							tt.name, most, total, baseMost, baseTotal, tt.extra)
					}
				}
			})
		}
	}
}

// TestLateReadingAtWindowBoundary: callers read the clock before they wait
// for the store's lock, so one may decide at a reading older than a
// decision already made. Read at the window before, it must not move the
// next window's count back into it: the next window admits its limit, no
// more, and the late caller's RetryAfter is true from its own reading.
func TestLateReadingAtWindowBoundary(t *testing.T) {
	for _, algo := range []Algorithm{FixedWindow, SlidingWindowCounter, SlidingWindowLog} {
		t.Run(algo.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			req := Request{Name: "late", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: algo}
			t0 := time.Unix(1_000_000, 0)
			check := func(at time.Time) Decision {
				t.Helper()
				d, err := s.CheckAt(req, at)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			// The next window begins at t0+1s; a caller takes its
			// hits 1 ms in.
			var admitted int
			for i := range 12 {
				if check(t0.Add(time.Second + time.Millisecond + time.Duration(i)*time.Microsecond)).Allowed {
					admitted++
				}
			}
			// A caller that read the clock 1 ms before the window.
			lateAt := t0.Add(time.Second - time.Millisecond)
			late := check(lateAt)
			if late.Allowed {
				admitted++
			}
			// The rest of the window, a check every 10 ms.
			for at := t0.Add(time.Second + 2*time.Millisecond); at.Before(t0.Add(2 * time.Second)); at = at.Add(10 * time.Millisecond) {
				if check(at).Allowed {
					admitted++
				}
			}
			if admitted > 10 {
				t.Errorf("%d admitted in one period of a limit of 10 per second", admitted)
			}
			if !late.Allowed {
				retry := lateAt.Add(late.RetryAfter)
				if d := check(retry); !d.Allowed {
					t.Errorf("late caller's RetryAfter %v: a check at %v is denied (%+v)", late.RetryAfter, retry.Sub(t0), d)
				}
			}
		})
	}
}
