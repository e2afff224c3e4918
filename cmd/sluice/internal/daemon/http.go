package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/redislimit"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// CheckRequest is the JSON form of one check.
type CheckRequest struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Hits absent means 1; 0 peeks.
	Hits   *int64   `json:"hits,omitempty"`
	Limit  int64    `json:"limit"`
	Period Duration `json:"period,omitzero"`
	Burst  int64    `json:"burst,omitempty"`
	// Algorithm is required: token_bucket, leaky_bucket, fixed_window,
	// sliding_window_log, sliding_window_counter or gcra.
	Algorithm      string `json:"algorithm"`
	Calendar       string `json:"calendar,omitempty"`
	TimeZone       string `json:"time_zone,omitempty"`
	Reset          bool   `json:"reset,omitempty"`
	DrainOverLimit bool   `json:"drain_over_limit,omitempty"`
	// Unreachable is "", "default", "local", "allow" or "deny".
	Unreachable string `json:"unreachable,omitempty"`
}

// Duration is a time.Duration in JSON: a Go duration string ("1m30s") or
// an integer number of nanoseconds. It is written as a string.
type Duration time.Duration

// UnmarshalJSON reads a duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return &itemError{Code: "invalid_period", Field: "period", Message: fmt.Sprintf("period %q is not a duration such as \"1m\" or \"250ms\"", s)}
		}
		*d = Duration(v)
		return nil
	}
	if string(b) == "null" {
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return &itemError{Code: "invalid_period", Field: "period", Message: fmt.Sprintf("period %s is neither a duration string nor an integer number of nanoseconds", b)}
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Decision is the JSON form of a decision.
type Decision struct {
	Allowed   bool  `json:"allowed"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// ResetAt is RFC 3339 with nanoseconds, in UTC; absent when unknown.
	ResetAt string `json:"reset_at,omitempty"`
	// The durations are in milliseconds, rounded up, so that waiting that
	// long is always enough.
	ResetAfterMs int64  `json:"reset_after_ms"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	DelayMs      int64  `json:"delay_ms"`
	Owner        string `json:"owner"`
	WithoutOwner bool   `json:"without_owner"`
}

// EncodeDecision returns d in JSON form, with reset_after_ms counted from
// now.
func EncodeDecision(d limiter.Decision, owner string, withoutOwner bool, now time.Time) Decision {
	out := Decision{
		Allowed:      d.Allowed,
		Limit:        d.Limit,
		Remaining:    d.Remaining,
		RetryAfterMs: ceilMillis(d.RetryAfter),
		DelayMs:      ceilMillis(d.Delay),
		Owner:        owner,
		WithoutOwner: withoutOwner,
	}
	if !d.ResetAt.IsZero() {
		out.ResetAt = d.ResetAt.UTC().Format(time.RFC3339Nano)
		out.ResetAfterMs = ceilMillis(d.ResetAt.Sub(now))
	}
	return out
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	if d > math.MaxInt64-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// itemError is the error of one check: a code (the wire protocol's error
// code in snake case), the JSON field at fault when there is one, and a
// message that names it.
type itemError struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *itemError) Error() string { return e.Message }

// BatchRequest is the body of POST /v1/check/batch.
type BatchRequest struct {
	Requests []json.RawMessage `json:"requests"`
}

// BatchItem is one response of a batch: a decision, or an error.
type BatchItem struct {
	*Decision
	Error *itemError `json:"error,omitempty"`
}

// BatchResponse answers POST /v1/check/batch, one item per request, in
// order.
type BatchResponse struct {
	Responses []BatchItem `json:"responses"`
}

// problem is an RFC 9457 problem detail, with the field and code of the
// failure when it is one check's.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
	Code   string `json:"code,omitempty"`
}

// Handler returns the daemon's HTTP API:
//
//	POST /v1/check        one check
//	POST /v1/check/batch  {"requests": [...]}, per-item errors
//	POST /v1/rules/check  a request described for the rules of rules_file
//	GET  /v1/admin/keys   a key's state on its owner (admin.go)
//	POST /v1/admin/keys/reset  {"name": N, "key": K}: the key is fresh
//	GET  /healthz         liveness
//	GET  /readyz          readiness
//	GET  /metrics         Prometheus
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", d.requireClientCert(d.handleCheck))
	mux.HandleFunc("POST /v1/check/batch", d.requireClientCert(d.handleBatch))
	mux.HandleFunc("POST /v1/rules/check", d.requireClientCert(d.handleRulesCheck))
	mux.HandleFunc("GET /v1/admin/keys", d.requireClientCert(d.handleInspect))
	mux.HandleFunc("POST /v1/admin/keys/reset", d.requireClientCert(d.handleReset))
	mux.HandleFunc("POST /json", d.requireClientCert(d.handleEnvoyJSON))
	mux.HandleFunc("GET /healthcheck", d.handleHealthcheck)
	mux.HandleFunc("GET /healthz", d.handleHealthz)
	mux.HandleFunc("GET /readyz", d.handleReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	return d.metrics.instrument(mux, d.logger)
}

