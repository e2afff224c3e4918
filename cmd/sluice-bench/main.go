// Command sluice-bench measures a cluster on the standard workload: N nodes
// in this process on loopback, C concurrent callers, each check sent to a
// random node for a random key of K, with a token bucket whose limit is
// never reached, for a fixed time. It prints checks/s and the p50, p99 and
// p99.9 latencies, then the same for a hot-key run (every caller on one key).
// Each caller counts its latencies in a histogram of its own, in buckets at
// most 1/64 of their values wide; a quantile is its bucket's upper bound.
//
// With -leases it then compares the hot key without and with token leases
// (cluster.LeaseConfig), each on a fresh cluster: once with a limit never
// reached, once with a token bucket limit reached all the time, reporting
// the calls to the owner (forwarded checks and lease requests) and, for the
// limited run, the hits admitted against the most the limit allows.
//
//	go run ./cmd/sluice-bench -nodes 3 -callers 64 -keys 10000 -duration 5s
//	go run ./cmd/sluice-bench -keys 1 -hot=false -leases
//
// With -scenario failover it measures instead the hits forgotten when a
// key's owner is killed hard under steady traffic (see failover.go):
//
//	go run ./cmd/sluice-bench -scenario failover -trials 5 -rate 2000 -callers 8
//
// With -scenario loopback it measures the floor under the cluster's
// latencies: plain Go round trips on as many loopback TCP connections as the
// cluster has links between nodes, without gRPC or sluice (see loopback.go).
//
// With -scenario redis it compares, in one run on one redis-server (started
// on a free loopback port, or -redis-addr), sluice's Redis backend (each
// algorithm), envoyproxy/ratelimit's scheme (INCRBY and EXPIRE pipelined)
// and go-redis/redis_rate's GCRA, then sluice's own cluster on the same
// workload, with the server's time per check and the bytes per key in
// Redis (see redis.go):
//
//	go run ./cmd/sluice-bench -scenario redis -callers 64 -keys 1000 -duration 5s
//
// With -scenario rls it drives running rate limit services (Envoy's
// envoy.service.ratelimit.v3 API: sluice daemons, envoyproxy/ratelimit)
// with unary ShouldRateLimit calls of one descriptor, taking turns, and
// reports each one's checks/s, latencies and server CPU per check (the
// utime and stime in /proc of the pids given; see rls.go and
// bench/envoy-vs-ratelimit.sh, which starts the services):
//
//	go run ./cmd/sluice-bench -scenario rls -targets sluice=127.0.0.1:7947@1234,ratelimit=127.0.0.1:8081@1240+1230
//
// -procs sets GOMAXPROCS for every scenario; by default it is Go's own.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
)

