package transport

import "context"

// A forwarded check carries the W3C traceparent of the span that forwarded
// it in its own item (RateLimitRequest.traceparent), not in the call's
// metadata: a CheckStream call lives as long as the connection and its
// batches mix checks of many callers, each of its own trace. The owner
// reads them with TraceParents and starts each decision's span as a child
// of its caller's. This package reads and writes the strings only; the
// peer and cluster packages speak OpenTelemetry.

// traceParentKey is the header name of the W3C trace context that
// TraceCarrier keeps.
const traceParentKey = "traceparent"

// TraceCarrier holds the traceparent of one check. It has the methods of
// OpenTelemetry's propagation.TextMapCarrier, so that a
// propagation.TraceContext injects into it and extracts from it; it keeps
// the traceparent header only (tracestate is not carried).
type TraceCarrier struct {
	TraceParent string
}

// Get returns the traceparent for key "traceparent", and "" for any
// other key.
func (c *TraceCarrier) Get(key string) string {
	if key == traceParentKey {
		return c.TraceParent
	}
	return ""
}

// Set keeps value when key is "traceparent", and ignores any other key.
func (c *TraceCarrier) Set(key, value string) {
	if key == traceParentKey {
		c.TraceParent = value
	}
}

// Keys returns the one key a TraceCarrier keeps.
func (c *TraceCarrier) Keys() []string { return []string{traceParentKey} }

// itemTraces are the traceparents of a batch's requests, in the order of
// the requests the Checker gets.
type itemTraces struct{ parents []string }

type itemTracesKey struct{}

// TraceParents returns the traceparent that the sender gave each request
// of the batch, within a Checker called by the Peer service: one per
// request, in the order of its reqs, "" for a request sent without one;
// or nil when no request of the batch has one (always, when the sender
// does not trace). The strings are as received, unchecked. The slice is
// valid until the Checker returns.
func TraceParents(ctx context.Context) []string {
	if t, ok := ctx.Value(itemTracesKey{}).(*itemTraces); ok {
		return t.parents
	}
	return nil
}
