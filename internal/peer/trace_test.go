package peer

import (
	"context"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// traceRecorder is an owner that admits everything and keeps the
// traceparents its batches carried.
type traceRecorder struct {
	trivial
	mu      sync.Mutex
	parents [][]string // per batch: transport.TraceParents
}

func (r *traceRecorder) CheckMany(ctx context.Context, reqs []limiter.Request) []transport.Result {
	r.mu.Lock()
	r.parents = append(r.parents, append([]string(nil), transport.TraceParents(ctx)...))
	r.mu.Unlock()
	return r.trivial.CheckMany(ctx, reqs)
}

func (r *traceRecorder) batches() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.parents...)
}

// With a TracerProvider, each check carries to the owner the traceparent
// of its call's forwarding span, a client span under the caller's;
// without one, no check carries any.
func TestForwardCarriesTraceParent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	t.Run("off", func(t *testing.T) {
		o := new(traceRecorder)
		c := newTestClient(t, startServer(t, o).addr, DefaultConfig())
		ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
		defer caller.End()
		if _, err := c.Check(ctx, req("a")); err != nil {
			t.Fatal(err)
		}
		c.CheckMany(ctx, []limiter.Request{req("b"), req("c")})
		for _, b := range o.batches() {
			if b != nil {
				t.Errorf("batch carried traceparents %q without a TracerProvider", b)
			}
		}
	})

	t.Run("on", func(t *testing.T) {
		exp.Reset()
		o := new(traceRecorder)
		cfg := DefaultConfig()
		cfg.TracerProvider = tp
		c := newTestClient(t, startServer(t, o).addr, cfg)
		ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
		if _, err := c.Check(ctx, req("a")); err != nil {
			t.Fatal(err)
		}
		c.CheckMany(ctx, []limiter.Request{req("b"), req("c")})
		caller.End()

		var forwards []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == "sluice.peer.Forward" {
				forwards = append(forwards, s)
			}
		}
		if len(forwards) != 2 {
			t.Fatalf("%d forwarding spans, want one per call", len(forwards))
		}
		var want []string
		for _, f := range forwards {
			if f.Parent.SpanID() != caller.SpanContext().SpanID() || f.SpanKind != trace.SpanKindClient {
				t.Errorf("forwarding span: parent %s, kind %v; want the caller's %s, client", f.Parent.SpanID(), f.SpanKind, caller.SpanContext().SpanID())
			}
			var carrier transport.TraceCarrier
			traceContext.Inject(trace.ContextWithSpanContext(context.Background(), f.SpanContext), &carrier)
			want = append(want, carrier.TraceParent)
		}
		var got []string
		for _, b := range o.batches() {
			got = append(got, b...)
		}
		if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[1] {
			t.Errorf("traceparents received %q, want %q for the first check and %q for the two others", got, want[0], want[1])
		}
	})
}
