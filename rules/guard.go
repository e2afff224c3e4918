package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Provider gives the rules in force. Current is called once per request
// and must be cheap and safe for concurrent use; *Source and *Watcher are
// Providers.
type Provider interface {
	Current() *Set
}

var (
	_ Provider = (*Source)(nil)
	_ Provider = (*Watcher)(nil)
)

// ErrInvalidGuard wraps the errors of NewGuard.
var ErrInvalidGuard = errors.New("rules: invalid guard")

// Outcome is what a Guard did with a request.
type Outcome uint8

// The outcomes.
const (
	// Allowed: every rule admitted the request (or none applied).
	Allowed Outcome = iota + 1
	// Rejected: an enforced rule rejected it.
	Rejected
	// Shadowed: a shadow rule (or every rule, with GuardConfig.Shadow)
	// would have rejected it; it goes through.
	Shadowed
	// FailedOpen: the limiter failed and the request goes through.
	FailedOpen
	// FailedClosed: the limiter failed and the request is refused
	// (GuardConfig.FailClosed).
	FailedClosed
	// Abandoned: the request's context ended while it waited for a
	// leaky-bucket delay; its hits were given back.
	Abandoned
	numOutcomes
)

var outcomeNames = [...]string{Allowed: "allowed", Rejected: "rejected", Shadowed: "shadowed",
	FailedOpen: "failed_open", FailedClosed: "failed_closed", Abandoned: "abandoned"}

// String returns the outcome's snake_case name.
func (o Outcome) String() string {
	if o == 0 || o >= numOutcomes {
		return "outcome(" + strconv.Itoa(int(o)) + ")"
	}
	return outcomeNames[o]
}

// Stats counts requests by outcome.
type Stats struct {
	Allowed, Rejected, Shadowed, FailedOpen, FailedClosed, Abandoned int64
	// Waited counts requests that waited for a leaky-bucket delay.
	Waited int64
}

// GuardConfig is what every adapter of a Guard (the HTTP middleware, the
// gRPC interceptor) lets its user set.
type GuardConfig struct {
	// Shadow makes every rule a shadow rule: requests are decided,
	// counted and given the rate-limit fields, but never refused. Rules
	// can also be shadowed one at a time in the rule set.
	Shadow bool
	// MaxWait lets a request wait up to MaxWait for a leaky-bucket rule's
	// pacing delay instead of being rejected. With 0, a leaky-bucket rule
	// admits only requests that need no delay. The wait ends early, and
	// the request's hits are given back, when its context ends.
	MaxWait time.Duration
	// FailClosed refuses requests the limiter failed to decide. By
	// default they go through, counted as FailedOpen.
	FailClosed bool
	// Now is the time the rate-limit fields are computed at; it should be
	// the limiter's clock. Default time.Now.
	Now func() time.Time
	// After replaces time.After for leaky-bucket waits (for tests).
	After func(time.Duration) <-chan time.Time
	// Logger receives limiter failures; default: discarded.
	Logger *slog.Logger
}

// Guard is the enforcement core of the adapters: for one request it
// applies the rules in force through an Enforcer, waits for a leaky
// bucket's delay, chooses the Outcome and counts it. An adapter only
// describes the request and turns the Ruling into its protocol's answer.
// It is safe for concurrent use.
type Guard struct {
	src        Provider
	enf        Enforcer
	now        func() time.Time
	failClosed bool
	logger     *slog.Logger
	counts     [numOutcomes]atomic.Int64
	waited     atomic.Int64
}

// NewGuard returns a guard that checks requests with lim against the
// rules src gives. cfg is copied.
func NewGuard(lim sluice.Limiter, src Provider, cfg GuardConfig) (*Guard, error) {
	switch {
	case lim == nil || src == nil:
		return nil, fmt.Errorf("%w: a Limiter and a rule Provider are required", ErrInvalidGuard)
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("%w: MaxWait %v is negative", ErrInvalidGuard, cfg.MaxWait)
	}
	g := &Guard{src: src, now: cfg.Now, failClosed: cfg.FailClosed, logger: cfg.Logger,
		enf: Enforcer{Limiter: lim, Shadow: cfg.Shadow, MaxWait: cfg.MaxWait, After: cfg.After}}
	if g.now == nil {
		g.now = time.Now
	}
	g.enf.Now = g.now
	if g.logger == nil {
		g.logger = slog.New(slog.DiscardHandler)
	}
	return g, nil
}

// Ruling is what a Guard decided for one request.
type Ruling struct {
	Outcome Outcome
	// Descriptor and Verdict are nil when no rules were in force.
	Descriptor *Descriptor
	Verdict    *Verdict
	// Fields are the rate-limit fields of the answer, when HasFields.
	Fields    Fields
	HasFields bool
}

// Decide applies the rules in force to one request. describe gives the
// request's descriptor and cost (its hits); it is called only when some
// rules are in force. A cost a limit can never admit is rejected by that
// limit; a negative cost is a limiter failure.
func (g *Guard) Decide(ctx context.Context, describe func() (*Descriptor, int64)) Ruling {
	set := g.src.Current()
	if set.Len() == 0 {
		g.counts[Allowed].Add(1)
		return Ruling{Outcome: Allowed}
	}
	d, cost := describe()
	v := g.enf.Enforce(ctx, set, d, cost)
	r := Ruling{Descriptor: d, Verdict: v}
	r.Fields, r.HasFields = v.Fields(g.now())
	switch {
	case v.Err != nil && g.failClosed:
		r.Outcome = FailedClosed
	case v.Err != nil:
		r.Outcome = FailedOpen
	case !v.Allowed:
		r.Outcome = Rejected
	case v.Delay > 0 && g.wait(ctx, v) != nil:
		r.Outcome = Abandoned
	case v.ShadowRejected:
		r.Outcome = Shadowed
	default:
		r.Outcome = Allowed
	}
	g.counts[r.Outcome].Add(1)
	if v.Err != nil {
		g.logger.Warn("sluice: the limiter failed", "outcome", r.Outcome, "route", d.Route, "err", v.Err)
	}
	return r
}

func (g *Guard) wait(ctx context.Context, v *Verdict) error {
	g.waited.Add(1)
	return g.enf.Wait(ctx, v)
}

// Stats returns the guard's counters.
func (g *Guard) Stats() Stats {
	return Stats{
		Allowed: g.counts[Allowed].Load(), Rejected: g.counts[Rejected].Load(), Shadowed: g.counts[Shadowed].Load(),
		FailedOpen: g.counts[FailedOpen].Load(), FailedClosed: g.counts[FailedClosed].Load(), Abandoned: g.counts[Abandoned].Load(),
		Waited: g.waited.Load(),
	}
}
