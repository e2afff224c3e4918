package limiter

import "time"

// CalendarWindow returns the window of calendar unit c in loc (nil: UTC)
// that holds t, as FixedWindow counts it: start <= t < end. A backend that
// keeps its windows elsewhere (Redis) aligns them with it.
func CalendarWindow(c Calendar, loc *time.Location, t time.Time) (start, end time.Time) {
	s, e := calendarBounds(c, loc, t.UnixNano())
	return time.Unix(0, s), time.Unix(0, e)
}
