package daemon

import (
	"context"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// healthServices are the services grpc.health.v1 answers for: the
// server as a whole and envoyproxy/ratelimit's name, which Envoy's
// cluster health checks and upstream's manifests ask for.
var healthServices = []string{"", "ratelimit"}

// healthService is grpc.health.v1 with each Check answering the
// readiness of that moment; Watch streams the statuses refreshHealth sets
// (at every Check, /readyz, /healthcheck and at shutdown).
type healthService struct {
	*health.Server
	d *Daemon
}

// Check answers the daemon's readiness now.
func (h healthService) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.d.refreshHealth()
	return h.Server.Check(ctx, req)
}

// registerHealth adds grpc.health.v1 to a public gRPC server.
func (d *Daemon) registerHealth(s grpc.ServiceRegistrar) {
	healthpb.RegisterHealthServer(s, healthService{d.health, d})
}

// refreshHealth sets the status of healthServices to the daemon's
// readiness: SERVING when ready, NOT_SERVING otherwise and from the start
// of a shutdown.
func (d *Daemon) refreshHealth() bool {
	ok, _ := d.readiness()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		d.health.SetServingStatus(name, st)
	}
	return ok
}

// handleHealthcheck is envoyproxy/ratelimit's GET /healthcheck: 200 "OK"
// when ready, 500 otherwise.
func (d *Daemon) handleHealthcheck(w http.ResponseWriter, _ *http.Request) {
	if !d.refreshHealth() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// handleEnvoyJSON is envoyproxy/ratelimit's POST /json: a RateLimitRequest
// in protobuf's JSON form, answered with the RateLimitResponse in the
// same form, 429 when it is OVER_LIMIT. An invalid request is 400; 404
// without an Envoy configuration.
func (d *Daemon) handleEnvoyJSON(w http.ResponseWriter, r *http.Request) {
	if d.envoySvc == nil {
		writeProblem(w, http.StatusNotFound, "no Envoy rate limit configuration: POST /json needs envoy_config_dir or envoy_xds_addr", nil)
		return
	}
	body, release, ok := d.readBody(w, r)
	defer release()
	if !ok {
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		writeProblem(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON: "+err.Error(), nil)
		return
	}
	resp, err := d.envoySvc.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusBadRequest
		if st, ok := status.FromError(err); ok && grpcHTTPStatus(st) != 0 {
			code = grpcHTTPStatus(st)
		}
		writeProblem(w, code, errorMessage(err), nil)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, err.Error(), nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// errorMessage is the message of a gRPC status error, or err's text.
func errorMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// grpcHTTPStatus is the HTTP status of a failed ShouldRateLimit: 400 for
// a request it refused, 503 when the limiter failed, 0 for other codes.
func grpcHTTPStatus(st *status.Status) int {
	switch st.Code() {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return http.StatusServiceUnavailable
	}
	return 0
}
