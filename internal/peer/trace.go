package peer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/transport"
)

// Tracing (Config.TracerProvider): a forwarded call, Check or CheckMany,
// is a client span that starts when its checks are queued and ends when
// the last of them has its answer. Each check carries the span's
// traceparent in its own item of whatever batch it goes in, so that the
// owner's span of its decision is a child of this span, whichever other
// callers' checks share the batch. The batch itself, a unit of transport
// shared by callers of different traces, has no span.

// tracerName names the tracer of this package.
const tracerName = "github.com/sluicehq/sluice/internal/peer"

// forwardSpan is the name of the span of a forwarded call.
const forwardSpan = "sluice.peer.Forward"

// Attributes of the forwarding span.
const (
	attrPeer     = attribute.Key("sluice.peer")
	attrPeerAddr = attribute.Key("sluice.peer.addr")
	attrChecks   = attribute.Key("sluice.checks")
	attrFailed   = attribute.Key("sluice.checks.failed")
)

// traceContext is the W3C propagator that writes the traceparent items
// carry.
var traceContext propagation.TraceContext

// startForward starts the span of a forwarded call of n checks under
// ctx, and returns the traceparent its checks carry: "" when the span has
// no valid context (a no-op tracer).
func (c *Client) startForward(ctx context.Context, n int) (context.Context, trace.Span, string) {
	ctx, span := c.tracer.Start(ctx, forwardSpan, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("rpc.system", "grpc"),
			attribute.String("rpc.service", "sluice.v1.Peer"),
			attribute.String("rpc.method", "CheckStream"),
			attrPeer.String(c.name),
			attrPeerAddr.String(c.addr),
			attrChecks.Int(n),
		))
	var carrier transport.TraceCarrier
	traceContext.Inject(ctx, &carrier)
	return ctx, span, carrier.TraceParent
}

// endForward ends span, the span of a forwarded call whose results are
// rs: with an error status when a check failed for want of an answer or
// for its own fault.
func endForward(span trace.Span, rs ...transport.Result) {
	failed := 0
	var first error
	for _, r := range rs {
		if r.Err != nil {
			if first == nil {
				first = r.Err
			}
			failed++
		}
	}
	if first != nil {
		span.SetAttributes(attrFailed.Int(failed))
		span.RecordError(first)
		span.SetStatus(codes.Error, first.Error())
	}
	span.End()
}