// requireClientCert refuses, with mutual TLS configured (tls_ca_file), a
// request whose connection presented no verified client certificate. The
// TLS listener asks for one but lets health, readiness and metrics through
// without, so that probes and scrapers need no certificate.
func (d *Daemon) requireClientCert(h http.HandlerFunc) http.HandlerFunc {
	if d.cfg.TLSCAFile == "" {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			writeProblem(w, http.StatusUnauthorized, "a client certificate signed by the daemon's tls_ca_file is required", nil)
			return
		}
		h(w, r)
	}
}

func (d *Daemon) handleHealthz(w http.ResponseWriter, r *http.Request) {
	// grpc_addr lets a client that dialed this port with gRPC say where
	// the gRPC API is.
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "node": d.cfg.NodeName, "grpc_addr": d.GRPCAddr()})
}

func (d *Daemon) handleReadyz(w http.ResponseWriter, r *http.Request) {
	d.refreshHealth() // grpc.health.v1's watchers see what probes see
	ok, why := d.readiness()
	body := map[string]any{"node": d.cfg.NodeName, "backend": d.cfg.Backend}
	if d.node != nil {
		body["members"] = len(d.node.RingMembers())
		// unconfirmed: members whose hand-over of the keys that moved here
		// this node still waits for (cluster.Node.Unconfirmed); 0 once settled.
		body["unconfirmed"] = len(d.node.Unconfirmed())
	}
	if refused := d.refusedMembers(); len(refused) > 0 {
		// Gossip members that have not proved they belong to the cluster:
		// they own no key. They do not make the node unready, which would
		// let anyone who reaches the gossip port take a node out.
		out := make([]map[string]any, len(refused))
		for i, r := range refused {
			out[i] = map[string]any{"name": r.Name, "grpc": r.GRPCAddr, "reason": r.Reason,
				"since": r.Since.UTC().Format(time.RFC3339Nano), "attempts": r.Attempts}
		}
		body["refused_members"] = out
	}
	if clocks := d.peerClocks(); len(clocks) > 0 {
		// Each member's clock offset from this node's, as estimated; a
		// member beyond max_clock_skew does not make the node unready.
		out := make([]map[string]any, len(clocks))
		for i, p := range clocks {
			out[i] = map[string]any{"name": p.Name, "offset_seconds": p.Offset.Seconds(), "rtt_seconds": p.RTT.Seconds(), "beyond_max_skew": p.Beyond}
		}
		body["peer_clocks"] = out
	}
	if !ok {
		body["status"] = "not ready"
		body["reason"] = why
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	body["status"] = "ready"
	writeJSON(w, http.StatusOK, body)
}

// refusedMembers are the node's refused gossip members; none with
// backend redis.
// peerClocks are the node's estimates of its members' clocks; none with
// backend redis.
func (d *Daemon) peerClocks() []cluster.PeerClock {
	if d.node == nil {
		return nil
	}
	return d.node.PeerClocks()
}

func (d *Daemon) refusedMembers() []cluster.RefusedMember {
	if d.node == nil {
		return nil
	}
	return d.node.RefusedMembers()
}

func (d *Daemon) handleCheck(w http.ResponseWriter, r *http.Request) {
	body, release, ok := d.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	req, policy, ierr := d.decodeCheck(body)
	if ierr != nil {
		d.metrics.items.WithLabelValues(resultInvalid).Inc()
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	if err := d.permitHTTP(r, &req); err != nil {
		writeProblem(w, http.StatusForbidden, err.Error(), &itemError{Code: "permission_denied", Field: "behavior", Message: err.Error()})
		return
	}
	dec, err := d.limiter.Check(r.Context(), req, sluice.OnUnreachable(policy))
	if err != nil {
		ierr := toItemError(err)
		d.metrics.items.WithLabelValues(resultFor(ierr)).Inc()
		writeProblem(w, statusFor(ierr), ierr.Message, ierr)
		return
	}
	d.metrics.countDecision(dec.Allowed)
	writeJSON(w, http.StatusOK, EncodeDecision(dec.Decision, dec.Owner, dec.WithoutOwner, d.opts.now()))
}

func (d *Daemon) handleBatch(w http.ResponseWriter, r *http.Request) {
	body, release, ok := d.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	var batch BatchRequest
	if err := decodeStrict(body, &batch); err != nil {
		ierr := jsonError(err)
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	if n := len(batch.Requests); n > d.cfg.MaxBatchItems {
		writeProblem(w, http.StatusBadRequest, fmt.Sprintf("requests holds %d items, more than the maximum %d", n, d.cfg.MaxBatchItems),
			&itemError{Code: "invalid_argument", Field: "requests"})
		return
	}
	out := BatchResponse{Responses: make([]BatchItem, len(batch.Requests))}
	// Valid requests are decided together, one CheckMany per unreachable
	// policy, the groups in the order their policies first appear.
	type group struct {
		policy sluice.Policy
		idx    []int
		reqs   []limiter.Request
	}
	var groups []*group
	for i, raw := range batch.Requests {
		req, policy, ierr := d.decodeCheck(raw)
		if ierr != nil {
			d.metrics.items.WithLabelValues(resultInvalid).Inc()
			out.Responses[i].Error = ierr
			continue
		}
		if err := d.permitHTTP(r, &req); err != nil {
			msg := fmt.Sprintf("requests[%d]: %v", i, err)
			writeProblem(w, http.StatusForbidden, msg, &itemError{Code: "permission_denied", Field: "behavior", Message: msg})
			return
		}
		var g *group
		for _, h := range groups {
			if h.policy == policy {
				g = h
				break
			}
		}
		if g == nil {
			g = &group{policy: policy}
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.reqs = append(g.reqs, req)
	}
	now := d.opts.now()
	for _, g := range groups {
		for j, res := range d.limiter.CheckMany(r.Context(), g.reqs, sluice.OnUnreachable(g.policy)) {
			i := g.idx[j]
			if res.Err != nil {
				ierr := toItemError(res.Err)
				d.metrics.items.WithLabelValues(resultFor(ierr)).Inc()
				out.Responses[i].Error = ierr
				continue
			}
			d.metrics.countDecision(res.Allowed)
			dec := EncodeDecision(res.Decision.Decision, res.Owner, res.WithoutOwner, now)
			out.Responses[i].Decision = &dec
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// decodeCheck parses and validates one check the way the gRPC API does:
// through transport's codec, so that both APIs accept the same requests.
func (d *Daemon) decodeCheck(raw []byte) (limiter.Request, sluice.Policy, *itemError) {
	var in CheckRequest
	if err := decodeStrict(raw, &in); err != nil {
		return limiter.Request{}, 0, jsonError(err)
	}
	return d.checkRequest(&in)
}

// checkRequest validates in, a check as the HTTP API takes it.
func (d *Daemon) checkRequest(in *CheckRequest) (limiter.Request, sluice.Policy, *itemError) {
	if in.Algorithm == "" {
		return limiter.Request{}, 0, &itemError{Code: "unknown_algorithm", Field: "algorithm", Message: "algorithm is required: " + algorithmList()}
	}
	alg, err := limiter.ParseAlgorithm(in.Algorithm)
	if err != nil {
		return limiter.Request{}, 0, &itemError{Code: "unknown_algorithm", Field: "algorithm", Message: fmt.Sprintf("algorithm %q is unknown: want %s", in.Algorithm, algorithmList())}
	}
	cal, err := limiter.ParseCalendar(in.Calendar)
	if err != nil {
		return limiter.Request{}, 0, &itemError{Code: "invalid_calendar", Field: "calendar", Message: fmt.Sprintf("calendar %q is unknown: want minute, hour, day, week, month or year", in.Calendar)}
	}
	policy := sluice.PolicyDefault
	if in.Unreachable != "" && in.Unreachable != "default" {
		if policy, err = sluice.ParsePolicy(in.Unreachable); err != nil {
			return limiter.Request{}, 0, &itemError{Code: "invalid_argument", Field: "unreachable", Message: fmt.Sprintf("unreachable %q is unknown: want default, local, allow or deny", in.Unreachable)}
		}
	}
	req := limiter.Request{
		Name: in.Name, Key: in.Key, Hits: 1,
		Limit: in.Limit, Period: time.Duration(in.Period), Burst: in.Burst,
		Algorithm: alg, Calendar: cal,
	}
	if in.Hits != nil {
		req.Hits = *in.Hits
	}
	if in.Reset {
		req.Behavior |= limiter.Reset
	}
	if in.DrainOverLimit {
		req.Behavior |= limiter.DrainOverLimit
	}
	if err := req.Validate(); err != nil {
		return limiter.Request{}, 0, toItemError(err)
	}
	if in.TimeZone != "" {
		m := transport.RequestToProto(req)
		m.TimeZone = in.TimeZone
		if req, err = d.codec.RequestFromProto(m); err != nil {
			return limiter.Request{}, 0, &itemError{Code: "invalid_calendar", Field: "time_zone", Message: err.Error()}
		}
	}
	return req, policy, nil
}

func algorithmList() string {
	names := make([]string, len(limiter.Algorithms))
	for i, a := range limiter.Algorithms {
		names[i] = a.String()
	}
	return strings.Join(names, ", ")
}

// decodeStrict decodes exactly one JSON value into v, refusing text that
// would decode as U+FFFD (checkText), unknown fields and trailing data.
func decodeStrict(data []byte, v any) error {
	if e := checkText(data); e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errTrailingData
	}
	return nil
}

var errTrailingData = errors.New("unexpected data after the JSON object")

// fieldCodes gives the error code of a wrongly typed JSON field.
var fieldCodes = map[string]string{
	"name": "invalid_name", "key": "invalid_key", "hits": "invalid_hits",
	"limit": "invalid_limit", "period": "invalid_period", "burst": "invalid_burst",
	"algorithm": "unknown_algorithm", "calendar": "invalid_calendar", "time_zone": "invalid_calendar",
}

// jsonError describes an error of encoding/json.
func jsonError(err error) *itemError {
	var (
		ierr   *itemError
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &ierr):
		return ierr
	case errors.As(err, &typ):
		code := fieldCodes[typ.Field]
		if code == "" {
			code = "invalid_argument"
		}
		if typ.Field == "" {
			return &itemError{Code: code, Message: fmt.Sprintf("want a JSON object, got a JSON %s", typ.Value)}
		}
		return &itemError{Code: code, Field: typ.Field, Message: fmt.Sprintf("%s: want %s, got a JSON %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)}
	case errors.As(err, &syntax):
		return &itemError{Code: "invalid_argument", Message: fmt.Sprintf("malformed JSON at byte %d: %s", syntax.Offset, strings.TrimPrefix(syntax.Error(), "json: "))}
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return &itemError{Code: "invalid_argument", Message: "malformed JSON: unexpected end of input"}
	case errors.Is(err, errTrailingData):
		return &itemError{Code: "invalid_argument", Message: err.Error()}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return &itemError{Code: "invalid_argument", Field: name, Message: fmt.Sprintf("unknown field %q", name)}
	}
	return &itemError{Code: "invalid_argument", Message: err.Error()}
}

func jsonKind(k string) string {
	switch k {
	case "int64", "int", "uint8":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "struct":
		return "an object"
	}
	return "a " + k
}

// sentinelFields names the JSON field of each limiter validation error.
var sentinelFields = []struct {
	err   error
	field string
}{
	{limiter.ErrInvalidName, "name"},
	{limiter.ErrInvalidKey, "key"},
	{limiter.ErrInvalidHits, "hits"},
	{limiter.ErrHitsExceedLimit, "hits"},
	{limiter.ErrInvalidLimit, "limit"},
	{limiter.ErrInvalidPeriod, "period"},
	{limiter.ErrInvalidBurst, "burst"},
	{limiter.ErrUnknownAlgorithm, "algorithm"},
	{limiter.ErrInvalidCalendar, "calendar"},
	{limiter.ErrInvalidBehavior, "reset"},
}

// toItemError describes an error of validation or of the node, with the
// wire protocol's code.
func toItemError(err error) *itemError {
	if errors.Is(err, cluster.ErrClosed) || errors.Is(err, redislimit.ErrClosed) {
		return &itemError{Code: "unavailable", Message: err.Error()}
	}
	code, msg := transport.ErrorToProto(err)
	out := &itemError{Code: codeName(code), Message: msg}
	for _, s := range sentinelFields {
		if errors.Is(err, s.err) {
			out.Field = s.field
			break
		}
	}
	return out
}

func codeName(c pb.ErrorCode) string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "ERROR_CODE_"))
}

// statusFor returns the HTTP status of a single check that failed with e.
func statusFor(e *itemError) int {
	switch e.Code {
	case "unavailable":
		return http.StatusServiceUnavailable
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "canceled":
		return 499 // the client went away; nobody reads this
	case "internal":
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, jsonType, v)
}

func writeProblem(w http.ResponseWriter, status int, detail string, e *itemError) {
	p := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
	if p.Title == "" {
		p.Title = "Client Closed Request"
	}
	if e != nil {
		p.Field, p.Code = e.Field, e.Code
	}
	writeBody(w, status, problemType, p)
}

// The values of the response headers writeBody sets, shared by every
// response rather than a slice each: full slices, so that a handler that
// adds a value appends to a copy.
var (
	jsonType    = []string{"application/json"}[:1:1]
	problemType = []string{"application/problem+json"}[:1:1]
	noSniff     = []string{"nosniff"}[:1:1]
)

// writeBody writes v as the JSON body of the response with status, of
// the Content-Type contentType (jsonType or problemType).
func writeBody(w http.ResponseWriter, status int, contentType []string, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own types: cannot happen
		http.Error(w, "encoding the response failed", http.StatusInternalServerError)
		return
	}
	b = append(b, '\n')
	h := w.Header() // the keys are canonical already
	h["Content-Type"] = contentType
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	h["X-Content-Type-Options"] = noSniff
	w.WriteHeader(status)
	w.Write(b)
}
