package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/limiter"
)

// Entry is one key and value of a request descriptor.
type Entry struct{ Key, Value string }

// how says how a step of a match found its descriptor.
type how uint8

const (
	byValue   how = iota // key and value equal
	byPattern            // key equal, value matched by a '*' pattern
	byKey                // key equal, the descriptor has no value
)

// Match is what the entries of one request descriptor matched in a
// domain's tree.
type Match struct {
	// Descriptor is the descriptor whose RateLimit applies, nil when none
	// does: no descriptor matched every entry, or the one that did has no
	// rate_limit.
	Descriptor *Descriptor

	domain  string
	entries []Entry
	path    []hop // one per entry, when Descriptor is set
}

// hop is the descriptor one entry matched, and how.
type hop struct {
	ds  *Descriptor
	how how
}

// Match finds the rate limit of a request descriptor as envoyproxy/
// ratelimit does. Each entry is looked for among the descriptors of one
// level, starting at the domain's: first one with its key and value, then
// the first whose value is a pattern the value matches, in file order,
// then one with its key and no value. A limit applies when every entry
// was found, each below the one before, and the last has a rate_limit: a
// descriptor with more or fewer entries than the configured path matches
// nothing.
func (d *Domain) Match(entries []Entry) Match {
	return d.match(entries, nil)
}

// match is Match, with the path in space when it has room.
func (d *Domain) match(entries []Entry, space []hop) Match {
	m := Match{domain: d.Name, entries: entries}
	lv := &d.root
	path := space
	if len(path) < len(entries) {
		path = make([]hop, len(entries))
	}
	path = path[:len(entries)]
	for i, e := range entries {
		next, h := lv.find(e)
		if next == nil {
			return m
		}
		path[i] = hop{next, h}
		if i == len(entries)-1 {
			if next.RateLimit != nil {
				m.Descriptor, m.path = next, path
			}
			return m
		}
		lv = &next.level
	}
	return m
}

// find returns the descriptor of lv that e matches, and how.
func (lv *level) find(e Entry) (*Descriptor, how) {
	if ds := lv.exact[entryKey{e.Key, e.Value}]; ds != nil {
		return ds, byValue
	}
	for _, ds := range lv.patterns {
		if ds.Key == e.Key && wildcardMatch(ds.parts, e.Value) {
			return ds, byPattern
		}
	}
	if ds := lv.byKey[e.Key]; ds != nil {
		return ds, byKey
	}
	return nil, 0
}

// shared reports whether an entry counts under its pattern rather than
// its value: it matched a share_threshold pattern.
func (s hop) shared() bool { return s.how == byPattern && s.ds.ShareThreshold }

// MaxCounterKeyLen bounds the counter keys CounterKey writes out in full:
// a longer one is replaced by its SHA-256, so that any descriptor fits
// limiter.MaxKeyLen and keys stay distinct.
const MaxCounterKeyLen = limiter.MaxKeyLen

// CounterKey returns the key of the counter of m: the domain, then each
// entry as |key=value, or |key~pattern for an entry that matched a
// share_threshold pattern (so that every value it matches shares the
// counter), where '%', '|', '=' and '~' are written %25, %7C, %3D and
// %7E. Without a limit (Descriptor nil) every entry is written with its
// value: the key of a limit Envoy's request sets itself. A key longer than MaxCounterKeyLen, or not valid UTF-8, is
// "sha256:" and the hex SHA-256 of the key.
func (m *Match) CounterKey() string {
	var b strings.Builder
	n := len(m.domain)
	for i, e := range m.entries {
		n += 2 + len(e.Key) + len(e.Value)
		if m.path != nil && m.path[i].shared() {
			n += len(m.path[i].ds.Value)
		}
	}
	b.Grow(n) // enough unless something needs escaping
	escape(&b, m.domain)
	for i, e := range m.entries {
		b.WriteByte('|')
		escape(&b, e.Key)
		if m.path != nil && m.path[i].shared() {
			b.WriteByte('~')
			escape(&b, m.path[i].ds.Value)
		} else {
			b.WriteByte('=')
			escape(&b, e.Value)
		}
	}
	key := b.String()
	if len(key) > MaxCounterKeyLen || !utf8.ValidString(key) {
		sum := sha256.Sum256([]byte(key))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

// escape writes s with '%', '|', '=' and '~' percent-encoded.
func escape(b *strings.Builder, s string) {
	for {
		i := strings.IndexAny(s, "%|=~")
		if i < 0 {
			b.WriteString(s)
			return
		}
		b.WriteString(s[:i])
		switch s[i] {
		case '%':
			b.WriteString("%25")
		case '|':
			b.WriteString("%7C")
		case '=':
			b.WriteString("%3D")
		default:
			b.WriteString("%7E")
		}
		s = s[i+1:]
	}
}

// MetricKey returns the name envoyproxy/ratelimit gives m's limit in its
// statistics: the domain and, for each entry, its key or key_value,
// joined by '.'. An entry contributes its configured value (the pattern,
// for one that matched a pattern), or none when the descriptor has no
// value; the request's value instead when its descriptor has
// value_to_metric (but for a share_threshold pattern, which stays). With
// detailed_metric on the limit's descriptor, every entry contributes its
// request's value (a share_threshold pattern still stays). "" when no
// limit applies.
func (m *Match) MetricKey() string {
	if m.Descriptor == nil {
		return ""
	}
	detailed := m.Descriptor.DetailedMetric
	if p := m.Descriptor.path; !m.valuesInMetric(detailed) && len(p) > len(m.domain) && p[len(m.domain)] == '.' && p[:len(m.domain)] == m.domain {
		return p // the configuration's name, built once
	}
	return m.buildMetricKey(detailed)
}

// buildMetricKey writes out MetricKey; detailed is the limit's
// detailed_metric.
func (m *Match) buildMetricKey(detailed bool) string {
	value := func(i int) string {
		st, e := m.path[i], m.entries[i]
		switch {
		case st.shared():
		case detailed || st.how == byValue || st.ds.ValueToMetric:
			return e.Value
		}
		return st.ds.Value
	}
	n := len(m.domain)
	for i := range m.path {
		n += 2 + len(m.entries[i].Key) + len(value(i))
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(m.domain)
	for i := range m.path {
		b.WriteByte('.')
		writeComposite(&b, m.entries[i].Key, value(i))
	}
	return b.String()
}

// valuesInMetric reports whether an entry of m contributes its request's
// value to MetricKey rather than its descriptor's; detailed is the
// limit's detailed_metric.
func (m *Match) valuesInMetric(detailed bool) bool {
	for _, st := range m.path {
		if !st.shared() && st.how != byValue && (detailed || st.ds.ValueToMetric) {
			return true
		}
	}
	return false
}

// overrideMetricKey is the metric key of a limit Envoy sent with the
// descriptor: the domain and each entry's key_value, as envoyproxy/
// ratelimit names it.
func (m *Match) overrideMetricKey() string {
	var b strings.Builder
	b.WriteString(m.domain)
	for _, e := range m.entries {
		b.WriteByte('.')
		writeComposite(&b, e.Key, e.Value)
	}
	return b.String()
}

// writeComposite writes compositeKey(key, value) to b.
func writeComposite(b *strings.Builder, key, value string) {
	b.WriteString(key)
	if value != "" {
		b.WriteByte('_')
		b.WriteString(value)
	}
}
