package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// RuleSource gives the rules in force; *rules.Source and *rules.Watcher
// are RuleSources.
type RuleSource = rules.Provider

// ErrInvalidOption wraps the errors of New for a bad option.
var ErrInvalidOption = errors.New("httplimit: invalid option")

// Stats counts requests by outcome.
type Stats = rules.Stats

// Event describes one decision, for OnDecision: the request and the
// guard's Ruling (its Outcome, Descriptor and Verdict).
type Event struct {
	Request *http.Request
	rules.Ruling
}

// Option configures a Middleware.
type Option func(*config)

type config struct {
	guard      rules.GuardConfig
	trusted    []string
	header     string
	ipHeader   string
	route      func(*http.Request) string
	user       func(*http.Request) (string, bool)
	values     func(*http.Request) map[string]string
	cost       func(*http.Request) int64
	onDecision func(Event)
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

// Cost sets the hits a request costs, a function of the request (its
// body size, say); default 1. A cost more than a rule can ever admit is
// rejected by that rule (429) without being counted; a negative cost is a
// limiter failure (see rules.GuardConfig.FailClosed). 0 checks without consuming.
func Cost(f func(*http.Request) int64) Option { return func(c *config) { c.cost = f } }

// Guard sets what every adapter of rules.Guard shares: shadow mode,
// waiting for a leaky bucket (MaxWait), failing closed, the clock, the
// wait timer and the logger. See rules.GuardConfig.
func Guard(cfg rules.GuardConfig) Option { return func(c *config) { c.guard = cfg } }

// OnDecision calls f after every decision, before the response is written
// or the next handler called, on the request's goroutine. Use it for
// metrics and logs; it must not keep the Event's pointers.
func OnDecision(f func(Event)) Option { return func(c *config) { c.onDecision = f } }

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
	guard *rules.Guard
	ips   clientIPs
	cfg   config
}

// New returns a middleware that checks requests with lim against the rules
// src gives. It fails on an invalid option.
func New(lim sluice.Limiter, src RuleSource, opts ...Option) (*Middleware, error) {
	m := &Middleware{}
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
	if c.route == nil {
		c.route = func(r *http.Request) string { return r.URL.Path }
	}
	var err error
	if m.guard, err = rules.NewGuard(lim, src, c.guard); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
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
func (m *Middleware) Stats() Stats { return m.guard.Stats() }

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
		ru := m.guard.Decide(r.Context(), func() (*rules.Descriptor, int64) { return m.Descriptor(r), m.cost(r) })
		if ru.HasFields {
			setHeaders(w.Header(), &ru.Fields)
		}
		if m.cfg.onDecision != nil && ru.Verdict != nil {
			m.cfg.onDecision(Event{Request: r, Ruling: ru})
		}
		switch ru.Outcome {
		case rules.Rejected:
			writeProblem(w, http.StatusTooManyRequests, &ru.Fields, "")
		case rules.FailedClosed:
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, nil, "The rate limiter could not decide on this request.")
		case rules.Abandoned:
			writeProblem(w, http.StatusServiceUnavailable, nil, "The request ended while it waited for its turn.")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// cost is the hits r costs.
func (m *Middleware) cost(r *http.Request) int64 {
	if m.cfg.cost == nil {
		return 1
	}
	return m.cfg.cost(r)
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
