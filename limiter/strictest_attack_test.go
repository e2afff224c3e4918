package limiter

import (
	"testing"
	"time"
)

// TestKeepStrictestCalendarMoved attacks a calendar window's key after it
// moves to another store (a hand-off, a replica's take-over, a restore
// from disk). A caller who spent the day's 10 hits checks the moved key at
// 10 hits a second: were the day's rate lost on the way, the receiving
// store would place the day's count in a one-second window and admit
// again a second later. The snapshot carries the calendar unit, so the
// key stays spent.
func TestKeepStrictestCalendarMoved(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	day := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Day}
	lax := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: FixedWindow}
	for _, moved := range []bool{false, true} {
		from := newStrictStore(t)
		if d, err := from.CheckAt(day, t0); err != nil || !d.Allowed {
			t.Fatalf("spending: %+v %v", d, err)
		}
		s := from
		if moved {
			s = newStrictStore(t)
			sn := snapOf(t, from, day, t0)
			mustMerge(t, s, []Snapshot{sn}, t0)
		}
		admitted := 0
		for i := range 5 {
			now := t0.Add(time.Duration(i) * 1500 * time.Millisecond)
			if d, err := s.CheckAt(lax, now); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				admitted++
			}
		}
		if admitted > 0 {
			t.Errorf("moved=%v: a day's spent calendar window admitted %d hits at 10 a second", moved, admitted)
		}
	}
}

// TestKeepStrictestCalendarAcrossEncoding attacks calendar keys of
// several units and zones moved through the state format (encoded,
// decoded, merged into another KeepStrictest store): every rate variant,
// and the same unit in another zone, finds the key spent.
func TestKeepStrictestCalendarAcrossEncoding(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	now := t0.Add(time.Second)
	bases := []Request{
		{Name: "n", Key: "day-utc", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Day},
		{Name: "n", Key: "week-paris", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Week, Location: mustZone("Europe/Paris")},
		{Name: "n", Key: "month-ny", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Month, Location: mustZone("America/New_York")},
		{Name: "n", Key: "hour-kolkata", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Hour, Location: mustZone("Asia/Kolkata")},
	}
	for _, base := range bases {
		variants := append(rateVariants(base),
			rateVariant{"other_zone", func(r *Request) { r.Location = mustZone("Pacific/Kiritimati") }},
			rateVariant{"utc", func(r *Request) { r.Location = nil }},
			rateVariant{"minute", func(r *Request) { r.Calendar = Minute }},
			rateVariant{"no_calendar", func(r *Request) { r.Calendar, r.Period = NoCalendar, time.Second }},
		)
		for _, a := range Algorithms { // rateVariants' keep the Calendar, which only fixed windows take
			variants = append(variants, rateVariant{"no_calendar_" + a.String(), func(r *Request) {
				r.Algorithm, r.Calendar, r.Location, r.Limit, r.Period = a, NoCalendar, nil, 1_000_000, time.Millisecond
			}})
		}
		for _, v := range variants {
			t.Run(base.Key+"/"+v.name, func(t *testing.T) {
				bad := base
				v.set(&bad)
				bad.Hits = 1
				if bad.Validate() != nil {
					t.Skip("invalid variant")
				}
				sn := attackMoved(t, base, bad, t0, now, func(sn Snapshot) Snapshot { return reencoded(t, sn) })
				if sn.RateLimit != 10 || sn.RateCalendar != base.Calendar || zoneName(sn.RateLocation) != zoneName(base.Location) || sn.RatePeriod != 0 {
					t.Fatalf("snapshot rate %d per %v/%s in %v", sn.RateLimit, sn.RatePeriod, sn.RateCalendar, sn.RateLocation)
				}
			})
		}
	}
}

// TestKeepStrictestCalendarMergeBothSides: a live key charged under one
// rate that receives a copy charged under another keeps the strictest of
// both, whichever side has the calendar window, and the larger count: a
// laxer check finds the key spent, and its snapshot carries the calendar
// rate on.
func TestKeepStrictestCalendarMergeBothSides(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	paris := mustZone("Europe/Paris")
	day := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Day, Location: paris}
	second := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: FixedWindow}
	for _, calendarHere := range []bool{false, true} {
		here, there := second, day
		if calendarHere {
			here, there = day, second
		}
		to, from := newStrictStore(t), newStrictStore(t)
		if d, err := to.CheckAt(here, t0); err != nil || !d.Allowed {
			t.Fatalf("charging here: %+v %v", d, err)
		}
		if d, err := from.CheckAt(there, t0); err != nil || !d.Allowed {
			t.Fatalf("charging there: %+v %v", d, err)
		}
		mustMerge(t, to, []Snapshot{snapOf(t, from, there, t0)}, t0)
		sn := snapOf(t, to, day, t0)
		if sn.RateCalendar != Day || zoneName(sn.RateLocation) != "Europe/Paris" || sn.RateLimit != 10 {
			t.Errorf("calendar here %v: merged rate %d per %s in %v, want 10 per day in Europe/Paris", calendarHere, sn.RateLimit, sn.RateCalendar, sn.RateLocation)
		}
		for i := range 4 {
			now := t0.Add(time.Duration(i) * 1500 * time.Millisecond)
			if d, err := to.CheckAt(second, now); err != nil || d.Allowed {
				t.Errorf("calendar here %v: a check at 10 a second admitted at %v: %+v %v", calendarHere, now, d, err)
			}
		}
	}
}
