package limiter

import "time"

// CalendarWindow returns the window of calendar unit c in loc (nil: UTC)
// that holds t, as FixedWindow counts it: start <= t < end. A backend that
// keeps its windows elsewhere (Redis) aligns them with it.
func CalendarWindow(c Calendar, loc *time.Location, t time.Time) (start, end time.Time) {
	s, e := calendarBounds(c, loc, t.UnixNano())
	return time.Unix(0, s), time.Unix(0, e)
}

// Window returns the window that holds t for the window algorithms
// (FixedWindow, SlidingWindowCounter), as they count it: start <= t < end,
// aligned to multiples of Period since the Unix epoch, or to r's Calendar
// unit in its Location. r must be valid.
func (r *Request) Window(t time.Time) (start, end time.Time) {
	s, e := windowBounds(r, t.UnixNano())
	return time.Unix(0, s), time.Unix(0, e)
}
