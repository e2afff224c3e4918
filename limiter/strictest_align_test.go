package limiter

import (
	"testing"
	"time"
)

// TestKeepStrictestLongerPeriodKeepsTheWindow attacks the rule that a
// longer Period is kept "so that no window shortens under a count": a
// longer window is not a later-ending one when it is aligned elsewhere.
// The rightful caller spends a fixed window; an attacker checks the key
// once (denied) at a longer Period, or a longer calendar unit, or a Period
// one nanosecond longer than a calendar day on a 23-hour DST day, whose
// window holding now ends before the spent one. Once that window ends,
// the rightful caller must still find its own window spent.
func TestKeepStrictestLongerPeriodKeepsTheWindow(t *testing.T) {
	ny := mustZone("America/New_York")
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC) // a multiple of 6h since the epoch
	cases := []struct {
		name      string
		own, bad  Request
		spend, at time.Time // when the caller spends, when the attacker checks
		after     time.Time // after the attacker's window ends, within the caller's
	}{{
		name:  "2h_then_3h",
		own:   Request{Limit: 10, Period: 2 * time.Hour},
		bad:   Request{Limit: 10, Period: 3 * time.Hour},
		spend: base6h.Add(2*time.Hour + time.Minute), at: base6h.Add(2*time.Hour + 2*time.Minute),
		after: base6h.Add(3*time.Hour + time.Minute), // own window [2h, 4h), bad's [0, 3h)
	}, {
		name:  "week_then_month",
		own:   Request{Limit: 10, Calendar: Week},
		bad:   Request{Limit: 10, Calendar: Month},
		spend: time.Date(2026, 3, 30, 12, 0, 0, 0, time.UTC), at: time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC),
		after: time.Date(2026, 4, 1, 12, 0, 0, 0, time.UTC), // week from Monday 30 March to 6 April
	}, {
		name:  "dst_day_then_24h",
		own:   Request{Limit: 10, Calendar: Day, Location: ny}, // 8 March 2026 is 23 hours in New York
		bad:   Request{Limit: 10, Period: 24 * time.Hour},
		spend: time.Date(2026, 3, 8, 12, 0, 0, 0, ny), at: time.Date(2026, 3, 8, 13, 0, 0, 0, ny),
		after: time.Date(2026, 3, 8, 21, 0, 0, 0, ny), // 01:00 UTC on the 9th: the UTC day has ended
	}, {
		name:  "day_then_25h",
		own:   Request{Limit: 10, Calendar: Day, Location: ny},
		bad:   Request{Limit: 10, Period: 25 * time.Hour},
		spend: time.Date(2026, 3, 4, 1, 0, 0, 0, ny), at: time.Date(2026, 3, 4, 2, 0, 0, 0, ny),
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			own, bad := c.own, c.bad
			for _, r := range []*Request{&own, &bad} {
				r.Name, r.Key, r.Algorithm, r.Hits = "n", "k", FixedWindow, 1
			}
			s := newStrictStore(t)
			spend := own
			spend.Hits = own.Limit
			if d, err := s.CheckAt(spend, c.spend); err != nil || !d.Allowed {
				t.Fatalf("spending: %+v %v", d, err)
			}
			d, err := s.CheckAt(bad, c.at)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Fatalf("the attacker's check on a spent key admitted: %+v", d)
			}
			after := c.after
			if after.IsZero() {
				after = d.ResetAt.Add(time.Minute)
			}
			if _, end := own.Window(c.spend); !after.Before(end) {
				t.Skipf("the attacker's window (to %v) outlasts the caller's (to %v)", d.ResetAt, end)
			}
			if d, err := s.CheckAt(own, after); err != nil || d.Allowed {
				_, end := own.Window(c.spend)
				t.Errorf("at %v, within the caller's spent window (ending %v), a check admitted after one at %v/%v: %+v %v",
					after.UTC(), end.UTC(), bad.Period, bad.Calendar, d, err)
			}
		})
	}
}

