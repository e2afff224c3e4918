package httplimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// RuleSource gives the rules in force. Current is called once per request
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
var ErrInvalidOption = errors.New("httplimit: invalid option")

// Outcome is what the middleware did with a request.
type Outcome uint8

const (
	// Allowed: every rule admitted the request (or none applied).
	Allowed Outcome = iota + 1
	// Rejected: a rule rejected it with 429.
	Rejected
	// Shadowed: a shadow rule (or every rule, in shadow mode) would have
	// rejected it; it went through.
	Shadowed
	// FailedOpen: the limiter failed and the request went through.
	FailedOpen
	// FailedClosed: the limiter failed and the request got 503.
	FailedClosed
	// Abandoned: the request's context ended while it waited for a
	// leaky-bucket delay; its hits were given back.
	Abandoned
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
	Request    *http.Request
	Descriptor *rules.Descriptor
	Verdict    *rules.Verdict
	Outcome    Outcome
}

// Stats counts requests by outcome.
type Stats struct {
	Allowed, Rejected, Shadowed, FailedOpen, FailedClosed, Abandoned int64
	// Waited counts requests that waited for a leaky-bucket delay.
	Waited int64
}

// Option configures a Middleware.
type Option func(*config)

type config struct {
	trusted    []string
	header     string
	ipHeader   string
	route      func(*http.Request) string
	user       func(*http.Request) (string, bool)
	values     func(*http.Request) map[string]string
	shadow     bool
	maxWait    time.Duration
	failClosed bool
	onDecision func(Event)
	now        func() time.Time
	after      func(time.Duration) <-chan time.Time
	logger     *slog.Logger
}

// TrustedProxies sets the proxies whose forwarding header is believed:
// addresses or CIDR prefixes. Without it, the client IP is the
// connection's peer and forwarding headers are ignored. The header read is
// X-Forwarded-For unless ForwardedHeader or ClientIPHeader says otherwise.
// List every proxy that appends to the header, not only the nearest: the
// header is read right to left, trusted hops skipped, at most
// MaxForwardedHops of them. The package comment shows the settings for
// common proxies and load balancers.
func TrustedProxies(cidrs ...string) Option {
	return func(c *config) { c.trusted = append(c.trusted, cidrs...) }
}

// ForwardedHeader names the one list header the trusted proxies append
// to: "X-Forwarded-For" (the default, what nginx, HAProxy's option
// forwardfor, cloud load balancers, Envoy and Traefik append) or
// "Forwarded" (RFC 7239, the for= parameter of each element). Only that
// header is read, right to left from its last field line, skipping
// trusted hops; at most MaxForwardedHops hops are examined, and past them
// the client is the nearest address found, as at a hop that is not an
// address. The other header is ignored: behind a proxy that appends only
// one, a client could name itself in the other.
//
//	httplimit.New(node, src,
//		httplimit.TrustedProxies("10.0.0.0/8"),
//		httplimit.ForwardedHeader("Forwarded"))
func ForwardedHeader(name string) Option {
	return func(c *config) { c.header = name }
}

// ClientIPHeader reads the client IP from a header that holds one address
// and that the trusted proxy sets, replacing any value the client sent:
// CF-Connecting-IP (Cloudflare), True-Client-IP, or X-Real-IP as nginx's
// "proxy_set_header X-Real-IP $remote_addr" sets it. It is read only when
// the connection's peer is one of the TrustedProxies, and must be one
// field line holding one address; anything else leaves the peer as the
// client. It replaces the list header, so it does not go with
// ForwardedHeader. Trust only peers that set the header on every request:
// a trusted peer that passes a client's own value through lets the client
// name itself.
//
//	// cloudflare holds every range of https://www.cloudflare.com/ips/.
//	httplimit.New(node, src,
//		httplimit.TrustedProxies(cloudflare...),
//		httplimit.ClientIPHeader("CF-Connecting-IP"))
func ClientIPHeader(name string) Option {
	return func(c *config) { c.ipHeader = name }
}

// RouteFunc sets how a request's route is found; by default it is
// r.URL.Path. See MuxPattern.
func RouteFunc(f func(*http.Request) string) Option { return func(c *config) { c.route = f } }

