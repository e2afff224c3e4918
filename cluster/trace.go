package cluster

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// Tracing (Config.TracerProvider). Three spans make up a check that is
// forwarded, all in the caller's trace:
//
//   - "sluice.Check" (or "sluice.CheckMany", one per call, with an event
//     per check) on the node asked, around the whole decision;
//   - "sluice.peer.Forward", a client span of the peer package around the
//     call to the owner, child of the first;
//   - "sluice.Decide", a server span on the owner around its decision,
//     child of the forwarding span, whose traceparent the check carried in
//     its item of the peer batch (transport.TraceParents).
//
// A check decided where it was asked has the first span only. The client
// key is personal data in many deployments: it is recorded only with
// Config.TraceKeys.

// tracerName names the tracer of this package.
const tracerName = "github.com/sluicehq/sluice/cluster"

// Span names.
const (
	checkSpan     = "sluice.Check"
	checkManySpan = "sluice.CheckMany"
	decideSpan    = "sluice.Decide"
)

// Attributes of the spans, and of the events of a CheckMany span.
const (
	attrName         = attribute.Key("sluice.limit.name")
	attrAlgorithm    = attribute.Key("sluice.limit.algorithm")
	attrHits         = attribute.Key("sluice.hits")
	attrKey          = attribute.Key("sluice.key")
	attrAllowed      = attribute.Key("sluice.allowed")
	attrOwner        = attribute.Key("sluice.owner")
	attrForwarded    = attribute.Key("sluice.forwarded")
	attrWithoutOwner = attribute.Key("sluice.without_owner")
	attrChecks       = attribute.Key("sluice.checks")
	attrFrom         = attribute.Key("sluice.peer.from")
)

// tracing starts and ends a node's spans. A node without
// Config.TracerProvider has none (Node.tracing is nil), and its checks
// take no step of this file.
type tracing struct {
	tracer trace.Tracer
	keys   bool // Config.TraceKeys
	self   string
}

// traceContext reads the traceparents that forwarded checks carry.
var traceContext propagation.TraceContext

func newTracing(cfg *Config) *tracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &tracing{tracer: cfg.TracerProvider.Tracer(tracerName), keys: cfg.TraceKeys, self: cfg.NodeName}
}

// requestAttrs returns the attributes of req a span records.
func (t *tracing) requestAttrs(req *limiter.Request) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, attrName.String(req.Name), attrAlgorithm.String(req.Algorithm.String()), attrHits.Int64(req.Hits))
	if t.keys {
		attrs = append(attrs, attrKey.String(req.Key))
	}
	return attrs
}

// resultAttrs appends to attrs those of a check's outcome, d or err, as
// seen from the node asked.
func (t *tracing) resultAttrs(attrs []attribute.KeyValue, d *sluice.Decision, err error) []attribute.KeyValue {
	if err != nil {
		return attrs
	}
	return append(attrs,
		attrAllowed.Bool(d.Allowed),
		attrOwner.String(d.Owner),
		attrForwarded.Bool(d.Owner != "" && d.Owner != t.self),
		attrWithoutOwner.Bool(d.WithoutOwner))
}

// startCheck starts the span of a Check of req.
func (t *tracing) startCheck(ctx context.Context, req *limiter.Request) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, checkSpan)
	if span.IsRecording() {
		span.SetAttributes(t.requestAttrs(req)...)
	}
	return ctx, span
}

// endCheck ends the span of a Check of req, whose outcome is d or err.
func (t *tracing) endCheck(span trace.Span, d *sluice.Decision, err error) {
	if span.IsRecording() {
		span.SetAttributes(t.resultAttrs(nil, d, err)...)
		markFailed(span, err)
	}
	span.End()
}

// startMany starts the span of a CheckMany of n checks.
func (t *tracing) startMany(ctx context.Context, n int) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, checkManySpan, trace.WithAttributes(attrChecks.Int(n)))
}

// endMany ends the span of a CheckMany of reqs, with an event "check" per
// request that records it and its outcome.
func (t *tracing) endMany(span trace.Span, reqs []limiter.Request, out []sluice.Result) {
	if span.IsRecording() {
		for i := range reqs {
			attrs := t.resultAttrs(t.requestAttrs(&reqs[i]), &out[i].Decision, out[i].Err)
			if err := out[i].Err; err != nil {
				attrs = append(attrs, attribute.String("error", err.Error()))
			}
			span.AddEvent("check", trace.WithAttributes(attrs...))
		}
	}
	span.End()
}

// startDecide starts the owner's span of its decision of req, a check
// forwarded by the node from with traceparent (possibly "" or invalid:
// then the span starts under ctx alone).
func (t *tracing) startDecide(ctx context.Context, req *limiter.Request, from, traceparent string) trace.Span {
	if traceparent != "" {
		ctx = traceContext.Extract(ctx, &transport.TraceCarrier{TraceParent: traceparent})
	}
	_, span := t.tracer.Start(ctx, decideSpan, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(append(t.requestAttrs(req), attrFrom.String(from))...)
	}
	return span
}

// endDecide ends the owner's span of a decision whose result is r.
func (t *tracing) endDecide(span trace.Span, r *sluice.Result) {
	if span.IsRecording() {
		span.SetAttributes(t.resultAttrs(nil, &r.Decision, r.Err)...)
		markFailed(span, r.Err)
	}
	span.End()
}

// markFailed marks span as failed with err, when err is not nil.
func markFailed(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}