// TestKeepStrictestClaimedByAWindowEndingFirst is the mirror: the key is
// claimed first at 7 per 25 hours (a window that ends at 15:00 UTC), then
// its rightful caller, at 14 per UTC day, spends what it is given in the
// morning and again after 15:00. Its day must admit no more than 14, as
// its own rate alone would: the hits counted in the morning stay counted
// until the day ends, the later end of the two windows they were charged
// under, for a fixed window and a sliding window counter.
func TestKeepStrictestClaimedByAWindowEndingFirst(t *testing.T) {
	for _, own := range []Request{
		{Name: "n", Key: "k", Hits: 1, Limit: 14, Period: 24 * time.Hour, Algorithm: FixedWindow},
		{Name: "n", Key: "k", Hits: 1, Limit: 14, Calendar: Day, Algorithm: FixedWindow},
		{Name: "n", Key: "k", Hits: 1, Limit: 14, Period: 24 * time.Hour, Algorithm: SlidingWindowCounter},
	} {
		s := newStrictStore(t)
		claim := Request{Name: "n", Key: "k", Hits: 1, Limit: 7, Period: 25 * time.Hour, Algorithm: own.Algorithm}
		if d, err := s.CheckAt(claim, time.Date(2026, 5, 16, 23, 0, 0, 0, time.UTC)); err != nil || !d.Allowed {
			t.Fatalf("claiming: %+v %v", d, err)
		}
		if _, end := claim.Window(time.Date(2026, 5, 17, 1, 0, 0, 0, time.UTC)); !end.Equal(time.Date(2026, 5, 17, 15, 0, 0, 0, time.UTC)) {
			t.Fatalf("the 25-hour window ends at %v", end)
		}
		admitted := int64(0)
		for _, at := range []time.Time{time.Date(2026, 5, 17, 1, 0, 0, 0, time.UTC), time.Date(2026, 5, 17, 16, 0, 0, 0, time.UTC)} {
			for range 20 {
				if d, err := s.CheckAt(own, at); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					admitted++
				}
			}
		}
		if admitted > own.Limit {
			t.Errorf("%v/%v: the caller's day admitted %d, more than its limit %d", own.Period, own.Calendar, admitted, own.Limit)
		}
	}
}

// TestKeepStrictestMisalignedPeriodsSurvey interleaves, over ten hours,
// the rightful caller's checks at 10 hits per 2 hours with an attacker's
// at longer Periods aligned elsewhere, for every algorithm: the rightful
// caller gets no more than alone, and both together no more than if every
// check had used the caller's rate.
func TestKeepStrictestMisalignedPeriodsSurvey(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 2, 1, 0, 0, time.UTC) // 2h1m past a multiple of 6h
	const steps, step = 60, 10 * time.Minute
	for _, a := range Algorithms {
		for _, p := range []time.Duration{3 * time.Hour, 5 * time.Hour, 2*time.Hour + time.Nanosecond, 7 * time.Hour / 2} {
			t.Run(a.String()+"/"+p.String(), func(t *testing.T) {
				base := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: 2 * time.Hour, Algorithm: a}
				bad := base
				bad.Period = p
				attacked, alone, asBase := newStrictStore(t), newStrictStore(t), newStrictStore(t)
				check := func(s *Store, r Request, at time.Time) int64 {
					d, err := s.CheckAt(r, at)
					if err != nil {
						t.Fatalf("%+v: %v", r, err)
					}
					if d.Allowed {
						return r.Hits
					}
					return 0
				}
				var legit, legitAlone, total, totalBase int64
				for i := range steps {
					at := t0.Add(time.Duration(i) * step)
					for range 3 {
						n := check(attacked, base, at)
						legit, total = legit+n, total+n
						legitAlone += check(alone, base, at)
						totalBase += check(asBase, base, at)
					}
					total += check(attacked, bad, at)
					totalBase += check(asBase, base, at)
					if legit > legitAlone {
						t.Fatalf("step %d (%v): the rightful caller got %d hits, %d alone", i, at, legit, legitAlone)
					}
					if total > totalBase {
						t.Fatalf("step %d (%v): %d hits admitted in all, %d at the base rate", i, at, total, totalBase)
					}
				}
			})
		}
	}
}

// TestKeepStrictestMergeMisalignedWindows merges a key's state charged
// under one rate with a copy charged under another whose window ends at
// another instant, both spent, in both directions: a calendar day in New
// York against 24-hour windows (UTC days), on a 24-hour day and on the
// 23-hour DST day, and 2-hour against 3-hour windows, for fixed windows and
// sliding window counters. Until the later of the two windows ends, a
// check at either rate finds the key spent.
func TestKeepStrictestMergeMisalignedWindows(t *testing.T) {
	ny := mustZone("America/New_York")
	day := Request{Name: "n", Key: "k", Limit: 10, Algorithm: FixedWindow, Calendar: Day, Location: ny}
	utc := Request{Name: "n", Key: "k", Limit: 10, Algorithm: FixedWindow, Period: 24 * time.Hour}
	two := Request{Name: "n", Key: "k", Limit: 10, Algorithm: FixedWindow, Period: 2 * time.Hour}
	three := two
	three.Period = 3 * time.Hour
	counter := func(r Request) Request { r.Algorithm = SlidingWindowCounter; return r }
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		a, b Request
		at   time.Time
	}{
		{"day_24h", day, utc, time.Date(2026, 3, 4, 12, 0, 0, 0, ny)},     // New York's day ends at 05:00 UTC
		{"dst_day_24h", day, utc, time.Date(2026, 3, 8, 12, 0, 0, 0, ny)}, // 23 hours, to 04:00 UTC
		{"2h_3h", two, three, base6h.Add(2*time.Hour + 30*time.Minute)},
		{"counter_2h_3h", counter(two), counter(three), base6h.Add(2*time.Hour + 30*time.Minute)},
	}
	for _, c := range cases {
		for _, firstHere := range []bool{false, true} {
			here, there := c.a, c.b
			if !firstHere {
				here, there = there, here
			}
			to, from := newStrictStore(t), newStrictStore(t)
			for _, sr := range []struct {
				s *Store
				r Request
			}{{to, here}, {from, there}} {
				r := sr.r
				r.Hits = 10
				if d, err := sr.s.CheckAt(r, c.at); err != nil || !d.Allowed {
					t.Fatalf("%s: spending: %+v %v", c.name, d, err)
				}
			}
			mustMerge(t, to, []Snapshot{snapOf(t, from, there, c.at)}, c.at)
			_, endA := c.a.Window(c.at)
			_, endB := c.b.Window(c.at)
			first, last := endA, endB
			if first.After(last) {
				first, last = last, first
			}
			for _, when := range []time.Time{c.at.Add(time.Minute), first.Add(time.Minute), last.Add(-time.Minute)} {
				for _, r := range []Request{c.a, c.b} {
					r.Hits = 1
					if d, err := to.CheckAt(r, when); err != nil || d.Allowed {
						t.Errorf("%s, %v/%v here: at %v (windows end %v, %v) a check per %v/%v admitted: %+v %v",
							c.name, here.Period, here.Calendar, when.UTC(), endA.UTC(), endB.UTC(), r.Period, r.Calendar, d, err)
					}
				}
			}
		}
	}
}