// UserFunc sets how the authenticated user is found; ok false means
// anonymous.
func UserFunc(f func(*http.Request) (user string, ok bool)) Option {
	return func(c *config) { c.user = f }
}

// DescriptorFunc sets the application-defined descriptors of a request
// ("plan": "free"), for rules' descriptors conditions and keys.
func DescriptorFunc(f func(*http.Request) map[string]string) Option {
	return func(c *config) { c.values = f }
}

// Shadow turns every rule into a shadow rule: requests are decided,
// counted and given the headers, but never blocked. Rules can also be
// shadowed one at a time in the rule set.
func Shadow() Option { return func(c *config) { c.shadow = true } }

// MaxWait lets a request wait up to d for a leaky-bucket rule's pacing
// delay instead of being rejected. By default a leaky-bucket rule admits
// only requests that need no delay. The wait ends early, and the request's
// hits are given back, when its context ends.
func MaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// FailClosed answers 503 when the limiter fails. By default the request
// goes through and the failure is counted (Stats.FailedOpen).
func FailClosed() Option { return func(c *config) { c.failClosed = true } }

// OnDecision calls f after every decision, before the response is written
// or the next handler called, on the request's goroutine. Use it for
// metrics and logs; it must not keep the Event's pointers.
func OnDecision(f func(Event)) Option { return func(c *config) { c.onDecision = f } }

// Clock sets the time the response fields are computed at; it should be
// the limiter's clock. Default time.Now.
func Clock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WaitTimer replaces time.After for leaky-bucket waits (for tests).
func WaitTimer(after func(time.Duration) <-chan time.Time) Option {
	return func(c *config) { c.after = after }
}

// Logger sets where limiter failures are logged; default: discarded.
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// MuxPattern returns a RouteFunc that gives the pattern mux would route
// the request to ("GET /items/{id}"), or the path when none matches, so
// that rules match patterns and key counters per pattern rather than per
// path.
func MuxPattern(mux *http.ServeMux) func(*http.Request) string {
	return func(r *http.Request) string {
		if _, p := mux.Handler(r); p != "" {
			return p
		}
		return r.URL.Path
	}
}

// Middleware rate-limits HTTP requests with the rules of a RuleSource. It
// is safe for concurrent use.
type Middleware struct {
	src    RuleSource
	enf    rules.Enforcer
	ips    clientIPs
	cfg    config
	logger *slog.Logger

	allowed, rejected, shadowed, failedOpen, failedClosed, abandoned, waited atomic.Int64
}

// New returns a middleware that checks requests with lim against the rules
// src gives. It fails on an invalid option.
func New(lim sluice.Limiter, src RuleSource, opts ...Option) (*Middleware, error) {
	if lim == nil || src == nil {
		return nil, fmt.Errorf("%w: a Limiter and a RuleSource are required", ErrInvalidOption)
	}
	m := &Middleware{src: src}
	for _, o := range opts {
		o(&m.cfg)
	}
	c := &m.cfg
	switch http.CanonicalHeaderKey(c.header) {
	case "", "X-Forwarded-For":
	case "Forwarded":
		m.ips.from = fromForwarded
	default:
		return nil, fmt.Errorf("%w: forwarded header %q: want X-Forwarded-For or Forwarded", ErrInvalidOption, c.header)
	}
	if c.ipHeader != "" {
		name := http.CanonicalHeaderKey(c.ipHeader)
		switch {
		case c.header != "":
			return nil, fmt.Errorf("%w: ClientIPHeader %q and ForwardedHeader %q: one header is read, not both", ErrInvalidOption, c.ipHeader, c.header)
		case name == "X-Forwarded-For" || name == "Forwarded":
			return nil, fmt.Errorf("%w: ClientIPHeader %q: it is a list of hops, read by default or with ForwardedHeader", ErrInvalidOption, c.ipHeader)
		case !isToken(name):
			return nil, fmt.Errorf("%w: ClientIPHeader %q is not a header name", ErrInvalidOption, c.ipHeader)
		}
		m.ips.from, m.ips.single = fromSingle, name
	}
	for _, s := range c.trusted {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%w: trusted proxy %q: %w", ErrInvalidOption, s, err)
		}
		m.ips.trusted = append(m.ips.trusted, p)
	}
	if c.maxWait < 0 {
		return nil, fmt.Errorf("%w: MaxWait %v is negative", ErrInvalidOption, c.maxWait)
	}
	if c.route == nil {
		c.route = func(r *http.Request) string { return r.URL.Path }
	}
	if c.now == nil {
		c.now = time.Now
	}
	m.logger = c.logger
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	m.enf = rules.Enforcer{Limiter: lim, Shadow: c.shadow, MaxWait: c.maxWait, After: c.after}
	return m, nil
}

