package redislimit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

// longRequest is a request of limit 100 whose state does not drain while
// a test runs: a period of limiter.MaxPeriod.
func longRequest(algo limiter.Algorithm, key string) limiter.Request {
	return limiter.Request{Name: "exact", Key: key, Hits: 1, Limit: 100, Period: limiter.MaxPeriod, Algorithm: algo}
}

// admitConcurrently sends 64 callers, spread over limiters, at req, 10
// checks each, and returns how many were admitted; it fails t on an error
// or a decision Redis did not make.
func admitConcurrently(t *testing.T, limiters []*Limiter, req limiter.Request) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := limiters[g%len(limiters)]
			for range 10 {
				d, err := l.Check(context.Background(), req)
				switch {
				case err != nil:
					errs <- err
					return
				case d.WithoutOwner:
					errs <- errors.New("a decision without Redis")
					return
				case d.Allowed:
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: %v", req.Algorithm, err)
	}
	return admitted.Load()
}

// TestExactUnderConcurrency: 64 callers on one key, over three limiters
// (three instances, each with its own connections), admit exactly the
// limit, every algorithm, on the server's clock.
func TestExactUnderConcurrency(t *testing.T) {
	srv := testredis.Start(t)
	limiters := []*Limiter{newTestLimiter(t, nil, srv.Addr()), newTestLimiter(t, nil, srv.Addr()), newTestLimiter(t, nil, srv.Addr())}
	prefix := limiters[0].cfg.Prefix
	for _, l := range limiters {
		l.cfg.Prefix = prefix
	}
	for _, algo := range limiter.Algorithms {
		// A key of its own per algorithm: a switch would carry the
		// spent key over (see convert in decide.lua).
		if got := admitConcurrently(t, limiters, longRequest(algo, "one-"+algo.String())); got != 100 {
			t.Errorf("%s: %d of 640 checks admitted, want exactly the limit, 100", algo, got)
		}
	}
}

// TestInvalidRequests: every invalid request is refused with the limiter
// sentinel of its field before Redis is asked (the limiter's Redis does
// not exist), and so are what Redis time cannot decide, a nil context, a
// context that has ended and a closed limiter. CheckMany keeps the order.
func TestInvalidRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	l := newTestLimiter(t, nil, addr)
	valid := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	with := func(f func(r *limiter.Request)) limiter.Request { r := valid; f(&r); return r }
	for _, tc := range []struct {
		name string
		req  limiter.Request
		want []error
	}{
		{"empty key", with(func(r *limiter.Request) { r.Key = "" }), []error{limiter.ErrInvalidKey}},
		{"long name", with(func(r *limiter.Request) { r.Name = strings.Repeat("n", limiter.MaxNameLen+1) }), []error{limiter.ErrInvalidName}},
		{"zero limit", with(func(r *limiter.Request) { r.Limit = 0 }), []error{limiter.ErrInvalidLimit}},
		{"negative hits", with(func(r *limiter.Request) { r.Hits = -1 }), []error{limiter.ErrInvalidHits}},
		{"hits over capacity", with(func(r *limiter.Request) { r.Hits = 11 }), []error{limiter.ErrHitsExceedLimit}},
		{"no algorithm", with(func(r *limiter.Request) { r.Algorithm = 0 }), []error{limiter.ErrUnknownAlgorithm}},
		{"calendar on a bucket", with(func(r *limiter.Request) { r.Calendar = limiter.Day }), []error{limiter.ErrInvalidCalendar}},
		{"sub-microsecond period", with(func(r *limiter.Request) { r.Period = time.Millisecond + 1 }), []error{ErrUnsupported, limiter.ErrInvalidPeriod}},
		{"GCRA faster than 1/us", with(func(r *limiter.Request) {
			r.Algorithm, r.Limit, r.Period, r.Hits = limiter.GCRA, 2000, time.Millisecond, 1
		}), []error{ErrUnsupported, limiter.ErrInvalidLimit}},
	} {
		_, err := l.Check(context.Background(), tc.req)
		for _, w := range tc.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: error %v, want one wrapping %v", tc.name, err, w)
			}
		}
	}
	if l.WithoutOwner() != 0 {
		t.Errorf("%d invalid requests went to the policy", l.WithoutOwner())
	}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := l.Check(nil, valid); !errors.Is(err, sluice.ErrNilContext) { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Check(ctx, valid); !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: %v", err)
	}
	res := l.CheckMany(context.Background(), []limiter.Request{with(func(r *limiter.Request) { r.Limit = 0 }), valid})
	if !errors.Is(res[0].Err, limiter.ErrInvalidLimit) || res[1].Err != nil || !res[1].WithoutOwner {
		t.Errorf("CheckMany of an invalid and a valid request: %+v", res)
	}
	l.Close()
	l.Close()
	if _, err := l.Check(context.Background(), valid); !errors.Is(err, ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}

