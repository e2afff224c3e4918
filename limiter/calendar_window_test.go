package limiter

import (
	"testing"
	"time"
)

// TestCalendarWindow: the window CalendarWindow gives holds its instant,
// and is the one a calendar fixed window counts in: a fresh key's hit at t
// resets at its end, DST changes included.
func TestCalendarWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no zone database: %v", err)
	}
	for _, tc := range []struct {
		unit Calendar
		loc  *time.Location
		at   time.Time
	}{
		{Minute, nil, time.Date(2026, 3, 29, 0, 59, 30, 0, time.UTC)},
		{Hour, berlin, time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC)}, // the repeated hour
		{Day, berlin, time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)},   // a 23-hour day
		{Week, berlin, time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)},
		{Month, time.UTC, time.Date(2026, 2, 28, 23, 59, 59, 999_999_999, time.UTC)},
		{Year, berlin, time.Date(2026, 12, 31, 23, 30, 0, 0, time.UTC)}, // already 2027 in Berlin
	} {
		start, end := CalendarWindow(tc.unit, tc.loc, tc.at)
		if tc.at.Before(start) || !tc.at.Before(end) {
			t.Errorf("%s at %v: window [%v, %v) does not hold it", tc.unit, tc.at, start, end)
		}
		s, err := NewStore(DefaultStoreConfig())
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.CheckAt(Request{Name: "n", Key: "k", Hits: 1, Limit: 5, Algorithm: FixedWindow, Calendar: tc.unit, Location: tc.loc}, tc.at)
		if err != nil || !d.ResetAt.Equal(end) {
			t.Errorf("%s at %v: the fixed window resets at %v (%v), CalendarWindow ends at %v", tc.unit, tc.at, d.ResetAt, err, end)
		}
	}
}
