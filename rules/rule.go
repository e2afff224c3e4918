package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// MaxNameLen bounds a rule's name: one byte less than a limiter Name, so
// that a daemon that serves rules beside checks that carry their own limits
// can put its rules' counters apart by a one-byte prefix (the sluice
// daemon's "@"), which no such check may use.
const MaxNameLen = limiter.MaxNameLen - 1

// Rule is one named limit: what it matches and what it imposes. Build rules
// in code and pass them to NewSet or NewStatic, or load them from YAML. A
// *Rule obtained from a Set is shared and must not be modified.
type Rule struct {
	// Name is the limiter's Name: unique in a set, [A-Za-z0-9_.:-]+, at
	// most MaxNameLen bytes.
	Name  string
	Match Match
	// Key says what the counter is per, in order: "ip", "user", "route",
	// "method", "header:<Name>", "descriptor:<name>". Empty means one
	// counter shared by every request the rule matches.
	Key []string

	Algorithm limiter.Algorithm
	Limit     int64
	Period    time.Duration
	// Burst is the limiter's Burst; 0 means Limit.
	Burst int64
	// Calendar and Location align a fixed_window rule to calendar units
	// instead of Period (which must then be 0).
	Calendar limiter.Calendar
	Location *time.Location

	// Unreachable is the policy when the key's owner cannot be reached;
	// PolicyDefault uses the limiter's.
	Unreachable sluice.Policy
	// Shadow rules are decided and reported but never block.
	Shadow bool
	// Missing says what the rule does with a request that lacks a part of
	// its Key, such as an anonymous request under a rule keyed on user.
	// The zero value, MissingSkip, lets such a request through this rule.
	Missing Missing

	c *compiled // set by NewSet; nil on a Rule built by hand
}

// Match holds a rule's conditions. All given conditions must hold; an
// empty condition holds for every request.
type Match struct {
	// Routes are exact routes or prefixes ending in "*": "/api/*" matches
	// "/api/" and everything below it, "*" matches any route.
	Routes []string
	// Methods match case-insensitively.
	Methods []string
	// Headers must each be present with the given value; "*" means
	// present with any value. Names are case-insensitive.
	Headers map[string]string
	// IPs are addresses or CIDR prefixes; the client IP must be in one.
	IPs []string
	// Users are user names; "*" means any authenticated user.
	Users []string
	// Descriptors must each equal the given value; "*" means present.
	Descriptors map[string]string
}

// Missing is what a rule does with a request that lacks a part of its
// Key: no user for key [user], no such header for key [header:X-Api-Key].
type Missing uint8

const (
	// MissingSkip: the rule does not apply to the request, which this
	// rule leaves unlimited. The default.
	MissingSkip Missing = iota
	// MissingDeny: the rule rejects the request and counts nothing.
	MissingDeny
	// MissingShared: every request that lacks the part shares one
	// counter of the rule, apart from every present value (the part is
	// written as its tag alone, "user", where a present one is "user=42").
	MissingShared
)

var missingNames = [...]string{MissingSkip: "skip", MissingDeny: "deny", MissingShared: "shared"}

func (m Missing) String() string {
	if m.Valid() {
		return missingNames[m]
	}
	return fmt.Sprintf("Missing(%d)", uint8(m))
}

// Valid reports whether m is one of the defined values.
func (m Missing) Valid() bool { return int(m) < len(missingNames) }

