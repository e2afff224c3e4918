package cluster_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// tracedCluster starts n nodes, each with a tracer provider of its own
// (as separate processes have) that exports synchronously to its own
// in-memory exporter; traced[i] false leaves node i without tracing.
func tracedCluster(t *testing.T, traced []bool, configure func(i int, c *cluster.Config)) (*testcluster.Cluster, []*tracetest.InMemoryExporter, []*sdktrace.TracerProvider) {
	t.Helper()
	exps := make([]*tracetest.InMemoryExporter, len(traced))
	tps := make([]*sdktrace.TracerProvider, len(traced))
	for i, on := range traced {
		if !on {
			continue
		}
		exps[i] = tracetest.NewInMemoryExporter()
		tps[i] = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exps[i]))
		tp := tps[i]
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
	}
	c := testcluster.New(t, len(traced), testcluster.WithConfig(func(i int, c *cluster.Config) {
		if tps[i] != nil {
			c.TracerProvider = tps[i]
		}
		if configure != nil {
			configure(i, c)
		}
	}))
	return c, exps, tps
}

// remoteKey returns a request whose key node 1 owns, decided there once
// already (so that the key's hand-over is settled) by a check from node 0.
func remoteKey(t *testing.T, c *testcluster.Cluster) limiter.Request {
	t.Helper()
	for i := range 1000 {
		req := limiter.Request{Name: "traced", Key: fmt.Sprintf("user-%d", i), Hits: 2, Limit: 100, Period: time.Minute, Algorithm: limiter.GCRA}
		if c.Owner(req.Name, req.Key) != c.Node(1) {
			continue
		}
		err := testcluster.WaitFor(5*time.Second, func() error {
			d, err := c.Node(0).Check(context.Background(), limiter.Request{Name: req.Name, Key: req.Key, Hits: 0, Limit: req.Limit, Period: req.Period, Algorithm: req.Algorithm})
			if err == nil && (d.Owner != c.Node(1).Name() || d.WithoutOwner) {
				err = fmt.Errorf("decided by %s, without owner %v", d.Owner, d.WithoutOwner)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	t.Fatal("node 1 owns none of 1000 keys")
	return limiter.Request{}
}

// spanNamed returns the only span named name, failing the test when
// there is not exactly one.
func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %s in %v", len(found), name, names(spans))
	}
	return found[0]
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// wantAttrs fails the test when attrs lack one of want, or hold a key of
// absent.
func wantAttrs(t *testing.T, span string, attrs []attribute.KeyValue, want []attribute.KeyValue, absent ...attribute.Key) {
	t.Helper()
	got := map[attribute.Key]attribute.Value{}
	for _, a := range attrs {
		got[a.Key] = a.Value
	}
	for _, w := range want {
		if v, ok := got[w.Key]; !ok || v != w.Value {
			t.Errorf("%s: %s = %v (set %v), want %v", span, w.Key, v.Emit(), ok, w.Value.Emit())
		}
	}
	for _, k := range absent {
		if _, ok := got[k]; ok {
			t.Errorf("%s: has %s = %v, want none", span, k, got[k].Emit())
		}
	}
}

// A check that node 0 forwards to node 1, the owner, gives three spans in
// the caller's trace: node 0's check span (child of the caller's span),
// its forwarding span (a client span, child of the check span) and node
// 1's decision span (a server span, child of the forwarding span, whose
// context crossed the peer stream in the check's item). The client key is
// recorded nowhere.
func TestTracingForwardedCheckIsOneTrace(t *testing.T) {
	c, exps, tps := tracedCluster(t, []bool{true, true}, nil)
	req := remoteKey(t, c)
	for _, e := range exps {
		e.Reset()
	}

	ctx, caller := tps[0].Tracer("caller").Start(context.Background(), "caller")
	d, err := c.Node(0).Check(ctx, req)
	caller.End()
	if err != nil || !d.Allowed || d.Owner != c.Node(1).Name() {
		t.Fatalf("Check: %+v, %v; want allowed by %s", d, err, c.Node(1).Name())
	}

	callerSpans, ownerSpans := exps[0].GetSpans(), exps[1].GetSpans()
	check := spanNamed(t, callerSpans, "sluice.Check")
	forward := spanNamed(t, callerSpans, "sluice.peer.Forward")
	decide := spanNamed(t, ownerSpans, "sluice.Decide")
	root := caller.SpanContext()
	for _, s := range []tracetest.SpanStub{check, forward, decide} {
		if s.SpanContext.TraceID() != root.TraceID() {
			t.Errorf("%s in trace %s, want the caller's %s", s.Name, s.SpanContext.TraceID(), root.TraceID())
		}
	}
	for _, tt := range []struct {
		child  tracetest.SpanStub
		parent trace.SpanContext
		kind   trace.SpanKind
		remote bool
	}{
		{check, root, trace.SpanKindInternal, false},
		{forward, check.SpanContext, trace.SpanKindClient, false},
		{decide, forward.SpanContext, trace.SpanKindServer, true},
	} {
		if tt.child.Parent.SpanID() != tt.parent.SpanID() || tt.child.Parent.IsRemote() != tt.remote {
			t.Errorf("%s: parent %s (remote %v), want %s (remote %v)", tt.child.Name, tt.child.Parent.SpanID(), tt.child.Parent.IsRemote(), tt.parent.SpanID(), tt.remote)
		}
		if tt.child.SpanKind != tt.kind {
			t.Errorf("%s: kind %v, want %v", tt.child.Name, tt.child.SpanKind, tt.kind)
		}
	}

	owner := c.Node(1).Name()
	wantAttrs(t, "sluice.Check", check.Attributes, []attribute.KeyValue{
		attribute.String("sluice.limit.name", "traced"),
		attribute.String("sluice.limit.algorithm", limiter.GCRA.String()),
		attribute.Int64("sluice.hits", 2),
		attribute.Bool("sluice.allowed", true),
		attribute.String("sluice.owner", owner),
		attribute.Bool("sluice.forwarded", true),
		attribute.Bool("sluice.without_owner", false),
	}, "sluice.key")
	wantAttrs(t, "sluice.peer.Forward", forward.Attributes, []attribute.KeyValue{
		attribute.String("sluice.peer", owner),
		attribute.Int("sluice.checks", 1),
	}, "sluice.key")
	wantAttrs(t, "sluice.Decide", decide.Attributes, []attribute.KeyValue{
		attribute.String("sluice.limit.name", "traced"),
		attribute.Int64("sluice.hits", 2),
		attribute.Bool("sluice.allowed", true),
		attribute.String("sluice.owner", owner),
		attribute.String("sluice.peer.from", c.Node(0).Name()),
	}, "sluice.key")
	if len(ownerSpans) != 1 {
		t.Errorf("owner spans %v, want its decision only", names(ownerSpans))
	}
}

// CheckMany is one span per call, with an event per check; its forwarded
// checks share one forwarding span, the parent of each of their decision
// spans on the owner. Config.TraceKeys adds the client key.
func TestTracingCheckMany(t *testing.T) {
	c, exps, _ := tracedCluster(t, []bool{true, true}, func(i int, c *cluster.Config) { c.TraceKeys = true })
	remote := remoteKey(t, c)
	local := remote
	for i := 0; c.Owner(local.Name, local.Key) != c.Node(0); i++ {
		local.Key = fmt.Sprintf("local-%d", i)
	}
	remote2 := remote
	remote2.Hits = 1 // the same key, a second check
	for _, e := range exps {
		e.Reset()
	}

	rs := c.Node(0).CheckMany(context.Background(), []limiter.Request{remote, local, remote2})
	for i, r := range rs {
		if r.Err != nil || !r.Allowed {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	many := spanNamed(t, exps[0].GetSpans(), "sluice.CheckMany")
	forward := spanNamed(t, exps[0].GetSpans(), "sluice.peer.Forward")
	if forward.Parent.SpanID() != many.SpanContext.SpanID() {
		t.Errorf("forwarding span's parent %s, want the CheckMany span %s", forward.Parent.SpanID(), many.SpanContext.SpanID())
	}
	wantAttrs(t, "sluice.CheckMany", many.Attributes, []attribute.KeyValue{attribute.Int("sluice.checks", 3)})
	wantAttrs(t, "sluice.peer.Forward", forward.Attributes, []attribute.KeyValue{attribute.Int("sluice.checks", 2)})
	if len(many.Events) != 3 {
		t.Fatalf("%d events, want one per check", len(many.Events))
	}
	for i, tt := range []struct {
		key       string
		forwarded bool
	}{{remote.Key, true}, {local.Key, false}, {remote2.Key, true}} {
		wantAttrs(t, fmt.Sprintf("event %d", i), many.Events[i].Attributes, []attribute.KeyValue{
			attribute.String("sluice.key", tt.key),
			attribute.Bool("sluice.forwarded", tt.forwarded),
			attribute.Bool("sluice.allowed", true),
		})
	}
	decides := exps[1].GetSpans()
	if len(decides) != 2 {
		t.Fatalf("owner spans %v, want 2 decisions", names(decides))
	}
	for _, d := range decides {
		if d.Name != "sluice.Decide" || d.Parent.SpanID() != forward.SpanContext.SpanID() || d.SpanContext.TraceID() != many.SpanContext.TraceID() {
			t.Errorf("owner span %s: parent %s in trace %s, want the forwarding span %s", d.Name, d.Parent.SpanID(), d.SpanContext.TraceID(), forward.SpanContext.SpanID())
		}
		wantAttrs(t, "sluice.Decide", d.Attributes, []attribute.KeyValue{attribute.String("sluice.key", remote.Key)})
	}
}

// A node without a TracerProvider sends no trace context: the owner, which
// traces, decides its checks in spans of traces of their own.
func TestTracingOffSendsNoContext(t *testing.T) {
	c, exps, _ := tracedCluster(t, []bool{false, true}, nil)
	req := remoteKey(t, c)
	exps[1].Reset()
	if _, err := c.Node(0).Check(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	decide := spanNamed(t, exps[1].GetSpans(), "sluice.Decide")
	if decide.Parent.IsValid() {
		t.Errorf("decision span has parent %v, want none: the caller does not trace", decide.Parent)
	}
}

// Without a TracerProvider, a check decided locally allocates what it did
// before tracing existed; with one, spans are made.
func TestTracingOffAddsNoAllocation(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations")
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	req := limiter.Request{Name: "allocs", Key: "k", Hits: 1, Limit: 1_000_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
	for _, tt := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"off", nil}, {"on", tp}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := cluster.TestConfig("allocs-" + tt.name)
			cfg.TracerProvider = tt.tp
			nd, err := cluster.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer nd.Close()
			ctx := context.Background()
			if _, err := nd.Check(ctx, req); err != nil {
				t.Fatal(err)
			}
			// AllocsPerRun counts the whole process's allocations: the
			// least of three runs leaves out what goroutines of tests
			// before this one allocate meanwhile.
			allocs := math.Inf(1)
			for range 3 {
				allocs = min(allocs, testing.AllocsPerRun(1000, func() {
					if _, err := nd.Check(ctx, req); err != nil {
						t.Fatal(err)
					}
				}))
			}
			t.Logf("%.1f allocations per local check", allocs)
			// A local check allocated 1 before tracing existed, measured
			// the same way.
			if tt.tp == nil && allocs > 1 {
				t.Errorf("%.1f allocations per local check without tracing, want at most 1 as before", allocs)
			}
			if tt.tp != nil && len(exp.GetSpans()) == 0 {
				t.Error("no span with tracing on")
			}
		})
	}
}