// TestConfigValidate: each invalid field is named; New refuses it.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(c *Config)
	}{
		{"no address", func(c *Config) { c.Addrs = nil }},
		{"empty address", func(c *Config) { c.Addrs = []string{""} }},
		{"zero timeout", func(c *Config) { c.Timeout = 0 }},
		{"default policy", func(c *Config) { c.Unreachable = sluice.PolicyDefault }},
		{"unknown policy", func(c *Config) { c.Unreachable = 9 }},
		{"zero threshold", func(c *Config) { c.BreakerThreshold = 0 }},
		{"zero cooldown", func(c *Config) { c.BreakerCooldown = 0 }},
		{"long prefix", func(c *Config) { c.Prefix = strings.Repeat("p", MaxPrefixLen+1) }},
		{"hash tag in prefix", func(c *Config) { c.Prefix = "{sluice}:" }},
		{"open brace in prefix", func(c *Config) { c.Prefix = "a{" }},
		{"closing brace in prefix", func(c *Config) { c.Prefix = "a}" }},
		{"bad local store", func(c *Config) { c.Local.Shards = 3 }},
		{"negative cache", func(c *Config) { c.OverLimitCache = -1 }},
		{"huge cache", func(c *Config) { c.OverLimitCache = MaxOverLimitCache + 1 }},
	} {
		cfg := DefaultConfig()
		tc.f(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}

// TestKeys: distinct (name, key) pairs make distinct Redis keys whatever
// bytes they hold, and the hash tag is the whole pair.
func TestKeys(t *testing.T) {
	seen := map[string][2]string{}
	for _, p := range [][2]string{
		{"a", "b:c"}, {"a:b", "c"}, {"a", "{b}"}, {"a}", "b"}, {"a", "%7B"}, {"a", "{"}, {"a%", "b"}, {"a", "%b"}, {"ä", "b"},
	} {
		k := Key("p:", p[0], p[1])
		if prev, dup := seen[k]; dup {
			t.Errorf("%q and %q both make key %q", prev, p, k)
		}
		seen[k] = p
		open, closing := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if open != len("p:") || closing != len(k)-1 || strings.Count(k, "{")+strings.Count(k, "}") != 2 {
			t.Errorf("key %q of %q: the hash tag is not the whole pair", k, p)
		}
	}
}

// startWithLimiter starts a redis-server and returns it, a Limiter on it
// and a plain client of it, all stopped when t ends.
func startWithLimiter(t *testing.T) (*testredis.Server, *Limiter, *redis.Client) {
	t.Helper()
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return srv, newTestLimiter(t, nil, srv.Addr()), rdb
}

// TestBoundedKeys: every key expires when its state is fresh again, and a
// decision that leaves it fresh deletes it; a sliding window log holds at
// most limiter.MaxLogEntries entries however many instants it sees, and
// admits no more than the limit.
func TestBoundedKeys(t *testing.T) {
	srv, l, rdb := startWithLimiter(t)
	ctx := context.Background()
	for _, algo := range limiter.Algorithms {
		req := limiter.Request{Name: "ttl", Key: algo.String(), Hits: 1, Limit: 10, Period: 10 * time.Second, Algorithm: algo}
		d, err := l.Check(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", algo, d, err)
		}
		key := Key(l.cfg.Prefix, req.Name, req.Key)
		ttl, err := rdb.PTTL(ctx, key).Result()
		// The state is fresh at ResetAt, at most two periods on (the
		// sliding window counter's); the key's TTL ends there, to the
		// millisecond.
		if err != nil || ttl <= 0 || ttl > 20*time.Second {
			t.Errorf("%s: PTTL %v, %v: want a TTL within two periods", algo, ttl, err)
		}
		if until := time.Until(d.ResetAt); ttl < until-time.Second || ttl > until+time.Second {
			t.Errorf("%s: PTTL %v, but the state is fresh in %v", algo, ttl, until)
		}
		req.Behavior = limiter.Refund
		if _, err := l.Check(ctx, req); err != nil {
			t.Fatal(err)
		}
		if n := rdb.Exists(ctx, key).Val(); n != 0 && algo != limiter.SlidingWindowCounter && algo != limiter.FixedWindow {
			// The windows keep a window start with no hits until the
			// window ends; the others are fresh after the refund.
			t.Errorf("%s: the key is still there after a refund left it fresh", algo)
		}
	}

	// The log: 5000 distinct instants of one hit each in one period.
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	tl := newTestLimiter(t, clock, srv.Addr())
	req := limiter.Request{Name: "log", Key: "k", Hits: 1, Limit: 4500, Period: time.Hour, Algorithm: limiter.SlidingWindowLog}
	key := Key(tl.cfg.Prefix, req.Name, req.Key)
	admitted := 0
	for range 5000 {
		clock.now = clock.now.Add(time.Millisecond + 7*time.Microsecond)
		d, err := tl.Check(ctx, req)
		if err != nil || d.WithoutOwner {
			t.Fatalf("%+v, %v", d, err)
		}
		if d.Allowed {
			admitted++
		}
		if n := rdb.StrLen(ctx, key).Val(); n > 34+limiter.MaxLogEntries*16 {
			t.Fatalf("the log is %d bytes, more than %d entries", n, limiter.MaxLogEntries)
		}
	}
	if admitted != 4500 {
		t.Errorf("the log admitted %d in one period, want the limit, 4500", admitted)
	}
	// A quarter period after the first hits, the coarsened log still
	// counts them (later than exactly, never earlier): nothing admitted.
	clock.now = clock.now.Add(time.Minute)
	if d, _ := tl.Check(ctx, req); d.Allowed {
		t.Errorf("a coarsened log admitted before its oldest hits expired: %+v", d)
	}
}

// TestScriptReloaded: after SCRIPT FLUSH (a restart, a failover) the
// script is sent again and decides; no decision falls to the policy.
func TestScriptReloaded(t *testing.T) {
	_, l, rdb := startWithLimiter(t)
	ctx := context.Background()
	req := longRequest(limiter.FixedWindow, "flush")
	for i := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Check(ctx, req)
		if err != nil || d.WithoutOwner || d.Remaining != int64(99-i) {
			t.Fatalf("check %d after SCRIPT FLUSH: %+v, %v", i, d, err)
		}
	}
	// A pipeline of checks, each answered NOSCRIPT, then sent by EVAL.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i, r := range l.CheckMany(ctx, []limiter.Request{req, req, req}) {
		if r.Err != nil || r.WithoutOwner || r.Remaining != int64(96-i) {
			t.Fatalf("CheckMany %d after SCRIPT FLUSH: %+v", i, r)
		}
	}
}

