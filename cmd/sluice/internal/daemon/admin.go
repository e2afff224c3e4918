package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// The admin API: inspect a key's state on its owner, and reset a key.
//
//	GET  /v1/admin/keys?name=N&key=K[&algorithm=A&limit=L&period=P...]
//	POST /v1/admin/keys/reset  {"name": N, "key": K}
//
// Inspecting goes to the key's owner through the node (cluster's
// Node.Inspect, the Peer service's Inspect) and changes nothing; given a
// limit's parameters, it also peeks (a check of 0 hits) for the decision
// the next request would get. A reset is the check limiter.ResetRequest,
// which its owner decides and passes on to the key's replicas. Who may:
// a reset is a destructive behavior (Config.Destructive); inspecting
// reveals a key's usage, so under DestructiveAdmins only admins may, and
// otherwise every caller the API admits.

// errInspect is an inspection refused by Config.Destructive.
var errInspect = errors.New("inspecting keys is permitted to admins only (destructive_behaviors admins)")

// permitInspect refuses to inspect keys for a caller, whose verified
// client certificate is cert (nil for none), who is not an admin under
// DestructiveAdmins.
func (d *Daemon) permitInspect(cert *x509.Certificate) error {
	if d.cfg.Destructive != DestructiveAdmins || cert != nil && transport.HasIdentity(cert, d.cfg.AdminIdentities) {
		return nil
	}
	return errInspect
}

// permitInspectGRPC is permitInspect for a caller of the public gRPC API.
func (d *Daemon) permitInspectGRPC(ctx context.Context) error {
	return d.permitInspect(transport.CallerCertificate(ctx))
}

// KeyState is the JSON form of a key's state: the fields of its algorithm
// (limiter.StateView), instants in RFC 3339 with nanoseconds, in UTC.
type KeyState struct {
	Algorithm string `json:"algorithm"`
	ExpireAt  string `json:"expire_at"`
	// Token and leaky buckets.
	Level   *float64 `json:"level,omitempty"`
	LevelAt string   `json:"level_at,omitempty"`
	// Fixed window and sliding window counter.
	WindowStart    string `json:"window_start,omitempty"`
	WindowHits     *int64 `json:"window_hits,omitempty"`
	PrevWindowHits *int64 `json:"prev_window_hits,omitempty"`
	// GCRA.
	TAT      string    `json:"tat,omitempty"`
	Interval *Duration `json:"interval,omitempty"`
	// Sliding window log.
	LogEntries *int   `json:"log_entries,omitempty"`
	LogHits    *int64 `json:"log_hits,omitempty"`
}

// Inspection is the JSON answer of GET /v1/admin/keys.
type Inspection struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Owner is the node whose store was read; WithoutOwner is set when
	// the owner could not be reached and that is the node asked.
	Owner        string   `json:"owner"`
	Replicas     []string `json:"replicas"`
	WithoutOwner bool     `json:"without_owner"`
	ReadAt       string   `json:"read_at,omitempty"`
	// State is absent when the key is fresh.
	State *KeyState `json:"state,omitempty"`
	// Decision is the peek's, when the limit's parameters were given.
	Decision *Decision `json:"decision,omitempty"`
}

