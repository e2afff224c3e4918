package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// owner is the fake Checker behind the test servers. It admits up to
// Limit hits per key, counting forever. A batch holding the key "hold"
// waits until gate is closed or its call is canceled; one holding "hang"
// ignores its call's end and waits until unhang is closed, so that it
// never answers in time; the key "reject" gets a per-item error.
type owner struct {
	name   string
	gate   chan struct{}
	unhang chan struct{}

	mu     sync.Mutex
	used   map[string]int64
	sizes  []int // batch sizes, in arrival order
	active int   // calls inside CheckMany
}

func newOwner(name string) *owner {
	return &owner{name: name, gate: make(chan struct{}), unhang: make(chan struct{}), used: map[string]int64{}}
}

var _ transport.Checker = (*owner)(nil)

func (o *owner) CheckMany(ctx context.Context, reqs []limiter.Request) []transport.Result {
	o.mu.Lock()
	o.sizes = append(o.sizes, len(reqs))
	o.active++
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.active--
		o.mu.Unlock()
	}()
	for _, r := range reqs {
		switch r.Key {
		case "hold":
			select {
			case <-o.gate:
			case <-ctx.Done():
			}
		case "hang":
			<-o.unhang
		}
	}
	out := make([]transport.Result, len(reqs))
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, r := range reqs {
		out[i].Owner = o.name
		if r.Key == "reject" {
			out[i].Err = fmt.Errorf("%w: Burst %d is not allowed here", limiter.ErrInvalidBurst, r.Burst)
			continue
		}
		k := r.Name + "/" + r.Key
		d := limiter.Decision{Limit: r.Limit}
		if o.used[k]+r.Hits <= r.Limit {
			o.used[k] += r.Hits
			d.Allowed = true
		} else {
			d.RetryAfter = r.Period
		}
		d.Remaining = r.Limit - o.used[k]
		out[i].Decision.Decision = d
	}
	return out
}

func (o *owner) release() { close(o.gate) }

func (o *owner) batchSizes() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.sizes)
}

func (o *owner) inside() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.active
}

// server is a real gRPC server on 127.0.0.1:0 serving the Peer service.
type server struct {
	addr    string
	grpc    *grpc.Server
	stop    func()
	streams *atomic.Int64 // CheckStream calls received
}

func startServer(t testing.TB, local transport.Checker, opts ...transport.ServerOption) server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	streams := new(atomic.Int64)
	count := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		streams.Add(1)
		return handler(srv, ss)
	}
	s := grpc.NewServer(append(transport.ServerOptions(), grpc.StreamInterceptor(count))...)
	transport.RegisterPeer(s, local, opts...)
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.Serve(lis)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			s.Stop()
			<-served
		})
	}
	t.Cleanup(stop)
	return server{addr: lis.Addr().String(), grpc: s, stop: stop, streams: streams}
}

// testConfig is DefaultConfig with a generous timeout: under -race gRPC is
// slow, and no test below depends on the timeout but the one that sets it.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Timeout = 30 * time.Second
	cfg.Self = "node-a"
	return cfg
}

func newTestClient(t testing.TB, addr string, cfg Config) *Client {
	t.Helper()
	c, err := NewClient("node-b", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// receive returns the value from ch, failing the test after 10 s.
func receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

type outcome struct {
	d   limiter.Decision
	err error
}

// goCheck runs c.Check in a goroutine and returns where its outcome goes.
func goCheck(ctx context.Context, c *Client, r limiter.Request) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		d, err := c.Check(ctx, r)
		ch <- outcome{d, err}
	}()
	return ch
}

func req(key string) limiter.Request {
	return limiter.Request{Name: "api", Key: key, Hits: 1, Limit: 3, Period: time.Second, Algorithm: limiter.TokenBucket}
}

// holdOneCall starts a check that the owner holds, and waits until its
// call is inside the owner.
func holdOneCall(t *testing.T, c *Client, o *owner) <-chan outcome {
	t.Helper()
	held := goCheck(context.Background(), c, req("hold"))
	testwait.For(t, "the held call to reach the owner", func() bool { return o.inside() == 1 })
	return held
}

