package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Bounds of a POST /v1/rules/check body, checked before anything is built
// from it: a request holds at most MaxRulesDescriptors descriptors and
// MaxRulesHeaders headers, whose names are at most limiter.MaxNameLen
// bytes and whose values, like the route and the user, at most
// limiter.MaxKeyLen; the method is at most limiter.MaxNameLen.
const (
	MaxRulesDescriptors = transport.MaxRulesEntries
	MaxRulesHeaders     = transport.MaxRulesEntries
)

// maxRulesWait is the Enforcer's MaxWait: a leaky-bucket rule's pacing
// delay is not waited for by the daemon but returned as delay_ms, for the
// caller to wait, however long it is (a full bucket rejects by itself).
const maxRulesWait = time.Duration(math.MaxInt64)

// maxIPLen bounds the ip field before it is parsed: the longest IPv6
// text with a zone fits.
const maxIPLen = 64

// codeRulesNotConfigured answers POST /v1/rules/check on a daemon started
// without rules_file.
const codeRulesNotConfigured = "rules_not_configured"

// rulesCheckJSON is the body of POST /v1/rules/check: a request as the
// rules see it (rules.Descriptor), and its cost. Headers and descriptors
// are read by decodeEntries, which bounds them as it goes.
type rulesCheckJSON struct {
	Route       string          `json:"route"`
	Method      string          `json:"method"`
	IP          string          `json:"ip"`
	User        string          `json:"user"`
	Headers     json.RawMessage `json:"headers"`
	Descriptors json.RawMessage `json:"descriptors"`
	// Hits absent means 1; 0 peeks.
	Hits *int64 `json:"hits"`
}

// RulesDecision answers POST /v1/rules/check.
type RulesDecision struct {
	// Allowed says the request may proceed: every enforced rule that
	// applied admits it. It is true when no rule applied.
	Allowed bool `json:"allowed"`
	// RetryAfterMs is, for a request not allowed, how long until it would
	// be, if nothing else is consumed meanwhile.
	RetryAfterMs int64 `json:"retry_after_ms"`
	// DelayMs is how long an allowed request should wait before it
	// proceeds: the pacing of a leaky-bucket rule.
	DelayMs int64 `json:"delay_ms"`
	// Rules has one entry per rule that applied, in the file's order.
	Rules []RuleDecision `json:"rules"`
}

// RuleDecision is one rule's part in a RulesDecision: its name, the
// counter it keys, whether it is a shadow rule (decided, never blocking),
// and its decision, whose allowed is false when this rule rejects the
// request and retry_after_ms says until when.
type RuleDecision struct {
	Name   string `json:"name"`
	Key    string `json:"key"`
	Shadow bool   `json:"shadow"`
	Decision
}

// rulesInput is a descriptor check as an adapter decoded it, before it is
// checked: the body of POST /v1/rules/check and the Rules service's
// RulesCheckRequest both come to this, and descriptorOf validates it for
// both.
type rulesInput struct {
	Route, Method, IP, User string
	Headers, Descriptors    []rulesEntry
	Hits                    *int64 // nil means 1
}

// rulesEntry is one header or descriptor of a rulesInput.
type rulesEntry struct{ Name, Value string }

// handleRulesCheck decides a request described by its route, user,
// descriptors and so on, with every rule of Config.RulesFile that applies
// to it, all or nothing.
func (d *Daemon) handleRulesCheck(w http.ResponseWriter, r *http.Request) {
	if d.rules == nil {
		writeProblem(w, http.StatusNotFound, "no rules_file is configured: POST /v1/rules/check needs the daemon started with one",
			&itemError{Code: codeRulesNotConfigured})
		return
	}
	body, release, ok := d.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	desc, hits, ierr := parseRulesCheck(body)
	if ierr != nil {
		d.metrics.items.WithLabelValues(resultInvalid).Inc()
		writeProblem(w, http.StatusBadRequest, ierr.Message, ierr)
		return
	}
	v, ierr := d.enforceRules(r.Context(), desc, hits)
	if ierr != nil {
		d.metrics.items.WithLabelValues(resultFor(ierr)).Inc()
		writeProblem(w, statusFor(ierr), ierr.Message, ierr)
		return
	}
	d.metrics.countDecision(v.Allowed)
	writeJSON(w, http.StatusOK, encodeVerdict(v, d.opts.now()))
}

