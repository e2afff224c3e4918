package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/leakcheck"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// startNode starts a single-node cluster and returns a client of it.
func startNode(t *testing.T, opts ...client.Option) (*cluster.Node, *client.Client) {
	t.Helper()
	return startNodeWith(t, func(*cluster.Config) {}, opts...)
}

// startNodeWith is startNode with the node's config changed by change.
func startNodeWith(t *testing.T, change func(*cluster.Config), opts ...client.Option) (*cluster.Node, *client.Client) {
	t.Helper()
	cfg := cluster.TestConfig("client-test")
	cfg.ServePublicAPI = true
	change(&cfg)
	n, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	// A call's deadline is generous unless the test sets its own: under
	// -race on a loaded machine a batch of a thousand takes seconds.
	c, err := client.New(n.GRPCAddr(), append([]client.Option{client.WithTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return n, c
}

// serve serves srv's registrations on a loopback port and returns a client
// of it.
func serve(t *testing.T, register func(*grpc.Server), opts ...client.Option) *client.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(transport.ServerOptions()...)
	register(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	c, err := client.New(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func req(key string, limit int64) limiter.Request {
	return limiter.Request{Name: "api", Key: key, Hits: 1, Limit: limit, Period: time.Hour, Algorithm: limiter.TokenBucket}
}

func TestCheckAgainstANode(t *testing.T) {
	n, c := startNode(t)
	ctx := context.Background()
	steps := []struct {
		hits          int64
		wantAllowed   bool
		wantRemaining int64
	}{
		{1, true, 2},
		{0, true, 2}, // a peek consumes nothing
		{2, true, 0},
		{1, false, 0},
	}
	for i, s := range steps {
		r := req("user:1", 3)
		r.Hits = s.hits
		d, err := c.Check(ctx, r)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining {
			t.Errorf("step %d: allowed %v remaining %d, want %v %d", i, d.Allowed, d.Remaining, s.wantAllowed, s.wantRemaining)
		}
		if d.Owner != n.Name() || d.WithoutOwner || d.Limit != 3 {
			t.Errorf("step %d: owner %q without owner %v limit %d", i, d.Owner, d.WithoutOwner, d.Limit)
		}
		if d.Allowed == (d.RetryAfter != 0) || d.ResetAt.IsZero() {
			t.Errorf("step %d: retry after %v, reset at %v", i, d.RetryAfter, d.ResetAt)
		}
	}
}

// Through the public API, a fixed window's charge names its window, and
// a refund that carries it gives its hits back to that window only.
func TestRefundToItsChargedWindow(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	_, c := startNodeWith(t, func(cfg *cluster.Config) { cfg.Clock = cluster.ClockFunc(clk.Now) })
	ctx := context.Background()
	r := limiter.Request{Name: "api", Key: "user:1", Hits: 1, Limit: 3, Period: time.Minute, Algorithm: limiter.FixedWindow}
	charge, err := c.Check(ctx, r)
	if err != nil || !charge.Allowed || charge.Window.IsZero() {
		t.Fatalf("charge: %+v, %v", charge, err)
	}
	back := r
	back.Behavior, back.Charged = limiter.Refund, charge.Window
	if d, err := c.Check(ctx, back); err != nil || d.Window != charge.Window || d.Remaining != 3 {
		t.Fatalf("refund to the charge's window: %+v, %v", d, err)
	}
	if _, err := c.Check(ctx, r); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute) // the next window: a hit of another request
	next, err := c.Check(ctx, r)
	if err != nil || next.Window == charge.Window {
		t.Fatalf("the next window's charge: %+v, %v", next, err)
	}
	if d, err := c.Check(ctx, back); err != nil || !d.Window.IsZero() || d.Remaining != 2 {
		t.Fatalf("refund to the window that ended: %+v, %v; want nothing given back, remaining 2", d, err)
	}
}

func TestRequestErrorsKeepTheirSentinel(t *testing.T) {
	_, c := startNode(t)
	mars := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 1, Algorithm: limiter.FixedWindow, Calendar: limiter.Day,
		Location: time.FixedZone("Mars/Olympus_Mons", 0)} // a valid name the server cannot load
	tests := []struct {
		name string
		req  limiter.Request
		want error
	}{
		{"limit checked by the client", func() limiter.Request { r := req("k", 0); return r }(), limiter.ErrInvalidLimit},
		{"algorithm checked by the client", func() limiter.Request { r := req("k", 1); r.Algorithm = 0; return r }(), limiter.ErrUnknownAlgorithm},
		{"zone checked by the server", mars, limiter.ErrInvalidCalendar},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Check(context.Background(), tt.req)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Check = %v, want %v", err, tt.want)
			}
			rs := c.CheckMany(context.Background(), []limiter.Request{req("fine:"+tt.name, 1), tt.req})
			if rs[0].Err != nil || !rs[0].Allowed {
				t.Errorf("valid item: %+v", rs[0])
			}
			if !errors.Is(rs[1].Err, tt.want) {
				t.Errorf("CheckMany item = %v, want %v", rs[1].Err, tt.want)
			}
		})
	}
}

