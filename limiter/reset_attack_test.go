package limiter

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// Attacks on the reset's mark (Request.Charged after a Reset) and on
// KeepStrictest's later-ending window, cases the marks' own tests do not
// write.

// attackCheck decides req at t0+at on s, with hits, behavior and charged
// set, and fails the test on an error.
func attackCheck(t *testing.T, s *Store, base Request, t0 time.Time, at time.Duration, hits int64, b Behavior, charged Window) Decision {
	t.Helper()
	r := base
	r.Hits, r.Behavior, r.Charged = hits, b, charged
	d, err := s.CheckAt(r, t0.Add(at))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRefundOfTheResettingChargeGivesItBack: a request that resets a live
// key and charges 3 in the same decision (Reset with Hits) is refunded,
// naming its charge: its 3 hits were charged after the reset, so they go
// back and the key reads fresh, for every algorithm, with and without
// KeepStrictest.
func TestRefundOfTheResettingChargeGivesItBack(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		for _, c := range []struct {
			name string
			cfg  StoreConfig
		}{
			{"", DefaultStoreConfig()},
			{"/strictest", StoreConfig{Shards: 1, KeepStrictest: true}},
		} {
			t.Run(a.String()+c.name, func(t *testing.T) {
				s, err := NewStore(c.cfg)
				if err != nil {
					t.Fatal(err)
				}
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				attackCheck(t, s, base, t0, time.Second, 5, 0, Window{})
				mine := attackCheck(t, s, base, t0, 2*time.Second, 3, Reset, Window{})
				if !mine.Allowed || mine.Remaining != 7 || mine.Window.IsZero() {
					t.Fatalf("the reset and charge: %+v", mine)
				}
				if d := attackCheck(t, s, base, t0, 3*time.Second, 3, Refund, mine.Window); d.Remaining != 10 {
					t.Errorf("the refund of the charge made with the reset: remaining %d (window %v), want its 3 back (remaining 10)", d.Remaining, d.Window)
				}
			})
		}
	}
}

// TestResetMarkSurvivesAClockAheadPeek: an owner's clock runs two hours
// ahead while a peek (Hits 0) reads a key reset a second earlier, then
// is set right. Peeks never write: the reset's mark must still keep a
// refund of a charge made before the reset from taking the hits others
// charged since.
func TestResetMarkSurvivesAClockAheadPeek(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, 2*time.Second, 0, Reset, Window{})
			attackCheck(t, s, base, t0, 2*time.Hour, 0, 0, Window{}) // the clock ahead: a peek
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if !theirs.Allowed || theirs.Remaining != 6 {
				t.Fatalf("the others' charge after the reset: %+v", theirs)
			}
			if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != 6 {
				t.Errorf("the refund of a charge the reset cleared, after a peek with the clock 2h ahead: remaining %d, want 6 (the others' 4 still counted)", d.Remaining)
			}
		})
	}
}

// TestResetMarksOfTheLeastRecentKeysStayInMaxBytes: a shard full of
// keys, each reset in turn from the least recently used: every mark
// costs ResetMarkOverhead, and the shard must evict to stay within
// MaxBytes rather than hold more than it.
func TestResetMarksOfTheLeastRecentKeysStayInMaxBytes(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	s, err := NewStore(StoreConfig{Shards: 1, MaxBytes: MaxKeyBytes})
	if err != nil {
		t.Fatal(err)
	}
	base := Request{Name: "n", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}
	// Fill the shard until the first eviction, then keep the keys it
	// holds, oldest first.
	var keys []string
	for i := 0; s.Stats().Evictions == 0; i++ {
		r := base
		r.Key = "k" + strconv.Itoa(i)
		attackCheck(t, s, r, t0, time.Second, 1, 0, Window{})
		keys = append(keys, r.Key)
	}
	keys = keys[len(keys)-s.Len():]
	most := s.Bytes()
	for i, k := range keys {
		r := base
		r.Key = k
		attackCheck(t, s, r, t0, 2*time.Second, 0, Reset, Window{})
		if b := s.Bytes(); b > MaxKeyBytes {
			t.Fatalf("after resetting %d of the %d least recently used keys the store holds %d bytes, %d past MaxBytes %d (%d when full)",
				i+1, len(keys), b, b-MaxKeyBytes, int64(MaxKeyBytes), most)
		}
		recount(t, s)
	}
}