// enforceRules applies the rules in force to desc at a cost of hits. When
// the limiter fails, it returns the error of the first limit that failed.
func (d *Daemon) enforceRules(ctx context.Context, desc *rules.Descriptor, hits int64) (*rules.Verdict, *itemError) {
	v := d.enforcer.Enforce(ctx, d.rules.Current(), desc, hits)
	if v.Err == nil {
		return v, nil
	}
	for i := range v.Limits { // the first failure, for its code
		if err := v.Limits[i].Err; err != nil {
			return nil, toItemError(err)
		}
	}
	return nil, toItemError(v.Err)
}

// ruleDecision returns the decision of l as the rule made it: a limit's
// own decision may admit what the rule rejects, since a cost over its
// capacity is only peeked at.
func ruleDecision(l *rules.Limit) limiter.Decision {
	dec := l.Decision.Decision
	dec.Allowed, dec.RetryAfter = !l.Rejected, l.RetryAfter
	if dec.Limit == 0 {
		dec.Limit = l.Request.Limit
	}
	return dec
}

// encodeVerdict returns v in JSON form, reset_after_ms counted from now.
func encodeVerdict(v *rules.Verdict, now time.Time) RulesDecision {
	out := RulesDecision{
		Allowed:      v.Allowed,
		RetryAfterMs: ceilMillis(v.RetryAfter),
		DelayMs:      ceilMillis(v.Delay),
		Rules:        make([]RuleDecision, len(v.Limits)),
	}
	for i := range v.Limits {
		l := &v.Limits[i]
		out.Rules[i] = RuleDecision{
			Name: l.Rule.Name, Key: l.Request.Key, Shadow: !l.Enforced,
			Decision: EncodeDecision(ruleDecision(l), l.Decision.Owner, l.Decision.WithoutOwner, now),
		}
	}
	return out
}

// parseRulesCheck parses and checks a POST /v1/rules/check body.
func parseRulesCheck(raw []byte) (*rules.Descriptor, int64, *itemError) {
	in, ierr := decodeRulesCheck(raw)
	if ierr != nil {
		return nil, 0, ierr
	}
	return descriptorOf(in)
}

// decodeRulesCheck parses a POST /v1/rules/check body, bounding its
// headers and descriptors as it reads them.
func decodeRulesCheck(raw []byte) (*rulesInput, *itemError) {
	var body rulesCheckJSON
	if err := decodeStrict(raw, &body); err != nil {
		ierr := jsonError(err)
		if strings.HasPrefix(ierr.Field, "headers.") || strings.HasPrefix(ierr.Field, "descriptors.") {
			// Not the check's own field of that name ("descriptors.key").
			ierr.Code = "invalid_argument"
		}
		return nil, ierr
	}
	in := &rulesInput{Route: body.Route, Method: body.Method, IP: body.IP, User: body.User, Hits: body.Hits}
	var ierr *itemError
	if in.Headers, ierr = decodeEntries(body.Headers, "headers", MaxRulesHeaders); ierr != nil {
		return nil, ierr
	}
	if in.Descriptors, ierr = decodeEntries(body.Descriptors, "descriptors", MaxRulesDescriptors); ierr != nil {
		return nil, ierr
	}
	return in, nil
}