// EncodeInspection returns ins, about (name, key), in JSON form.
func EncodeInspection(name, key string, ins sluice.Inspection) Inspection {
	out := Inspection{Name: name, Key: key, Owner: ins.Owner, Replicas: ins.Replicas, WithoutOwner: ins.WithoutOwner,
		ReadAt: rfc3339(ins.At)}
	if out.Replicas == nil {
		out.Replicas = []string{}
	}
	if !ins.Found {
		return out
	}
	v := ins.State.View()
	s := &KeyState{Algorithm: v.Algorithm.String(), ExpireAt: rfc3339(v.ExpireAt)}
	switch v.Algorithm {
	case limiter.TokenBucket, limiter.LeakyBucket:
		s.Level, s.LevelAt = &v.Level, rfc3339(v.LevelAt)
	case limiter.FixedWindow:
		s.WindowStart, s.WindowHits = rfc3339(v.WindowStart), &v.WindowHits
	case limiter.SlidingWindowCounter:
		s.WindowStart, s.WindowHits, s.PrevWindowHits = rfc3339(v.WindowStart), &v.WindowHits, &v.PrevWindowHits
	case limiter.GCRA:
		interval := Duration(v.Interval)
		s.TAT, s.Interval = rfc3339(v.TAT), &interval
	case limiter.SlidingWindowLog:
		s.LogEntries, s.LogHits = &v.LogEntries, &v.LogHits
	}
	out.State = s
	return out
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// inspectParams are the query parameters of GET /v1/admin/keys besides
// name and key: a limit's, for the peek.
var inspectParams = []string{"algorithm", "limit", "period", "burst", "calendar", "time_zone"}

func (d *Daemon) handleInspect(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for p := range q {
		if p != "name" && p != "key" && !slices.Contains(inspectParams, p) {
			writeProblem(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q", p), &itemError{Code: "invalid_argument", Field: p})
			return
		}
		if len(q[p]) > 1 {
			writeProblem(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q is given %d times", p, len(q[p])), &itemError{Code: "invalid_argument", Field: p})
			return
		}
	}
	name, key := q.Get("name"), q.Get("key")
	if err := limiter.ValidateKey(name, key); err != nil {
		ierr := toItemError(err)
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	peek, ierr := d.peekRequest(name, key, q)
	if ierr != nil {
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	if err := d.permitInspect(callerCert(r)); err != nil {
		writeProblem(w, http.StatusForbidden, err.Error(), &itemError{Code: "permission_denied", Message: err.Error()})
		return
	}
	if d.node == nil {
		writeProblem(w, http.StatusNotImplemented, "inspect reads a key's state in a cluster node's store: backend redis keeps it in Redis, read by its script alone", &itemError{Code: "unimplemented"})
		return
	}
	ins, err := d.node.Inspect(r.Context(), name, key)
	if err != nil {
		ierr := toItemError(err)
		writeProblem(w, statusFor(ierr), ierr.Message, ierr)
		return
	}
	out := EncodeInspection(name, key, ins)
	if peek != nil {
		dec, err := d.node.Check(r.Context(), *peek)
		if err != nil {
			ierr := toItemError(err)
			writeProblem(w, statusFor(ierr), ierr.Message, ierr)
			return
		}
		e := EncodeDecision(dec.Decision, dec.Owner, dec.WithoutOwner, d.opts.now())
		out.Decision = &e
	}
	writeJSON(w, http.StatusOK, out)
}

// peekRequest returns the peek that the limit parameters of q describe,
// validated as a check, or nil when q gives none.
func (d *Daemon) peekRequest(name, key string, q url.Values) (*limiter.Request, *itemError) {
	given := slices.ContainsFunc(inspectParams, q.Has)
	if !given {
		return nil, nil
	}
	zero := int64(0)
	in := CheckRequest{Name: name, Key: key, Hits: &zero, Algorithm: q.Get("algorithm"), Calendar: q.Get("calendar"), TimeZone: q.Get("time_zone")}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"limit", &in.Limit}, {"burst", &in.Burst}} {
		if !q.Has(f.name) {
			continue
		}
		v, err := strconv.ParseInt(q.Get(f.name), 10, 64)
		if err != nil {
			return nil, &itemError{Code: fieldCodes[f.name], Field: f.name, Message: fmt.Sprintf("%s %q is not an integer", f.name, q.Get(f.name))}
		}
		*f.dst = v
	}
	if q.Has("period") {
		p, err := time.ParseDuration(q.Get("period"))
		if err != nil {
			return nil, &itemError{Code: "invalid_period", Field: "period", Message: fmt.Sprintf("period %q is not a duration such as \"1m\" or \"250ms\"", q.Get("period"))}
		}
		in.Period = Duration(p)
	}
	req, _, ierr := d.checkRequest(&in)
	if ierr != nil {
		return nil, ierr
	}
	return &req, nil
}

// ResetRequest is the body of POST /v1/admin/keys/reset.
type ResetRequest struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// ResetResponse answers POST /v1/admin/keys/reset: the key is fresh on
// Owner, which passes the reset on to the key's replicas.
type ResetResponse struct {
	Name  string `json:"name"`
	Key   string `json:"key"`
	Owner string `json:"owner"`
}

func (d *Daemon) handleReset(w http.ResponseWriter, r *http.Request) {
	body, release, ok := d.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	var in ResetRequest
	if err := decodeStrict(body, &in); err != nil {
		ierr := jsonError(err)
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	if err := limiter.ValidateKey(in.Name, in.Key); err != nil {
		ierr := toItemError(err)
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	req := limiter.ResetRequest(in.Name, in.Key)
	if err := d.permitHTTP(r, &req); err != nil {
		writeProblem(w, http.StatusForbidden, err.Error(), &itemError{Code: "permission_denied", Message: err.Error()})
		return
	}
	// Deny, not decide here: an owner out of reach resets nothing.
	dec, err := d.limiter.Check(r.Context(), req, sluice.OnUnreachable(sluice.PolicyDeny))
	if err != nil {
		ierr := toItemError(err)
		writeProblem(w, statusFor(ierr), ierr.Message, ierr)
		return
	}
	if dec.WithoutOwner {
		writeProblem(w, http.StatusServiceUnavailable, "the key's owner could not be reached: nothing was reset", &itemError{Code: "unavailable"})
		return
	}
	d.logger.Info("sluice: key reset", "name", in.Name, "key", in.Key, "owner", dec.Owner)
	writeJSON(w, http.StatusOK, ResetResponse{Name: in.Name, Key: in.Key, Owner: dec.Owner})
}