// TestResetMarkAcrossAHandOff: the mark travels with the key's state
// (Request.Charged's doc): on the new owner of a key reset, then handed
// off, a refund naming a charge made before the reset gives nothing back
// of the hits others charged since.
func TestResetMarkAcrossAHandOff(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			old, _ := NewStore(DefaultStoreConfig())
			nu, _ := NewStore(DefaultStoreConfig())
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, old, base, t0, 2*time.Second, 1, Reset, Window{})
			if sn, ok := old.Snapshot("n", "k", t0.Add(2*time.Second)); ok {
				if _, err := nu.Merge([]Snapshot{sn}, t0.Add(2*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			attackCheck(t, nu, base, t0, 3*time.Second, 4, 0, Window{})
			if d := attackCheck(t, nu, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != 5 {
				t.Errorf("on the new owner, the refund of a charge the reset cleared: remaining %d, want 5 (the reset's 1 and the others' 4)", d.Remaining)
			}
		})
	}
}

// TestPeekWithAnotherRateLeavesASpentKeySpent: a key spent at 3 per
// hour, then peeked (Hits 0) with every other algorithm at a limit of
// 3,000,000 per second, calendar or not, stays spent for its own rate.
func TestPeekWithAnotherRateLeavesASpentKeySpent(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, keep := range []bool{false, true} {
		for _, a := range Algorithms {
			for _, b := range Algorithms {
				for _, cal := range []Calendar{NoCalendar, Minute} {
					if cal != NoCalendar && b != FixedWindow {
						continue
					}
					s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: keep})
					if err != nil {
						t.Fatal(err)
					}
					base := Request{Name: "n", Key: "k", Limit: 3, Period: time.Hour, Algorithm: a}
					for i := 0; i < 3; i++ {
						attackCheck(t, s, base, t0, time.Second, 1, 0, Window{})
					}
					p := Request{Name: "n", Key: "k", Limit: 3_000_000, Burst: 3_000_000, Period: time.Second, Algorithm: b, Calendar: cal}
					if cal != NoCalendar {
						p.Period = 0
					}
					attackCheck(t, s, p, t0, 2*time.Second, 0, 0, Window{})
					if d := attackCheck(t, s, base, t0, 3*time.Second, 1, 0, Window{}); d.Allowed {
						t.Errorf("keep %v: %v spent, peeked as %v %v: a check admitted (%+v)", keep, a, b, cal, d)
					}
				}
			}
		}
	}
}

// TestKeepStrictestCalendarAndPeriodAlternating: a fixed window key
// checked hour by hour for three days, alternately at 5 per calendar day
// in UTC+14 and at 5 per 24h (UTC days): no window of either rate admits
// more than 5, and the key admits some hits every day.
func TestKeepStrictestCalendarAndPeriodAlternating(t *testing.T) {
	kiri, err := time.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Skip(err)
	}
	t0 := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		cal  Calendar
		loc  *time.Location
	}{{"day+14", Day, kiri}, {"hour", Hour, time.UTC}} {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: true})
			if err != nil {
				t.Fatal(err)
			}
			cal := Request{Name: "n", Key: "k", Limit: 5, Algorithm: FixedWindow, Calendar: Day, Location: kiri}
			per := Request{Name: "n", Key: "k", Limit: 5, Algorithm: FixedWindow, Period: 24 * time.Hour}
			if c.cal == Hour {
				cal = Request{Name: "n", Key: "k", Limit: 5, Algorithm: FixedWindow, Calendar: Hour}
				per = Request{Name: "n", Key: "k", Limit: 5, Algorithm: FixedWindow, Period: 24 * time.Hour}
			}
			inCal, inPer := map[int64]int{}, map[int64]int{}
			total := 0
			for i := 0; i < 72*4; i++ {
				at := time.Duration(i) * 15 * time.Minute
				r := per
				if i%2 == 1 {
					r = cal
				}
				d := attackCheck(t, s, r, t0, at, 1, 0, Window{})
				if !d.Allowed {
					continue
				}
				total++
				now := t0.Add(at).UnixNano()
				cs, _ := windowBounds(&cal, now)
				ps, _ := windowBounds(&per, now)
				inCal[cs]++
				inPer[ps]++
				if inPer[ps] > 5 {
					t.Errorf("at %v: window %v of 5 per 24h admitted %d", at, time.Unix(0, ps).UTC(), inPer[ps])
				}
				if c.cal == Day && inCal[cs] > 5 {
					t.Errorf("at %v: calendar day from %v admitted %d", at, time.Unix(0, cs).UTC(), inCal[cs])
				}
			}
			if total < 10 {
				t.Errorf("admitted %d in three days, want at least 10", total)
			}
			t.Logf("admitted %d in three days", total)
		})
	}
}