// descriptorOf checks in and returns the descriptor and cost it describes.
// It refuses strings over their bounds, a method that is no HTTP token, an
// ip that is no address, a negative cost, and headers and descriptors as
// checkEntries does; the first field at fault is named in the error.
func descriptorOf(in *rulesInput) (*rules.Descriptor, int64, *itemError) {
	for _, f := range []struct {
		name, value string
		max         int
	}{{"route", in.Route, limiter.MaxKeyLen}, {"user", in.User, limiter.MaxKeyLen}, {"method", in.Method, limiter.MaxNameLen}} {
		if len(f.value) > f.max {
			return nil, 0, invalidf(f.name, "%s is %d bytes, more than %d", f.name, len(f.value), f.max)
		}
	}
	if in.Method != "" && !httpguts.ValidHeaderFieldName(in.Method) { // the same token rule
		return nil, 0, invalidf("method", "method %q is not an HTTP token", in.Method)
	}
	desc := &rules.Descriptor{Route: in.Route, Method: in.Method, User: in.User}
	if in.IP != "" {
		ip, err := netip.ParseAddr(in.IP)
		if len(in.IP) > maxIPLen || err != nil {
			return nil, 0, invalidf("ip", "ip is not an IPv4 or IPv6 address")
		}
		desc.IP = ip.WithZone("") // a zone means nothing off its host: one client, one counter
	}
	headers, ierr := checkEntries(in.Headers, "headers", MaxRulesHeaders, true)
	if ierr != nil {
		return nil, 0, ierr
	}
	if headers != nil {
		desc.Header = func(name string) (string, bool) {
			v, ok := headers[name] // both canonical
			return v, ok
		}
	}
	if desc.Values, ierr = checkEntries(in.Descriptors, "descriptors", MaxRulesDescriptors, false); ierr != nil {
		return nil, 0, ierr
	}
	hits := int64(1)
	if in.Hits != nil {
		if hits = *in.Hits; hits < 0 {
			return nil, 0, &itemError{Code: "invalid_hits", Field: "hits", Message: fmt.Sprintf("hits %d is negative", hits)}
		}
	}
	return desc, hits, nil
}

// checkEntries returns entries as a map, nil for none; field names them
// in errors. It refuses more than max entries, names that are empty or
// longer than limiter.MaxNameLen (for headers, that are no HTTP token),
// values longer than limiter.MaxKeyLen, and a name given twice (for
// headers, in any case). It stops at the first entry at fault.
func checkEntries(entries []rulesEntry, field string, max int, header bool) (map[string]string, *itemError) {
	if len(entries) == 0 {
		return nil, nil
	}
	if len(entries) > max {
		return nil, tooManyEntries(field, max)
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		name := e.Name
		switch {
		case name == "":
			return nil, invalidf(field, "%s: a name is empty", field)
		case len(name) > limiter.MaxNameLen:
			return nil, invalidf(field, "%s: a name is %d bytes, more than %d", field, len(name), limiter.MaxNameLen)
		case header && !httpguts.ValidHeaderFieldName(name):
			return nil, invalidf(field, "%s: %q is not an HTTP header name", field, name)
		}
		if header {
			name = http.CanonicalHeaderKey(name)
		}
		path := field + "." + name
		if len(e.Value) > limiter.MaxKeyLen {
			return nil, invalidf(path, "%s is %d bytes, more than %d", path, len(e.Value), limiter.MaxKeyLen)
		}
		if _, dup := out[name]; dup {
			return nil, invalidf(path, "%s is given twice", path)
		}
		out[name] = e.Value
	}
	return out, nil
}

// decodeEntries reads raw, a JSON object of strings or null, as entries
// in their order; field names it in errors. It stops at entry max+1, so
// that what it builds stays within the bounds whatever raw holds, and
// leaves the rest of the checks to checkEntries.
func decodeEntries(raw json.RawMessage, field string, max int) ([]rulesEntry, *itemError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, invalidf(field, "%s: want an object of names to strings", field)
	}
	var out []rulesEntry
	for dec.More() {
		if len(out) == max {
			return nil, tooManyEntries(field, max)
		}
		tok, err := dec.Token()
		name, ok := tok.(string)
		if err != nil || !ok { // raw is valid JSON already: cannot happen
			return nil, invalidf(field, "%s: malformed object", field)
		}
		tok, err = dec.Token()
		value, ok := tok.(string)
		if err != nil || !ok {
			path := field + "." + name
			return nil, invalidf(path, "%s: want a string", path)
		}
		out = append(out, rulesEntry{Name: name, Value: value})
	}
	return out, nil
}

// tooManyEntries is the error of headers or descriptors, field, holding
// more than max entries.
func tooManyEntries(field string, max int) *itemError {
	return invalidf(field, "%s holds more than %d entries", field, max)
}

// invalidf is an invalid_argument error of field.
func invalidf(field, format string, a ...any) *itemError {
	return &itemError{Code: "invalid_argument", Field: field, Message: fmt.Sprintf(format, a...)}
}
