package daemon

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestRedisNoCallerLowersACount is TestNoCallerLowersACount on backend
// redis: under destructive_behaviors deny, no caller of the public API may
// give a spent key hits back, by a behavior or by a check at a laxer rate.
// Known break: the Redis script converts a key's state on a rate change as
// the cluster does under allow (docs/design.md, "Backends"), so a check
// with a far higher limit, a far shorter period or another algorithm is
// admitted on a spent key. Run with SLUICE_ATTACK=1.
func TestRedisNoCallerLowersACount(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") == "" {
		t.Skip("known break: backend redis does not keep the strictest rate under destructive_behaviors deny; SLUICE_ATTACK=1 runs it")
	}
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