// TestResetMarkAcrossAClockAheadCharge: the owner's clock runs two
// hours ahead while a check charges 1 hit on a key reset a second
// earlier (the mark has lapsed on that clock, and the write drops it),
// then is set right: a refund of a charge made before the reset must
// not take the 4 hits others charged since.
func TestResetMarkAcrossAClockAheadCharge(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, 2*time.Second, 0, Reset, Window{})
			attackCheck(t, s, base, t0, 2*time.Hour, 1, 0, Window{}) // the clock ahead
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if !theirs.Allowed {
				t.Fatalf("the others' charge after the clock was set right: %+v", theirs)
			}
			if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining < theirs.Remaining {
				t.Fatalf("refund gave less than nothing: %+v", d)
			} else if d.Remaining != theirs.Remaining {
				t.Errorf("the refund of a charge the reset cleared, after a charge with the clock 2h ahead: remaining %d, want %d (as before it: the others' 4 still counted)", d.Remaining, theirs.Remaining)
			}
		})
	}
}

// TestResetMarkAcrossCalendarAndPeriodWindows: a fixed window key is
// charged 3 under one rate, reset, and charged 4 by others under another
// whose window also holds the reset (a calendar hour and 2 hours of
// Period, both ways round): the refund of the first 3, naming its
// charge, gives nothing back, and the refund of the others' 4, naming
// theirs, gives them back; with and without KeepStrictest.
func TestResetMarkAcrossCalendarAndPeriodWindows(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	cal := Request{Name: "n", Key: "k", Limit: 10, Calendar: Hour, Algorithm: FixedWindow}
	per := Request{Name: "n", Key: "k", Limit: 10, Period: 2 * time.Hour, Algorithm: FixedWindow}
	for _, keep := range []bool{false, true} {
		for _, c := range []struct {
			name          string
			first, others Request
		}{{"calendar then period", cal, per}, {"period then calendar", per, cal}} {
			t.Run(c.name+"/strictest="+strconv.FormatBool(keep), func(t *testing.T) {
				s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: keep})
				if err != nil {
					t.Fatal(err)
				}
				mine := attackCheck(t, s, c.first, t0, 10*time.Minute, 3, 0, Window{})
				attackCheck(t, s, c.first, t0, 30*time.Minute, 0, Reset, Window{})
				theirs := attackCheck(t, s, c.others, t0, 40*time.Minute, 4, 0, Window{})
				if !theirs.Allowed || theirs.Remaining != 6 {
					t.Fatalf("the others' charge after the reset: %+v", theirs)
				}
				for _, r := range []Request{c.first, c.others} {
					if d := attackCheck(t, s, r, t0, 45*time.Minute, 3, Refund, mine.Window); d.Remaining != 6 {
						t.Errorf("the refund of the charge the reset cleared, at the rate %v/%v: remaining %d, want 6", r.Period, r.Calendar, d.Remaining)
					}
				}
				if d := attackCheck(t, s, c.others, t0, 50*time.Minute, 4, Refund, theirs.Window); d.Remaining != 10 {
					t.Errorf("the refund of the others' charge: remaining %d (window %v, charged %v), want 10", d.Remaining, d.Window, theirs.Window)
				}
			})
		}
	}
}

