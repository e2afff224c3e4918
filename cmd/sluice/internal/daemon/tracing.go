package daemon

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exportTimeout bounds one export of spans to the collector, and the
// flush of a Close.
const exportTimeout = 5 * time.Second

// newTracerProvider returns the tracer provider of cfg's tracing settings,
// which batches the node's spans and exports them over OTLP/gRPC to
// cfg.TracingEndpoint, or nil when tracing is off. Nothing is dialled
// before the first export; a collector that cannot be reached loses spans,
// never checks.
func newTracerProvider(cfg *Config) (*sdktrace.TracerProvider, error) {
	if cfg.TracingEndpoint == "" {
		return nil, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.TracingEndpoint), otlptracegrpc.WithTimeout(exportTimeout)}
	if cfg.TracingInsecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, &ConfigError{Field: "tracing_endpoint", Err: fmt.Errorf("OTLP exporter: %w", err)}
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "sluice"),
		attribute.String("service.instance.id", cfg.NodeName),
	)
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.TracingSampleRatio))),
	), nil
}

// stopTracing exports the spans not yet sent, within ctx, and stops the
// tracer provider; nothing when tracing is off.
func (d *Daemon) stopTracing(ctx context.Context) error {
	if d.tracer == nil {
		return nil
	}
	if err := d.tracer.Shutdown(ctx); err != nil {
		return fmt.Errorf("daemon: flush traces: %w", err)
	}
	return nil
}
