package daemon

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/rules"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// registerPublic registers the public gRPC API on s, the server of
// grpc_addr: the node's Sluice service (cluster.Node.RegisterPublicAPI,
// with the daemon's permits), the rules' enforcer over the node, set
// before any request can reach it, the Rules service, and Envoy's rate
// limit service when envoy_config_dir is set. Without peer_addr it is the
// node's RegisterServices, and s the node's own server. With backend
// redis n is nil and the services decide on Redis.
func (d *Daemon) registerPublic(s grpc.ServiceRegistrar, n *cluster.Node) error {
	var lim sluice.Limiter = n
	d.registerHealth(s)
	if n != nil {
		n.RegisterPublicAPI(s)
	} else {
		d.redis.register(s, d.permitGRPC)
		lim = d.redis
	}
	// A refund of a window rule's hits goes back to the window its
	// consume's decision names, which the key's owner (or Redis) checks.
	// A decision that names none (an owner that does not report it) is
	// refunded only while the window that charged the hits holds, up to
	// a peer call's timeout, past both ends of the consume and the
	// refund: one may be that long on its way to the key's owner.
	d.enforcer = rules.Enforcer{Limiter: serverLimits{lim}, MaxWait: maxRulesWait, Now: d.opts.now, ClockSkew: d.cfg.PeerTimeout}
	transport.RegisterRules(s, rulesServer{d: d})
	if d.envoy != nil || d.envoyXDS != nil {
		return d.registerEnvoy(s, lim)
	}
	return nil
}

// rulesServer serves sluice.v1.Rules, the gRPC form of POST
// /v1/rules/check: the same checks of its input (descriptorOf), the same
// rules, the same decisions. The server of grpc_addr admits its callers
// as it admits the Sluice service's.
type rulesServer struct {
	pb.UnimplementedRulesServer
	d *Daemon
}

func (s rulesServer) Check(ctx context.Context, in *pb.RulesCheckRequest) (*pb.RulesCheckResponse, error) {
	if s.d.rules == nil {
		return nil, status.Error(codes.FailedPrecondition, "no rules_file is configured: sluice.v1.Rules/Check needs the daemon started with one")
	}
	desc, hits, ierr := descriptorOf(&rulesInput{
		Route: in.Route, Method: in.Method, IP: in.Ip, User: in.User,
		Headers: entriesOf(in.Headers), Descriptors: entriesOf(in.Descriptors), Hits: in.Hits,
	})
	if ierr != nil {
		return nil, invalidStatus(ierr)
	}
	v, ierr := s.d.enforceRules(ctx, desc, hits)
	if ierr != nil {
		return nil, status.Error(grpcCode(ierr), ierr.Message)
	}
	return encodeVerdictProto(v), nil
}

// entriesOf returns es as rulesEntry values; the count guard has bounded
// them to transport.MaxRulesEntries.
func entriesOf(es []*pb.RulesEntry) []rulesEntry {
	if len(es) == 0 {
		return nil
	}
	out := make([]rulesEntry, len(es))
	for i, e := range es {
		out[i] = rulesEntry{Name: e.GetName(), Value: e.GetValue()}
	}
	return out
}

// encodeVerdictProto returns v as a RulesCheckResponse listing its first
// transport.MaxRulesResults rules.
func encodeVerdictProto(v *rules.Verdict) *pb.RulesCheckResponse {
	limits := v.Limits
	out := &pb.RulesCheckResponse{
		Allowed:         v.Allowed,
		RetryAfterNanos: int64(v.RetryAfter),
		DelayNanos:      int64(v.Delay),
		Truncated:       len(limits) > transport.MaxRulesResults,
	}
	if out.Truncated {
		limits = limits[:transport.MaxRulesResults]
	}
	out.Rules = make([]*pb.RuleResult, len(limits))
	for i := range limits {
		l := &limits[i]
		dec := ruleDecision(l)
		r := &pb.RuleResult{
			Name: l.Rule.Name, Key: l.Request.Key, Shadow: !l.Enforced,
			Allowed: dec.Allowed, Limit: dec.Limit, Remaining: dec.Remaining,
			RetryAfterNanos: int64(dec.RetryAfter), DelayNanos: int64(dec.Delay),
			Owner: l.Decision.Owner, WithoutOwner: l.Decision.WithoutOwner,
		}
		if !dec.ResetAt.IsZero() {
			r.ResetAtUnixNano = dec.ResetAt.UnixNano()
		}
		out.Rules[i] = r
	}
	return out
}

// invalidStatus is e, an invalid input, as InvalidArgument: its message
// names the field, and so does a google.rpc.BadRequest detail.
func invalidStatus(e *itemError) error {
	st := status.New(codes.InvalidArgument, e.Message)
	if e.Field == "" {
		return st.Err()
	}
	withField, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: e.Field, Description: e.Message}},
	})
	if err != nil { // cannot happen: the detail is a valid message
		return st.Err()
	}
	return withField.Err()
}

// grpcCode is the status code of a check that failed with e, as statusFor
// is its HTTP status.
func grpcCode(e *itemError) codes.Code {
	switch e.Code {
	case "unavailable":
		return codes.Unavailable
	case "deadline_exceeded":
		return codes.DeadlineExceeded
	case "canceled":
		return codes.Canceled
	case "internal":
		return codes.Internal
	}
	return codes.InvalidArgument
}
