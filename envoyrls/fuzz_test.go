package envoyrls

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseDomain feeds the parser arbitrary files: it never panics, every
// error is a *ConfigError naming the file, and what it accepts matches
// descriptors and builds counter keys within the limiter's bounds.
func FuzzParseDomain(f *testing.F) {
	for _, seed := range []string{
		hitsConfig, unitsConfig, headersConfig, quotaConfig, matchConfig,
		"domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: yes}\n    descriptors: [{key: s, rate_limit: {name: n, replaces: [{name: m}], unit: hour}}]\n",
		"domain: &a d\ndescriptors: [{key: *a, metadata: {x: [1, 2]}}]\n",
		"", "- x", "domain: [", "domain: d\n---\n",
	} {
		f.Add(seed, "k", "abc", "s", "x")
	}
	f.Fuzz(func(t *testing.T, text, k1, v1, k2, v2 string) {
		d, err := ParseDomain("f.yaml", []byte(text))
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.File != "f.yaml" || !strings.HasPrefix(err.Error(), "envoyrls: f.yaml") {
				t.Fatalf("error %v (%T) is not a *ConfigError of f.yaml", err, err)
			}
			return
		}
		if _, err := NewRules(d); err != nil {
			t.Fatal(err)
		}
		for _, entries := range [][]Entry{{{k1, v1}}, {{k1, v1}, {k2, v2}}} {
			m := d.Match(entries)
			if m.Descriptor == nil {
				continue
			}
			if key := m.CounterKey(); key == "" || len(key) > MaxCounterKeyLen {
				t.Fatalf("counter key %q", key)
			}
			if !strings.HasPrefix(m.MetricKey(), d.Name+".") {
				t.Fatalf("metric key %q outside domain %q", m.MetricKey(), d.Name)
			}
		}
	})
}
