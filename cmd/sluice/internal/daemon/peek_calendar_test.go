package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// TestCalendarPeeksWriteNothing spends calendar windows in zones with DST
// and half-hour offsets (New York's 23-hour day, Lord Howe's week across
// its half-hour DST change, Kolkata's hour) on a daemon with
// destructive_behaviors deny, then peeks at each through every API that
// reads: POST /v1/check with hits 0, the gRPC Check with Hits 0, the
// admin inspect with and without a peek's limit, and gRPC Inspect; with
// every algorithm, other units and zones, a far higher limit, and a
// period as long as the window. The key's state (the node's snapshot of
// it, its rate included) is the same after every peek, and a check of
// the rightful rate still finds 3 hits left.
func TestCalendarPeeksWriteNothing(t *testing.T) {
	ny, _ := limiter.LoadZone("America/New_York")
	howe, _ := limiter.LoadZone("Australia/Lord_Howe")
	kolkata, _ := limiter.LoadZone("Asia/Kolkata")
	if ny == nil || howe == nil || kolkata == nil {
		t.Fatal("zones do not load")
	}
	t0 := time.Date(2026, 4, 4, 12, 0, 0, 0, howe) // 3 April 21:00 in New York, 4 April 06:30 in Kolkata
	clk := fakeclock.New(t0)
	cfg := testConfig("peekcal")
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg, WithClock(clk.Now))
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	bases := []limiter.Request{
		{Key: "day", Calendar: limiter.Day, Location: ny},
		{Key: "week", Calendar: limiter.Week, Location: howe},
		{Key: "hour", Calendar: limiter.Hour, Location: kolkata},
	}
	zoneOf := func(l *time.Location) string {
		if l == nil {
			return ""
		}
		return l.String()
	}
	for _, base := range bases {
		base.Name, base.Limit, base.Algorithm = "peekcal", 10, limiter.FixedWindow
		spend := base
		spend.Hits = 7
		dec, err := c.Check(ctx, spend)
		if err != nil || !dec.Allowed {
			t.Fatalf("%s: spending: %+v %v", base.Key, dec, err)
		}
		w := dec.Window
		snap := func() limiter.Snapshot {
			t.Helper()
			sn, ok := d.Node().Store().Snapshot(base.Name, base.Key, clk.Now())
			if !ok {
				t.Fatalf("%s: no state", base.Key)
			}
			return sn
		}
		before := snap()
		var peeks []limiter.Request
		for _, a := range limiter.Algorithms {
			r := base
			r.Algorithm, r.Calendar, r.Location, r.Period = a, limiter.NoCalendar, nil, time.Minute
			peeks = append(peeks, r)
		}
		for _, edit := range []func(r *limiter.Request){
			func(r *limiter.Request) {},
			func(r *limiter.Request) { r.Location = nil },
			func(r *limiter.Request) { r.Location = kolkata },
			func(r *limiter.Request) { r.Location = ny },
			func(r *limiter.Request) { r.Calendar = limiter.Minute },
			func(r *limiter.Request) { r.Calendar = limiter.Year },
			func(r *limiter.Request) { r.Limit = 1_000_000 },
			func(r *limiter.Request) {
				r.Calendar, r.Location, r.Period = limiter.NoCalendar, nil, time.Duration(w.End-w.Start)
			},
		} {
			r := base
			edit(&r)
			peeks = append(peeks, r)
		}
		for _, p := range peeks {
			p.Hits = 0
			what := fmt.Sprintf("%s, peek %s %v/%v in %q", base.Key, p.Algorithm, p.Period, p.Calendar, zoneOf(p.Location))
			body := map[string]any{"name": p.Name, "key": p.Key, "hits": 0, "limit": p.Limit, "algorithm": p.Algorithm.String()}
			q := url.Values{"algorithm": {p.Algorithm.String()}, "limit": {fmt.Sprint(p.Limit)}}
			if p.Calendar != limiter.NoCalendar {
				body["calendar"], body["time_zone"] = p.Calendar.String(), zoneOf(p.Location)
				q.Set("calendar", p.Calendar.String())
				q.Set("time_zone", zoneOf(p.Location))
			} else {
				body["period"] = p.Period.String()
				q.Set("period", p.Period.String())
			}
			b, _ := json.Marshal(body)
			if resp := do(t, "POST", "http://"+d.HTTPAddr()+"/v1/check", string(b)); resp.status != 200 {
				t.Fatalf("%s over HTTP: %d %s", what, resp.status, resp.body)
			}
			if _, err := c.Check(ctx, p); err != nil {
				t.Fatalf("%s over gRPC: %v", what, err)
			}
			for _, extra := range []string{"", q.Encode()} {
				if resp := do(t, "GET", inspectURL(d, p.Name, p.Key, extra), ""); resp.status != 200 {
					t.Fatalf("%s: inspect %q: %d %s", what, extra, resp.status, resp.body)
				}
			}
			if _, err := c.Inspect(ctx, p.Name, p.Key); err != nil {
				t.Fatalf("%s: gRPC Inspect: %v", what, err)
			}
			if after := snap(); !reflect.DeepEqual(after, before) {
				t.Fatalf("%s changed the key:\nbefore %+v\nafter  %+v", what, before, after)
			}
		}
		one := base
		one.Hits = 0
		if dec, err := c.Check(ctx, one); err != nil || dec.Remaining != 3 {
			t.Errorf("%s: after the peeks: %+v %v, want 3 left", base.Key, dec, err)
		}
	}
}