func TestCheckManySplitsLongLists(t *testing.T) {
	_, c := startNode(t)
	const n = 2*client.MaxBatchItems + 17
	reqs := make([]limiter.Request, n)
	for i := range reqs {
		reqs[i] = req("shared", 1500)
	}
	reqs[1234].Limit = -1
	rs := c.CheckMany(context.Background(), reqs)
	allowed := 0
	for i, r := range rs {
		switch {
		case i == 1234:
			if !errors.Is(r.Err, limiter.ErrInvalidLimit) {
				t.Errorf("item %d: %v", i, r.Err)
			}
		case r.Err != nil:
			t.Fatalf("item %d: %v", i, r.Err)
		case r.Allowed:
			allowed++
		}
	}
	if allowed != 1500 {
		t.Errorf("allowed %d, want 1500", allowed)
	}
}

func TestHealth(t *testing.T) {
	n, c := startNode(t)
	h, err := c.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !h.Serving() || h.Members != 1 || h.Node != n.Name() {
		t.Errorf("Health = %+v", h)
	}
}

// recorder is a Router that records what it was asked and answers with
// the request's hits as remaining, after waiting for release if set.
type recorder struct {
	mu        sync.Mutex
	policies  []sluice.Policy
	deadlines []time.Time
	release   chan struct{}
}

func (r *recorder) Route(ctx context.Context, reqs []transport.RoutedRequest) []sluice.Result {
	dl, _ := ctx.Deadline()
	r.mu.Lock()
	r.deadlines = append(r.deadlines, dl)
	for _, q := range reqs {
		r.policies = append(r.policies, q.Policy)
	}
	r.mu.Unlock()
	if r.release != nil {
		<-r.release // not ctx: the client's own deadline must end the call
	}
	out := make([]sluice.Result, len(reqs))
	for i, q := range reqs {
		out[i] = sluice.Result{Decision: sluice.Decision{Decision: limiter.Decision{Allowed: true, Limit: q.Request.Limit, Remaining: q.Request.Hits}, Owner: "fake", WithoutOwner: true}}
	}
	return out
}

func TestPolicyIsSent(t *testing.T) {
	rec := &recorder{}
	c := serve(t, func(s *grpc.Server) { transport.RegisterPublic(s, rec, nil) }, client.WithPolicy(sluice.PolicyDeny))
	ctx := context.Background()
	if _, err := c.Check(ctx, req("k", 5)); err != nil {
		t.Fatal(err)
	}
	d, err := c.Check(ctx, req("k", 5), sluice.OnUnreachable(sluice.PolicyAllow))
	if err != nil {
		t.Fatal(err)
	}
	if d.Owner != "fake" || !d.WithoutOwner {
		t.Errorf("decision %+v", d)
	}
	for _, r := range c.CheckMany(ctx, []limiter.Request{req("a", 1), req("b", 1)}, sluice.OnUnreachable(sluice.PolicyLocal)) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	want := []sluice.Policy{sluice.PolicyDeny, sluice.PolicyAllow, sluice.PolicyLocal, sluice.PolicyLocal}
	if fmt.Sprint(rec.policies) != fmt.Sprint(want) {
		t.Errorf("policies %v, want %v", rec.policies, want)
	}
	if _, err := c.Check(ctx, req("k", 5), sluice.OnUnreachable(sluice.Policy(99))); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("unknown policy: %v", err)
	}
	if _, err := client.New("localhost:1", client.WithPolicy(sluice.Policy(99))); !errors.Is(err, client.ErrInvalidOption) {
		t.Errorf("New with an unknown policy: %v", err)
	}
}

