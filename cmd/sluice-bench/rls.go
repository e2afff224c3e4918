package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// set makes r the request of descriptor key=value in domain.
func (r *rlsRequest) set(domain, key, value string) *rlsv3.RateLimitRequest {
	r.entry.Key, r.entry.Value = key, value
	r.entries[0] = &r.entry
	r.desc.Entries = r.entries[:]
	r.descs[0] = &r.desc
	r.req.Domain, r.req.Descriptors = domain, r.descs[:]
	return &r.req
}

// rlsBench drives each target in turn, rounds times, with callers
// calling unary ShouldRateLimit on conns gRPC connections, one
// descriptor (key, one of keys values) of domain per call, for d after a
// warm-up of warm. It prints checks/s, latencies and the targets'
// server CPU per check; a call that fails or is not OK is an error, and the first error of
// a run is printed, with the count of the calls failed of each gRPC code.
func rlsBench(targets []rlsTarget, domain, key string, callers, conns, keys, rounds int, d, warm time.Duration, maxChecks int) error {
	values := make([]string, keys)
	for i := range values {
		values[i] = "u" + strconv.Itoa(i)
	}
	fmt.Printf("%d callers on %d connection(s), domain %q, descriptor key %q with %d values, %v per run after %v of warm-up\n",
		callers, conns, domain, key, keys, d, warm)
	fmt.Printf("%-12s %10s %9s %9s %9s %14s %14s %8s\n", "target", "checks/s", "p50", "p99", "p99.9", "server µs/ck", "client µs/ck", "errors")
	for n := range rounds {
		for _, t := range targets {
			ccs := make([]*grpc.ClientConn, conns)
			clients := make([]rlsv3.RateLimitServiceClient, conns)
			for i := range ccs {
				cc, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return err
				}
				ccs[i], clients[i] = cc, rlsv3.NewRateLimitServiceClient(cc)
			}
			var firstErr atomic.Pointer[string]
			var byCode [codes.Unauthenticated + 1]atomic.Int64
			check := func(ctx context.Context, rng *rand.Rand) bool {
				c := clients[rng.IntN(conns)]
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				req := rlsRequests.Get().(*rlsRequest)
				defer rlsRequests.Put(req)
				resp, err := c.ShouldRateLimit(ctx, req.set(domain, key, values[rng.IntN(keys)]))
				if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("overall code %v", resp.OverallCode)
				}
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
					for _, cc := range ccs {
						cc.Close()
					}
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
			for _, cc := range ccs {
				cc.Close()
			}
			if err := errors.Join(err0, err1); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			q := func(p float64) time.Duration { return round(r.lat.quantile(p)) }
			fmt.Printf("%-12s %10.0f %9v %9v %9v %14.1f %14.1f %8d   (round %d)\n", t.name,
				float64(r.checks)/r.elapsed.Seconds(), q(0.5), q(0.99), q(0.999),
				float64((cpu1-cpu0).Microseconds())/float64(max(r.checks, 1)),
				float64(r.cpu.Microseconds())/float64(max(r.checks, 1)), r.errors, n+1)
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
