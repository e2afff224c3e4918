package limiter

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// Attacks on the drop marks and the sweep reading (a store shard's latest
// reading at which Sweep or an eviction dropped a key), and on the bound
// a snapshot puts on a mark's instant. Those that hold run always; those
// that broke skip unless SLUICE_ATTACK=1, with the gap in the message.

// TestAtkClockHandOffOfAMarkAheadFromAClockAhead: as TestHandOffOfAMarkAhead
// (a sweep two hours ahead, or a reset 30 minutes ahead, then the clock
// set right) with the old owner's clock four minutes ahead of the new
// owner's, within MaxClockSkew: the snapshot bounds the mark's instant at
// the old owner's now, four minutes after the new owner's, and the new
// owner takes the state and counts the others' 4.
func TestAtkClockHandOffOfAMarkAheadFromAClockAhead(t *testing.T) {
	const ahead = 4 * time.Minute
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, how := range []string{"sweep", "reset"} {
		for _, a := range Algorithms {
			t.Run(how+"/"+a.String(), func(t *testing.T) {
				old, _ := NewStore(DefaultStoreConfig())
				nu, _ := NewStore(DefaultStoreConfig())
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				// old's clock reads t0+ahead+x where the new owner's reads t0+x.
				attackCheck(t, old, base, t0, ahead+time.Second, 3, 0, Window{})
				if how == "sweep" {
					old.Sweep(t0.Add(2 * time.Hour))
				} else {
					attackCheck(t, old, base, t0, 30*time.Minute, 0, Reset, Window{})
				}
				theirs := attackCheck(t, old, base, t0, ahead+3*time.Second, 4, 0, Window{})
				sn, ok := old.Snapshot("n", "k", t0.Add(ahead+4*time.Second))
				if !ok {
					t.Fatalf("no snapshot")
				}
				if _, err := nu.Merge([]Snapshot{sn}, t0.Add(4*time.Second)); err != nil {
					t.Errorf("the new owner, %v behind the old, refused the state: %v", ahead, err)
				}
				// At most: a received GCRA state reads its TAT ahead as
				// the burst spent (TestHandOffFromAClockAhead).
				if d := attackCheck(t, nu, base, t0, 4*time.Second, 0, 0, Window{}); d.Remaining > theirs.Remaining {
					t.Errorf("on the new owner: remaining %d, want at most %d", d.Remaining, theirs.Remaining)
				}
			})
		}
	}
}