func main() {
	nodes := flag.Int("nodes", 3, "nodes in the cluster")
	callers := flag.Int("callers", 64, "concurrent callers")
	keys := flag.Int("keys", 10_000, "distinct keys")
	duration := flag.Duration("duration", 5*time.Second, "length of each run")
	maxChecks := flag.Int("max-checks", 50_000_000, "stop a run after this many checks")
	hot := flag.Bool("hot", true, "also run the hot-key workload")
	inflight := flag.Int("inflight", cluster.DefaultConfig().Peer.MaxInFlight, "calls in flight per peer")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the runs to this file")
	memprofile := flag.String("memprofile", "", "write a heap profile (with what the runs allocated) to this file")
	traceFile := flag.String("trace", "", "write an execution trace of the runs to this file")
	peerStats := flag.Bool("peerstats", false, "also print the batches sent to peers in each run")
	scenario := flag.String("scenario", "throughput", "throughput; failover: hits forgotten when an owner is killed hard; loopback: plain Go TCP round trips on the cluster's links; rls: running Envoy rate limit services (-targets); redis: sluice's Redis backend against envoyproxy/ratelimit's scheme, go-redis/redis_rate and sluice's cluster")
	procs := flag.Int("procs", 0, "GOMAXPROCS (0: Go's default)")
	size := flag.Int("size", 256, "loopback: bytes per message")
	trials := flag.Int("trials", 5, "failover: trials")
	rate := flag.Float64("rate", 2000, "failover: checks per second on the key, from all callers")
	interval := flag.Duration("replicate", cluster.DefaultConfig().ReplicateInterval, "failover: Config.ReplicateInterval")
	leases := flag.Bool("leases", false, "also compare the hot key without and with leases")
	leaseThreshold := flag.Int64("lease-threshold", 0, "lease hot keys from this many checks per second per key on a node (0: off) in every run")
	leaseTTL := flag.Duration("lease-ttl", 100*time.Millisecond, "lease TTL")
	leaseShare := flag.Float64("lease-share", 0.1, "most of a key's capacity one lease takes")
	limitedRate := flag.Int64("limited-rate", 20_000, "hits per second of the limited hot-key run with -leases")
	limitedAlgo := flag.String("limited-algorithm", "token_bucket", "algorithm of the limited hot-key run: token_bucket, gcra, or fixed_window (windows of 100ms)")
	redisAddr := flag.String("redis-addr", "", "redis: host:port of the Redis to use (empty: start redis-server on a free loopback port)")
	redisServer := flag.String("redis-server", "redis-server", "redis: the redis-server program started without -redis-addr")
	persist := flag.Bool("persist", false, "throughput: run the keys workload without and with a data directory per node (Config.DataDir), alternately, twice each")
	rlsTargets := flag.String("targets", "", "rls: the rate limit services to drive, name=host:port@pid[+pid...] separated by commas; the pids' CPU time is the server's")
	rlsDomain := flag.String("domain", "bench", "rls: the domain of the requests")
	rlsKey := flag.String("descriptor-key", "user", "rls: the key of the requests' one descriptor entry")
	rlsConns := flag.Int("conns", 1, "rls: gRPC connections per target")
	rlsRounds := flag.Int("rounds", 2, "rls: runs of each target, alternating")
	rlsClient := flag.String("client", "grpc", "rls: the load generator of -api envoy: grpc (grpc-go's client) or h2 (gRPC on HTTP/2 frames written by sluice-bench itself, for less CPU)")
	rlsAPI := flag.String("api", "envoy", "rls: the API called: envoy (ShouldRateLimit), grpc (sluice's Check) or http (POST /v1/check, at the targets' HTTP addresses)")
	warmup := flag.Duration("warmup", time.Second, "rls: unmeasured calls before each run")
	cost := flag.Bool("cost", false, "also print the CPU time and heap allocated per check, and the GCs, in each run")
	flag.DurationVar(&peerTimeout, "peer-timeout", 0, "throughput: Config.Peer.Timeout and HandoverTimeout of the nodes (0: the defaults); under valgrind a forwarded check takes seconds")
	flag.Parse()
	if *procs < 0 {
		fmt.Fprintln(os.Stderr, "sluice-bench: -procs must not be negative")
		os.Exit(2)
	}
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	if *scenario == "loopback" {
		if *nodes < 2 || *size < 1 || *duration <= 0 || *maxChecks < 1 {
			fmt.Fprintln(os.Stderr, "sluice-bench: loopback needs -nodes of 2 or more, and positive -size, -duration and -max-checks")
			os.Exit(2)
		}
		links := *nodes * (*nodes - 1)
		fmt.Printf("GOMAXPROCS %d, %d loopback TCP connections, %d-byte messages, %v\n", runtime.GOMAXPROCS(0), links, *size, *duration)
		r, err := loopback(links, *size, *duration, max(*maxChecks/links, 1))
		if err != nil {
			log.Fatal(err)
		}
		reportAs("loopback", "round trip", r, *cost)
		return
	}
	if *scenario == "failover" {
		if *trials < 1 || *rate <= 0 || *interval <= 0 || *callers < 1 {
			fmt.Fprintln(os.Stderr, "sluice-bench: -trials, -rate, -replicate and -callers must be positive")
			os.Exit(2)
		}
		if err := failover(*trials, *callers, *rate, *interval); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *scenario == "redis" {
		if *nodes < 1 || *callers < 1 || *keys < 1 || *duration <= 0 || *maxChecks < 1 {
			fmt.Fprintln(os.Stderr, "sluice-bench: -nodes, -callers, -keys, -duration and -max-checks must be positive")
			os.Exit(2)
		}
		if err := redisBench(*redisAddr, *redisServer, *nodes, *callers, *keys, *duration, *maxChecks); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *scenario == "rls" {
		targets, err := parseRLSTargets(*rlsTargets)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench:", err)
			os.Exit(2)
		}
		if *callers < 1 || *keys < 1 || *rlsConns < 1 || *rlsRounds < 1 || *duration <= 0 || *warmup < 0 || *maxChecks < 1 {
			fmt.Fprintln(os.Stderr, "sluice-bench: -callers, -keys, -conns, -rounds, -duration and -max-checks must be positive")
			os.Exit(2)
		}
		if *cpuprofile != "" {
			f, err := os.Create(*cpuprofile)
			if err != nil {
				log.Fatal(err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				log.Fatal(err)
			}
			defer pprof.StopCPUProfile()
		}
		if err := rlsBench(targets, *rlsAPI, *rlsClient, *rlsDomain, *rlsKey, *callers, *rlsConns, *keys, *rlsRounds, *duration, *warmup, *maxChecks); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *scenario != "throughput" {
		fmt.Fprintf(os.Stderr, "sluice-bench: unknown -scenario %q\n", *scenario)
		os.Exit(2)
	}
	if *nodes < 1 || *callers < 1 || *keys < 1 || *duration <= 0 || *maxChecks < 1 {
		fmt.Fprintln(os.Stderr, "sluice-bench: -nodes, -callers, -keys, -duration and -max-checks must be positive")
		os.Exit(2)
	}
	lease := cluster.LeaseConfig{Threshold: *leaseThreshold, TTL: *leaseTTL, Share: *leaseShare}
	var batches peerBatches
	if *persist {
		if err := persistRuns(*nodes, *inflight, &batches, lease, *callers, *keys, *duration, *maxChecks, *cost); err != nil {
			log.Fatal(err)
		}
		return
	}
	cl, err := start(*nodes, *inflight, &batches, lease)
	if err != nil {
		log.Fatal(err)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			log.Fatal(err)
		}
		defer trace.Stop()
	}
	if *memprofile != "" {
		defer writeHeapProfile(*memprofile)
	}
	fmt.Printf("GOMAXPROCS %d, %d nodes, %d callers, token bucket never limited, %v per run, leases %+v\n", runtime.GOMAXPROCS(0), *nodes, *callers, *duration, lease)
	report(fmt.Sprintf("%d keys", *keys), run(cl, *callers, *keys, *duration, *maxChecks, unlimited), *cost)
	if *peerStats {
		batches.report()
	}
	if *hot {
		report("hot key", run(cl, *callers, 1, *duration, *maxChecks, unlimited), *cost)
		if *peerStats {
			batches.report()
		}
	}
	closeAll(cl)
	if !*leases {
		return
	}
	on := cluster.LeaseConfig{Threshold: 1000, TTL: *leaseTTL, Share: *leaseShare}
	if *leaseThreshold > 0 {
		on.Threshold = *leaseThreshold
	}
	limited := limiter.Request{Name: "bench", Key: "limited", Hits: 1, Limit: *limitedRate, Period: time.Second}
	if limited.Algorithm, err = limiter.ParseAlgorithm(*limitedAlgo); err != nil {
		log.Fatal(err)
	}
	if limited.Algorithm == limiter.FixedWindow {
		limited.Limit, limited.Period = max(*limitedRate/10, 1), 100*time.Millisecond
	}
	if err := limited.Validate(); err != nil {
		log.Fatalf("limited run: %v", err)
	}
	for _, lc := range []cluster.LeaseConfig{{}, on} {
		cl, err := start(*nodes, *inflight, &batches, lc)
		if err != nil {
			log.Fatal(err)
		}
		name := "no leases"
		if lc.Threshold > 0 {
			name = "leases"
		}
		fmt.Printf("hot key, %s %+v\n", name, lc)
		calls := ownerCalls(cl)
		u := run(cl, *callers, 1, *duration, *maxChecks, unlimited)
		report("unlimited", u, *cost)
		c := ownerCalls(cl) - calls
		fmt.Printf("%-10s %10d calls to the owner, %.4f per check\n", "", c, float64(c)/float64(max(u.checks, 1)))
		calls = ownerCalls(cl)
		limited.Key = "limited-" + name
		began := time.Now()
		r := run(cl, *callers, 1, *duration, *maxChecks, limited)
		ended := began.Add(r.elapsed)
		report("limited", r, *cost)
		allowed := limited.Limit + int64(float64(limited.Limit)*r.elapsed.Seconds()/limited.Period.Seconds())
		if limited.Algorithm == limiter.FixedWindow { // the windows the run touched
			p := limited.Period
			allowed = limited.Limit * int64(ended.Truncate(p).Sub(began.Truncate(p))/p+1)
		}
		c = ownerCalls(cl) - calls
		fmt.Printf("%-10s %10d calls to the owner, %.4f per check; admitted %d, the limit allows at most %d\n",
			"", c, float64(c)/float64(max(r.checks, 1)), r.checks-r.errors, allowed)
		closeAll(cl)
	}
}

var unlimited = limiter.Request{Name: "bench", Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}

// ownerCalls sums the checks the nodes forwarded and the leases they asked for.
func ownerCalls(nodes []*cluster.Node) int64 {
	var n int64
	for _, nd := range nodes {
		s := nd.Stats()
		n += s.Forwarded + s.Leases.Requested
	}
	return n
}

func closeAll(nodes []*cluster.Node) {
	for _, n := range nodes {
		n.Close()
	}
}

func writeHeapProfile(name string) {
	f, err := os.Create(name)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		log.Fatal(err)
	}
}

// peerBatches counts the batches the nodes send to their peers.
type peerBatches struct {
	batches, items, failed, nanos atomic.Int64
}

func (p *peerBatches) observe(_ string, items int, took time.Duration, err error) {
	p.batches.Add(1)
	p.items.Add(int64(items))
	p.nanos.Add(int64(took))
	if err != nil {
		p.failed.Add(1)
	}
}

// report prints the counts since the last report and resets them.
func (p *peerBatches) report() {
	b, it, f, ns := p.batches.Swap(0), p.items.Swap(0), p.failed.Swap(0), p.nanos.Swap(0)
	fmt.Printf("%-10s %10d batches to peers, %.1f checks and %v per batch, %d failed\n", "", b,
		float64(it)/float64(max(b, 1)), (time.Duration(ns) / time.Duration(max(b, 1))).Round(time.Microsecond), f)
}

type result struct {
	checks, errors int
	elapsed        time.Duration
	lat            histogram
	// CPU time (user and system), heap bytes allocated and garbage
	// collections during the run, in the whole process.
	cpu        time.Duration
	allocBytes uint64
	gcs        uint32
}

// histogram counts latencies in log-linear buckets: exact below 64 ns,
// then 64 buckets per power of two, so that a bucket is at most 1/64 of
// its values wide. Each caller has its own; they are merged at the end.
type histogram struct {
	counts [64 << subBits]uint64
	n      int
}

const subBits = 6

func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < 1<<subBits {
		return int(v)
	}
	e := bits.Len64(v) - subBits // >= 1
	return e<<subBits | int(v>>(e-1))&(1<<subBits-1)
}

