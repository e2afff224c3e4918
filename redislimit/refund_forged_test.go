package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestRefundToAForgedWindow charges a calendar day in New York on its
// 23-hour DST day and a week in Lord Howe across its half-hour DST change
// on Redis, then refunds with windows that are not the charge's: a
// nanosecond or a microsecond off at either end (the script counts in
// microseconds), an hour wider, the whole int64 range, the next window,
// the last representable nanoseconds. None gives a hit back, an inverted
// one is refused, and the charge's own window gets its hits back.
func TestRefundToAForgedWindow(t *testing.T) {
	srv := testredis.Start(t)
	ny, _ := limiter.LoadZone("America/New_York")
	howe, _ := limiter.LoadZone("Australia/Lord_Howe")
	if ny == nil || howe == nil {
		t.Fatal("zones do not load")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		req limiter.Request
		at  time.Time
	}{
		{limiter.Request{Key: "day", Calendar: limiter.Day, Location: ny}, time.Date(2026, 3, 8, 12, 0, 0, 0, ny)},
		{limiter.Request{Key: "week", Calendar: limiter.Week, Location: howe}, time.Date(2026, 4, 4, 12, 0, 0, 0, howe)},
	} {
		clock := &testClock{now: tc.at}
		l := newTestLimiter(t, clock, srv.Addr())
		l.cfg.KeepStrictest = true
		r := tc.req
		r.Name, r.Limit, r.Algorithm, r.Hits = "forged", 10, limiter.FixedWindow, 10
		d, err := l.Check(ctx, r)
		if err != nil || !d.Allowed || d.Window.IsZero() {
			t.Fatalf("%s: charging: %+v %v", r.Key, d, err)
		}
		w := d.Window
		clock.now = tc.at.Add(time.Minute)
		refund := func(charged limiter.Window, hits int64) (limiter.Decision, error) {
			q := r
			q.Hits, q.Behavior, q.Charged = hits, limiter.Refund, charged
			d, err := l.Check(ctx, q)
			return d.Decision, err
		}
		us := int64(time.Microsecond)
		for _, forged := range []limiter.Window{
			{Start: w.Start + 1, End: w.End},
			{Start: w.Start, End: w.End - 1},
			{Start: w.Start + us, End: w.End},
			{Start: w.Start, End: w.End + us},
			{Start: w.Start - int64(time.Hour), End: w.End},
			{Start: -1 << 63, End: 1<<63 - 1},
			{Start: w.End, End: w.End + (w.End - w.Start)},
			{Start: 1<<63 - 2, End: 1<<63 - 1},
		} {
			d, err := refund(forged, 10)
			if err != nil {
				t.Fatalf("%s: refund to %+v: %v", r.Key, forged, err)
			}
			if d.Remaining != 0 || !d.Window.IsZero() {
				t.Errorf("%s: a refund to the forged window %+v gave back: %+v (charged %+v)", r.Key, forged, d, w)
			}
		}
		if _, err := refund(limiter.Window{Start: w.End, End: w.Start}, 1); err == nil {
			t.Errorf("%s: a refund to an inverted window was taken", r.Key)
		}
		if d, err := refund(w, 4); err != nil || d.Remaining != 4 || d.Window != w {
			t.Errorf("%s: a refund of 4 to the charged window %+v: %+v %v", r.Key, w, d, err)
		}
	}
}
