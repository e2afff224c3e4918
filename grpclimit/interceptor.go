package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Method is the Descriptor.Method of every gRPC call, for rules that
// match on methods.
const Method = "grpc"

// RuleSource gives the rules in force. Current is called once per call
// and must be cheap and safe for concurrent use; *rules.Source and
// *rules.Watcher are RuleSources.
type RuleSource interface {
	Current() *rules.Set
}

var (
	_ RuleSource = (*rules.Source)(nil)
	_ RuleSource = (*rules.Watcher)(nil)
)

// ErrInvalidOption wraps the errors of New for a bad option.
var ErrInvalidOption = errors.New("grpclimit: invalid option")

// Outcome is what the interceptor did with a call.
type Outcome uint8

const (
	Allowed      Outcome = iota + 1 // every rule admitted the call (or none applied)
	Rejected                        // a rule rejected it: ResourceExhausted
	Shadowed                        // a shadow rule would have rejected it; it went through
	FailedOpen                      // the limiter failed and the call went through
	FailedClosed                    // the limiter failed and the call got Unavailable
	Abandoned                       // the call ended while it waited for a leaky bucket
	numOutcomes
)

var outcomeNames = [...]string{Allowed: "allowed", Rejected: "rejected", Shadowed: "shadowed",
	FailedOpen: "failed_open", FailedClosed: "failed_closed", Abandoned: "abandoned"}

func (o Outcome) String() string {
	if o == 0 || o >= numOutcomes {
		return "outcome(" + strconv.Itoa(int(o)) + ")"
	}
	return outcomeNames[o]
}

// Event describes one decision, for OnDecision.
type Event struct {
	FullMethod string
	Descriptor *rules.Descriptor
	Verdict    *rules.Verdict
	Outcome    Outcome
}

// Stats counts calls by outcome.
type Stats struct {
	Allowed, Rejected, Shadowed, FailedOpen, FailedClosed, Abandoned int64
	Waited                                                           int64
}

// Option configures an Interceptor.
type Option func(*config)

type config struct {
	user       func(ctx context.Context, fullMethod string) (string, bool)
	values     func(ctx context.Context, fullMethod string) map[string]string
	shadow     bool
	maxWait    time.Duration
	failClosed bool
	onDecision func(Event)
	now        func() time.Time
	after      func(time.Duration) <-chan time.Time
	logger     *slog.Logger
}

// UserFunc sets how the authenticated user of a call is found (from its
// auth info or metadata); ok false means anonymous.
func UserFunc(f func(ctx context.Context, fullMethod string) (user string, ok bool)) Option {
	return func(c *config) { c.user = f }
}

// DescriptorFunc sets the application-defined descriptors of a call.
func DescriptorFunc(f func(ctx context.Context, fullMethod string) map[string]string) Option {
	return func(c *config) { c.values = f }
}

// Shadow turns every rule into a shadow rule: calls are decided, counted
// and given the metadata, but never rejected.
func Shadow() Option { return func(c *config) { c.shadow = true } }

// MaxWait lets a call wait up to d for a leaky-bucket rule's pacing delay
// instead of being rejected. The wait ends early, and the hits are given
// back, when the call's context ends.
func MaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// FailClosed answers codes.Unavailable when the limiter fails. By default
// the call goes through and the failure is counted.
func FailClosed() Option { return func(c *config) { c.failClosed = true } }

// OnDecision calls f after every decision, on the call's goroutine.
func OnDecision(f func(Event)) Option { return func(c *config) { c.onDecision = f } }

// Clock sets the time the metadata values are computed at; it should be
// the limiter's clock. Default time.Now.
func Clock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WaitTimer replaces time.After for leaky-bucket waits (for tests).
func WaitTimer(after func(time.Duration) <-chan time.Time) Option {
	return func(c *config) { c.after = after }
}

// Logger sets where limiter failures are logged; default: discarded.
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Interceptor rate-limits gRPC calls with the rules of a RuleSource. It is
// safe for concurrent use.
type Interceptor struct {
	src    RuleSource
	enf    rules.Enforcer
	cfg    config
	logger *slog.Logger

	allowed, rejected, shadowed, failedOpen, failedClosed, abandoned, waited atomic.Int64
}

// New returns an interceptor that checks calls with lim against the rules
// src gives.
func New(lim sluice.Limiter, src RuleSource, opts ...Option) (*Interceptor, error) {
	if lim == nil || src == nil {
		return nil, fmt.Errorf("%w: a Limiter and a RuleSource are required", ErrInvalidOption)
	}
	i := &Interceptor{src: src}
	for _, o := range opts {
		o(&i.cfg)
	}
	if i.cfg.maxWait < 0 {
		return nil, fmt.Errorf("%w: MaxWait %v is negative", ErrInvalidOption, i.cfg.maxWait)
	}
	if i.cfg.now == nil {
		i.cfg.now = time.Now
	}
	i.logger = i.cfg.logger
	if i.logger == nil {
		i.logger = slog.New(slog.DiscardHandler)
	}
	i.enf = rules.Enforcer{Limiter: lim, Shadow: i.cfg.shadow, MaxWait: i.cfg.maxWait, After: i.cfg.after}
	return i, nil
}

