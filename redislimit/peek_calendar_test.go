package redislimit

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestPeekKeepsCalendarStateStrictest: with KeepStrictest, keys of
// calendar windows in zones with DST or half-hour offsets (New York's
// 23-hour day, Lord Howe's week across its half-hour DST change,
// Kolkata's hour) answer peeks of every algorithm, of other units and
// zones, of a period as long as the day, and refunds of 0 hits naming the
// charge's window, as limiter's store does, and keep their bytes and TTL,
// while the window is live and after it ends.
func TestPeekKeepsCalendarStateStrictest(t *testing.T) {
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ny, _ := limiter.LoadZone("America/New_York")
	howe, _ := limiter.LoadZone("Australia/Lord_Howe")
	kolkata, _ := limiter.LoadZone("Asia/Kolkata")
	if ny == nil || howe == nil || kolkata == nil {
		t.Fatal("zones do not load")
	}
	clock := &testClock{}
	rl := newTestLimiter(t, clock, srv.Addr())
	rl.cfg.KeepStrictest = true
	cfg := limiter.DefaultStoreConfig()
	cfg.KeepStrictest = true
	store, err := limiter.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mem := sluice.NewLocal(store, clock.read)
	ctx := context.Background()
	check := func(what string, req limiter.Request) limiter.Decision {
		t.Helper()
		want, werr := mem.Check(ctx, req)
		got, gerr := rl.Check(ctx, req)
		if werr != nil || gerr != nil || got.WithoutOwner {
			t.Fatalf("%s %+v: limiter %v, redis %+v, %v", what, req, werr, got, gerr)
		}
		if msg := compareDecisions(want.Decision, got.Decision); msg != "" {
			t.Fatalf("%s %+v: %s\nlimiter %+v\nredis   %+v", what, req, msg, want.Decision, got.Decision)
		}
		return got.Decision
	}
	bases := []struct {
		req limiter.Request
		at  time.Time
	}{
		{limiter.Request{Calendar: limiter.Day, Location: ny}, time.Date(2026, 3, 8, 12, 0, 0, 0, ny)},
		{limiter.Request{Calendar: limiter.Week, Location: howe}, time.Date(2026, 4, 4, 12, 0, 0, 0, howe)}, // DST ends 5 April, 02:00 -> 01:30
		{limiter.Request{Calendar: limiter.Hour, Location: kolkata}, time.Date(2026, 3, 4, 12, 40, 0, 0, kolkata)},
	}
	for _, b := range bases {
		base := b.req
		base.Name, base.Key, base.Limit, base.Algorithm = "peekcal", base.Calendar.String(), 10, limiter.FixedWindow
		key := Key(rl.cfg.Prefix, base.Name, base.Key)
		clock.now = b.at
		write := base
		write.Hits = 7
		w := check("write", write).Window
		before, err := rdb.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		ttl := rdb.PTTL(ctx, key).Val()
		var peeks []limiter.Request
		for _, a := range limiter.Algorithms {
			r := base
			r.Algorithm, r.Calendar, r.Location, r.Period = a, limiter.NoCalendar, nil, time.Hour
			peeks = append(peeks, r)
		}
		for _, edit := range []func(r *limiter.Request){
			func(r *limiter.Request) { r.Location = nil },
			func(r *limiter.Request) { r.Location = kolkata },
			func(r *limiter.Request) { r.Calendar = limiter.Minute },
			func(r *limiter.Request) { r.Calendar = limiter.Year },
			func(r *limiter.Request) { r.Limit = 1_000_000 },
			func(r *limiter.Request) { r.Limit = 1 },
			func(r *limiter.Request) {
				r.Calendar, r.Location, r.Period = limiter.NoCalendar, nil, time.Duration(w.End-w.Start)
			},
			func(r *limiter.Request) { r.Behavior, r.Charged = limiter.Refund, w },
		} {
			r := base
			edit(&r)
			peeks = append(peeks, r)
		}
		for _, when := range []time.Duration{time.Minute, time.Duration(w.End-w.Start) / 2} {
			clock.now = b.at.Add(when)
			for _, p := range peeks {
				check("peek", p)
				after, err := rdb.Get(ctx, key).Bytes()
				if err != nil || !bytes.Equal(after, before) {
					t.Fatalf("%s: a peek %+v changed the key: %x -> %x (%v)", base.Key, p, before, after, err)
				}
				if now := rdb.PTTL(ctx, key).Val(); now <= 0 || now > ttl {
					t.Fatalf("%s: after a peek %+v the TTL is %v, was %v", base.Key, p, now, ttl)
				}
			}
		}
	}
}
