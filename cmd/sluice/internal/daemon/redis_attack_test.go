package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestRedisNoCallerLowersACount is TestNoCallerLowersACount on backend
// redis: under destructive_behaviors deny, no caller of the public API may
// give a spent key hits back, by a behavior or by a check at a laxer rate
// (a far higher limit, a far shorter period, another algorithm): the
// script keeps the strictest rate (redislimit.Config.KeepStrictest).
func TestRedisNoCallerLowersACount(t *testing.T) {
	srv := testredis.Start(t)
	cfg := redisConfigFor("redis-lower", srv.Addr())
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg)
	for _, a := range limiter.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			for _, api := range publicAPIs(t, d) {
				spend := limiter.Request{Name: "api_" + a.String(), Key: api.name, Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
				if got := api.check(t, spend); got != "allowed" {
					t.Fatalf("%s: spending the key: %s", api.name, got)
				}
				spent := spend
				spent.Hits = 1
				for _, at := range lowerAttempts(a) {
					r := spend
					at.edit(&r)
					want := at.wantHTTP
					if api.name == "grpc" {
						want = at.wantGRPC
					}
					if r.Algorithm == limiter.GCRA && r.Limit > int64(r.Period/time.Microsecond) {
						// Faster than Redis time decides (redislimit
						// ErrUnsupported): refused whatever the key holds,
						// which lowers nothing either.
						want = "invalid"
					}
					if got := api.check(t, r); got != want {
						t.Errorf("%s, %s: %s, want %s", api.name, at.name, got, want)
					}
					if got := api.check(t, spent); got != "denied" {
						t.Errorf("%s: after %s, a check of the spent key: %s", api.name, at.name, got)
					}
				}
			}
		})
	}
}

// TestRedisEnvoyModes is TestEnvoyModes on backend redis, in day windows
// (Redis's clock decides them): a hits_addend of 0 on a full window is OK
// with 0 remaining, and OVER_LIMIT on one a request went past; quota
// mode, no charge for a request over but on the descriptor over (the
// others given back on Redis), and whole seconds in
// duration_until_reset.
func TestRedisEnvoyModes(t *testing.T) {
	srv := testredis.Start(t)
	dir := t.TempDir()
	writeEnvoyFile(t, dir, "m1.yaml", "domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	writeEnvoyFile(t, dir, "m2.yaml", "domain: m\ndescriptors:\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 2}\n")
	cfg := redisConfigFor("redis-envoy-modes", srv.Addr())
	cfg.EnvoyConfigDir = dir
	cfg.Destructive = DestructiveDeny
	cfg.EnvoyMergeDomains, cfg.EnvoyQuotaMode, cfg.EnvoyStopIncrementOverLimit = true, true, true
	d := start(t, cfg)
	client := rlsClient(t, d.GRPCAddr())
	call := rlsCaller(t, client, "m")
	for i, s := range []struct {
		hits    uint64
		entries []string
		want    string
	}{
		{0, []string{"b=1"}, "OK; OK r=2"},
		{2, []string{"b=1"}, "OK; OK r=0"},
		{0, []string{"b=1"}, "OK; OK r=0"},
		{1, []string{"a=1", "b=1"}, "OK; OK r=5; OVER_LIMIT r=0"},
		{0, []string{"a=1"}, "OK; OK r=5"},
		{1 << 40, []string{"a=1"}, "OVER_LIMIT; OVER_LIMIT r=0"},
		{0, []string{"a=1"}, "OVER_LIMIT; OVER_LIMIT r=0"}, // the descriptor over is charged past its limit, as upstream's
	} {
		resp := call(s.hits, s.entries...)
		if got := rlsSummary(resp); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
		for _, st := range resp.Statuses {
			if dr := st.DurationUntilReset; dr != nil && (dr.Nanos != 0 || dr.Seconds <= 0 || dr.Seconds > 86400) {
				t.Errorf("step %d: duration_until_reset %v, want whole seconds in (0, 1 day]", i, dr.AsDuration())
			}
		}
	}
}

// TestRedisEnvoyResetIgnoresDaemonClock: on backend redis, Redis's clock
// places the windows, so a daemon whose clock is skewed must still tell
// Envoy when the window Redis counts in ends: days 36 hours off would
// otherwise report the end of another day's window, and the HTTP API's
// reset_after_ms would be off by the skew.
func TestRedisEnvoyResetIgnoresDaemonClock(t *testing.T) {
	srv := testredis.Start(t)
	var resets []time.Duration
	for i, skew := range []time.Duration{0, -36 * time.Hour, 36 * time.Hour, 90 * time.Second} {
		cfg := redisConfigFor("redis-skew", srv.Addr())
		cfg.EnvoyConfigDir = envoyDir(t)
		d := start(t, cfg, WithClock(fakeclock.New(time.Now().Add(skew)).Now))
		resp, err := rlsClient(t, d.GRPCAddr()).ShouldRateLimit(context.Background(), rlsRequest("messaging", []string{"to_number=1"}))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := rlsSummary(resp), fmt.Sprintf("OK; OK r=%d", 99-i); got != want {
			t.Errorf("skew %v: %s, want %s (one count in Redis)", skew, got, want)
		}
		resets = append(resets, resp.Statuses[0].DurationUntilReset.AsDuration())
		// The HTTP API's reset_after_ms of a window of a minute is at
		// most a minute, whatever the daemon's clock.
		r := do(t, http.MethodPost, "http://"+d.HTTPAddr()+"/v1/check", `{"name":"skew","key":"k","limit":100,"period":"1m","algorithm":"fixed_window"}`)
		var dec Decision
		if err := json.Unmarshal(r.body, &dec); err != nil || dec.ResetAfterMs <= 0 || dec.ResetAfterMs > 60_000 {
			t.Errorf("skew %v: HTTP %d %s: reset_after_ms outside (0, 60000]", skew, r.status, r.body)
		}
		// The daemons read Redis's day window within seconds of each
		// other: their resets must agree within a minute.
		if diff := resets[0] - resets[i]; diff < -time.Minute || diff > time.Minute {
			t.Errorf("skew %v: duration_until_reset %v, want about %v as with no skew", skew, resets[i], resets[0])
		}
	}
}
