package redislimit

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// benchKeys is how many keys the benchmarks' callers spread over.
const benchKeys = 1000

// runCallers runs b.N calls of op from 64 parallel callers (RunParallel
// starts SetParallelism goroutines per GOMAXPROCS) and reports checks/s,
// the 99th percentile and the longest latency, and the server's CPU time
// per check, which Redis counts per command (INFO commandstats) on addr
// ("": none, the server is down).
func runCallers(b *testing.B, addr string, op func(ctx context.Context, key string) error) {
	b.Helper()
	var admin *redis.Client
	if addr != "" {
		admin = redis.NewClient(&redis.Options{Addr: addr})
		defer admin.Close()
		if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
	var (
		mu    sync.Mutex
		lats  []time.Duration
		next  atomic.Int64
		fails atomic.Int64
	)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			key := strconv.FormatInt(next.Add(1)%benchKeys, 10)
			t0 := time.Now()
			if err := op(ctx, key); err != nil {
				fails.Add(1)
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		lats = append(lats, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if n := fails.Load(); n > 0 {
		b.Fatalf("%d calls failed", n)
	}
	slices.Sort(lats)
	b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "checks/s")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(lats[len(lats)-1].Microseconds()), "max-us")
	if admin == nil {
		return
	}
	stats, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(serverMicros(stats)/float64(len(lats)), "redis-us/check")
}

// serverMicros sums the usec of every command in INFO commandstats but
// CONFIG's and INFO's own.
func serverMicros(stats string) float64 {
	var sum float64
	for _, line := range strings.Split(stats, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_config") || strings.HasPrefix(line, "cmdstat_info") {
			continue
		}
		for _, field := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				sum += n
			}
		}
	}
	return sum
}

// BenchmarkRedis is sluice's Redis backend, each algorithm, against the
// fixed window scheme of envoyproxy/ratelimit (INCRBY and EXPIRE
// pipelined, the window's start in the key) and go-redis/redis_rate's
// GCRA, on one redis-server, 1,000,000 per minute on 1000 keys.
func BenchmarkRedis(b *testing.B) {
	srv := testredis.Start(b)
	for _, algo := range limiter.Algorithms {
		b.Run(algo.String(), func(b *testing.B) {
			l := newTestLimiter(b, nil, srv.Addr())
			runCallers(b, srv.Addr(), func(ctx context.Context, key string) error {
				d, err := l.Check(ctx, limiter.Request{Name: "bench", Key: key, Hits: 1, Limit: 1_000_000, Period: time.Minute, Algorithm: algo})
				if err == nil && d.WithoutOwner {
					err = fmt.Errorf("decided without Redis")
				}
				return err
			})
		})
	}
	b.Run("envoy_incrby_expire", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		period := int64(60)
		runCallers(b, srv.Addr(), func(ctx context.Context, key string) error {
			// The window's start in the key; INCRBY then EXPIRE in one
			// pipeline; the count decides on the client.
			window := time.Now().Unix() / period * period
			k := "envoy_bench_" + key + "_" + strconv.FormatInt(window, 10)
			var incr *redis.IntCmd
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				incr = p.IncrBy(ctx, k, 1)
				p.Expire(ctx, k, time.Duration(period)*time.Second)
				return nil
			})
			if err == nil && incr.Val() < 1 {
				err = fmt.Errorf("count %d", incr.Val())
			}
			return err
		})
	})
	b.Run("redis_rate_gcra", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		rl := redis_rate.NewLimiter(rdb)
		runCallers(b, srv.Addr(), func(ctx context.Context, key string) error {
			res, err := rl.Allow(ctx, "redis_rate_bench:"+key, redis_rate.PerMinute(1_000_000))
			if err == nil && res.Allowed != 1 {
				err = fmt.Errorf("denied: %+v", res)
			}
			return err
		})
	})
}

// BenchmarkRedisDown is the Redis backend with its server killed: 64
// callers, Timeout 100 ms, the default breaker (5 failures, 1 s
// cooldown), PolicyLocal: checks/s, p99 and the longest check while
// every check goes to the policy, the breaker letting one probe through a
// second.
func BenchmarkRedisDown(b *testing.B) {
	srv := testredis.Start(b)
	cfg := DefaultConfig()
	cfg.Addrs = []string{srv.Addr()}
	l, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	srv.Kill()
	runCallers(b, "", func(ctx context.Context, key string) error {
		d, err := l.Check(ctx, limiter.Request{Name: "bench", Key: key, Hits: 1, Limit: 1_000_000, Period: time.Minute, Algorithm: limiter.GCRA})
		if err == nil && !d.WithoutOwner {
			err = fmt.Errorf("decided by a dead Redis")
		}
		return err
	})
}

// TestMemoryPerKey measures what one key costs in Redis (MEMORY USAGE)
// for each algorithm, and a sliding window log full at MaxLogEntries: the
// bounds the docs state.
func TestMemoryPerKey(t *testing.T) {
	_, l, rdb := startWithLimiter(t)
	l.cfg.Prefix = DefaultConfig().Prefix
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	ctx := context.Background()
	// Beside them, for the same client key: envoyproxy/ratelimit's
	// counter and go-redis/redis_rate's.
	envoyKey := "ratelimit_api_per_user_user:1234567_1800000000"
	rdb.IncrBy(ctx, envoyKey, 1)
	rdb.Expire(ctx, envoyKey, time.Minute)
	if _, err := redis_rate.NewLimiter(rdb).Allow(ctx, "api_per_user:user:1234567", redis_rate.PerMinute(100)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{envoyKey, "rate:api_per_user:user:1234567"} {
		n, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", k, err)
		}
		t.Logf("%s: %d bytes", k, n)
	}
	for _, strict := range []bool{false, true} {
		// With KeepStrictest, the rate beside the state (format version 2).
		l.cfg.KeepStrictest = strict
		name := "api_per_user"
		if strict {
			name = "api_per_usr" // as long, another key
		}
		for _, algo := range limiter.Algorithms {
			req := limiter.Request{Name: name, Key: "user:1234567", Hits: 1, Limit: 100, Period: time.Minute, Algorithm: algo}
			if _, err := l.Check(ctx, req); err != nil {
				t.Fatal(err)
			}
			n, err := rdb.MemoryUsage(ctx, Key(l.cfg.Prefix, req.Name, req.Key), 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s, KeepStrictest %v: %d bytes", algo, strict, n)
			if n > 192 {
				t.Errorf("%s: a key of 32 bytes costs %d bytes, more than 192", algo, n)
			}
		}
	}
	l.cfg.KeepStrictest = false
	tl := newTestLimiter(t, clock, l.cfg.Addrs...)
	req := limiter.Request{Name: "api_per_user", Key: "user:1234567", Hits: 1, Limit: 10_000, Period: time.Hour, Algorithm: limiter.SlidingWindowLog}
	for range limiter.MaxLogEntries {
		clock.now = clock.now.Add(time.Millisecond)
		if _, err := tl.Check(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	n, err := rdb.MemoryUsage(ctx, Key(tl.cfg.Prefix, req.Name, req.Key), 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sliding_window_log full at %d entries: %d bytes", limiter.MaxLogEntries, n)
	if limit := int64(96 << 10); n > limit {
		t.Errorf("a full log costs %d bytes, more than %d", n, limit)
	}
}