// TestBadState: a key holding what this package did not write (another
// program's string, a list) is an error of that request, named, and not a
// Redis failure: the rest of the batch is decided.
func TestBadState(t *testing.T) {
	_, l, rdb := startWithLimiter(t)
	ctx := context.Background()
	str, list, good := longRequest(limiter.GCRA, "str"), longRequest(limiter.GCRA, "list"), longRequest(limiter.GCRA, "good")
	rdb.Set(ctx, Key(l.cfg.Prefix, str.Name, str.Key), "not a state", 0)
	rdb.RPush(ctx, Key(l.cfg.Prefix, list.Name, list.Key), "x")
	// Format version 1 as this package writes it, with what it never
	// writes: a NaN expiry, an unknown algorithm, a log longer than it
	// says, a log count past MaxLogEntries.
	state := func(algo byte, words ...float64) string {
		b := []byte{1, algo}
		for _, w := range words {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(w))
		}
		return string(b)
	}
	version2 := func(v string) string { return "\x02" + v[1:] }
	crafted := []string{
		state(byte(limiter.GCRA), math.NaN(), 1, 1, 0),
		state(9, 2e15, 1, 1, 0),
		state(byte(limiter.SlidingWindowLog), 2e15, 0, 1, 0) + "0123456789abcdef0123456789abcdef",
		state(byte(limiter.SlidingWindowLog), 2e15, 0, 1e9, 0),
		// Format version 2, with a rate no request has: a NaN Limit, a
		// capacity of 0, a Period of 0, an unknown calendar unit, a
		// calendar on another algorithm than a fixed window's; and a
		// version 2 state without its rate.
		version2(state(byte(limiter.GCRA), 2e15, 1, 1, 0, math.NaN(), 1, 1e6, 0)),
		version2(state(byte(limiter.GCRA), 2e15, 1, 1, 0, 1, 0, 1e6, 0)),
		version2(state(byte(limiter.GCRA), 2e15, 1, 1, 0, 1, 1, 0, 0)),
		version2(state(byte(limiter.FixedWindow), 2e15, 1, 1, 0, 1, 1, -9, 0)),
		version2(state(byte(limiter.GCRA), 2e15, 1, 1, 0, 1, 1, -1, 0)),           // a calendar on GCRA
		version2(state(byte(limiter.FixedWindow), 2e15, 3e15, 1, 0, 1, 1, -1, 0)), // a window ending before it starts
		version2(state(byte(limiter.GCRA), 2e15, 1, 1, 0)),
	}
	reqs := []limiter.Request{str, list}
	for i, v := range crafted {
		r := longRequest(limiter.GCRA, fmt.Sprintf("crafted%d", i))
		rdb.Set(ctx, Key(l.cfg.Prefix, r.Name, r.Key), v, 0)
		reqs = append(reqs, r)
	}
	res := l.CheckMany(ctx, append(reqs, good))
	for i := range reqs {
		if !errors.Is(res[i].Err, ErrBadState) {
			t.Errorf("request %d: %+v, want ErrBadState", i, res[i])
		}
	}
	if r := res[len(reqs)]; r.Err != nil || r.WithoutOwner || !r.Allowed {
		t.Errorf("the good request beside them: %+v", r)
	}
	if b := l.breakerFor(""); !b.Closed() || b.Failures() != 0 {
		t.Errorf("bad states counted as %d Redis failures", b.Failures())
	}
}