// upper returns the largest duration in bucket i.
func upper(i int) time.Duration {
	e, m := i>>subBits, uint64(i&(1<<subBits-1))
	if e == 0 {
		return time.Duration(m)
	}
	return time.Duration((1<<subBits+m+1)<<(e-1) - 1)
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.n++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the upper bound of the bucket that holds the q-quantile.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(min(h.n-1, int(q*float64(h.n))))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return upper(i)
		}
	}
	return upper(len(h.counts) - 1)
}

// run makes checks of tmpl (its Key replaced when keys > 1) and counts as
// errors the checks that failed, were denied or were decided without owner.
func run(nodes []*cluster.Node, callers, keys int, d time.Duration, maxChecks int, tmpl limiter.Request) result {
	names := keyNames(keys)
	if keys == 1 && tmpl.Key != "" {
		names[0] = tmpl.Key
	}
	return drive(callers, d, maxChecks, func(ctx context.Context, rng *rand.Rand) bool {
		req := tmpl
		req.Key = names[rng.IntN(keys)]
		dec, err := nodes[rng.IntN(len(nodes))].Check(ctx, req)
		return err == nil && dec.Allowed && !dec.WithoutOwner
	})
}

// keyNames are the names of n client keys.
func keyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "client:" + strconv.Itoa(i)
	}
	return names
}