func TestTimeouts(t *testing.T) {
	t.Run("default timeout without a deadline", func(t *testing.T) {
		rec := &recorder{release: make(chan struct{})}
		c := serve(t, func(s *grpc.Server) { transport.RegisterPublic(s, rec, nil) }, client.WithTimeout(300*time.Millisecond))
		t.Cleanup(func() { close(rec.release) }) // before the server stops
		// Connect first (health is not served here, which does not
		// matter), so that the timed call needs no dial on a loaded
		// machine.
		warm, cancel := context.WithTimeout(context.Background(), time.Minute)
		c.Health(warm)
		cancel()
		start := time.Now()
		_, err := c.Check(context.Background(), req("k", 1))
		if !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Check = %v (code %v), want a deadline error", err, status.Code(err))
		}
		rec.mu.Lock()
		seen := slices.Clone(rec.deadlines)
		rec.mu.Unlock()
		if len(seen) == 0 {
			t.Fatal("the call never reached the server before its deadline")
		}
		dl := seen[0]
		// The server sees the client's deadline, give or take the clock
		// reads: far below DefaultTimeout.
		if d := dl.Sub(start); d <= 0 || d > client.DefaultTimeout/2 {
			t.Errorf("server saw a deadline %v after the call, want about the 300ms timeout", d)
		}
	})
	t.Run("the context's deadline wins", func(t *testing.T) {
		rec := &recorder{}
		c := serve(t, func(s *grpc.Server) { transport.RegisterPublic(s, rec, nil) }, client.WithTimeout(time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		if rs := c.CheckMany(ctx, []limiter.Request{req("k", 1)}); rs[0].Err != nil {
			t.Fatal(rs[0].Err)
		}
		rec.mu.Lock()
		dl := rec.deadlines[0]
		rec.mu.Unlock()
		if d := time.Until(dl); d < 50*time.Minute {
			t.Errorf("server saw a deadline in %v, want the context's hour", d)
		}
	})
	if _, err := client.New("localhost:1", client.WithTimeout(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Errorf("New with a zero timeout: %v", err)
	}
}

// broken answers batches with one item too few and health with an error.
type broken struct {
	pb.UnimplementedSluiceServer
}

func (broken) CheckBatch(_ context.Context, in *pb.BatchCheckRequest) (*pb.BatchCheckResponse, error) {
	return &pb.BatchCheckResponse{Responses: make([]*pb.RateLimitResponse, len(in.Requests)-1)}, nil
}

func (broken) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{}, nil // no response inside
}

func TestMalformedAnswers(t *testing.T) {
	c := serve(t, func(s *grpc.Server) { pb.RegisterSluiceServer(s, broken{}) })
	ctx := context.Background()
	if _, err := c.Check(ctx, req("k", 1)); !errors.Is(err, client.ErrMalformedResponse) {
		t.Errorf("Check = %v, want ErrMalformedResponse", err)
	}
	rs := c.CheckMany(ctx, []limiter.Request{req("a", 1), req("b", 0), req("c", 1)})
	if !errors.Is(rs[0].Err, client.ErrMalformedResponse) || !errors.Is(rs[1].Err, limiter.ErrInvalidLimit) || !errors.Is(rs[2].Err, client.ErrMalformedResponse) {
		t.Errorf("items: %v, %v, %v", rs[0].Err, rs[1].Err, rs[2].Err)
	}
	if _, err := c.Health(ctx); status.Code(err) != codes.Unimplemented {
		t.Errorf("Health = %v, want Unimplemented", err)
	}
}

func TestUnreachableDaemon(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Check(context.Background(), req("k", 1))
	if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Errorf("Check = %v, want Unavailable", err)
	}
}