// isToken says whether s is a header field name: a nonempty RFC 9110
// token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), p.Addr().Unmap().BitLen())).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Stats returns the middleware's counters.
func (m *Middleware) Stats() Stats {
	return Stats{
		Allowed: m.allowed.Load(), Rejected: m.rejected.Load(), Shadowed: m.shadowed.Load(),
		FailedOpen: m.failedOpen.Load(), FailedClosed: m.failedClosed.Load(), Abandoned: m.abandoned.Load(),
		Waited: m.waited.Load(),
	}
}

// Descriptor returns what the rules see of r: route, method, client IP,
// user, headers and descriptors.
func (m *Middleware) Descriptor(r *http.Request) *rules.Descriptor {
	d := &rules.Descriptor{
		Route:  m.cfg.route(r),
		Method: r.Method,
		IP:     m.ips.resolve(r),
		Header: rules.HTTPHeader(r.Header),
	}
	if m.cfg.user != nil {
		if u, ok := m.cfg.user(r); ok {
			d.User = u
		}
	}
	if m.cfg.values != nil {
		d.Values = m.cfg.values(r)
	}
	return d
}

// Handler returns next behind the rate limit. Every response to a request
// some rule applied to carries X-RateLimit-Limit, -Remaining and -Reset
// and the draft's RateLimit-Policy and RateLimit fields; a rejected
// request gets 429 with Retry-After and an application/problem+json body,
// and next is not called.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		set := m.src.Current()
		if set.Len() == 0 {
			m.allowed.Add(1)
			next.ServeHTTP(w, r)
			return
		}
		d := m.Descriptor(r)
		ctx := r.Context()
		v := m.enf.Enforce(ctx, set, d, 1)
		f, hasFields := v.Fields(m.cfg.now())
		if hasFields {
			setHeaders(w.Header(), &f)
		}
		var outcome Outcome
		switch {
		case v.Err != nil && m.cfg.failClosed:
			outcome = FailedClosed
		case v.Err != nil:
			outcome = FailedOpen
		case !v.Allowed:
			outcome = Rejected
		case v.Delay > 0:
			m.waited.Add(1)
			if err := m.enf.Wait(ctx, v); err != nil {
				outcome = Abandoned
				break
			}
			fallthrough
		default:
			outcome = Allowed
			if v.ShadowRejected {
				outcome = Shadowed
			}
		}
		m.count(outcome)
		if v.Err != nil {
			m.logger.Warn("httplimit: limiter failed", "outcome", outcome, "route", d.Route, "err", v.Err)
		}
		if m.cfg.onDecision != nil {
			m.cfg.onDecision(Event{Request: r, Descriptor: d, Verdict: v, Outcome: outcome})
		}
		switch outcome {
		case Rejected:
			writeProblem(w, http.StatusTooManyRequests, &f, "")
		case FailedClosed:
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, nil, "The rate limiter could not decide on this request.")
		case Abandoned:
			writeProblem(w, http.StatusServiceUnavailable, nil, "The request ended while it waited for its turn.")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func (m *Middleware) count(o Outcome) {
	switch o {
	case Allowed:
		m.allowed.Add(1)
	case Rejected:
		m.rejected.Add(1)
	case Shadowed:
		m.shadowed.Add(1)
	case FailedOpen:
		m.failedOpen.Add(1)
	case FailedClosed:
		m.failedClosed.Add(1)
	case Abandoned:
		m.abandoned.Add(1)
	}
}

// setHeaders writes the rate-limit fields.
func setHeaders(h http.Header, f *rules.Fields) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(f.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(f.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(f.Reset, 10))
	h.Set("RateLimit-Policy", f.Policy)
	h.Set("RateLimit", f.RateLimit)
	if f.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(f.RetryAfter, 10))
	}
}
