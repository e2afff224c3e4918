package limiter

import (
	"testing"
	"time"
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestCalendarBounds(t *testing.T) {
	utc := time.UTC
	ny := mustLoad(t, "America/New_York")
	kolkata := mustLoad(t, "Asia/Kolkata")
	santiago := mustLoad(t, "America/Santiago") // DST starts at midnight
	apia := mustLoad(t, "Pacific/Apia")         // skipped 2011-12-30 entirely
	at := func(loc *time.Location, y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, loc)
	}
	// utcAt names an instant in UTC, for times that are ambiguous locally.
	utcAt := func(y int, mo time.Month, d, h, mi int) time.Time { return time.Date(y, mo, d, h, mi, 0, 0, utc) }
	tests := []struct {
		name       string
		unit       Calendar
		loc        *time.Location
		now        time.Time
		start, end time.Time
	}{
		{"minute", Minute, utc, at(utc, 2024, 5, 15, 10, 20, 30, 5e8), at(utc, 2024, 5, 15, 10, 20, 0, 0), at(utc, 2024, 5, 15, 10, 21, 0, 0)},
		{"minute start", Minute, utc, at(utc, 2024, 5, 15, 10, 20, 0, 0), at(utc, 2024, 5, 15, 10, 20, 0, 0), at(utc, 2024, 5, 15, 10, 21, 0, 0)},
		{"minute end", Minute, utc, at(utc, 2024, 5, 15, 10, 20, 59, 999999999), at(utc, 2024, 5, 15, 10, 20, 0, 0), at(utc, 2024, 5, 15, 10, 21, 0, 0)},
		{"hour", Hour, utc, at(utc, 2024, 5, 15, 10, 20, 30, 0), at(utc, 2024, 5, 15, 10, 0, 0, 0), at(utc, 2024, 5, 15, 11, 0, 0, 0)},
		{"day", Day, utc, at(utc, 2024, 5, 15, 10, 20, 30, 0), at(utc, 2024, 5, 15, 0, 0, 0, 0), at(utc, 2024, 5, 16, 0, 0, 0, 0)},
		{"nil location is UTC", Day, nil, at(utc, 2024, 5, 15, 23, 59, 59, 0), at(utc, 2024, 5, 15, 0, 0, 0, 0), at(utc, 2024, 5, 16, 0, 0, 0, 0)},
		{"week from wednesday", Week, utc, at(utc, 2024, 5, 15, 10, 0, 0, 0), at(utc, 2024, 5, 13, 0, 0, 0, 0), at(utc, 2024, 5, 20, 0, 0, 0, 0)},
		{"week on sunday night", Week, utc, at(utc, 2024, 5, 19, 23, 59, 59, 999999999), at(utc, 2024, 5, 13, 0, 0, 0, 0), at(utc, 2024, 5, 20, 0, 0, 0, 0)},
		{"week on monday", Week, utc, at(utc, 2024, 5, 20, 0, 0, 0, 0), at(utc, 2024, 5, 20, 0, 0, 0, 0), at(utc, 2024, 5, 27, 0, 0, 0, 0)},
		{"week across new year", Week, utc, at(utc, 2025, 1, 1, 12, 0, 0, 0), at(utc, 2024, 12, 30, 0, 0, 0, 0), at(utc, 2025, 1, 6, 0, 0, 0, 0)},
		{"month", Month, utc, at(utc, 2024, 5, 31, 23, 0, 0, 0), at(utc, 2024, 5, 1, 0, 0, 0, 0), at(utc, 2024, 6, 1, 0, 0, 0, 0)},
		{"leap february", Month, utc, at(utc, 2024, 2, 29, 12, 0, 0, 0), at(utc, 2024, 2, 1, 0, 0, 0, 0), at(utc, 2024, 3, 1, 0, 0, 0, 0)},
		{"december", Month, utc, at(utc, 2024, 12, 10, 0, 0, 0, 0), at(utc, 2024, 12, 1, 0, 0, 0, 0), at(utc, 2025, 1, 1, 0, 0, 0, 0)},
		{"year", Year, utc, at(utc, 2024, 12, 31, 23, 59, 59, 999999999), at(utc, 2024, 1, 1, 0, 0, 0, 0), at(utc, 2025, 1, 1, 0, 0, 0, 0)},

		// New York springs forward on 2024-03-10 at 02:00 EST to 03:00 EDT.
		{"ny short day", Day, ny, at(ny, 2024, 3, 10, 12, 0, 0, 0), at(ny, 2024, 3, 10, 0, 0, 0, 0), at(ny, 2024, 3, 11, 0, 0, 0, 0)},
		{"ny hour before the gap", Hour, ny, at(ny, 2024, 3, 10, 1, 30, 0, 0), utcAt(2024, 3, 10, 6, 0), utcAt(2024, 3, 10, 7, 0)},
		{"ny hour after the gap", Hour, ny, at(ny, 2024, 3, 10, 3, 30, 0, 0), utcAt(2024, 3, 10, 7, 0), utcAt(2024, 3, 10, 8, 0)},
		// ... and falls back on 2024-11-03 at 02:00 EDT to 01:00 EST: 01:xx twice.
		{"ny long day", Day, ny, at(ny, 2024, 11, 3, 12, 0, 0, 0), utcAt(2024, 11, 3, 4, 0), utcAt(2024, 11, 4, 5, 0)},
		{"ny first 1am hour", Hour, ny, utcAt(2024, 11, 3, 5, 30), utcAt(2024, 11, 3, 5, 0), utcAt(2024, 11, 3, 6, 0)},
		{"ny second 1am hour", Hour, ny, utcAt(2024, 11, 3, 6, 30), utcAt(2024, 11, 3, 6, 0), utcAt(2024, 11, 3, 7, 0)},
		{"ny minute in the second 1am hour", Minute, ny, utcAt(2024, 11, 3, 6, 30).Add(30 * time.Second), utcAt(2024, 11, 3, 6, 30), utcAt(2024, 11, 3, 6, 31)},
		{"ny week with the change", Week, ny, at(ny, 2024, 11, 3, 23, 0, 0, 0), utcAt(2024, 10, 28, 4, 0), utcAt(2024, 11, 4, 5, 0)},
		{"ny month with the change", Month, ny, at(ny, 2024, 11, 15, 0, 0, 0, 0), utcAt(2024, 11, 1, 4, 0), utcAt(2024, 12, 1, 5, 0)},
		{"ny month with spring", Month, ny, at(ny, 2024, 3, 31, 23, 0, 0, 0), utcAt(2024, 3, 1, 5, 0), utcAt(2024, 4, 1, 4, 0)},
		{"ny year", Year, ny, utcAt(2025, 1, 1, 4, 59), utcAt(2024, 1, 1, 5, 0), utcAt(2025, 1, 1, 5, 0)},

		// Kolkata is UTC+05:30: local hours start at half past in UTC.
		{"kolkata minute", Minute, kolkata, at(kolkata, 2024, 5, 15, 10, 45, 10, 0), at(kolkata, 2024, 5, 15, 10, 45, 0, 0), at(kolkata, 2024, 5, 15, 10, 46, 0, 0)},
		{"kolkata hour", Hour, kolkata, at(kolkata, 2024, 5, 15, 10, 45, 0, 0), utcAt(2024, 5, 15, 4, 30), utcAt(2024, 5, 15, 5, 30)},
		{"kolkata day", Day, kolkata, at(kolkata, 2024, 5, 15, 3, 0, 0, 0), utcAt(2024, 5, 14, 18, 30), utcAt(2024, 5, 15, 18, 30)},
		{"kolkata week", Week, kolkata, utcAt(2024, 5, 19, 18, 29), utcAt(2024, 5, 12, 18, 30), utcAt(2024, 5, 19, 18, 30)},
		{"kolkata month", Month, kolkata, utcAt(2024, 5, 31, 18, 30), utcAt(2024, 5, 31, 18, 30), utcAt(2024, 6, 30, 18, 30)},
		{"kolkata year", Year, kolkata, utcAt(2024, 12, 31, 18, 29), utcAt(2023, 12, 31, 18, 30), utcAt(2024, 12, 31, 18, 30)},

		// Santiago skips 2024-09-08 00:00-01:00: that day starts at 01:00.
		{"santiago day after skipped midnight", Day, santiago, utcAt(2024, 9, 8, 15, 0), utcAt(2024, 9, 8, 4, 0), utcAt(2024, 9, 9, 3, 0)},
		{"santiago day before skipped midnight", Day, santiago, utcAt(2024, 9, 8, 3, 30), utcAt(2024, 9, 7, 4, 0), utcAt(2024, 9, 8, 4, 0)},
		{"santiago week", Week, santiago, utcAt(2024, 9, 8, 3, 30), utcAt(2024, 9, 2, 4, 0), utcAt(2024, 9, 9, 3, 0)},
		// Apia went from 2011-12-29 23:59:59 -10 to 2011-12-31 00:00 +14.
		{"apia day before the skipped day", Day, apia, utcAt(2011, 12, 30, 9, 30), utcAt(2011, 12, 29, 10, 0), utcAt(2011, 12, 30, 10, 0)},
		{"apia day after the skipped day", Day, apia, utcAt(2011, 12, 30, 10, 0), utcAt(2011, 12, 30, 10, 0), utcAt(2011, 12, 31, 10, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, end := calendarBounds(tt.unit, tt.loc, tt.now.UnixNano())
			if start != tt.start.UnixNano() || end != tt.end.UnixNano() {
				t.Errorf("%v of %v: [%v, %v), want [%v, %v)", tt.unit, tt.now.UTC(),
					time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), tt.start.UTC(), tt.end.UTC())
			}
		})
	}
}

