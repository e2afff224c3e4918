package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limiter"
)

// rlsTarget is a running rate limit service measured by rlsBench: its
// address and the processes whose CPU time is its cost.
type rlsTarget struct {
	name string
	addr string
	pids []int
}

// parseRLSTargets reads name=host:port@pid[+pid...] targets, separated
// by commas.
func parseRLSTargets(s string) ([]rlsTarget, error) {
	var ts []rlsTarget
	for f := range strings.SplitSeq(s, ",") {
		name, rest, ok1 := strings.Cut(f, "=")
		addr, pids, ok2 := strings.Cut(rest, "@")
		if !ok1 || !ok2 || name == "" || addr == "" {
			return nil, fmt.Errorf("rls target %q: want name=host:port@pid[+pid...]", f)
		}
		t := rlsTarget{name: name, addr: addr}
		for p := range strings.SplitSeq(pids, "+") {
			pid, err := strconv.Atoi(p)
			if err != nil || pid < 1 {
				return nil, fmt.Errorf("rls target %q: pid %q", f, p)
			}
			t.pids = append(t.pids, pid)
		}
		ts = append(ts, t)
	}
	if len(ts) == 0 {
		return nil, errors.New("no rls target")
	}
	return ts, nil
}

// procCPU returns the CPU time (user and system) process pid has used,
// from /proc/pid/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// clockTick is USER_HZ, the unit of /proc/pid/stat's times: 100 on every
// Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// parseProcStat returns utime+stime of a /proc/pid/stat line. The
// command name, in parentheses, may hold spaces and parentheses: the
// fields are counted from the last ')'.
func parseProcStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	// After ')' come state (field 3) ... utime (14) and stime (15).
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("proc stat: too few fields")
	}
	var total int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("proc stat: time %q", v)
		}
		total += n
	}
	return time.Duration(total) * clockTick, nil
}

func procsCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

// rlsRequest is a request of one descriptor of one entry, reused from
// call to call (gRPC has encoded it when the call returns), so that the
// load generator, which shares the machine with the services, spends
// less on building requests.
type rlsRequest struct {
	req     rlsv3.RateLimitRequest
	descs   [1]*rlcommon.RateLimitDescriptor
	desc    rlcommon.RateLimitDescriptor
	entries [1]*rlcommon.RateLimitDescriptor_Entry
	entry   rlcommon.RateLimitDescriptor_Entry
}

var rlsRequests = sync.Pool{New: func() any { return new(rlsRequest) }}

// set makes r the request of descriptor key=value in domain, the one
// rlsRequestOf builds.
func (r *rlsRequest) set(domain, key, value string) *rlsv3.RateLimitRequest {
	r.entry.Key, r.entry.Value = key, value
	r.entries[0] = &r.entry
	r.desc.Entries = r.entries[:]
	r.descs[0] = &r.desc
	r.req.Domain, r.req.Descriptors, r.req.HitsAddend = domain, r.descs[:], 1
	return &r.req
}

// rlsBench drives each target in turn, rounds times, with callers
// calling unary ShouldRateLimit on conns gRPC connections, one
// descriptor (key, one of keys values) of domain per call, for d after a
// warm-up of warm. It prints checks/s, latencies and the targets'
// server CPU per check; a call that fails or is not OK is an error, and the first error of
// a run is printed, with the count of the calls failed of each gRPC code.
//
// api chooses the API called: "envoy", ShouldRateLimit; "grpc", sluice's
// native Check (the client package, on conns connections); "http", POST
// /v1/check on keep-alive connections (t.addr is then the HTTP address).
// The native checks carry the limit of the domain file the script
// serves: a fixed window of a second, 1,000,000 hits, never reached.
//
// loadgen chooses the client of the envoy API: "grpc", grpc-go's (with
// go-control-plane's stubs); "h2", the client of h2.go on HTTP/2 frames,
// which sends the same requests for less of the machine's CPU.
func rlsBench(targets []rlsTarget, api, loadgen, domain, key string, callers, conns, keys, rounds int, d, warm time.Duration, maxChecks int) error {
	values := make([]string, keys)
	for i := range values {
		values[i] = "u" + strconv.Itoa(i)
	}
	if api != "envoy" {
		loadgen = "grpc"
	}
	fmt.Printf("%d callers of API %s (load generator %s) on %d connection(s), domain %q, descriptor key %q with %d values, %v per run after %v of warm-up\n",
		callers, api, loadgen, conns, domain, key, keys, d, warm)
	fmt.Printf("%-12s %10s %9s %9s %9s %14s %14s %8s\n", "target", "checks/s", "p50", "p99", "p99.9", "server µs/ck", "client µs/ck", "errors")
	for n := range rounds {
		for _, t := range targets {
			call, closeAll, err := newAPICaller(api, loadgen, t.addr, domain, key, values, conns, callers)
			if err != nil {
				return err
			}
			var firstErr atomic.Pointer[string]
			var byCode [codes.Unauthenticated + 1]atomic.Int64
			check := func(ctx context.Context, rng *rand.Rand) bool {
				err := call(ctx, rng, rng.IntN(keys))
				if err != nil {
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					if c := status.Code(err); c != codes.OK && int(c) < len(byCode) {
						byCode[c].Add(1)
					}
				}
				return err == nil
			}
			if warm > 0 {
				if r := drive(callers, warm, maxChecks, check); r.checks == r.errors {
					closeAll()
					return fmt.Errorf("%s at %s: every warm-up call failed", t.name, t.addr)
				}
			}
			firstErr.Store(nil) // the run's, not the warm-up's
			for i := range byCode {
				byCode[i].Store(0)
			}
			cpu0, err0 := procsCPU(t.pids)
			r := drive(callers, d, maxChecks, check)
			cpu1, err1 := procsCPU(t.pids)
			closeAll()
			if err := errors.Join(err0, err1); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			q := func(p float64) time.Duration { return round(r.lat.quantile(p)) }
			fmt.Printf("%-12s %10.0f %9v %9v %9v %14.1f %14.1f %8d   (round %d, load average %s)\n", t.name,
				float64(r.checks)/r.elapsed.Seconds(), q(0.5), q(0.99), q(0.999),
				float64((cpu1-cpu0).Microseconds())/float64(max(r.checks, 1)),
				float64(r.cpu.Microseconds())/float64(max(r.checks, 1)), r.errors, n+1, loadAverage())
			if e := firstErr.Swap(nil); e != nil && r.errors > 0 {
				fmt.Printf("%-12s first error: %s\n", "", *e)
				var counts []string
				for c := range byCode {
					if n := byCode[c].Swap(0); n > 0 {
						counts = append(counts, fmt.Sprintf("%v %d", codes.Code(c), n))
					}
				}
				if len(counts) > 0 {
					fmt.Printf("%-12s failed: %s\n", "", strings.Join(counts, ", "))
				}
			}
		}
	}
	return nil
}