// Stats returns the interceptor's counters.
func (i *Interceptor) Stats() Stats {
	return Stats{
		Allowed: i.allowed.Load(), Rejected: i.rejected.Load(), Shadowed: i.shadowed.Load(),
		FailedOpen: i.failedOpen.Load(), FailedClosed: i.failedClosed.Load(), Abandoned: i.abandoned.Load(),
		Waited: i.waited.Load(),
	}
}

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := i.check(ctx, info.FullMethod)
		if err != nil {
			if md != nil {
				grpc.SetTrailer(ctx, md)
			}
			return nil, err
		}
		if md != nil {
			grpc.SetHeader(ctx, md)
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor. A stream is one hit,
// checked when it starts.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := i.check(ss.Context(), info.FullMethod)
		if err != nil {
			if md != nil {
				ss.SetTrailer(md)
			}
			return err
		}
		if md != nil {
			ss.SetHeader(md)
		}
		return handler(srv, ss)
	}
}

// Descriptor returns what the rules see of a call: the full method as the
// route, Method as the method, the peer's IP, the incoming metadata as
// headers, the user and the descriptors.
func (i *Interceptor) Descriptor(ctx context.Context, fullMethod string) *rules.Descriptor {
	d := &rules.Descriptor{Route: fullMethod, Method: Method, IP: peerIP(ctx)}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		d.Header = func(name string) (string, bool) {
			v := md[strings.ToLower(name)]
			if len(v) == 0 {
				return "", false
			}
			return v[0], true
		}
	}
	if i.cfg.user != nil {
		if u, ok := i.cfg.user(ctx, fullMethod); ok {
			d.User = u
		}
	}
	if i.cfg.values != nil {
		d.Values = i.cfg.values(ctx, fullMethod)
	}
	return d
}

// check decides a call. It returns the rate-limit metadata (nil when no
// rule applied) and the call's error: nil to proceed.
func (i *Interceptor) check(ctx context.Context, fullMethod string) (metadata.MD, error) {
	set := i.src.Current()
	if set.Len() == 0 {
		i.allowed.Add(1)
		return nil, nil
	}
	d := i.Descriptor(ctx, fullMethod)
	v := i.enf.Enforce(ctx, set, d, 1)
	f, hasFields := v.Fields(i.cfg.now())
	var md metadata.MD
	if hasFields {
		md = fieldsMD(&f)
	}
	var outcome Outcome
	var err error
	switch {
	case v.Err != nil && i.cfg.failClosed:
		outcome, err = FailedClosed, status.Error(codes.Unavailable, "grpclimit: the rate limiter could not decide on this call")
	case v.Err != nil:
		outcome = FailedOpen
	case !v.Allowed:
		outcome, err = Rejected, rejection(&f, v.RetryAfter)
	case v.Delay > 0:
		i.waited.Add(1)
		if werr := i.enf.Wait(ctx, v); werr != nil {
			outcome, err = Abandoned, status.FromContextError(werr).Err()
			break
		}
		fallthrough
	default:
		outcome = Allowed
		if v.ShadowRejected {
			outcome = Shadowed
		}
	}
	i.count(outcome)
	if v.Err != nil {
		i.logger.Warn("grpclimit: limiter failed", "outcome", outcome, "method", fullMethod, "err", v.Err)
	}
	if i.cfg.onDecision != nil {
		i.cfg.onDecision(Event{FullMethod: fullMethod, Descriptor: d, Verdict: v, Outcome: outcome})
	}
	return md, err
}

func (i *Interceptor) count(o Outcome) {
	switch o {
	case Allowed:
		i.allowed.Add(1)
	case Rejected:
		i.rejected.Add(1)
	case Shadowed:
		i.shadowed.Add(1)
	case FailedOpen:
		i.failedOpen.Add(1)
	case FailedClosed:
		i.failedClosed.Add(1)
	case Abandoned:
		i.abandoned.Add(1)
	}
}

// rejection is the ResourceExhausted status of a rejected call, with a
// RetryInfo and a QuotaFailure naming the violated limits.
func rejection(f *rules.Fields, retry time.Duration) error {
	msg := fmt.Sprintf("rate limit exceeded (%s); retry in %ds", strings.Join(f.Violated, ", "), f.RetryAfter)
	st := status.New(codes.ResourceExhausted, msg)
	qf := &errdetails.QuotaFailure{}
	for _, name := range f.Violated {
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{Subject: name, Description: "rate limit " + name + " exceeded"})
	}
	withDetails, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}, qf)
	if err != nil { // cannot happen: both messages marshal
		return st.Err()
	}
	return withDetails.Err()
}

// fieldsMD is the rate-limit metadata.
func fieldsMD(f *rules.Fields) metadata.MD {
	md := metadata.Pairs(
		"x-ratelimit-limit", strconv.FormatInt(f.Limit, 10),
		"x-ratelimit-remaining", strconv.FormatInt(f.Remaining, 10),
		"x-ratelimit-reset", strconv.FormatInt(f.Reset, 10),
		"ratelimit-policy", f.Policy,
		"ratelimit", f.RateLimit,
	)
	if f.RetryAfter > 0 {
		md.Set("retry-after", strconv.FormatInt(f.RetryAfter, 10))
	}
	return md
}

// peerIP is the call's peer address; the zero Addr when unknown.
func peerIP(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		return tcp.AddrPort().Addr().Unmap().WithZone("")
	}
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}