// TestCalendarBoundsScan walks through years with zone transitions and
// checks that every instant is in its window and that consecutive windows
// tile time.
func TestCalendarBoundsScan(t *testing.T) {
	zones := []struct {
		name  string
		from  time.Time
		tiles bool // Minute and Hour windows tile too (no sub-hour offset change)
	}{
		{"UTC", time.Date(2023, 12, 25, 0, 0, 0, 0, time.UTC), true},
		{"America/New_York", time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{"Asia/Kolkata", time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{"America/Santiago", time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{"Australia/Lord_Howe", time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), false}, // 30-minute DST
		{"Pacific/Apia", time.Date(2011, 6, 1, 0, 0, 0, 0, time.UTC), true},
	}
	step := 7*time.Hour + 13*time.Minute + 17*time.Second
	if testing.Short() {
		step *= 5
	}
	for _, z := range zones {
		loc := mustLoad(t, z.name)
		for c := Minute; c <= Year; c++ {
			for now := z.from; now.Before(z.from.AddDate(1, 0, 7)); now = now.Add(step) {
				n := now.UnixNano()
				start, end := calendarBounds(c, loc, n)
				if start > n || n >= end {
					t.Fatalf("%s %v of %v: [%v, %v) does not hold it", z.name, c, now.UTC(), time.Unix(0, start).UTC(), time.Unix(0, end).UTC())
				}
				if c >= Day || z.tiles {
					if s2, _ := calendarBounds(c, loc, end); s2 != end {
						t.Fatalf("%s %v of %v: ends at %v, the next starts at %v", z.name, c, now.UTC(), time.Unix(0, end).UTC(), time.Unix(0, s2).UTC())
					}
					if _, e0 := calendarBounds(c, loc, start-1); e0 != start {
						t.Fatalf("%s %v of %v: starts at %v, the previous ends at %v", z.name, c, now.UTC(), time.Unix(0, start).UTC(), time.Unix(0, e0).UTC())
					}
				}
			}
		}
	}
}

func TestCalendarFixedWindowSteps(t *testing.T) {
	ny := mustLoad(t, "America/New_York")
	kolkata := mustLoad(t, "Asia/Kolkata")
	s := newTestStore(t)
	type row struct {
		at          time.Time
		hits        int64
		wantAllowed bool
		wantRetry   time.Duration
		wantResetAt time.Time
	}
	run := func(req Request, rows []row) {
		t.Helper()
		for i, r := range rows {
			req.Hits = r.hits
			d, err := s.CheckAt(req, r.at)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != r.wantAllowed || d.RetryAfter != r.wantRetry || !d.ResetAt.Equal(r.wantResetAt) {
				t.Errorf("%v %s row %d: allowed %v retry %v resetAt %v, want %v %v %v", req.Calendar, req.Key, i,
					d.Allowed, d.RetryAfter, d.ResetAt.UTC(), r.wantAllowed, r.wantRetry, r.wantResetAt.UTC())
			}
			checkInvariants(t, s, req, r.at, d)
		}
	}
	// Two per day in New York, across the 25-hour day of 2024-11-03.
	nov3, nov4 := time.Date(2024, 11, 3, 0, 0, 0, 0, ny), time.Date(2024, 11, 4, 0, 0, 0, 0, ny)
	run(Request{Name: "n", Key: "day", Limit: 2, Algorithm: FixedWindow, Calendar: Day, Location: ny}, []row{
		{nov3, 2, true, 0, nov4},
		{nov3.Add(time.Hour), 1, false, 24 * time.Hour, nov4},
		{nov4.Add(-1), 1, false, 1, nov4},
		{nov4, 2, true, 0, time.Date(2024, 11, 5, 0, 0, 0, 0, ny)},
	})
	// One per hour: the repeated 01:00 hour is a window of its own.
	first := time.Date(2024, 11, 3, 5, 0, 0, 0, time.UTC) // 01:00 EDT
	run(Request{Name: "n", Key: "hour", Limit: 1, Algorithm: FixedWindow, Calendar: Hour, Location: ny}, []row{
		{first.Add(30 * time.Minute), 1, true, 0, first.Add(time.Hour)},
		{first.Add(59 * time.Minute), 1, false, time.Minute, first.Add(time.Hour)},
		{first.Add(time.Hour), 1, true, 0, first.Add(2 * time.Hour)}, // 01:00 EST
		{first.Add(90 * time.Minute), 1, false, 30 * time.Minute, first.Add(2 * time.Hour)},
	})
	// Three per month, across the end of February; Location nil is UTC.
	feb := time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)
	run(Request{Name: "n", Key: "month", Limit: 3, Algorithm: FixedWindow, Calendar: Month}, []row{
		{feb, 3, true, 0, feb.Add(time.Second)},
		{feb, 1, false, time.Second, feb.Add(time.Second)},
		{feb.Add(time.Second), 3, true, 0, time.Date(2024, 4, 1, 0, 0, 0, 0, time.UTC)},
	})
	// One per hour in Kolkata: hours turn at half past in UTC.
	k := time.Date(2024, 5, 15, 4, 45, 0, 0, time.UTC) // 10:15 IST
	run(Request{Name: "n", Key: "kolkata", Limit: 1, Algorithm: FixedWindow, Calendar: Hour, Location: kolkata}, []row{
		{k, 1, true, 0, k.Add(45 * time.Minute)},
		{k.Add(44 * time.Minute), 1, false, time.Minute, k.Add(45 * time.Minute)},
		{k.Add(45 * time.Minute), 1, true, 0, k.Add(105 * time.Minute)},
	})
	// A week and a year.
	mon := time.Date(2024, 12, 30, 0, 0, 0, 0, time.UTC)
	run(Request{Name: "n", Key: "week", Limit: 1, Algorithm: FixedWindow, Calendar: Week}, []row{
		{mon.Add(-time.Second), 1, true, 0, mon},
		{mon, 1, true, 0, mon.AddDate(0, 0, 7)},
		{mon.AddDate(0, 0, 6), 1, false, 24 * time.Hour, mon.AddDate(0, 0, 7)},
	})
	y := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	run(Request{Name: "n", Key: "year", Limit: 1, Algorithm: FixedWindow, Calendar: Year}, []row{
		{y.Add(-1), 1, true, 0, y},
		{y.Add(-1), 1, false, 1, y},
		{y, 1, true, 0, y.AddDate(1, 0, 0)},
	})
}