// TestAtkClockHandOffAfterASweepFarAhead: a store swept with its clock
// 200 years ahead (a real-time clock gone wrong), then set right, then
// charged 4: the key's mark ends 200 years ahead, and its state must still
// reach a new owner whose clock is right.
func TestAtkClockHandOffAfterASweepFarAhead(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			old, _ := NewStore(DefaultStoreConfig())
			nu, _ := NewStore(DefaultStoreConfig())
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
			if n := old.Sweep(t0.AddDate(200, 0, 0)); n != 1 {
				t.Fatalf("the sweep ahead dropped %d keys", n)
			}
			theirs := attackCheck(t, old, base, t0, 3*time.Second, 4, 0, Window{})
			now := t0.Add(4 * time.Second)
			sn, ok := old.Snapshot("n", "k", now)
			if !ok {
				t.Fatalf("no snapshot")
			}
			if bound := now.Add(MaxStateLife).UnixNano(); !sn.HasResetMark() || sn.ResetAt > now.UnixNano() || sn.ResetUntil > bound {
				t.Errorf("the mark at %v ends at %v, want a mark at most at now ending at most %v after it", nsTime(sn.ResetAt), nsTime(sn.ResetUntil), MaxStateLife)
			}
			if _, err := nu.Merge([]Snapshot{sn}, now); err != nil {
				t.Errorf("the new owner refused the state: %v", err)
			}
			if d := attackCheck(t, nu, base, t0, 4*time.Second, 0, 0, Window{}); d.Remaining != theirs.Remaining {
				t.Errorf("on the new owner: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
			if d := attackCheck(t, nu, base, t0, 5*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("on the new owner, the refund of the charge before the sweep: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
		})
	}
}

// TestAtkClockSweepAheadEvictsALiveKey: a store of 10 entries in one shard
// is swept with the clock two hours ahead, then set right. A key is spent
// (5 per hour), then 30 other keys are charged once each, one a second, at
// 1 per second, with a Sweep every second as a node runs it: their states
// go fresh within a second and the sweeps drop them, so the spent key
// stays spent. The drop mark each of them takes (the sweep reading ahead)
// must not hold them until it ends and evict the spent key instead.
func TestAtkClockSweepAheadEvictsALiveKey(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, ahead := range []bool{false, true} {
		for _, a := range Algorithms {
			t.Run(fmt.Sprintf("%s/ahead=%v", a, ahead), func(t *testing.T) {
				s, err := NewStore(StoreConfig{Shards: 1, MaxEntries: 10})
				if err != nil {
					t.Fatal(err)
				}
				first := Request{Name: "n", Key: "first", Limit: 1, Period: time.Second, Algorithm: a}
				attackCheck(t, s, first, t0, 0, 1, 0, Window{})
				if ahead {
					s.Sweep(t0.Add(2 * time.Hour))
				} else {
					s.Sweep(t0.Add(2 * time.Second))
				}
				spent := Request{Name: "n", Key: "spent", Limit: 5, Period: time.Hour, Algorithm: a}
				if d := attackCheck(t, s, spent, t0, 3*time.Second, 5, 0, Window{}); !d.Allowed || d.Remaining != 0 {
					t.Fatalf("the spent key's charge: %+v", d)
				}
				for i := range 30 {
					at := time.Duration(4+i) * time.Second
					other := Request{Name: "n", Key: fmt.Sprintf("o%d", i), Limit: 1, Period: time.Second, Algorithm: a}
					attackCheck(t, s, other, t0, at, 1, 0, Window{})
					s.Sweep(t0.Add(at + time.Second))
				}
				if n := s.Len(); n > 2 {
					t.Errorf("the store holds %d keys after the sweeps, want at most 2 (the spent key, the last)", n)
				}
				if d := attackCheck(t, s, spent, t0, 40*time.Second, 1, 0, Window{}); d.Allowed {
					t.Errorf("the spent key admitted a hit after the others' keys: %+v (evictions %d)", d, s.Stats().Evictions)
				}
			})
		}
	}
}

// TestAtkClockRetryAfterAfterAStepBack: a key spent with the clock two
// hours ahead, then checked with it set right (and, apart, a key spent
// with the clock right after a sweep or a reset two hours ahead) is denied
// for no longer than a key of a store that saw no step, spent at the
// instant the step back reads the state as written at, and is admitted
// once that RetryAfter has passed.
func TestAtkClockRetryAfterAfterAStepBack(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, how := range []string{"charge-ahead", "sweep-ahead", "reset-ahead"} {
		for _, a := range Algorithms {
			t.Run(how+"/"+a.String(), func(t *testing.T) {
				s, _ := NewStore(DefaultStoreConfig())
				clean, _ := NewStore(DefaultStoreConfig())
				base := Request{Name: "n", Key: "k", Limit: 5, Period: time.Minute, Algorithm: a}
				switch how {
				case "charge-ahead":
					attackCheck(t, s, base, t0, 2*time.Hour, 5, 0, Window{})
					attackCheck(t, clean, base, t0, 2*time.Second, 5, 0, Window{})
				case "sweep-ahead":
					attackCheck(t, s, base, t0, 0, 5, 0, Window{})
					s.Sweep(t0.Add(2 * time.Hour))
					attackCheck(t, s, base, t0, time.Second, 5, 0, Window{})
					attackCheck(t, clean, base, t0, time.Second, 5, 0, Window{})
				case "reset-ahead":
					attackCheck(t, s, base, t0, 0, 5, 0, Window{})
					attackCheck(t, s, base, t0, 2*time.Hour, 0, Reset, Window{})
					attackCheck(t, s, base, t0, time.Second, 5, 0, Window{})
					attackCheck(t, clean, base, t0, time.Second, 5, 0, Window{})
				}
				d := attackCheck(t, s, base, t0, 2*time.Second, 1, 0, Window{})
				want := attackCheck(t, clean, base, t0, 2*time.Second, 1, 0, Window{})
				if d.Allowed || want.Allowed {
					t.Fatalf("admitted a hit past the limit: %+v, clean %+v", d, want)
				}
				if d.RetryAfter <= 0 || d.RetryAfter > want.RetryAfter {
					t.Errorf("RetryAfter %v, want in (0, %v]", d.RetryAfter, want.RetryAfter)
				}
				if d := attackCheck(t, s, base, t0, 2*time.Second+d.RetryAfter, 1, 0, Window{}); !d.Allowed {
					t.Errorf("denied once RetryAfter had passed: %+v", d)
				}
			})
		}
	}
}

// TestAtkClockRefundsAfterASweepAhead: a key charged 3, swept with the
// clock two hours ahead, then charged to its limit with the clock set
// right, then refunded 3 at a time naming every window and instant around
// the sweep's reading and the charges', each refund followed by a hit:
// the key admits no more than the same trace admits on a store that saw
// no sweep (whose key still counts the first 3). The mark only keeps
// refunds from giving back.
func TestAtkClockRefundsAfterASweepAhead(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			admitted := func(sweep bool) int64 {
				s, _ := NewStore(DefaultStoreConfig())
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				first := attackCheck(t, s, base, t0, 0, 3, 0, Window{})
				if sweep {
					s.Sweep(t0.Add(2 * time.Hour))
				}
				mine := attackCheck(t, s, base, t0, time.Second, 10, 0, Window{})
				names := []Window{first.Window, mine.Window}
				for _, at := range []time.Duration{-time.Hour, 0, time.Second, time.Hour, 2 * time.Hour, 2*time.Hour + time.Microsecond, 3 * time.Hour} {
					i := t0.Add(at).UnixNano()
					names = append(names, Window{i, i}, Window{i, i + int64(time.Hour)}, Window{i - int64(time.Hour), i})
				}
				// What the key counts before the refunds, and then each
				// hit admitted after one.
				got := 10 - attackCheck(t, s, base, t0, time.Second, 0, 0, Window{}).Remaining
				for _, w := range names {
					r := base
					r.Hits, r.Behavior, r.Charged = 3, Refund, w
					if _, err := s.CheckAt(r, t0.Add(2*time.Second)); err != nil {
						continue // a name this algorithm does not take
					}
					if d := attackCheck(t, s, base, t0, 3*time.Second, 1, 0, Window{}); d.Allowed {
						got++
					}
				}
				return got
			}
			with, without := admitted(true), admitted(false)
			if with > without {
				t.Errorf("after the sweep ahead the key counted %d hits and admitted, without it %d", with, without)
			}
		})
	}
}