// drive runs callers goroutines, each calling check over and over with a
// random source of its own, for d or at most maxChecks calls in all, and
// returns the calls' latencies; a call that returns false is an error.
func drive(callers int, d time.Duration, maxChecks int, check func(ctx context.Context, rng *rand.Rand) bool) result {
	perCaller := maxChecks / callers
	lats := make([]histogram, callers)
	errs := make([]int, callers)
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	r := measure(func() {
		for c := range callers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(c), 7))
				ctx := context.Background()
				h := &lats[c]
				for i := 0; i < perCaller; i++ {
					if i%64 == 0 && time.Now().After(stop) {
						break
					}
					t0 := time.Now()
					ok := check(ctx, rng)
					h.record(time.Since(t0))
					if !ok {
						errs[c]++
					}
				}
			})
		}
		wg.Wait()
	})
	for c := range callers {
		r.lat.merge(&lats[c])
		r.errors += errs[c]
	}
	r.checks = r.lat.n
	return r
}

// measure runs f and returns the time, CPU time, heap bytes allocated and
// garbage collections it took, in the whole process.
func measure(f func()) result {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime()
	start := time.Now()
	f()
	r := result{elapsed: time.Since(start), cpu: cpuTime() - cpu0}
	runtime.ReadMemStats(&after)
	r.allocBytes, r.gcs = after.TotalAlloc-before.TotalAlloc, after.NumGC-before.NumGC
	return r
}

