package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
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

// RuleSource gives the rules in force; *rules.Source and *rules.Watcher
// are RuleSources.
type RuleSource = rules.Provider

// ErrInvalidOption wraps the errors of New for a bad option.
var ErrInvalidOption = errors.New("grpclimit: invalid option")

// Stats counts calls by outcome.
type Stats = rules.Stats

// Event describes one decision, for OnDecision: the call's full method
// and the guard's Ruling (its Outcome, Descriptor and Verdict).
type Event struct {
	FullMethod string
	rules.Ruling
}

// Option configures an Interceptor.
type Option func(*config)

type config struct {
	guard      rules.GuardConfig
	user       func(ctx context.Context, fullMethod string) (string, bool)
	values     func(ctx context.Context, fullMethod string) map[string]string
	cost       func(ctx context.Context, fullMethod string, req any) int64
	onDecision func(Event)
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

// Cost sets the hits a call costs, a function of the call: req is the
// request message of a unary call, nil for a stream (checked once, when
// it starts). Default 1. A cost more than a rule can ever admit is
// rejected by that rule (ResourceExhausted) without being counted; a
// negative cost is a limiter failure (see rules.GuardConfig.FailClosed).
func Cost(f func(ctx context.Context, fullMethod string, req any) int64) Option {
	return func(c *config) { c.cost = f }
}

// Guard sets what every adapter of rules.Guard shares: shadow mode,
// waiting for a leaky bucket (MaxWait), failing closed, the clock, the
// wait timer and the logger. See rules.GuardConfig.
func Guard(cfg rules.GuardConfig) Option { return func(c *config) { c.guard = cfg } }

// OnDecision calls f after every decision, on the call's goroutine.
func OnDecision(f func(Event)) Option { return func(c *config) { c.onDecision = f } }

// Interceptor rate-limits gRPC calls with the rules of a RuleSource. It is
// safe for concurrent use.
type Interceptor struct {
	guard *rules.Guard
	cfg   config
}

// New returns an interceptor that checks calls with lim against the rules
// src gives.
func New(lim sluice.Limiter, src RuleSource, opts ...Option) (*Interceptor, error) {
	i := &Interceptor{}
	for _, o := range opts {
		o(&i.cfg)
	}
	var err error
	if i.guard, err = rules.NewGuard(lim, src, i.cfg.guard); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return i, nil
}

// Stats returns the interceptor's counters.
func (i *Interceptor) Stats() Stats { return i.guard.Stats() }

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := i.check(ctx, info.FullMethod, req)
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
		md, err := i.check(ss.Context(), info.FullMethod, nil)
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
func (i *Interceptor) check(ctx context.Context, fullMethod string, req any) (metadata.MD, error) {
	ru := i.guard.Decide(ctx, func() (*rules.Descriptor, int64) {
		return i.Descriptor(ctx, fullMethod), i.cost(ctx, fullMethod, req)
	})
	var md metadata.MD
	if ru.HasFields {
		md = fieldsMD(&ru.Fields)
	}
	if i.cfg.onDecision != nil && ru.Verdict != nil {
		i.cfg.onDecision(Event{FullMethod: fullMethod, Ruling: ru})
	}
	switch ru.Outcome {
	case rules.FailedClosed:
		return md, status.Error(codes.Unavailable, "grpclimit: the rate limiter could not decide on this call")
	case rules.Rejected:
		return md, rejection(&ru.Fields, ru.Verdict.RetryAfter)
	case rules.Abandoned:
		return md, status.FromContextError(ctx.Err()).Err()
	}
	return md, nil
}

// cost is the hits a call costs.
func (i *Interceptor) cost(ctx context.Context, fullMethod string, req any) int64 {
	if i.cfg.cost == nil {
		return 1
	}
	return i.cfg.cost(ctx, fullMethod, req)
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