// TestCalendarAcrossClocks: with this process's clock an hour behind the
// server's, a calendar window is still the server's: the first pass
// misses, the script says the server's time, and the second pass counts in
// the window around it.
func TestCalendarAcrossClocks(t *testing.T) {
	srv := testredis.Start(t)
	l := newTestLimiter(t, nil, srv.Addr())
	const skew = -time.Hour
	l.clock = func() time.Time { return time.Now().Add(skew) }
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no zone database: %v", err)
	}
	req := limiter.Request{Name: "cal", Key: "k", Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Calendar: limiter.Minute, Location: tokyo}
	before := time.Now()
	d, err := l.Check(context.Background(), req)
	after := time.Now()
	if err != nil || d.WithoutOwner || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("%+v, %v", d, err)
	}
	// The server's minute ends at end, on the server's clock (this
	// machine's); ResetAt is on the caller's clock, an hour behind, and
	// the time left until it is the server's: ResetAt - skew is end, read
	// up to the time the call took late (the caller reads its clock after
	// the server's), and a millisecond early for the two clocks' grain.
	_, lo := limiter.CalendarWindow(limiter.Minute, tokyo, before)
	_, hi := limiter.CalendarWindow(limiter.Minute, tokyo, after)
	onServer := d.ResetAt.Add(-skew)
	if onServer.Before(lo.Add(-time.Millisecond)) || onServer.After(hi.Add(after.Sub(before))) {
		t.Errorf("ResetAt %v, want the end of the server's minute %v, an hour earlier on the caller's clock", d.ResetAt, lo.Add(skew))
	}
}

// TestGCRAIntervalChange: a change of GCRA's interval reschedules what is
// outstanding at the new interval, rounded up to a microsecond.
func TestGCRAIntervalChange(t *testing.T) {
	srv := testredis.Start(t)
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	l := newTestLimiter(t, clock, srv.Addr())
	ctx := context.Background()
	req := limiter.Request{Name: "gcra", Key: "k", Hits: 5, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	for _, step := range []struct {
		hits, limit   int64
		wantAllowed   bool
		wantRemaining int64
		wantReset     time.Duration // after the first instant
		wantRetry     time.Duration
	}{
		{hits: 5, limit: 10, wantAllowed: true, wantRemaining: 5, wantReset: 500 * time.Millisecond},
		// 5 hits of 100 ms outstanding become 5 of 333334 us: 1666670 us.
		{hits: 1, limit: 3, wantAllowed: false, wantRemaining: 0, wantReset: 1666670 * time.Microsecond,
			wantRetry: 1666670*time.Microsecond - 2*333334*time.Microsecond},
		// Back to 100 ms: 1666670 * 100000 / 333334 = 500000 us, exactly.
		{hits: 0, limit: 10, wantAllowed: true, wantRemaining: 5, wantReset: 500 * time.Millisecond},
	} {
		start := clock.now
		req.Hits, req.Limit = step.hits, step.limit
		d, err := l.Check(ctx, req)
		if err != nil || d.Allowed != step.wantAllowed || d.Remaining != step.wantRemaining ||
			d.ResetAt.Sub(start) != step.wantReset || d.RetryAfter != step.wantRetry {
			t.Fatalf("limit %d hits %d: %+v, %v; want allowed %v remaining %d reset +%v retry %v",
				step.limit, step.hits, d, err, step.wantAllowed, step.wantRemaining, step.wantReset, step.wantRetry)
		}
	}
}

// countingHook counts the calls sent to Redis: commands and pipelines.
type countingHook struct{ calls atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.Add(1)
		return next(ctx, cmds)
	}
}