// TestKeepStrictestMeetAdmittingNone: a key claimed at 2 per 25 hours,
// checked at 14 per 10 hours in a 10-hour window that ends after the
// 25-hour one. Over the later-ending 10 hours the claim allows less than
// one hit, so the check is denied until the key is fresh: charging it in
// the 25-hour window would release it at that window's end, before its
// own window ends, whose checks would then admit 14 more.
func TestKeepStrictestMeetAdmittingNone(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		s := newStrictStore(t)
		claim := Request{Name: "n", Key: "k", Hits: 1, Limit: 2, Period: 25 * time.Hour, Algorithm: a}
		own := Request{Name: "n", Key: "k", Hits: 1, Limit: 14, Period: 10 * time.Hour, Algorithm: a}
		t0 := time.Date(2026, 5, 17, 1, 0, 0, 0, time.UTC)
		if d, err := s.CheckAt(claim, t0); err != nil || !d.Allowed {
			t.Fatalf("%v: claiming: %+v %v", a, d, err)
		}
		// An hour within both windows, the 10-hour one ending later.
		_, claimEnd := claim.Window(t0)
		at := claimEnd.Add(-time.Hour)
		if _, end := own.Window(at); !end.After(claimEnd) {
			t.Fatalf("the 10-hour window ends at %v, not after the 25-hour one (%v)", end, claimEnd)
		}
		start, end := own.Window(at)
		admitted := int64(0)
		for _, when := range []time.Time{at, claimEnd.Add(time.Minute)} {
			if !when.Before(end) || when.Before(start) {
				t.Fatalf("%v is outside the 10-hour window [%v, %v)", when, start, end)
			}
			for range 20 {
				if d, err := s.CheckAt(own, when); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					admitted++
				}
			}
		}
		if admitted > own.Limit {
			t.Errorf("%v: the caller's 10-hour window admitted %d, more than its limit %d", a, admitted, own.Limit)
		}
	}
}

// TestKeepStrictestMergeChargedKeepsTheLaterWindow: a healed partition
// merges a copy of a key spent at 10 per 2 hours, its window [2h, 4h),
// with a store whose own state of it, at 10 per 3 hours ([0h, 3h)), holds
// 2 hits the copy lacks, charged to the copy at the stand-ins' 3-hour
// rate (Store.MergeCharged). The copy's hits were charged in a window
// ending at 4h, so the key must stay spent until then, at either rate.
func TestKeepStrictestMergeChargedKeepsTheLaterWindow(t *testing.T) {
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	at := base6h.Add(2*time.Hour + 30*time.Minute)
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		two := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Period: 2 * time.Hour, Algorithm: a}
		three := two
		three.Period, three.Hits = 3*time.Hour, 2
		to, from := newStrictStore(t), newStrictStore(t)
		if d, err := from.CheckAt(two, at); err != nil || !d.Allowed {
			t.Fatalf("%v: spending the copy: %+v %v", a, d, err)
		}
		if d, err := to.CheckAt(three, at); err != nil || !d.Allowed {
			t.Fatalf("%v: the store's own hits: %+v %v", a, d, err)
		}
		sn := snapOf(t, from, two, at)
		charge := three
		charge.Hits = 0
		if _, _, err := to.MergeCharged(&sn, charge, 2, at); err != nil {
			t.Fatal(err)
		}
		when := base6h.Add(3*time.Hour + 30*time.Minute) // the 3-hour window has ended, the 2-hour one not
		for _, r := range []Request{two, three} {
			r.Hits = 1
			if d, err := to.CheckAt(r, when); err != nil || d.Allowed {
				t.Errorf("%v: at 3h30, within the copy's spent window to 4h, a check per %v admitted: %+v %v", a, r.Period, d, err)
			}
		}
	}
}