// TestAtkClockExtremeInstants: decisions, resets, refunds, sweeps,
// snapshots and merges at the zero time, before 1970, at the far future
// and at the edges of Unix nanoseconds, in every order, never panic and
// keep Remaining within [0, Limit].
func TestAtkClockExtremeInstants(t *testing.T) {
	instants := []time.Time{
		{},
		time.Unix(0, 0),
		time.Unix(0, -1),
		time.Unix(-1, 0),
		time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC),
		time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC),
		time.Unix(0, math.MaxInt64),
		time.Unix(0, math.MinInt64),
		time.Unix(0, math.MaxInt64-1),
		time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, _ := NewStore(StoreConfig{Shards: 1, MaxEntries: 4})
			nu, _ := NewStore(StoreConfig{Shards: 1})
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			var last Window
			for round := range 3 {
				for i, at := range instants {
					for j, b := range []Behavior{0, Reset, Refund, 0} {
						r := base
						r.Key = fmt.Sprintf("k%d", (i+j+round)%6)
						r.Hits, r.Behavior = 3, b
						switch b {
						case Reset:
							r.Hits = 0
						case Refund:
							r.Charged = last
						}
						d, err := s.CheckAt(r, at)
						if err != nil {
							// A refused request is fine; a panic is not.
							continue
						}
						if d.Remaining < 0 || d.Remaining > r.Limit {
							t.Errorf("%v %+v: remaining %d", at, r, d.Remaining)
						}
						last = d.Window
						if sn, ok := s.Snapshot(r.Name, r.Key, at); ok {
							nu.Merge([]Snapshot{sn}, at) // an error is a refusal: fine
						}
						s.Changed(at, func(Snapshot) {})
					}
					s.Sweep(at)
					nu.Sweep(at)
				}
			}
		})
	}
}

// TestAtkClockFarFutureStaysLimited: with the clock in 2256 or on the day
// of the horizon (2262-04-11, at which every state is fresh), a key of 10
// an hour admits 10 of 30 hits (redislimit's TestAtkClockFarFutureOnRedis
// is its twin).
func TestAtkClockFarFutureStaysLimited(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(2256, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC),
	} {
		for _, a := range Algorithms {
			t.Run(fmt.Sprintf("%d/%s", at.Year(), a), func(t *testing.T) {
				s, _ := NewStore(DefaultStoreConfig())
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a, Hits: 1}
				n := 0
				for range 30 {
					if d, err := s.CheckAt(base, at); err == nil && d.Allowed {
						n++
					}
				}
				if n != 10 {
					t.Errorf("admitted %d of 30 at 10 an hour", n)
				}
			})
		}
	}
}
