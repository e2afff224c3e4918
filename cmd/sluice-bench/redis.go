package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/redislimit"
)

// redisRequest is the workload of the Redis scenario: a limit of
// 1,000,000 per minute, never reached on its keys.
var redisRequest = limiter.Request{Name: "bench", Hits: 1, Limit: 1_000_000, Period: time.Minute}

// redisScheme is one way of deciding a check on Redis: check decides one
// hit of key and reports whether it was admitted; memKey is the Redis key
// that holds key's state, for MEMORY USAGE.
type redisScheme struct {
	name   string
	check  func(ctx context.Context, key string) bool
	memKey func(key string) string
	close  func()
}

// redisBench compares, in one run on one redis-server, sluice's Redis
// backend (each algorithm), envoyproxy/ratelimit's scheme (a fixed window:
// INCRBY and EXPIRE pipelined, the window's start in the key, the count
// compared on the client) and go-redis/redis_rate's GCRA, then sluice's
// own cluster of nodes on the same workload: callers on keys, 1,000,000
// per minute, for d each. It starts redis-server on a free loopback port
// when addr is empty. Each Redis row also reports the server's CPU time
// per check (INFO commandstats) and the mean MEMORY USAGE of the first
// 100 keys among those still live after it (a key expires once its state
// is fresh again: a bucket's within an emission interval, 60 µs here, of
// its last hit), with how many were live. It returns an error naming the rows where a check failed
// or was denied.
func redisBench(addr, server string, nodes, callers, keys int, d time.Duration, maxChecks int) (err error) {
	if addr == "" {
		var stop func()
		if addr, stop, err = startRedisServer(server); err != nil {
			return err
		}
		defer stop()
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	version, err := admin.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	fmt.Printf("redis %s at %s; %d callers, %d keys, %d per %v (never reached), %v per run\n",
		infoField(version, "redis_version"), addr, callers, keys, redisRequest.Limit, redisRequest.Period, d)
	fmt.Printf("%-40s %10s %9s %9s %9s %12s %16s\n", "what", "checks/s", "p50", "p99", "p99.9", "redis µs/ck", "bytes/key")
	names := keyNames(keys)
	var failed error
	schemes, err := redisSchemes(addr)
	if err != nil {
		return err
	}
	for _, s := range schemes {
		if err := admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			return err
		}
		r := drive(callers, d, maxChecks, func(ctx context.Context, rng *rand.Rand) bool {
			return s.check(ctx, names[rng.IntN(keys)])
		})
		stats, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var bytes, n int64
		for _, k := range names[:min(keys, 100)] {
			if b, err := admin.MemoryUsage(ctx, s.memKey(k), 0).Result(); err == nil {
				bytes, n = bytes+b, n+1
			}
		}
		s.close()
		failed = errors.Join(failed, rowError(s.name, r))
		mem := "none live"
		if n > 0 {
			mem = fmt.Sprintf("%d (%d live)", bytes/n, n)
		}
		printRow(s.name, r, fmt.Sprintf("%.1f", commandMicros(stats)/float64(max(r.checks, 1))), mem)
	}
	cl, err := start(nodes, cluster.DefaultConfig().Peer.MaxInFlight, new(peerBatches), cluster.LeaseConfig{})
	if err != nil {
		closeAll(cl)
		return err
	}
	defer closeAll(cl)
	for _, algo := range limiter.Algorithms {
		tmpl := redisRequest
		tmpl.Algorithm = algo
		name := fmt.Sprintf("sluice cluster (%d nodes) %s", nodes, algo)
		r := run(cl, callers, keys, d, maxChecks, tmpl)
		failed = errors.Join(failed, rowError(name, r))
		printRow(name, r, "-", "-")
	}
	return failed
}

// rowError says that some checks of a row failed or were denied, which
// the workload never should.
func rowError(name string, r result) error {
	if r.errors == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d of %d checks failed or were denied", name, r.errors, r.checks)
}

// redisSchemes are the ways of deciding on the Redis at addr that the
// scenario compares.
func redisSchemes(addr string) ([]redisScheme, error) {
	var out []redisScheme
	for _, algo := range limiter.Algorithms {
		cfg := redislimit.DefaultConfig()
		cfg.Addrs = []string{addr}
		cfg.Timeout = time.Second
		l, err := redislimit.New(cfg)
		if err != nil {
			return nil, err
		}
		req := redisRequest
		req.Algorithm = algo
		out = append(out, redisScheme{
			name: "sluice redis " + algo.String(),
			check: func(ctx context.Context, key string) bool {
				r := req
				r.Key = key
				d, err := l.Check(ctx, r)
				return err == nil && d.Allowed && !d.WithoutOwner
			},
			memKey: func(key string) string { return redislimit.Key(cfg.Prefix, req.Name, key) },
			close:  func() { l.Close() },
		})
	}
	envoy := redis.NewClient(&redis.Options{Addr: addr})
	period := int64(redisRequest.Period / time.Second)
	envoyKey := func(key string, at time.Time) string {
		return "ratelimit_bench_" + key + "_" + strconv.FormatInt(at.Unix()/period*period, 10)
	}
	out = append(out, redisScheme{
		name: "envoyproxy/ratelimit INCRBY+EXPIRE",
		check: func(ctx context.Context, key string) bool {
			k := envoyKey(key, time.Now())
			var incr *redis.IntCmd
			_, err := envoy.Pipelined(ctx, func(p redis.Pipeliner) error {
				incr = p.IncrBy(ctx, k, 1)
				p.Expire(ctx, k, redisRequest.Period)
				return nil
			})
			return err == nil && incr.Val() <= redisRequest.Limit
		},
		memKey: func(key string) string { return envoyKey(key, time.Now()) },
		close:  func() { envoy.Close() },
	})
	rr := redis.NewClient(&redis.Options{Addr: addr})
	rl := redis_rate.NewLimiter(rr)
	out = append(out, redisScheme{
		name: "go-redis/redis_rate GCRA",
		check: func(ctx context.Context, key string) bool {
			res, err := rl.Allow(ctx, "bench:"+key, redis_rate.PerMinute(int(redisRequest.Limit)))
			return err == nil && res.Allowed == 1
		},
		memKey: func(key string) string { return "rate:bench:" + key },
		close:  func() { rr.Close() },
	})
	return out, nil
}

// startRedisServer runs server (redis-server) with no persistence on a
// free loopback port and waits until it answers PING; stop kills it.
func startRedisServer(server string) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(server, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("%s: %w (install redis-server, or pass -redis-addr)", server, err)
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.Join(errors.New("redis-server did not answer PING in 10s"), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// printRow prints one row of the Redis scenario's table.
func printRow(name string, r result, micros, bytes string) {
	q := func(p float64) time.Duration { return round(r.lat.quantile(p)) }
	fmt.Printf("%-40s %10.0f %9v %9v %9v %12s %16s", name, float64(r.checks)/r.elapsed.Seconds(), q(0.5), q(0.99), q(0.999), micros, bytes)
	if r.errors > 0 {
		fmt.Printf("  (%d of %d checks failed or denied)", r.errors, r.checks)
	}
	fmt.Println()
}

// commandMicros sums the usec of every command in INFO commandstats but
// CONFIG's, INFO's and MEMORY's own.
func commandMicros(stats string) float64 {
	var sum float64
	for _, line := range strings.Split(stats, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		switch name {
		case "cmdstat_config", "cmdstat_info", "cmdstat_memory|usage", "cmdstat_flushall":
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				sum += n
			}
		}
	}
	return sum
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return "?"
}