// TestRedisKilled kills Redis under traffic from 16 callers, for each
// policy: no call errs, every decision during the outage is the policy's
// and says WithoutOwner, the breaker then keeps calls off Redis until its
// cooldown, a probe that fails opens it again, and once Redis is back the
// decisions are Redis's again (its state started empty).
func TestRedisKilled(t *testing.T) {
	for _, policy := range []sluice.Policy{sluice.PolicyLocal, sluice.PolicyAllow, sluice.PolicyDeny} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := testredis.Start(t)
			clock := &testClock{now: time.Now()}
			var mu sync.Mutex // guards clock.now, moved under traffic
			cfg := DefaultConfig()
			cfg.Addrs = []string{srv.Addr()}
			cfg.Timeout = 2 * time.Second
			cfg.Unreachable = policy
			cfg.BreakerThreshold = 3
			cfg.BreakerCooldown = time.Minute
			cfg.Prefix = "kill:"
			l, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			l.clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock.now }
			advance := func(d time.Duration) { mu.Lock(); clock.now = clock.now.Add(d); mu.Unlock() }
			hook := &countingHook{}
			l.client.AddHook(hook)
			ctx := context.Background()
			req := limiter.Request{Name: "kill", Key: "k", Hits: 1, Limit: 3, Period: limiter.MaxPeriod, Algorithm: limiter.FixedWindow}
			d, err := l.Check(ctx, req)
			if err != nil || d.WithoutOwner || d.Remaining != 2 {
				t.Fatalf("before the kill: %+v, %v", d, err)
			}

			var (
				wg                     sync.WaitGroup
				stop                   atomic.Bool
				fromRedis, fromPolicy  atomic.Int64
				localAdmitted, badOnes atomic.Int64
			)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						d, err := l.Check(ctx, req)
						switch {
						case err != nil:
							badOnes.Add(1)
						case !d.WithoutOwner:
							fromRedis.Add(1)
						default:
							fromPolicy.Add(1)
							ok := policy == sluice.PolicyAllow && d.Allowed ||
								policy == sluice.PolicyDeny && !d.Allowed && d.RetryAfter == cfg.DenyRetryAfter ||
								policy == sluice.PolicyLocal
							if !ok {
								badOnes.Add(1)
							}
							if policy == sluice.PolicyLocal && d.Allowed {
								localAdmitted.Add(1)
							}
						}
					}
				}()
			}
			testwait.For(t, "traffic decided by Redis", func() bool { return fromRedis.Load() > 0 })
			srv.Kill()
			testwait.For(t, "the breaker open", func() bool { return fromPolicy.Load() > 100 && !l.breakerFor("").Closed() })
			stop.Store(true)
			wg.Wait()
			if n := badOnes.Load(); n != 0 {
				t.Fatalf("%d calls erred or were decided against the policy %s", n, policy)
			}
			if policy == sluice.PolicyLocal && localAdmitted.Load() != 3 {
				t.Errorf("the local store admitted %d, want its limit, 3", localAdmitted.Load())
			}

			// A call sent before the kill and answered after the breaker
			// opened closes it again (Redis answered it): until the next
			// failures open it, checks go to Redis.
			testwait.For(t, "the breaker open after the traffic", func() bool {
				if l.breakerFor("").Closed() {
					l.Check(ctx, req)
					return false
				}
				return true
			})
			// Open: no call reaches Redis.
			sent := hook.calls.Load()
			for range 20 {
				if d, err := l.Check(ctx, req); err != nil || !d.WithoutOwner {
					t.Fatalf("breaker open: %+v, %v", d, err)
				}
			}
			if n := hook.calls.Load() - sent; n != 0 {
				t.Errorf("%d calls sent while the breaker was open", n)
			}
			// After the cooldown one probe goes out, fails, and reopens.
			advance(cfg.BreakerCooldown)
			for range 5 {
				if d, err := l.Check(ctx, req); err != nil || !d.WithoutOwner {
					t.Fatalf("probe while down: %+v, %v", d, err)
				}
			}
			if n := hook.calls.Load() - sent; n != 1 {
				t.Errorf("%d calls after the cooldown, want one probe", n)
			}

			srv.Restart()
			testwait.For(t, "decisions by Redis again", func() bool {
				advance(cfg.BreakerCooldown)
				d, err := l.Check(ctx, req)
				return err == nil && !d.WithoutOwner
			})
			if d, err := l.Check(ctx, req); err != nil || d.WithoutOwner || d.Remaining != 1 {
				t.Errorf("after recovery, on the restarted (empty) Redis: %+v, %v; want the second hit counted", d, err)
			}
		})
	}
}

// TestClusterExact: on a 3-master Redis Cluster, limit keys spread over
// every master, and 64 callers on three limiters admit exactly the limit
// on one key, every algorithm, also when the script is not loaded yet on
// the key's master.
func TestClusterExact(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	rc := testredis.StartCluster(t, 3, 0)
	limiters := []*Limiter{newTestLimiter(t, nil, rc.Addrs()...), newTestLimiter(t, nil, rc.Addrs()...), newTestLimiter(t, nil, rc.Addrs()...)}
	for _, l := range limiters {
		l.cfg.Prefix = "c:"
	}
	ctx := context.Background()
	// 60 limit keys through CheckMany: one pipeline, split by node.
	var reqs []limiter.Request
	for i := range 60 {
		reqs = append(reqs, longRequest(limiter.TokenBucket, fmt.Sprintf("spread%d", i)))
	}
	for i, r := range limiters[0].CheckMany(ctx, reqs) {
		if r.Err != nil || r.WithoutOwner || !r.Allowed {
			t.Fatalf("CheckMany %d: %+v", i, r)
		}
	}
	cc := limiters[0].client.(*redis.ClusterClient)
	var mu sync.Mutex
	var perMaster []int64
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		mu.Lock()
		perMaster = append(perMaster, n)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(perMaster) != 3 {
		t.Fatalf("%d masters", len(perMaster))
	}
	for _, n := range perMaster {
		if n == 0 {
			t.Errorf("keys per master %v: a master holds none of 60 limit keys", perMaster)
		}
	}
	for _, algo := range limiter.Algorithms {
		if got := admitConcurrently(t, limiters, longRequest(algo, "hot-"+algo.String())); got != 100 {
			t.Errorf("%s: %d of 640 checks admitted on the cluster, want exactly the limit, 100", algo, got)
		}
	}

	// One master killed: a batch over every master is decided by Redis
	// where its master lives, and by the policy only where it died.
	victim := rc.Nodes[0]
	onVictim := map[int]bool{}
	for i, r := range reqs {
		m, err := cc.MasterForKey(ctx, Key(limiters[0].cfg.Prefix, r.Name, r.Key))
		if err != nil {
			t.Fatal(err)
		}
		onVictim[i] = m.Options().Addr == victim.Addr()
	}
	victim.Kill()
	// Each node has its breaker: the dead master's opens after
	// BreakerThreshold failed batches, the others stay closed.
	l := limiters[0]
	for round := range l.cfg.BreakerThreshold + 3 {
		for i, r := range l.CheckMany(ctx, reqs) {
			switch {
			case r.Err != nil:
				t.Fatalf("round %d, CheckMany %d with a master down: %v", round, i, r.Err)
			case onVictim[i] && !r.WithoutOwner:
				t.Fatalf("round %d, CheckMany %d, on the dead master: %+v, want the policy's decision", round, i, r)
			case !onVictim[i] && (r.WithoutOwner || r.Remaining != int64(98-round)):
				t.Fatalf("round %d, CheckMany %d, on a live master: %+v, want Redis's decision, %d remaining", round, i, r, 98-round)
			}
		}
	}
	if l.breakerFor(victim.Addr()).Closed() {
		t.Error("the dead master's breaker is closed")
	}
	for _, s := range rc.Nodes[1:] {
		if !l.breakerFor(s.Addr()).Closed() {
			t.Errorf("the breaker of %s, alive, is open", s.Addr())
		}
	}
}

