package envoyrls

import "testing"

const metricKeyConfig = `
domain: mk
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: exact
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: pattern
    value: p-*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: s-*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: valued
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: group
        value: g-*
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`

// MetricKey is the configuration's name, taken as it is, when no entry
// contributes its request's value, and written out otherwise; either way
// it is what writing it out gives.
func TestMetricKey(t *testing.T) {
	d, err := ParseDomain("mk.yaml", []byte(metricKeyConfig))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		entries []Entry
		want    string
		// configured: the configuration's name, taken without an
		// allocation.
		configured bool
	}{
		{[]Entry{{"plain", "x"}}, "mk.plain", true},
		{[]Entry{{"exact", "v"}}, "mk.exact_v", true},
		{[]Entry{{"pattern", "p-1"}}, "mk.pattern_p-*", true},
		{[]Entry{{"shared", "s-1"}}, "mk.shared_s-*", true},
		{[]Entry{{"valued", "x"}}, "mk.valued_x", false},
		{[]Entry{{"tenant", "t"}, {"user", "u"}}, "mk.tenant_t.user_u", false},
		{[]Entry{{"tenant", "t"}, {"group", "g-1"}}, "mk.tenant.group_g-1", false},
	} {
		m := d.Match(tt.entries)
		if m.Descriptor == nil {
			t.Fatalf("%v: no match", tt.entries)
		}
		if got := m.MetricKey(); got != tt.want {
			t.Errorf("%v: metric key %q, want %q", tt.entries, got, tt.want)
		}
		if built := m.buildMetricKey(m.Descriptor.DetailedMetric); built != tt.want {
			t.Errorf("%v: written out %q, want %q", tt.entries, built, tt.want)
		}
		allocs := testing.AllocsPerRun(100, func() { _ = m.MetricKey() })
		if configured := allocs == 0; configured != tt.configured {
			t.Errorf("%v: %v allocations, want the configuration's name %v", tt.entries, allocs, tt.configured)
		}
	}
}
