package rules

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// exampleRules returns the rule files of the repository's examples: the
// limits constant of each example service.
func exampleRules(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, path := range []string{"../examples/httpservice/main.go", "../examples/grpcservice/main.go"} {
		src, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		_, rest, ok := strings.Cut(string(src), "const limits = `")
		y, _, ok2 := strings.Cut(rest, "`")
		if !ok || !ok2 {
			tb.Fatalf("%s has no limits constant", path)
		}
		out = append(out, y)
	}
	return out
}

// FuzzLoadRules parses arbitrary bytes as a rule file. It must never
// panic; a refusal is an *Error (or several) with the file's name, and an
// accepted set is within the bounds and holds rules that validate again
// on their own.
func FuzzLoadRules(f *testing.F) {
	seeds := append(exampleRules(f), docExample(f), good, string(badRules(3)),
		"rules: []\n",
		"base: &base\n  algorithm: gcra\n  limit: 5\n  period: 1m\n  key: [ip]\nrules:\n  - name: a\n    <<: *base\n",
		laughs(func(i int) string {
			if i == 0 {
				return "[x, x]"
			}
			return fmt.Sprintf("[*a%d, *a%d]", i-1, i-1)
		}, "rules: *a8\n"),
		"rules:\n  - {name: a, algorithm: fixed_window, limit: 3, calendar: month, zone: Asia/Tokyo}\n",
		"rules:\n  - name: a\n    algorithm: gcra\n    limit: 1\n    period: 1s\n    match: {ips: [\"::1/129\"], routes: [\"/a/*/b\"]}\n",
		"rules: [{name: a}, {name: a}]\n---\nrules: []\n",
	)
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "fuzz.yaml" || e.Err == nil || !strings.HasPrefix(err.Error(), "rules: fuzz.yaml:") {
				t.Fatalf("refusal %T %v is not an *Error of fuzz.yaml", err, err)
			}
			if j, ok := err.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > maxErrors {
				t.Fatalf("%d problems reported, more than %d", len(j.Unwrap()), maxErrors)
			}
			return
		}
		if s.Len() > MaxRules || s.Origin() != "fuzz.yaml" {
			t.Fatalf("Len %d, Origin %q", s.Len(), s.Origin())
		}
		rules := make([]Rule, 0, s.Len())
		for _, r := range s.rules {
			rules = append(rules, *r)
		}
		if _, err := NewSet(rules...); err != nil {
			t.Fatalf("the rules of an accepted file do not validate again: %v", err)
		}
	})
}