// TestKeepStrictestTwoPeriodsAlternating: checks alternating between 5
// per 10s and 5 per 7s, a fixed window or a sliding window counter,
// every 1.5s for 140s: no window of either rate admits more than 5
// (the counter's estimate aside), and the key admits more than its
// first 5: the two rates' windows end together every 70s, which
// releases the count (65 admitted for the fixed window, 20 for the
// counter), where a calendar day in UTC+14 and 24h of Period never do
// (TestKeepStrictestCalendarAndPeriodAlternating).
func TestKeepStrictestTwoPeriodsAlternating(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: true})
			if err != nil {
				t.Fatal(err)
			}
			ten := Request{Name: "n", Key: "k", Limit: 5, Period: 10 * time.Second, Algorithm: a}
			seven := Request{Name: "n", Key: "k", Limit: 5, Period: 7 * time.Second, Algorithm: a}
			total := 0
			in := map[time.Duration]map[int64]int{}
			for i := 0; i < 140*2/3; i++ {
				r := ten
				if i%2 == 1 {
					r = seven
				}
				at := time.Duration(i) * 1500 * time.Millisecond
				if d := attackCheck(t, s, r, t0, at, 1, 0, Window{}); d.Allowed {
					total++
					if a != FixedWindow {
						continue
					}
					for _, q := range []Request{ten, seven} {
						w, _ := windowBounds(&q, t0.Add(at).UnixNano())
						if in[q.Period] == nil {
							in[q.Period] = map[int64]int{}
						}
						if in[q.Period][w]++; in[q.Period][w] > 5 {
							t.Errorf("at %v: the window of 5 per %v from %v admitted %d", at, q.Period, time.Unix(0, w).UTC(), in[q.Period][w])
						}
					}
				}
			}
			if total <= 5 {
				t.Errorf("admitted %d in 140s, no more than the first 5", total)
			}
			t.Logf("admitted %d in 140s", total)
		})
	}
}

// TestRefundsAcrossTwoResets: a key charged 3, reset, charged 2, reset
// again, then charged 4 by others, in one window of an hour: neither
// refund of a charge made before the second reset (its epoch since the
// first included) gives anything back; the others' refund gives their 4
// back; every algorithm, with and without KeepStrictest.
func TestRefundsAcrossTwoResets(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		for _, keep := range []bool{false, true} {
			t.Run(a.String()+"/strictest="+strconv.FormatBool(keep), func(t *testing.T) {
				s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: keep})
				if err != nil {
					t.Fatal(err)
				}
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				first := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
				attackCheck(t, s, base, t0, 2*time.Second, 0, Reset, Window{})
				between := attackCheck(t, s, base, t0, 3*time.Second, 2, 0, Window{})
				attackCheck(t, s, base, t0, 5*time.Second, 0, Reset, Window{})
				theirs := attackCheck(t, s, base, t0, 6*time.Second, 4, 0, Window{})
				if !theirs.Allowed || theirs.Remaining != 6 {
					t.Fatalf("the others' charge after the second reset: %+v", theirs)
				}
				if d := attackCheck(t, s, base, t0, 7*time.Second, 2, Refund, between.Window); d.Remaining != 6 {
					t.Errorf("the refund of the charge between the resets (%v): remaining %d, want 6", between.Window, d.Remaining)
				}
				if d := attackCheck(t, s, base, t0, 8*time.Second, 3, Refund, first.Window); d.Remaining != 6 {
					t.Errorf("the refund of the first charge: remaining %d, want 6", d.Remaining)
				}
				if d := attackCheck(t, s, base, t0, 9*time.Second, 4, Refund, theirs.Window); d.Remaining != 10 {
					t.Errorf("the refund of the others' charge: remaining %d, want 10", d.Remaining)
				}
			})
		}
	}
}