func TestSingleCheckIsSentAtOnce(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	c := newTestClient(t, srv.addr, testConfig())

	// Nothing is in flight before each check: each goes out alone, at
	// once, on the one stream.
	for i := range 4 {
		d, err := c.Check(context.Background(), req("x"))
		if wantAllowed := i < 3; err != nil || d.Allowed != wantAllowed || d.Remaining != max(2-int64(i), 0) || d.Limit != 3 {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
	}
	if got := o.batchSizes(); !slices.Equal(got, []int{1, 1, 1, 1}) {
		t.Fatalf("batch sizes %v, want four single checks", got)
	}
	s := c.Stats()
	if s.Calls != 4 || s.Items != 4 || s.MaxBatchSize != 1 || s.BatchSizes[0] != 4 || s.FailedCalls != 0 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	if n := srv.streams.Load(); n != 1 {
		t.Fatalf("%d streams, want 1", n)
	}
}

func TestMaxInFlightBatchesGoOutAtOnce(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 2
	c := newTestClient(t, srv.addr, cfg)

	// One batch is held by the owner. MaxInFlight is 2, so the next check
	// is sent at once, without waiting for the first answer (the owner
	// decides a stream's batches in order, so it waits there instead).
	held := holdOneCall(t, c, o)
	second := goCheck(context.Background(), c, req("x"))
	testwait.For(t, "the second batch to be sent", func() bool {
		s := c.Stats()
		return s.Calls == 2 && s.InFlight == 2 && s.Pending == 0
	})
	// Both slots are taken: the next checks wait, and go out together.
	third := goCheck(context.Background(), c, req("y"))
	fourth := goCheck(context.Background(), c, req("z"))
	testwait.For(t, "the checks to queue", func() bool { return c.Stats().Pending == 2 })
	if s := c.Stats(); s.Calls != 2 {
		t.Fatalf("stats %+v, want 2 calls while both slots are taken", s)
	}
	o.release()
	for _, ch := range []<-chan outcome{held, second, third, fourth} {
		if out := receive(t, "a check", ch); out.err != nil || !out.d.Allowed {
			t.Fatalf("check: %+v", out)
		}
	}
	if got := o.batchSizes(); !slices.Equal(got, []int{1, 1, 2}) {
		t.Fatalf("batch sizes %v, want [1 1 2]", got)
	}
	testwait.For(t, "the client to go idle", func() bool { return c.Stats().InFlight == 0 })
	if s := c.Stats(); s.Calls != 3 || s.Items != 4 || s.MaxBatchSize != 2 {
		t.Fatalf("stats %+v", s)
	}
	if n := srv.streams.Load(); n != 1 {
		t.Fatalf("%d streams, want 1", n)
	}
}

// gather holds one call with MaxInFlight 1, queues n checks behind it,
// releases it and returns the outcomes of the n checks.
func gather(t *testing.T, c *Client, o *owner, n int) []outcome {
	t.Helper()
	held := holdOneCall(t, c, o)
	waiting := make([]<-chan outcome, n)
	for i := range waiting {
		waiting[i] = goCheck(context.Background(), c, req(fmt.Sprint("k", i)))
	}
	testwait.For(t, "the checks to queue", func() bool { return c.Stats().Pending == n })
	o.release()
	if out := receive(t, "the held check", held); out.err != nil {
		t.Fatal(out.err)
	}
	outs := make([]outcome, n)
	for i, ch := range waiting {
		outs[i] = receive(t, "a queued check", ch)
		if outs[i].err != nil || !outs[i].d.Allowed || outs[i].d.Remaining != 2 {
			t.Fatalf("check %d: %+v", i, outs[i])
		}
	}
	return outs
}

func TestChecksGatherWhileACallIsInFlight(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	c := newTestClient(t, srv.addr, cfg)

	const n = 50
	gather(t, c, o, n)
	if got := o.batchSizes(); !slices.Equal(got, []int{1, n}) {
		t.Fatalf("batch sizes %v, want [1 %d]", got, n)
	}
	s := c.Stats()
	want := Stats{Calls: 2, Items: n + 1, MaxBatchSize: n}
	want.BatchSizes[0], want.BatchSizes[6] = 1, 1 // 1, and 33-64
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
}

func TestMaxBatchSplits(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	cfg.MaxBatch = 4
	c := newTestClient(t, srv.addr, cfg)

	gather(t, c, o, 10)
	if got := o.batchSizes(); !slices.Equal(got, []int{1, 4, 4, 2}) {
		t.Fatalf("batch sizes %v, want [1 4 4 2]", got)
	}
	if s := c.Stats(); s.Calls != 4 || s.Items != 11 || s.MaxBatchSize != 4 {
		t.Fatalf("stats %+v", s)
	}

	// CheckMany splits the same way, and keeps the order.
	reqs := make([]limiter.Request, 10)
	for i := range reqs {
		reqs[i] = req(fmt.Sprint("m", i))
		reqs[i].Hits = int64(i%3) + 1
	}
	reqs[4].Limit = 0 // invalid: fails locally, is not sent
	res := c.CheckMany(context.Background(), reqs)
	for i, r := range res {
		if i == 4 {
			if !errors.Is(r.Err, limiter.ErrInvalidLimit) {
				t.Fatalf("item 4: %v", r.Err)
			}
			continue
		}
		if r.Err != nil || r.Owner != "node-b" || r.Decision.Remaining != 3-reqs[i].Hits {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
	if got := o.batchSizes()[4:]; !slices.Equal(got, []int{4, 4, 1}) {
		t.Fatalf("CheckMany batch sizes %v, want [4 4 1]", got)
	}
}

func TestCallerCancellation(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	c := newTestClient(t, srv.addr, cfg)

	// The held check's own caller gives up while its call is in flight.
	heldCtx, cancelHeld := context.WithCancel(context.Background())
	held := goCheck(heldCtx, c, req("hold"))
	testwait.For(t, "the held call", func() bool { return o.inside() == 1 })
	// A second check waits behind it, and its caller gives up too.
	ctx, cancel := context.WithCancel(context.Background())
	queued := goCheck(ctx, c, req("x"))
	testwait.For(t, "the check to queue", func() bool { return c.Stats().Pending == 1 })

	cancel()
	if out := receive(t, "the canceled queued check", queued); !errors.Is(out.err, context.Canceled) {
		t.Fatalf("queued check: %v, want context.Canceled", out.err)
	}
	cancelHeld()
	if out := receive(t, "the canceled held check", held); !errors.Is(out.err, context.Canceled) {
		t.Fatalf("held check: %v, want context.Canceled", out.err)
	}
	// The call itself is still in flight; its late result is discarded and
	// the queued check, whose caller is gone, is never sent.
	if s := c.Stats(); s.InFlight != 1 {
		t.Fatalf("stats %+v, want the call still in flight", s)
	}
	o.release()
	testwait.For(t, "the client to go idle", func() bool {
		s := c.Stats()
		return s.InFlight == 0 && s.Pending == 0
	})
	if s := c.Stats(); s.Calls != 1 || s.CanceledItems != 1 {
		t.Fatalf("stats %+v, want one call and one dropped check", s)
	}
	// A context that is already done fails before anything is sent.
	if _, err := c.Check(ctx, req("y")); !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: %v", err)
	}
	if d, err := c.Check(context.Background(), req("x")); err != nil || d.Remaining != 2 {
		t.Fatalf("after: %+v, %v", d, err)
	}
}

func TestTimeoutFailsOnlyItsBatchAndReopens(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	t.Cleanup(func() { close(o.unhang) }) // runs before the server stops
	clk := fakeclock.New(clockStart)
	cfg := testConfig()
	cfg.Timeout, cfg.Clock = time.Second, ClockFunc(clk.Now)
	var observed []error
	var obsMu sync.Mutex
	cfg.Observer = func(peer string, items int, _ time.Duration, err error) {
		obsMu.Lock()
		defer obsMu.Unlock()
		if peer != "node-b" || items != 1 {
			t.Errorf("Observer(%q, %d)", peer, items)
		}
		observed = append(observed, err)
	}
	c := newTestClient(t, srv.addr, cfg)
	if _, err := c.Check(context.Background(), req("warm-up")); err != nil {
		t.Fatal(err)
	}

	hung := goCheck(context.Background(), c, req("hang"))
	testwait.For(t, "the hung batch", func() bool { return o.inside() == 1 })
	// A check made half a timeout later waits for the only slot; when the
	// hung batch times out, its stream is torn down and this check goes
	// out on a new one, with half its time left.
	clk.Set(clockStart.Add(cfg.Timeout / 2))
	ok := goCheck(context.Background(), c, req("ok"))
	testwait.For(t, "the check to queue", func() bool { return c.Stats().Pending == 1 })
	expireAt(c, clk, cfg.Timeout)
	receiveTimedOut(t, "the hung check", hung)
	if out := receive(t, "the check after the hung one", ok); out.err != nil || !out.d.Allowed {
		t.Fatalf("check after the hung one: %+v", out)
	}
	if s := c.Stats(); s.FailedCalls != 1 || s.Calls != 3 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	if n := srv.streams.Load(); n != 2 {
		t.Fatalf("%d streams, want 2: the stuck one is replaced", n)
	}
	// The Observer sees a batch after its checks have their results.
	testwait.For(t, "the Observer", func() bool {
		obsMu.Lock()
		defer obsMu.Unlock()
		return len(observed) == 3
	})
	obsMu.Lock()
	defer obsMu.Unlock()
	if observed[0] != nil || observed[1] == nil || observed[2] != nil {
		t.Fatalf("observed %v, want [nil deadline nil]", observed)
	}
}

func TestOwnerErrorsKeepTheirIdentity(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	c := newTestClient(t, srv.addr, testConfig())

	_, err := c.Check(context.Background(), req("reject"))
	var re *transport.RemoteError
	if !errors.Is(err, limiter.ErrInvalidBurst) || !errors.As(err, &re) {
		t.Fatalf("owner's error: %v, want a RemoteError matching limiter.ErrInvalidBurst", err)
	}
	// An invalid request fails here, without a call.
	bad := req("x")
	bad.Hits = 4
	if _, err := c.Check(context.Background(), bad); !errors.Is(err, limiter.ErrHitsExceedLimit) {
		t.Fatalf("invalid request: %v", err)
	}
	bad = req("x")
	bad.Algorithm, bad.Calendar, bad.Location = limiter.FixedWindow, limiter.Day, time.FixedZone("UTC+1 (custom)", 3600)
	if _, err := c.Check(context.Background(), bad); !errors.Is(err, limiter.ErrInvalidCalendar) {
		t.Fatalf("unsendable zone: %v", err)
	}
	if s := c.Stats(); s.Calls != 1 {
		t.Fatalf("%d calls, want 1", s.Calls)
	}
}

func TestStoppedServer(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.Timeout = 5 * time.Second
	c := newTestClient(t, srv.addr, cfg)
	if _, err := c.Check(context.Background(), req("x")); err != nil {
		t.Fatal(err)
	}
	srv.stop()
	_, err := c.Check(context.Background(), req("x"))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("stopped server: %v, want ErrUnavailable", err)
	}
	t.Logf("error: %v", err)
}

func TestCloseFailsWaitingChecks(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	c, err := NewClient("node-b", srv.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	held := holdOneCall(t, c, o)
	waiting := make([]<-chan outcome, 5)
	for i := range waiting {
		waiting[i] = goCheck(context.Background(), c, req("x"))
	}
	testwait.For(t, "the checks to queue", func() bool { return c.Stats().Pending == len(waiting) })

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	if err := receive(t, "Close", closed); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, ch := range append(waiting, held) {
		out := receive(t, "a check", ch)
		if !errors.Is(out.err, ErrClosed) || !errors.Is(out.err, transport.ErrUnavailable) {
			t.Fatalf("check during Close: %v, want ErrClosed", out.err)
		}
		// Only the held check reached the owner, which may have
		// decided it: sending it elsewhere could count it twice.
		if sent := i == len(waiting); errors.Is(out.err, ErrInFlight) != sent {
			t.Fatalf("check during Close (sent: %v): %v matches ErrInFlight: %v", sent, out.err, !sent)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Check(context.Background(), req("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Check after Close: %v", err)
	}
	if res := c.CheckMany(context.Background(), []limiter.Request{req("x")}); !errors.Is(res[0].Err, ErrClosed) {
		t.Fatalf("CheckMany after Close: %v", res[0].Err)
	}
	srv.stop()
	goleak.VerifyNone(t)
}

func TestNewClientRejects(t *testing.T) {
	bad := DefaultConfig()
	bad.MaxBatch = 0
	if _, err := NewClient("b", "127.0.0.1:1", bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("invalid config: %v", err)
	}
	if _, err := NewClient("b", "", DefaultConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("empty address: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *Config)
		ok   bool
	}{
		{"default", func(c *Config) {}, true},
		{"smallest", func(c *Config) { c.MaxBatch, c.MaxInFlight, c.Timeout = 1, 1, 1 }, true},
		{"largest", func(c *Config) { c.MaxBatch, c.MaxInFlight = transport.MaxBatchItems, MaxMaxInFlight }, true},
		{"zero MaxBatch", func(c *Config) { c.MaxBatch = 0 }, false},
		{"MaxBatch over the server's limit", func(c *Config) { c.MaxBatch = transport.MaxBatchItems + 1 }, false},
		{"zero MaxInFlight", func(c *Config) { c.MaxInFlight = 0 }, false},
		{"MaxInFlight too large", func(c *Config) { c.MaxInFlight = MaxMaxInFlight + 1 }, false},
		{"zero Timeout", func(c *Config) { c.Timeout = 0 }, false},
		{"negative Timeout", func(c *Config) { c.Timeout = -time.Second }, false},
		{"Self not UTF-8", func(c *Config) { c.Self = "\xff" }, false},
		{"nil DialOption", func(c *Config) { c.DialOptions = []grpc.DialOption{nil} }, false},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.edit(&c)
		err := c.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%s: Validate() = %v", tt.name, err)
		}
	}
	if (Config{}).Validate() == nil {
		t.Error("the zero Config is valid")
	}
}

func TestNewClientCopiesConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DialOptions = []grpc.DialOption{grpc.WithUserAgent("a")}
	c, err := NewClient("b", "127.0.0.1:1", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg.DialOptions[0] = nil
	cfg.MaxBatch = 0
	if c.cfg.DialOptions[0] == nil || c.cfg.MaxBatch != 500 {
		t.Fatal("the client shares the caller's config")
	}
	if c.Name() != "b" || c.Addr() != "127.0.0.1:1" {
		t.Fatalf("Name %q Addr %q", c.Name(), c.Addr())
	}
}

// trivial admits everything.
type trivial struct{}

func (trivial) CheckMany(_ context.Context, reqs []limiter.Request) []transport.Result {
	out := make([]transport.Result, len(reqs))
	for i, r := range reqs {
		out[i] = transport.Result{Decision: sluice.Decision{Owner: "bench", Decision: limiter.Decision{Allowed: true, Limit: r.Limit, Remaining: r.Limit - 1}}}
	}
	return out
}

func BenchmarkClientCheckParallel(b *testing.B) {
	for _, p := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("goroutines=%dxGOMAXPROCS", p), func(b *testing.B) {
			srv := startServer(b, trivial{})
			c := newTestClient(b, srv.addr, DefaultConfig())
			if _, err := c.Check(context.Background(), req("warm-up")); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(p)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				r := req("bench")
				for pb.Next() {
					if _, err := c.Check(context.Background(), r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			s := c.Stats()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "checks/s")
			b.ReportMetric(float64(s.Items)/float64(max(s.Calls, 1)), "checks/call")
		})
	}
}