// TestClusterFailover kills the master of a key under traffic on a Redis
// Cluster of 3 masters with a replica each: while the slot has no master
// the policy (deny) decides and says so, no call errs, and once the
// replica has taken over, Redis decides again from the state the replica
// holds (the hits acknowledged by WAIT are all there).
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster with replicas")
	}
	rc := testredis.StartCluster(t, 3, 1)
	cfg := DefaultConfig()
	cfg.Addrs = rc.Addrs()
	cfg.Timeout = time.Second
	cfg.Unreachable = sluice.PolicyDeny
	cfg.BreakerCooldown = 50 * time.Millisecond
	cfg.Prefix = "fo:"
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	req := longRequest(limiter.FixedWindow, "failover")
	req.Limit = 1000
	for i := range 50 {
		if d, err := l.Check(ctx, req); err != nil || d.WithoutOwner || !d.Allowed {
			t.Fatalf("check %d before the failover: %+v, %v", i, d, err)
		}
	}
	cc := l.client.(*redis.ClusterClient)
	master, err := cc.MasterForKey(ctx, Key(cfg.Prefix, req.Name, req.Key))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the key's replica acknowledging the writes", func() bool {
		n, err := master.Do(ctx, "WAIT", 1, 100).Int()
		return err == nil && n >= 1
	})
	var victim *testredis.Server
	for _, s := range rc.Nodes {
		if s.Addr() == master.Options().Addr {
			victim = s
		}
	}
	if victim == nil {
		t.Fatalf("the key's master %s is none of the nodes started", master.Options().Addr)
	}
	victim.Kill()

	var withoutOwner int
	testwait.For(t, "Redis deciding again after the failover", func() bool {
		d, err := l.Check(ctx, limiter.Request{Name: req.Name, Key: req.Key, Limit: req.Limit, Period: req.Period, Algorithm: req.Algorithm})
		switch {
		case err != nil:
			t.Fatalf("a check during the failover erred: %v", err)
		case d.WithoutOwner:
			withoutOwner++
			if d.Allowed || d.RetryAfter != cfg.DenyRetryAfter {
				t.Fatalf("during the failover, not PolicyDeny's decision: %+v", d)
			}
			return false
		}
		return true
	})
	if withoutOwner == 0 {
		t.Error("no check was decided by the policy while the slot had no master")
	}
	d, err := l.Check(ctx, req)
	if err != nil || d.WithoutOwner || d.Remaining != 1000-51 {
		t.Errorf("after the failover: %+v, %v; want the 50 replicated hits and this one counted, 949 remaining", d, err)
	}
}