// TestTheLargestKeyWithAResetMarkFitsMaxKeyBytes: the longest name and
// key, a sliding window log under KeepStrictest, charged, reset (a
// mark) and then charged at MaxLogEntries instants while the mark lasts,
// in a store of MaxKeyBytes: the key is never evicted by its own growth
// and the store stays within its bytes.
func TestTheLargestKeyWithAResetMarkFitsMaxKeyBytes(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	s, err := NewStore(StoreConfig{Shards: 1, MaxBytes: MaxKeyBytes, KeepStrictest: true})
	if err != nil {
		t.Fatal(err)
	}
	base := Request{Name: strings.Repeat("n", MaxNameLen), Key: strings.Repeat("k", MaxKeyLen), Limit: 2 * MaxLogEntries, Period: time.Hour, Algorithm: SlidingWindowLog}
	attackCheck(t, s, base, t0, 0, 1, 0, Window{})
	attackCheck(t, s, base, t0, time.Millisecond, 0, Reset, Window{})
	for i := 0; i < MaxLogEntries+10; i++ {
		if d := attackCheck(t, s, base, t0, time.Duration(i+2)*time.Millisecond, 1, 0, Window{}); !d.Allowed {
			t.Fatalf("charge %d: %+v", i, d)
		}
		if s.Len() != 1 {
			t.Fatalf("after %d charges the store holds %d keys", i+1, s.Len())
		}
	}
	recount(t, s)
	if st := s.Stats(); st.Evictions != 0 {
		t.Errorf("%d evictions", st.Evictions)
	}
}

// TestRefundAfterAResetMadeWithTheClockAhead: an owner whose clock ran an
// hour ahead resets a key, then is set right; others charge 4 and
// refund them, naming their charge: the charge came after the reset,
// and its 4 should go back.
func TestRefundAfterAResetMadeWithTheClockAhead(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: 10 * time.Hour, Algorithm: a}
			attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, time.Hour, 0, Reset, Window{}) // the clock an hour ahead
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if !theirs.Allowed || theirs.Remaining != 6 {
				t.Fatalf("the others' charge: %+v", theirs)
			}
			if d := attackCheck(t, s, base, t0, 4*time.Second, 4, Refund, theirs.Window); d.Remaining != 10 {
				t.Errorf("the refund of the others' charge: remaining %d (window %v), want 10", d.Remaining, theirs.Window)
			}
		})
	}
}

// TestRefundsNamingForgedEpochs: after a charge of 3, a reset and the
// others' charge of 4 (named by the window's epoch since the reset),
// refunds of 3 naming windows forged from that epoch (an epoch a
// microsecond later or earlier, one ending later, the window
// before or after, a Period from the reset) give nothing back, for a fixed
// window and a sliding window counter, with and without KeepStrictest.
func TestRefundsNamingForgedEpochs(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	us := int64(time.Microsecond)
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		for _, keep := range []bool{false, true} {
			t.Run(a.String()+"/strictest="+strconv.FormatBool(keep), func(t *testing.T) {
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				setup := func() (*Store, Window) {
					s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: keep})
					if err != nil {
						t.Fatal(err)
					}
					attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
					attackCheck(t, s, base, t0, 2*time.Second, 0, Reset, Window{})
					theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
					if !theirs.Allowed || theirs.Remaining != 6 || theirs.Window.Start != t0.Add(2*time.Second).UnixNano()+us {
						t.Fatalf("the others' charge: %+v", theirs)
					}
					return s, theirs.Window
				}
				_, epoch := setup()
				p := int64(time.Hour)
				start := t0.UnixNano()
				for _, f := range []struct {
					name string
					w    Window
				}{
					{"an epoch a microsecond later", Window{epoch.Start + us, epoch.End}},
					{"an epoch a microsecond earlier", Window{epoch.Start - us, epoch.End}},
					{"an epoch ending a Period later", Window{epoch.Start, epoch.End + p}},
					{"an epoch ending a microsecond later", Window{epoch.Start, epoch.End + us}},
					{"the window before", Window{start - p, start}},
					{"the window after", Window{start + p, start + 2*p}},
					{"the window from the reset", Window{epoch.Start - us, epoch.Start - us + p}},
				} {
					s, _ := setup()
					if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, f.w); d.Remaining != 6 {
						t.Errorf("a refund of 3 naming %s %v: remaining %d, want 6", f.name, f.w, d.Remaining)
					}
				}
			})
		}
	}
}