// newAPICaller returns the call of one check of values[i] through api
// with loadgen (see rlsBench) at addr, and what closes its connections.
// Each call times out after rlsCallTimeout.
func newAPICaller(api, loadgen, addr, domain, key string, values []string, conns, callers int) (call func(ctx context.Context, rng *rand.Rand, i int) error, closeAll func(), err error) {
	switch {
	case api == "envoy" && loadgen == "h2":
		bodies, err := rlsBodies(domain, key, values)
		if err != nil {
			return nil, nil, err
		}
		c, err := dialH2(addr, conns)
		if err != nil {
			return nil, nil, err
		}
		call = func(_ context.Context, rng *rand.Rand, i int) error {
			code, err := c.call(rng.IntN(conns), bodies[i])
			if err == nil && code != rlsv3.RateLimitResponse_OK {
				err = fmt.Errorf("overall code %v", code)
			}
			return err
		}
		return call, c.Close, nil
	case api == "envoy" && loadgen == "grpc":
		ccs := make([]*grpc.ClientConn, conns)
		clients := make([]rlsv3.RateLimitServiceClient, conns)
		for i := range ccs {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, nil, err
			}
			ccs[i], clients[i] = cc, rlsv3.NewRateLimitServiceClient(cc)
		}
		call = func(ctx context.Context, rng *rand.Rand, i int) error {
			ctx, cancel := context.WithTimeout(ctx, rlsCallTimeout)
			defer cancel()
			req := rlsRequests.Get().(*rlsRequest)
			defer rlsRequests.Put(req)
			resp, err := clients[rng.IntN(conns)].ShouldRateLimit(ctx, req.set(domain, key, values[i]))
			if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
				err = fmt.Errorf("overall code %v", resp.OverallCode)
			}
			return err
		}
		return call, func() {
			for _, cc := range ccs {
				cc.Close()
			}
		}, nil
	case api == "envoy":
		return nil, nil, fmt.Errorf("unknown load generator %q: want grpc or h2", loadgen)
	case api == "grpc":
		cs := make([]*client.Client, conns)
		for i := range cs {
			c, err := client.New(addr)
			if err != nil {
				return nil, nil, err
			}
			cs[i] = c
		}
		call = func(ctx context.Context, rng *rand.Rand, i int) error {
			ctx, cancel := context.WithTimeout(ctx, rlsCallTimeout)
			defer cancel()
			r := nativeRequest
			r.Name, r.Key = domain, values[i]
			d, err := cs[rng.IntN(conns)].Check(ctx, r)
			if err == nil && !d.Allowed {
				err = errors.New("denied")
			}
			return err
		}
		return call, func() {
			for _, c := range cs {
				c.Close()
			}
		}, nil
	case api == "http":
		tr := &http.Transport{MaxIdleConnsPerHost: callers}
		hc := &http.Client{Transport: tr}
		url := "http://" + addr + "/v1/check"
		prefix := `{"name":` + strconv.Quote(domain) + `,"key":`
		suffix := `,"limit":1000000,"period":"1s","algorithm":"fixed_window"}`
		call = func(ctx context.Context, _ *rand.Rand, i int) error {
			ctx, cancel := context.WithTimeout(ctx, rlsCallTimeout)
			defer cancel()
			body := prefix + strconv.Quote(values[i]) + suffix
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			out, err := io.ReadAll(resp.Body)
			switch {
			case err != nil:
				return err
			case resp.StatusCode != http.StatusOK:
				return fmt.Errorf("status %d: %s", resp.StatusCode, out)
			case !bytes.Contains(out, []byte(`"allowed":true`)):
				return fmt.Errorf("denied: %s", out)
			}
			return nil
		}
		return call, tr.CloseIdleConnections, nil
	}
	return nil, nil, fmt.Errorf("unknown api %q: want envoy, grpc or http", api)
}

// rlsCallTimeout bounds each call of the load generators.
const rlsCallTimeout = h2CallTimeout

// nativeRequest is the check of the native APIs: the limit of the domain
// file of bench/envoy-vs-ratelimit.sh.
var nativeRequest = limiter.Request{Hits: 1, Limit: 1_000_000, Period: time.Second, Algorithm: limiter.FixedWindow}

// loadAverage returns the one-minute load average of /proc/loadavg, or
// "?" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}
