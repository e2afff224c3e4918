package grpclimit

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/ruletest"
	"github.com/sluicehq/sluice/rules"
)

const waitTimeout = 10 * time.Second

// env is a real node, and a real gRPC server with the health service
// behind the interceptors, on 127.0.0.1, with a real client.
type env struct {
	node   *cluster.Node
	clk    *fakeclock.Clock
	ic     *Interceptor
	client healthpb.HealthClient
	events chan Event
}

// startWith serves yaml's rules through ruletest's node, whose clock
// starts 40s into a minute, with g as the guard's configuration (its
// clock the node's), behind a real gRPC health server.
func startWith(t *testing.T, yaml string, g rules.GuardConfig, opts ...Option) *env {
	t.Helper()
	b := ruletest.New(t, yaml)
	g.Now = b.Clock.Now
	e := &env{clk: b.Clock, node: b.Node, events: make(chan Event, 64)}
	ic, err := New(b.Node, b.Source, append([]Option{OnDecision(func(ev Event) { e.events <- ev }), Guard(g)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.ic = ic
	srv := grpc.NewServer(grpc.UnaryInterceptor(e.ic.Unary()), grpc.StreamInterceptor(e.ic.Stream()))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		hs.Shutdown()
		srv.Stop()
		<-served
	})
	e.client = healthpb.NewHealthClient(conn)
	return e
}

// start is startWith with the guard's defaults.
func start(t *testing.T, yaml string, opts ...Option) *env {
	t.Helper()
	return startWith(t, yaml, rules.GuardConfig{}, opts...)
}

func (e *env) event(t *testing.T) Event {
	t.Helper()
	return ruletest.Next(t, e.events)
}

// check calls Health/Check with metadata kv and returns the header and
// trailer metadata and the error.
func (e *env) check(t *testing.T, kv ...string) (metadata.MD, metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	var hdr, trl metadata.MD
	_, err := e.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
	return hdr, trl, err
}

func wantMD(t *testing.T, md metadata.MD, kv ...string) {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		got := md.Get(kv[i])
		switch {
		case kv[i+1] == "" && len(got) != 0:
			t.Errorf("%s: %q, want none", kv[i], got)
		case kv[i+1] != "" && (len(got) != 1 || got[0] != kv[i+1]):
			t.Errorf("%s: %q, want %q", kv[i], got, kv[i+1])
		}
	}
}

const perMethod = `rules:
  - name: per_method
    match: {routes: ["/grpc.health.v1.Health/*"], methods: [grpc]}
    key: [ip, route]
    algorithm: fixed_window
    limit: 2
    period: 1m
`

func TestUnary(t *testing.T) {
	e := start(t, perMethod)
	hdr, _, err := e.check(t)
	if err != nil {
		t.Fatal(err)
	}
	wantMD(t, hdr, "x-ratelimit-limit", "2", "x-ratelimit-remaining", "1", "x-ratelimit-reset", "20",
		"ratelimit-policy", `"per_method";q=2;w=60`, "ratelimit", `"per_method";r=1;t=20`, "retry-after", "")
	ev := e.event(t)
	if ev.Descriptor.IP.String() != "127.0.0.1" || ev.Descriptor.Route != "/grpc.health.v1.Health/Check" || ev.Outcome != rules.Allowed {
		t.Fatalf("event %+v %+v", ev, ev.Descriptor)
	}
	if ev.Verdict.Limits[0].Request.Key != "ip=127.0.0.1|route=/grpc.health.v1.Health/Check" {
		t.Fatalf("key %q", ev.Verdict.Limits[0].Request.Key)
	}
	if _, _, err := e.check(t); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(5 * time.Second)
	_, trl, err := e.check(t)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("third call: %v", err)
	}
	wantMD(t, trl, "x-ratelimit-limit", "2", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "15",
		"ratelimit-policy", `"per_method";q=2;w=60`, "ratelimit", `"per_method";r=0;t=15`, "retry-after", "15")
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() != 15*time.Second {
		t.Fatalf("RetryInfo %v", retry)
	}
	if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "per_method" {
		t.Fatalf("QuotaFailure %v", quota)
	}
	if st := e.ic.Stats(); st.Allowed != 2 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Metadata are the rules' headers; UserFunc and DescriptorFunc feed users
// and descriptors.
func TestMetadataUserAndDescriptors(t *testing.T) {
	e := start(t, `rules:
  - name: acme_users
    match: {headers: {X-Tenant: acme}, descriptors: {tier: gold}}
    key: [user, header:x-tenant]
    algorithm: fixed_window
    limit: 1
    period: 1m
`, UserFunc(func(ctx context.Context, _ string) (string, bool) {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return u[0], true
		}
		return "", false
	}), DescriptorFunc(func(ctx context.Context, fullMethod string) map[string]string {
		return map[string]string{"tier": "gold"}
	}))
	if _, _, err := e.check(t, "x-tenant", "acme", "x-user", "ann"); err != nil {
		t.Fatal(err)
	}
	if key := e.event(t).Verdict.Limits[0].Request.Key; key != "user=ann|header:X-Tenant=acme" {
		t.Fatalf("key %q", key)
	}
	if _, _, err := e.check(t, "x-tenant", "acme", "x-user", "ann"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second: %v", err)
	}
	// Another tenant does not match; no user means no key: both pass.
	if hdr, _, err := e.check(t, "x-tenant", "other", "x-user", "ann"); err != nil || len(hdr.Get("ratelimit")) != 0 {
		t.Fatalf("other tenant: %v %v", err, hdr)
	}
	if _, _, err := e.check(t, "x-tenant", "acme"); err != nil {
		t.Fatalf("anonymous: %v", err)
	}
}

