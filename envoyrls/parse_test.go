package envoyrls

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each invalid file is refused with an error naming the file, the line
// and, but for YAML syntax errors, the column of the problem; the cases include envoyproxy/ratelimit's own invalid
// test configurations.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
	}{
		{"empty", "", "bad.yaml: the file is empty"},
		{"not YAML", "domain: [x\n", "bad.yaml:2: not valid YAML"},
		{"two documents", "domain: a\n---\ndomain: b\n", "bad.yaml:2:1: not valid YAML: the file holds more than one YAML document"},
		{"not a mapping", "- a\n", "bad.yaml:1:1: want a mapping of domain, descriptors"},
		{"non-string key", "0.25: test-domain\n", `bad.yaml:1:1: a key must be text, not "0.25"`},
		{"empty domain", "descriptors:\n", "bad.yaml:1:1: the domain is empty"},
		{"non-map list", "domain: d\ndescriptors:\n  - a\n  - b\n", `bad.yaml:3:5: want a mapping of key, value`},
		{"misspelled key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n",
			`bad.yaml:4:5: unknown key "ratelimit" (want one of key, value, rate_limit,`},
		{"misspelled rate_limit key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			`bad.yaml:6:7: unknown key "requestsperunit" (want one of unit,`},
		{"misplaced key", "domain: d\nunit: day\n", `bad.yaml:2:1: unknown key "unit"`},
		{"key twice", "domain: d\ndomain: e\n", `bad.yaml:2:1: domain: the key "domain" is given twice (first at line 1, column 1)`},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "bad.yaml:3: descriptor has an empty key"},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n    value: v\n\n  - key: k\n    value: v\n",
			`bad.yaml:6: duplicate descriptor "d.k_v"`},
		{"duplicate nested descriptor", "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: s\n      - key: s\n",
			`bad.yaml:6: duplicate descriptor "d.k.s"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			`bad.yaml:5:13: invalid rate limit unit "foo"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
			"bad.yaml:3: rate_limit has no unit"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
			"bad.yaml:3: an unlimited rate_limit takes no unit (it has day)"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n",
			"bad.yaml:3: a replaces entry has an empty name"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n",
			`bad.yaml:3: rate_limit "self" replaces itself`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			`bad.yaml:3: share_threshold needs a wildcard value`},
		{"negative count", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n",
			`bad.yaml:4:48: "-1" is not a whole number`},
		{"count too large", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4294967296}\n",
			`bad.yaml:4:48: "4294967296" is not a whole number`},
		{"count as text", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: ten}\n",
			`bad.yaml:4:48: want a whole number, not "ten"`},
		{"bad boolean", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", `bad.yaml:4:18: want true or false, not "maybe"`},
		{"list as value", "domain: d\ndescriptors:\n  - key: [a]\n", "bad.yaml:3:10: want text, not a list"},
		{"descriptors not a list", "domain: d\ndescriptors: {key: k}\n", "bad.yaml:2:14: want a list, not a mapping"},
		{"alias bomb", aliasBomb(), "bad.yaml:10:51: descriptors[0].metadata.a5[7]: the alias *a4 expands the document beyond 1000000 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDomain("bad.yaml", []byte(tc.text))
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v, want a *ConfigError wrapping ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to hold %q", err, tc.want)
			}
		})
	}
}