func TestClosed(t *testing.T) {
	_, c := startNode(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	ctx := context.Background()
	if _, err := c.Check(ctx, req("k", 1)); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Check = %v", err)
	}
	if rs := c.CheckMany(ctx, []limiter.Request{req("k", 1)}); !errors.Is(rs[0].Err, client.ErrClosed) {
		t.Errorf("CheckMany = %v", rs[0].Err)
	}
	if _, err := c.Health(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Health = %v", err)
	}
}

// TestNilContext: every call refuses a nil context with ErrNilContext, as
// the cluster package does, rather than panicking.
func TestNilContext(t *testing.T) {
	_, c := startNode(t)
	req := limiter.Request{Name: "api", Key: "k", Hits: 1, Limit: 5, Period: time.Minute, Algorithm: limiter.GCRA}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := c.Check(nil, req); !errors.Is(err, client.ErrNilContext) { //nolint:staticcheck
		t.Errorf("Check(nil): %v, want ErrNilContext", err)
	}
	//lint:ignore SA1012 a nil context is what is tested
	res := c.CheckMany(nil, []limiter.Request{req}) //nolint:staticcheck
	if len(res) != 1 || !errors.Is(res[0].Err, client.ErrNilContext) {
		t.Errorf("CheckMany(nil): %+v, want ErrNilContext", res)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := c.Health(nil); !errors.Is(err, client.ErrNilContext) { //nolint:staticcheck
		t.Errorf("Health(nil): %v, want ErrNilContext", err)
	}
}

// A client pointed at an HTTP/1 server (a daemon's HTTP port) fails with
// ErrNotGRPC and an error naming the address and grpc_addr, on every kind
// of call; a closed port stays a plain Unavailable.
func TestHTTPPortNamesTheMistake(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	defer func() { srv.Close(); <-done }()
	addr := lis.Addr().String()
	c, err := client.New(addr, client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	_, checkErr := c.Check(ctx, req("k", 1))
	_, healthErr := c.Health(ctx)
	_, inspectErr := c.Inspect(ctx, "n", "k")
	batchErr := c.CheckMany(ctx, []limiter.Request{req("k", 1)})[0].Err
	for name, err := range map[string]error{"check": checkErr, "health": healthErr, "inspect": inspectErr, "batch": batchErr} {
		if !errors.Is(err, client.ErrNotGRPC) || !strings.Contains(err.Error(), addr+" answered as an HTTP/1 server") ||
			!strings.Contains(err.Error(), "grpc_addr") {
			t.Errorf("%s: %v; want ErrNotGRPC naming %s and grpc_addr", name, err, addr)
		}
	}
}

// Reset names the owner that reset the key; when the daemon decided
// without the owner, nothing was reset and the error wraps the client's
// ErrUnavailable, which callers can name.
func TestResetNamesTheOwnerOrIsUnavailable(t *testing.T) {
	n, c := startNode(t)
	ctx := context.Background()
	if _, err := c.Check(ctx, req("user:1", 1)); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Check(ctx, req("user:1", 1)); err != nil || d.Allowed {
		t.Fatalf("second check of a limit of 1: %+v, %v", d, err)
	}
	owner, err := c.Reset(ctx, "api", "user:1")
	if err != nil || owner != n.Name() {
		t.Fatalf("Reset: owner %q, %v; want %q", owner, err, n.Name())
	}
	if d, err := c.Check(ctx, req("user:1", 1)); err != nil || !d.Allowed {
		t.Errorf("check after Reset: %+v, %v", d, err)
	}

	rec := &recorder{}
	c = serve(t, func(s *grpc.Server) { transport.RegisterPublic(s, rec, nil) })
	owner, err = c.Reset(ctx, "api", "user:1")
	if !errors.Is(err, client.ErrUnavailable) || owner != "" {
		t.Errorf("Reset decided without the owner: owner %q, %v; want an error wrapping client.ErrUnavailable", owner, err)
	}
	if fmt.Sprint(rec.policies) != fmt.Sprint([]sluice.Policy{sluice.PolicyDeny}) {
		t.Errorf("Reset sent policies %v, want [%v]", rec.policies, sluice.PolicyDeny)
	}
}