// cpuTime returns the CPU time the process has used, or 0 if unknown.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func report(name string, r result, cost bool) { reportAs(name, "check", r, cost) }

// reportAs prints r, whose operations are each a unit.
func reportAs(name, unit string, r result, cost bool) {
	q := func(p float64) time.Duration { return round(r.lat.quantile(p)) }
	fmt.Printf("%-10s %10.0f %s/s  p50 %-9v p99 %-9v p99.9 %-9v (%d %s, %d errors or denials)\n",
		name, float64(r.checks)/r.elapsed.Seconds(), unit+"s", q(0.50), q(0.99), q(0.999), r.checks, unit+"s", r.errors)
	if cost {
		n := float64(max(r.checks, 1))
		fmt.Printf("%-10s %10.2f µs of CPU per %s (%.0f%% of a core), %.0f heap bytes per %s, %d GCs\n", "",
			float64(r.cpu.Microseconds())/n, unit, 100*r.cpu.Seconds()/r.elapsed.Seconds(), float64(r.allocBytes)/n, unit, r.gcs)
	}
}

// peerTimeout is -peer-timeout.
var peerTimeout time.Duration

func start(n, inflight int, batches *peerBatches, lease cluster.LeaseConfig) ([]*cluster.Node, error) {
	return startIn(n, inflight, batches, lease, nil)
}

