package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// TestRefundFollowsTheWindowAcrossAHandoff charges calendar windows (a
// day in New York on its 23-hour DST day, a week in Lord Howe, whose DST
// moves by half an hour, an hour in Kolkata) and a period's fixed window
// on their owners, has each owner leave (handing its keys off), and then
// refunds through another node with the charge's window: the new owner
// gives the hits back to that window alone. A refund naming a forged
// window (shifted by a nanosecond, inverted, enormous, far in the future)
// gives nothing back, and one that names no window can be told apart.
func TestRefundFollowsTheWindowAcrossAHandoff(t *testing.T) {
	ny, _ := limiter.LoadZone("America/New_York")
	howe, _ := limiter.LoadZone("Australia/Lord_Howe")
	kolkata, _ := limiter.LoadZone("Asia/Kolkata")
	if ny == nil || howe == nil || kolkata == nil {
		t.Fatal("zones do not load")
	}
	// The nodes' clocks run at the system's pace from noon in New York
	// on its 23-hour day (a clock that stands still would hold every
	// hand-over deadline): every window below has at least 30 minutes
	// left, far more than the test takes.
	offset := time.Until(time.Date(2026, 3, 8, 12, 0, 0, 0, ny))
	c := testcluster.New(t, 4, testcluster.WithClockOffsets(offset), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Store.KeepStrictest, cfg.Replicas = true, 1
	}))
	reqs := []limiter.Request{
		{Calendar: limiter.Day, Location: ny},
		{Calendar: limiter.Week, Location: howe},
		{Calendar: limiter.Hour, Location: kolkata},
		{Period: 90 * time.Minute},
	}
	ctx := context.Background()
	windows := make([]limiter.Window, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		r.Name, r.Key, r.Limit, r.Algorithm = "refund", fmt.Sprintf("k%d", i), 10, limiter.FixedWindow
		r.Hits = 10
		d, err := c.Owner(r.Name, r.Key).Check(ctx, *r)
		if err != nil || !d.Allowed || d.Window.IsZero() {
			t.Fatalf("%s: charging: %+v %v", r.Key, d, err)
		}
		windows[i] = d.Window
	}
	// The owners of the first keys leave (two of four nodes), handing
	// their keys off.
	first := make([]string, len(reqs))
	for i, r := range reqs {
		first[i] = c.Owner(r.Name, r.Key).Name()
	}
	left := map[int]bool{}
	for i := range reqs {
		o := c.OwnerIndex(reqs[i].Name, reqs[i].Key)
		if !left[o] && len(left) < 2 {
			left[o] = true
			c.Leave(o)
			c.WaitConverged()
		}
	}
	moved := 0
	for i, r := range reqs {
		if c.Owner(r.Name, r.Key).Name() != first[i] {
			moved++
		}
	}
	if moved < 2 {
		t.Fatalf("%d keys moved, want at least 2", moved)
	}
	for i, r := range reqs {
		w := windows[i]
		var via *cluster.Node
		for _, nd := range c.Nodes() {
			if nd != c.Owner(r.Name, r.Key) && nd.Ready() {
				via = nd
			}
		}
		if via == nil {
			via = c.Owner(r.Name, r.Key)
		}
		refund := func(charged limiter.Window, hits int64) (limiter.Decision, error) {
			q := r
			q.Hits, q.Behavior, q.Charged = hits, limiter.Refund, charged
			d, err := via.Check(ctx, q)
			return d.Decision, err
		}
		for _, forged := range []limiter.Window{
			{Start: w.Start + 1, End: w.End},
			{Start: w.Start, End: w.End + 1},
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
		d, err := refund(w, 4)
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 4 || d.Window != w {
			t.Errorf("%s: after the hand-off, a refund of 4 to the charged window %+v: %+v", r.Key, w, d)
		}
		check := r
		check.Hits = 5
		if d, err := via.Check(ctx, check); err != nil || d.Allowed {
			t.Errorf("%s: 5 hits after 4 given back: %+v %v", r.Key, d, err)
		}
	}
}
