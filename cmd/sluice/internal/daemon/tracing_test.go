package daemon

import (
	"context"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// otlpReceiver is an OTLP/gRPC trace collector on 127.0.0.1 that keeps
// the names of the spans it receives, and of the services that sent them.
type otlpReceiver struct {
	collector.UnimplementedTraceServiceServer
	addr string

	mu       sync.Mutex
	spans    []string
	services []string
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{addr: lis.Addr().String()}
	s := grpc.NewServer()
	collector.RegisterTraceServiceServer(s, r)
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-served
	})
	return r
}

func (r *otlpReceiver) Export(_ context.Context, in *collector.ExportTraceServiceRequest) (*collector.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range in.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				r.services = append(r.services, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, s.Name)
			}
		}
	}
	return &collector.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) received() (spans, services []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans), slices.Clone(r.services)
}

// With tracing_endpoint set, the daemon exports the spans of its checks
// to the collector there, at the latest when it shuts down.
func TestTracingExportsToCollector(t *testing.T) {
	recv := startReceiver(t)
	cfg := testConfig("traced")
	cfg.TracingEndpoint = recv.addr
	cfg.TracingInsecure = true
	cfg.TracingSampleRatio = 1
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	if r := do(t, http.MethodPost, base+"/v1/check", `{"name":"n","key":"k","limit":10,"period":"1s","algorithm":"gcra"}`); r.status != http.StatusOK {
		t.Fatalf("check: %d %s", r.status, r.body)
	}
	if err := d.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, services := recv.received()
	if !slices.Contains(spans, "sluice.Check") {
		t.Errorf("spans received %q, want sluice.Check", spans)
	}
	if len(services) == 0 || slices.IndexFunc(services, func(s string) bool { return s != "sluice" }) >= 0 {
		t.Errorf("services %q, want sluice", services)
	}
}

// Tracing is off by default, and its settings are checked.
func TestTracingSettings(t *testing.T) {
	if c := DefaultConfig(); c.TracingEndpoint != "" {
		t.Errorf("tracing_endpoint %q by default, want none", c.TracingEndpoint)
	}
	for _, tt := range []struct {
		key, value string
		ok         bool
	}{
		{"tracing_endpoint", "collector:4317", true},
		{"tracing_endpoint", "127.0.0.1:4317", true},
		{"tracing_endpoint", ":4317", false},
		{"tracing_endpoint", "collector:0", false},
		{"tracing_endpoint", "collector", false},
		{"tracing_sample_ratio", "0", true},
		{"tracing_sample_ratio", "1", true},
		{"tracing_sample_ratio", "1.5", false},
		{"tracing_sample_ratio", "NaN", false},
		{"tracing_insecure", "yes", false},
		{"tracing_keys", "true", true},
	} {
		cfg := DefaultConfig()
		cfg.NodeName = "n"
		err := fieldByKey(tt.key).set(&cfg, tt.value)
		if (err == nil) != tt.ok {
			t.Errorf("%s %q: %v, want ok %v", tt.key, tt.value, err, tt.ok)
		}
	}
}