// startIn starts n nodes as start does, node i with data directory
// dirs[i] when dirs is not nil.
func startIn(n, inflight int, batches *peerBatches, lease cluster.LeaseConfig, dirs []string) ([]*cluster.Node, error) {
	return startWith(n, func(i int) cluster.Config {
		cfg := cluster.DefaultConfig()
		cfg.NodeName = fmt.Sprintf("bench-%d", i)
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.GossipAddr = "127.0.0.1:0"
		cfg.BootstrapExpect = n // the n nodes form the cluster together
		cfg.GRPCAddr = "127.0.0.1:0"
		cfg.Peer.MaxInFlight = inflight
		if peerTimeout > 0 {
			cfg.Peer.Timeout, cfg.HandoverTimeout = peerTimeout, peerTimeout
		}
		cfg.Peer.Observer = batches.observe
		if lease.Threshold > 0 {
			cfg.Lease = lease
		}
		if dirs != nil {
			cfg.DataDir = dirs[i]
		}
		return cfg
	})
}

// persistRuns runs the keys workload on clusters without and with a data
// directory per node, alternately, twice each, and reports the bytes the
// directories hold per key at the end.
func persistRuns(n, inflight int, batches *peerBatches, lease cluster.LeaseConfig, callers, keys int, d time.Duration, maxChecks int, cost bool) error {
	fmt.Printf("GOMAXPROCS %d, %d nodes, %d callers, %d keys, token bucket never limited, %v per run, persist_interval %v\n",
		runtime.GOMAXPROCS(0), n, callers, keys, d, cluster.DefaultConfig().PersistInterval)
	daily := unlimited
	daily.Period, daily.Algorithm = 24*time.Hour, limiter.FixedWindow
	for round := range 8 {
		// The standard workload's token buckets are full again within a
		// nanosecond and are never written; a daily fixed window lasts
		// the day and is. Each pair runs
		// memory, data_dir, data_dir, memory.
		req, workload := unlimited, "standard"
		if round >= 4 {
			req, workload = daily, "daily"
		}
		var dirs []string
		name := workload + " memory"
		if round%4 == 1 || round%4 == 2 {
			name = workload + " data_dir"
			for i := range n {
				dir, err := os.MkdirTemp("", fmt.Sprintf("sluice-bench-%d-", i))
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				dirs = append(dirs, dir)
			}
		}
		cl, err := startIn(n, inflight, batches, lease, dirs)
		if err != nil {
			return err
		}
		report(name, run(cl, callers, keys, d, maxChecks, req), cost)
		var written int64
		for _, nd := range cl {
			written += nd.Stats().Persist.Written
		}
		closeAll(cl)
		if dirs != nil {
			var size int64
			held := 0
			for _, dir := range dirs {
				entries, _ := os.ReadDir(dir)
				for _, e := range entries {
					if info, err := e.Info(); err == nil && e.Name() != "LOCK" {
						size += info.Size()
					}
				}
				states, err := cluster.ReadDataDir(dir)
				if err != nil {
					return err
				}
				held += len(states)
			}
			fmt.Printf("%-10s %10d states written while running; after Close, %d bytes on disk holding %d key states (owned and replicated), %.1f bytes per state\n",
				"", written, size, held, float64(size)/float64(max(held, 1)))
		}
	}
	return nil
}

// startWith starts n nodes with the configs of config, joined to the first,
// and waits until every node's ring holds all of them.
func startWith(n int, config func(i int) cluster.Config) ([]*cluster.Node, error) {
	var nodes []*cluster.Node
	for i := range n {
		cfg := config(i)
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		nd, err := cluster.New(cfg)
		if err != nil {
			return nodes, err
		}
		nodes = append(nodes, nd)
	}
	return nodes, waitMembers(nodes, n)
}

// waitMembers polls until every node's ring holds n members, and every
// node is ready and has every member's hand-over confirmation.
func waitMembers(nodes []*cluster.Node, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		for _, nd := range nodes {
			done = done && len(nd.RingMembers()) == n && nd.Ready() && len(nd.Unconfirmed()) == 0
		}
		if done {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("cluster did not converge to %d members in 30s", n)
}

// round keeps three significant digits of sub-millisecond latencies.
func round(d time.Duration) time.Duration {
	if d < time.Microsecond {
		return d.Round(10 * time.Nanosecond)
	}
	return d.Round(time.Microsecond)
}