// aliasBomb is a few hundred bytes whose aliases expand to billions of
// nodes.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	return "domain: d\ndescriptors:\n  - key: k\n    metadata:\n" + indent(b.String(), "      ")
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// Files envoyproxy/ratelimit reads load as it reads them: YAML 1.1
// booleans, numbers as values, metadata, value_to_metric and quota_mode.
func TestParseAsEnvoyproxy(t *testing.T) {
	d, err := ParseDomain("ok.yaml", []byte(`
domain: 42
descriptors:
  - key: code
    value: 429
    shadow_mode: yes
    detailed_metric: on
    metadata:
      owner: {team: edge}
    rate_limit:
      name: ~
      unit: SECOND
      requests_per_unit: 0x10
  - key: anchor
    descriptors: &nested
      - key: x
        value_to_metric: True
        quota_mode: off
        rate_limit: {unit: week, requests_per_unit: 1_000}
  - key: alias
    descriptors: *nested
`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "42" {
		t.Errorf("domain %q, want 42", d.Name)
	}
	c := d.Descriptors[0]
	if c.Value != "429" || !c.ShadowMode || !c.DetailedMetric || c.RateLimit.Unit != Second || c.RateLimit.RequestsPerUnit != 16 {
		t.Errorf("descriptor %+v, limit %+v", c, c.RateLimit)
	}
	if m := d.Match([]Entry{{"alias", "a"}, {"x", "1"}}); m.Descriptor == nil || m.Descriptor.RateLimit.RequestsPerUnit != 1000 || !m.Descriptor.ValueToMetric {
		t.Errorf("the aliased descriptors do not match: %+v", m.Descriptor)
	}
}

// LoadDir reads the *.yaml and *.yml files of a directory, one domain
// each, skipping hidden entries and other files; a domain in two files
// is an error naming both.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write(".hidden.yaml", "not: valid\n")
	write("notes.txt", "anything")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	r, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, okA := r.Domain("a")
	_, okB := r.Domain("b")
	if r.Len() != 2 || !okA || !okB {
		t.Errorf("loaded %d domains (a %v, b %v), want a and b", r.Len(), okA, okB)
	}
	write("c.yaml", "domain: a\n")
	_, err = LoadDir(dir)
	if !errors.Is(err, ErrDuplicateDomain) || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "c.yaml") || !strings.Contains(err.Error(), "a.yaml") {
		t.Errorf("duplicate domain: %v", err)
	}
	write("c.yaml", "domain: c\ndescriptors:\n  - key:\n")
	if _, err = LoadDir(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "c.yaml")+":3: descriptor has an empty key") {
		t.Errorf("invalid file: %v", err)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory loaded")
	}
}

// LoadDir reads configuration files with the strict YAML reader: a key
// given twice at any depth, an alias bomb, a nesting bomb and a file past
// MaxFileBytes are refused with errors naming file:line:col, before any
// descriptor is read.
func TestLoadDirUsesTheStrictReader(t *testing.T) {
	var deep strings.Builder
	deep.WriteString("domain: d\ndescriptors:\n")
	for i := range 60 {
		pad := strings.Repeat("    ", i)
		deep.WriteString(pad + "  - key: k\n" + pad + "    descriptors:\n")
	}
	for _, tc := range []struct {
		name, yaml string
		want       string // after the path
	}{
		{"a key twice in a nested descriptor", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: day, unit: hour}\n",
			`:6:33: descriptors[0].descriptors[0].rate_limit.unit: the key "unit" is given twice (first at line 6, column 22)`},
		{"an alias bomb in metadata", aliasBomb(), ":10:51: descriptors[0].metadata.a5[7]: the alias *a4 expands the document beyond 1000000 nodes"},
		{"a nesting bomb", deep.String(), ":101:201: " + strings.TrimSuffix(strings.Repeat("descriptors[0].", 50), ".") + ": the document nests deeper than 100 levels"},
		{"one byte past the size bound", "domain: d\n" + strings.Repeat("#", MaxFileBytes-9), ": the file is larger than the limit of 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "d.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := LoadDir(dir)
			var ce *ConfigError
			if r != nil || !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "envoyrls: "+path+tc.want) {
				t.Fatalf("LoadDir: %v, want a *ConfigError holding %q", err, path+tc.want)
			}
		})
	}
	// At the size bound exactly, the same file loads.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\n"+strings.Repeat("#", MaxFileBytes-10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err != nil {
		t.Fatalf("a file of MaxFileBytes: %v", err)
	}
}