// TestOverLimitCache: with the cache on, a key Redis denied is denied
// here until its RetryAfter without a call to Redis, with the RetryAfter
// counting down; then Redis decides again. Other parameters, a behavior,
// or a denial that leaves hits remaining go to Redis; the cache holds at
// most its bound; it is off by default.
func TestOverLimitCache(t *testing.T) {
	srv := testredis.Start(t)
	if l := newTestLimiter(t, nil, srv.Addr()); l.over != nil {
		t.Fatal("the over-limit cache is on by default")
	}
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	cfg := DefaultConfig()
	cfg.Addrs = []string{srv.Addr()}
	cfg.Prefix = "over:"
	cfg.OverLimitCache = 2
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.clock, l.serverNow = clock.read, clock.read
	hook := &countingHook{}
	l.client.AddHook(hook)
	ctx := context.Background()
	req := limiter.Request{Name: "over", Key: "k", Hits: 1, Limit: 2, Period: time.Second, Algorithm: limiter.FixedWindow}
	for range 2 {
		if d, err := l.Check(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	d, err := l.Check(ctx, req)
	if err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("the third check: %+v, %v", d, err)
	}
	sent := hook.calls.Load()
	for i := range 10 {
		clock.now = clock.now.Add(50 * time.Millisecond)
		d, err := l.Check(ctx, req)
		want := time.Second - time.Duration(i+1)*50*time.Millisecond
		if err != nil || d.Allowed || d.RetryAfter != want || d.WithoutOwner {
			t.Fatalf("cached check %d: %+v, %v; want denied, RetryAfter %v", i, d, err, want)
		}
	}
	if n := hook.calls.Load() - sent; n != 0 {
		t.Errorf("%d calls to Redis for a key known to be over its limit", n)
	}
	for _, other := range []limiter.Request{
		{Name: "over", Key: "k", Hits: 1, Limit: 5, Period: time.Second, Algorithm: limiter.FixedWindow},
		{Name: "over", Key: "k", Hits: 1, Limit: 2, Period: time.Second, Algorithm: limiter.FixedWindow, Behavior: limiter.Refund},
	} {
		before := hook.calls.Load()
		if _, err := l.Check(ctx, other); err != nil {
			t.Fatal(err)
		}
		if hook.calls.Load() == before {
			t.Errorf("%+v was answered from the cache", other)
		}
	}
	clock.now = clock.now.Add(time.Second)
	before := hook.calls.Load()
	if d, err := l.Check(ctx, req); err != nil || !d.Allowed || hook.calls.Load() == before {
		t.Errorf("after RetryAfter: %+v, %v; want Redis to admit it", d, err)
	}

	// A reset or a refund through this Limiter forgets the key's denial:
	// the next check asks Redis, which admits it.
	for _, giveBack := range []limiter.Request{
		{Name: "over", Key: "k", Limit: 2, Period: time.Second, Algorithm: limiter.FixedWindow, Behavior: limiter.Reset},
		{Name: "over", Key: "k", Hits: 1, Limit: 2, Period: time.Second, Algorithm: limiter.FixedWindow, Behavior: limiter.Refund},
	} {
		l.Check(ctx, req)
		if d, _ := l.Check(ctx, req); d.Allowed {
			t.Fatalf("spending the key again: %+v", d)
		}
		if d, _ := l.Check(ctx, req); d.Allowed {
			t.Fatalf("a cached check of the spent key: %+v", d)
		}
		if _, err := l.Check(ctx, giveBack); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Check(ctx, req); err != nil || !d.Allowed {
			t.Errorf("after %v: %+v, %v; want Redis to admit it", giveBack.Behavior, d, err)
		}
	}

	// A denial of 2 hits with 1 remaining is not remembered.
	big := limiter.Request{Name: "over", Key: "big", Hits: 1, Limit: 3, Period: time.Second, Algorithm: limiter.FixedWindow}
	l.Check(ctx, big)
	l.Check(ctx, big)
	big.Hits = 2
	if d, _ := l.Check(ctx, big); d.Allowed || d.Remaining != 1 {
		t.Fatalf("2 hits with 1 remaining: %+v", d)
	}
	big.Hits = 1
	if d, _ := l.Check(ctx, big); !d.Allowed {
		t.Errorf("1 hit after a denial of 2 with 1 remaining: %+v", d)
	}

	// The bound: five keys denied, at most two remembered.
	for i := range 5 {
		r := limiter.Request{Name: "over", Key: fmt.Sprintf("many%d", i), Hits: 1, Limit: 1, Period: time.Hour, Algorithm: limiter.GCRA}
		l.Check(ctx, r)
		if d, _ := l.Check(ctx, r); d.Allowed {
			t.Fatalf("second hit of limit 1: %+v", d)
		}
	}
	if n := len(l.over.denied); n > 2 {
		t.Errorf("the cache holds %d keys, more than its bound 2", n)
	}
}

// TestRedisSlow: a Redis that answers nothing within Timeout (its scripts
// paused) is decided by the policy, with no error, and Redis decides again
// once it answers.
func TestRedisSlow(t *testing.T) {
	srv, _, rdb := startWithLimiter(t)
	cfg := DefaultConfig()
	cfg.Addrs = []string{srv.Addr()}
	cfg.Timeout = 100 * time.Millisecond
	cfg.Unreachable = sluice.PolicyDeny
	cfg.BreakerCooldown = time.Millisecond
	cfg.Prefix = "slow:"
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	req := longRequest(limiter.GCRA, "slow")
	peek := limiter.Request{Name: req.Name, Key: req.Key, Limit: req.Limit, Period: req.Period, Algorithm: req.Algorithm}
	// The first hit goes through a limiter that waits for Redis: through
	// l, on a loaded machine, its first call (a dial and a script load)
	// may outlast Timeout, and the hit might count or not. Peeks then
	// wait until l's calls are answered within Timeout.
	wcfg := cfg
	wcfg.Timeout = 10 * time.Second
	warm, err := New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	if d, err := warm.Check(ctx, req); err != nil || d.WithoutOwner {
		t.Fatalf("before the pause: %+v, %v", d, err)
	}
	testwait.For(t, "l deciding on Redis before the pause", func() bool {
		d, err := l.Check(ctx, peek)
		return err == nil && !d.WithoutOwner
	})
	// WRITE pauses every script (it may write), not the admin's UNPAUSE.
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", 60_000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := l.Check(ctx, req)
	if err != nil || !d.WithoutOwner || d.Allowed || d.RetryAfter != cfg.DenyRetryAfter {
		t.Fatalf("Redis paused: %+v, %v; want PolicyDeny's decision", d, err)
	}
	if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "Redis deciding again", func() bool {
		d, err := l.Check(ctx, peek)
		return err == nil && !d.WithoutOwner
	})
	// The first hit counts; the one sent while Redis was paused counts if
	// Redis ran it before it saw its connection closed, and at most once.
	if d, err := l.Check(ctx, peek); err != nil || d.Remaining != 99 && d.Remaining != 98 {
		t.Errorf("after the pause: %+v, %v; want 99 or 98 remaining", d, err)
	}
}