func TestStream(t *testing.T) {
	e := start(t, `rules:
  - name: watches
    match: {routes: [/grpc.health.v1.Health/Watch]}
    algorithm: fixed_window
    limit: 1
    period: 1m
`)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s1, err := e.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Recv(); err != nil {
		t.Fatal(err)
	}
	hdr, err := s1.Header()
	if err != nil {
		t.Fatal(err)
	}
	wantMD(t, hdr, "x-ratelimit-remaining", "0", "ratelimit", `"watches";r=0;t=20`)

	s2, err := e.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s2.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v", err)
	}
	wantMD(t, s2.Trailer(), "x-ratelimit-remaining", "0", "retry-after", "20", "ratelimit-policy", `"watches";q=1;w=60`)
	// Unary calls match no rule.
	if hdr, _, err := e.check(t); err != nil || len(hdr.Get("ratelimit")) != 0 {
		t.Fatalf("Check: %v %v", err, hdr)
	}
}

func TestShadowAndFailure(t *testing.T) {
	t.Run("shadow", func(t *testing.T) {
		e := startWith(t, perMethod, rules.GuardConfig{Shadow: true})
		for range 3 {
			if _, _, err := e.check(t); err != nil {
				t.Fatal(err)
			}
		}
		if st := e.ic.Stats(); st.Allowed != 2 || st.Shadowed != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("fail open", func(t *testing.T) {
		e := start(t, perMethod)
		e.node.Close()
		hdr, _, err := e.check(t)
		if err != nil || len(hdr.Get("x-ratelimit-limit")) != 0 {
			t.Fatalf("%v %v", err, hdr)
		}
		if ev := e.event(t); ev.Outcome != rules.FailedOpen || !errors.Is(ev.Verdict.Err, cluster.ErrClosed) {
			t.Fatalf("event %v", ev.Outcome)
		}
	})
	t.Run("fail closed", func(t *testing.T) {
		e := startWith(t, perMethod, rules.GuardConfig{FailClosed: true})
		e.node.Close()
		if _, _, err := e.check(t); status.Code(err) != codes.Unavailable {
			t.Fatalf("%v", err)
		}
	})
}

func TestLeakyBucketWait(t *testing.T) {
	asked := make(chan time.Duration, 4)
	fire := make(chan time.Time, 1)
	e := startWith(t, `rules:
  - name: paced
    algorithm: leaky_bucket
    limit: 10
    period: 1s
    burst: 5
`, rules.GuardConfig{MaxWait: 150 * time.Millisecond, After: func(d time.Duration) <-chan time.Time {
		asked <- d
		return fire
	}})
	if _, _, err := e.check(t); err != nil {
		t.Fatal(err)
	}
	fire <- time.Time{}
	if _, _, err := e.check(t); err != nil {
		t.Fatal(err)
	}
	if d := <-asked; d != 100*time.Millisecond {
		t.Fatalf("waited %v", d)
	}
	_, trl, err := e.check(t)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third: %v", err)
	}
	wantMD(t, trl, "retry-after", "1")
	if st := e.ic.Stats(); st.Waited != 1 || st.Allowed != 2 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCost charges each unary call the length of its request's service
// name: a cost counts that many hits, and a cost above what the rule can
// ever admit is refused with ResourceExhausted and counts nothing (it does
// not fail open).
func TestCost(t *testing.T) {
	e := start(t, `rules:
  - name: per_method
    key: [ip, route]
    algorithm: fixed_window
    limit: 5
    period: 1m
`, Cost(func(_ context.Context, _ string, req any) int64 {
		if r, ok := req.(*healthpb.HealthCheckRequest); ok {
			return int64(len(r.GetService()))
		}
		return 1
	}))
	for _, step := range []struct {
		service   string
		code      codes.Code // NotFound: admitted, and the health server knows no such service
		remaining string
		outcome   rules.Outcome
	}{
		{"abc", codes.NotFound, "2", rules.Allowed},
		{"abcdef", codes.ResourceExhausted, "2", rules.Rejected}, // never admissible: not counted
		{"abc", codes.ResourceExhausted, "2", rules.Rejected},
		{"ab", codes.NotFound, "0", rules.Allowed},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		var hdr, trl metadata.MD
		_, err := e.client.Check(ctx, &healthpb.HealthCheckRequest{Service: step.service}, grpc.Header(&hdr), grpc.Trailer(&trl))
		cancel()
		if code := status.Code(err); code != step.code {
			t.Fatalf("cost %d: %v, want %v", len(step.service), err, step.code)
		}
		md := hdr
		if step.code == codes.ResourceExhausted {
			md = trl
		}
		wantMD(t, md, "x-ratelimit-remaining", step.remaining)
		if ev := e.event(t); ev.Outcome != step.outcome {
			t.Fatalf("cost %d: outcome %v, want %v", len(step.service), ev.Outcome, step.outcome)
		}
	}
}