// ParseMissing parses "skip", "deny" or "shared".
func ParseMissing(s string) (Missing, error) {
	for i, name := range missingNames {
		if s == name {
			return Missing(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q (want skip, deny or shared)", ErrInvalidMissing, s)
}

// compiled is a rule's match and key, ready for use.
type compiled struct {
	anyRoute    bool
	exact       []string
	prefixes    []string
	methods     []string
	headers     []pair
	ips         []netip.Prefix
	anyUser     bool
	users       []string
	descriptors []pair
	key         []keyPart
}

type pair struct {
	name, value string
	any         bool // value "*": present with any value
}

type partKind uint8

const (
	partIP partKind = iota + 1
	partUser
	partRoute
	partMethod
	partHeader
	partDescriptor
)

type keyPart struct {
	kind partKind
	name string // header or descriptor name
	tag  string // how the part is written in the key: "ip", "header:X-A"
}

// fieldError is a problem found by compile, before it is given a position.
type fieldError struct {
	field string // relative to the rule: "match.ips[1]"
	err   error
	cause error
	msg   string
}

// compile validates r and builds its matcher, returning every problem.
func (r *Rule) compile() (*compiled, []fieldError) {
	var errs []fieldError
	add := func(field string, err, cause error, format string, a ...any) {
		if len(errs) < maxErrors { // no more is reported
			errs = append(errs, fieldError{field: field, err: err, cause: cause, msg: fmt.Sprintf(format, a...)})
		}
	}
	if msg := checkName(r.Name); msg != "" {
		add("name", ErrInvalidName, nil, "%s", msg)
	}
	c := &compiled{}
	m := &r.Match
	for i, p := range m.Routes {
		f := fmt.Sprintf("match.routes[%d]", i)
		switch star := strings.IndexByte(p, '*'); {
		case p == "":
			add(f, ErrInvalidMatch, nil, "empty route pattern")
		case p == "*":
			c.anyRoute = true
		case star >= 0 && star != len(p)-1:
			add(f, ErrInvalidMatch, nil, "route pattern %q: '*' may only end a pattern", p)
		case star >= 0:
			c.prefixes = append(c.prefixes, p[:star])
		default:
			c.exact = append(c.exact, p)
		}
	}
	for i, meth := range m.Methods {
		if !isToken(meth) {
			add(fmt.Sprintf("match.methods[%d]", i), ErrInvalidMatch, nil, "method %q is not an HTTP token", meth)
			continue
		}
		c.methods = append(c.methods, strings.ToUpper(meth))
	}
	for _, name := range sortedKeys(m.Headers) {
		if !isToken(name) {
			add("match.headers."+name, ErrInvalidMatch, nil, "header name %q is not an HTTP token", name)
			continue
		}
		v := m.Headers[name]
		c.headers = append(c.headers, pair{name: http.CanonicalHeaderKey(name), value: v, any: v == "*"})
	}
	for i, s := range m.IPs {
		p, err := parsePrefix(s)
		if err != nil {
			add(fmt.Sprintf("match.ips[%d]", i), ErrInvalidCIDR, err, "%q is neither an IP address nor a CIDR prefix", s)
			continue
		}
		c.ips = append(c.ips, p)
	}
	for i, u := range m.Users {
		switch u {
		case "":
			add(fmt.Sprintf("match.users[%d]", i), ErrInvalidMatch, nil, "empty user")
		case "*":
			c.anyUser = true
		default:
			c.users = append(c.users, u)
		}
	}
	for _, name := range sortedKeys(m.Descriptors) {
		if name == "" {
			add("match.descriptors", ErrInvalidMatch, nil, "empty descriptor name")
			continue
		}
		v := m.Descriptors[name]
		c.descriptors = append(c.descriptors, pair{name: name, value: v, any: v == "*"})
	}
	seen := make(map[string]bool, len(r.Key))
	for i, s := range r.Key {
		f := fmt.Sprintf("key[%d]", i)
		kp, msg := parseKeyPart(s)
		if msg != "" {
			add(f, ErrInvalidKey, nil, "%s", msg)
			continue
		}
		if seen[kp.tag] {
			add(f, ErrInvalidKey, nil, "key part %q given twice", s)
			continue
		}
		seen[kp.tag] = true
		c.key = append(c.key, kp)
	}
	if !r.Unreachable.Valid() {
		add("unreachable", ErrInvalidPolicy, nil, "unknown policy %v", r.Unreachable)
	}
	if !r.Missing.Valid() {
		add("missing", ErrInvalidMissing, nil, "unknown %v (want skip, deny or shared)", r.Missing)
	}
	errs = append(errs, r.checkRate()...)
	return c, errs
}

// checkRate validates the limit by building a sample request.
func (r *Rule) checkRate() []fieldError {
	if !r.Algorithm.Valid() {
		return []fieldError{{field: "algorithm", err: ErrUnknownAlgorithm, msg: fmt.Sprintf("algorithm %v is not one of %v", r.Algorithm, limiter.Algorithms)}}
	}
	if r.Calendar != limiter.NoCalendar && r.Period != 0 {
		return []fieldError{{field: "period", err: ErrInvalidPeriod, msg: "give either period or calendar, not both"}}
	}
	if r.Location != nil && r.Calendar == limiter.NoCalendar {
		return []fieldError{{field: "zone", err: ErrInvalidCalendar, msg: "a zone needs a calendar"}}
	}
	sample := r.request("", "sample", 0)
	err := sample.Validate()
	if err == nil {
		return nil
	}
	f := fieldError{cause: err, msg: strings.TrimPrefix(err.Error(), "limiter: ")}
	switch {
	case errors.Is(err, limiter.ErrInvalidLimit), errors.Is(err, limiter.ErrHitsExceedLimit):
		f.field, f.err = "limit", ErrInvalidLimit
	case errors.Is(err, limiter.ErrInvalidPeriod):
		f.field, f.err = "period", ErrInvalidPeriod
	case errors.Is(err, limiter.ErrInvalidBurst):
		f.field, f.err = "burst", ErrInvalidBurst
		if r.Burst == 0 {
			f.field = "period"
		}
	case errors.Is(err, limiter.ErrInvalidLocation):
		f.field, f.err = "zone", ErrInvalidCalendar
	case errors.Is(err, limiter.ErrInvalidCalendar):
		f.field, f.err = "calendar", ErrInvalidCalendar
	case errors.Is(err, limiter.ErrUnknownAlgorithm):
		f.field, f.err = "algorithm", ErrUnknownAlgorithm
	default: // the name, already reported by checkName
		return nil
	}
	return []fieldError{f}
}

func (r *Rule) request(name, key string, hits int64) limiter.Request {
	if name == "" {
		name = r.Name
	}
	return limiter.Request{
		Name: name, Key: key, Hits: hits,
		Limit: r.Limit, Period: r.Period, Burst: r.Burst,
		Algorithm: r.Algorithm, Calendar: r.Calendar, Location: r.Location,
	}
}

// Request builds the limiter request of r for d, costing hits. It returns
// false when the rule does not apply to d: a part of the key is missing
// from d (no user for key [user], say) and r.Missing is MissingSkip, or
// MissingDeny (Enforce rejects such a request; Request has no counter to
// give). Request does not check that r matches d.
func (r *Rule) Request(d *Descriptor, hits int64) (limiter.Request, bool) {
	req, missing, ok := r.requestFor(d, hits)
	if !ok || missing && r.Missing != MissingShared {
		return limiter.Request{}, false
	}
	return req, true
}

// requestFor builds the limiter request of r for d and says whether a key
// part is missing from d; ok is false for a hand-built rule that does not
// compile.
func (r *Rule) requestFor(d *Descriptor, hits int64) (req limiter.Request, missing, ok bool) {
	c := r.c
	if c == nil { // a Rule built by hand: compile its key now
		var errs []fieldError
		if c, errs = r.compile(); len(errs) > 0 {
			return limiter.Request{}, false, false
		}
	}
	key, missing := c.buildKey(d)
	return r.request("", key, hits), missing, true
}

// keyEscaper makes the joined key unambiguous: values cannot contain the
// separator.
var keyEscaper = strings.NewReplacer("%", "%25", "|", "%7C")

// buildKey joins the key parts as "tag=value|tag=value", values escaped,
// a part missing from d as its tag alone, and says whether one was
// missing. A key that is too long or not UTF-8 is replaced by its SHA-256.
func (c *compiled) buildKey(d *Descriptor) (key string, missing bool) {
	if len(c.key) == 0 {
		return "*", false
	}
	var vals [8]string
	var present [8]bool
	vs, has := vals[:0], present[:0]
	size := 0
	for _, kp := range c.key {
		var v string
		var ok bool
		switch kp.kind {
		case partIP:
			if ok = d.IP.IsValid(); ok {
				v = d.IP.Unmap().String()
			}
		case partUser:
			v, ok = d.User, d.User != ""
		case partRoute:
			v, ok = d.Route, d.Route != ""
		case partMethod:
			v, ok = d.Method, d.Method != ""
		case partHeader:
			v, ok = d.header(kp.name)
		case partDescriptor:
			v, ok = d.Values[kp.name]
		}
		missing = missing || !ok
		if strings.ContainsAny(v, "%|") {
			v = keyEscaper.Replace(v)
		}
		vs, has = append(vs, v), append(has, ok)
		size += len(kp.tag) + 2 + len(v)
	}
	var b strings.Builder
	b.Grow(size)
	for i, kp := range c.key {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(kp.tag)
		if has[i] {
			b.WriteByte('=')
			b.WriteString(vs[i])
		}
	}
	key = b.String()
	if len(key) > limiter.MaxKeyLen || !utf8.ValidString(key) {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return key, missing
}

// matches reports whether every condition of c holds for d.
func (c *compiled) matches(d *Descriptor) bool {
	if !c.anyRoute && (len(c.exact) > 0 || len(c.prefixes) > 0) {
		ok := slices.Contains(c.exact, d.Route)
		for _, p := range c.prefixes {
			if ok {
				break
			}
			ok = strings.HasPrefix(d.Route, p)
		}
		if !ok {
			return false
		}
	}
	if len(c.methods) > 0 && !slices.ContainsFunc(c.methods, func(m string) bool { return strings.EqualFold(m, d.Method) }) {
		return false
	}
	for i := range c.headers {
		h := &c.headers[i]
		v, ok := d.header(h.name)
		if !ok || !h.any && v != h.value {
			return false
		}
	}
	if len(c.ips) > 0 {
		if !d.IP.IsValid() {
			return false
		}
		ip := d.IP.Unmap()
		if !slices.ContainsFunc(c.ips, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return false
		}
	}
	if c.anyUser || len(c.users) > 0 {
		if d.User == "" || !c.anyUser && !slices.Contains(c.users, d.User) {
			return false
		}
	}
	for i := range c.descriptors {
		p := &c.descriptors[i]
		v, ok := d.Values[p.name]
		if !ok || !p.any && v != p.value {
			return false
		}
	}
	return true
}

func parseKeyPart(s string) (keyPart, string) {
	switch s {
	case "ip":
		return keyPart{kind: partIP, tag: s}, ""
	case "user":
		return keyPart{kind: partUser, tag: s}, ""
	case "route":
		return keyPart{kind: partRoute, tag: s}, ""
	case "method":
		return keyPart{kind: partMethod, tag: s}, ""
	}
	kind, name, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == "header" && isToken(name):
		name = http.CanonicalHeaderKey(name)
		return keyPart{kind: partHeader, name: name, tag: "header:" + name}, ""
	case ok && kind == "descriptor" && name != "":
		return keyPart{kind: partDescriptor, name: name, tag: s}, ""
	}
	return keyPart{}, fmt.Sprintf("unknown key part %q (want ip, user, route, method, header:<Name> or descriptor:<name>)", s)
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// checkName returns why name is not a valid rule name, or "".
func checkName(name string) string {
	switch {
	case name == "":
		return "rule name is empty"
	case len(name) > MaxNameLen:
		return fmt.Sprintf("rule name is %d bytes, more than %d", len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-') {
			return fmt.Sprintf("rule name %q has %q; use only [A-Za-z0-9_.:-]", name, c)
		}
	}
	return ""
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