// TestKeepStrictestSteps: with KeepStrictest, a spent key stays spent
// for checks and peeks at any laxer rate (a higher Limit, a shorter
// Period, another Algorithm, more Hits than its capacity), a cut takes
// effect at once, a Reset lets the request's own rate apply, and a key
// written without the rate (format version 1) is charged at the next
// request's.
func TestKeepStrictestSteps(t *testing.T) {
	srv := testredis.Start(t)
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	l := newTestLimiter(t, clock, srv.Addr())
	plain := newTestLimiter(t, clock, srv.Addr())
	plain.cfg.Prefix = l.cfg.Prefix
	l.cfg.KeepStrictest = true
	ctx := context.Background()
	base := limiter.Request{Name: "strict", Key: "k", Hits: 3, Limit: 3, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for i, s := range []struct {
		lim           *Limiter
		edit          func(r *limiter.Request)
		wantAllowed   bool
		wantRemaining int64
		wantLimit     int64
	}{
		{l, func(r *limiter.Request) {}, true, 0, 3},
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 1, 3_000_000 }, false, 0, 3},
		{l, func(r *limiter.Request) { r.Hits, r.Period = 1, time.Millisecond }, false, 0, 3},
		{l, func(r *limiter.Request) { r.Hits, r.Algorithm = 1, limiter.SlidingWindowLog }, false, 0, 3},
		{l, func(r *limiter.Request) { r.Hits, r.Limit, r.Algorithm = 0, 1000, limiter.FixedWindow }, false, 0, 3},
		{l, func(r *limiter.Request) { r.Hits, r.Limit, r.Period = 100, 1000, time.Millisecond }, false, 0, 3},
		// A cut at once: 1 per hour, the key still spent.
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 0, 1 }, false, 0, 1},
		// Reset: the request's own rate from fresh.
		{l, func(r *limiter.Request) { r.Hits, r.Limit, r.Behavior = 1, 10, limiter.Reset }, true, 9, 10},
		// Now charged at 10 per hour: a raise waits, a cut applies.
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 0, 100 }, true, 9, 10},
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 0, 2 }, true, 1, 2},
		// Written without the rate: the next request charges its own.
		{plain, func(r *limiter.Request) { r.Hits, r.Limit, r.Behavior = 2, 2, limiter.Reset }, true, 0, 2},
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 1, 4 }, true, 1, 4},
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 1, 40 }, true, 0, 4},
		{l, func(r *limiter.Request) { r.Hits, r.Limit = 1, 40 }, false, 0, 4},
	} {
		r := base
		s.edit(&r)
		d, err := s.lim.Check(ctx, r)
		if err != nil || d.WithoutOwner || d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining || d.Limit != s.wantLimit {
			t.Fatalf("step %d %+v: %+v, %v; want allowed %v remaining %d limit %d", i, r, d, err, s.wantAllowed, s.wantRemaining, s.wantLimit)
		}
	}
}

// TestKeepStrictestLocal: with KeepStrictest, the store PolicyLocal
// decides on while Redis is down keeps the strictest rate as well: a key
// spent there stays spent for a check at a higher Limit, a shorter Period
// or another Algorithm.
func TestKeepStrictestLocal(t *testing.T) {
	srv := testredis.Start(t)
	cfg := DefaultConfig()
	cfg.Addrs = []string{srv.Addr()}
	cfg.KeepStrictest = true
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	srv.Kill()
	ctx := context.Background()
	spend := limiter.Request{Name: "local", Key: "k", Hits: 3, Limit: 3, Period: time.Hour, Algorithm: limiter.TokenBucket}
	if d, err := l.Check(ctx, spend); err != nil || !d.WithoutOwner || !d.Allowed {
		t.Fatalf("spending on the local store: %+v, %v", d, err)
	}
	for _, edit := range []func(r *limiter.Request){
		func(r *limiter.Request) { r.Limit = 3_000_000 },
		func(r *limiter.Request) { r.Period = time.Millisecond },
		func(r *limiter.Request) { r.Algorithm = limiter.FixedWindow },
	} {
		r := spend
		r.Hits = 1
		edit(&r)
		if d, err := l.Check(ctx, r); err != nil || !d.WithoutOwner || d.Allowed {
			t.Errorf("%+v on the spent key: %+v, %v; want denied by the local store", r, d, err)
		}
	}
}
