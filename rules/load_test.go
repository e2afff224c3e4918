package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the tests load Europe/Paris wherever they run

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// good is a valid file exercising every field.
const good = `rules:
  - name: api_per_user
    description: every user's calls
    match:
      routes: ["/api/*", /health]
      methods: [GET, post]
      headers: {x-tenant: acme, X-Debug: "*"}
      ips: ["10.0.0.0/8", "2001:db8::/32", 192.0.2.7]
      users: [alice, "*"]
      descriptors: {plan: free}
    key: [user, header:x-tenant, descriptor:plan]
    algorithm: token_bucket
    limit: 100
    period: 1m
    burst: 150
    unreachable: deny
    shadow: true
  - name: exports_per_day
    key: ip
    algorithm: fixed-window
    limit: 20
    calendar: day
    zone: Europe/Paris
`

func TestParseGood(t *testing.T) {
	s, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 || s.Origin() != "good.yaml" {
		t.Fatalf("Len %d, Origin %q", s.Len(), s.Origin())
	}
	r, ok := s.Rule("api_per_user")
	if !ok {
		t.Fatal("api_per_user missing")
	}
	if r.Algorithm != limiter.TokenBucket || r.Limit != 100 || r.Period != time.Minute || r.Burst != 150 ||
		r.Unreachable != sluice.PolicyDeny || !r.Shadow {
		t.Errorf("api_per_user = %+v", r)
	}
	if got := strings.Join(r.Key, ","); got != "user,header:x-tenant,descriptor:plan" {
		t.Errorf("Key = %s", got)
	}
	if r.Match.Headers["x-tenant"] != "acme" || len(r.Match.IPs) != 3 || r.Match.Descriptors["plan"] != "free" {
		t.Errorf("Match = %+v", r.Match)
	}
	e, _ := s.Rule("exports_per_day")
	if e.Algorithm != limiter.FixedWindow || e.Calendar != limiter.Day || e.Location.String() != "Europe/Paris" || e.Period != 0 {
		t.Errorf("exports_per_day = %+v", e)
	}
	if got := strings.Join(e.Key, ","); got != "ip" {
		t.Errorf("a scalar key is a list of one: %q", got)
	}
}

func TestParseNoRules(t *testing.T) {
	s, err := Parse("none.yaml", []byte("rules: []\n"))
	if err != nil || s.Len() != 0 {
		t.Fatalf("rules: [] = %v, %v", s, err)
	}
}

// TestParseErrors checks that each kind of problem is reported with its
// sentinel, field and exact position.
func TestParseErrors(t *testing.T) {
	const head = "rules:\n  - name: a\n    algorithm: token_bucket\n" // lines 1-3
	tests := []struct {
		name       string
		yaml       string
		want       error
		line, col  int
		field      string
		alsoWanted error // a limiter sentinel, when the limiter decided
	}{
		{"syntax", "rules:\n  - name: a\n    limit: [1, 2\n    period: 1m\n", ErrSyntax, 3, 0, "", nil},
		{"syntax in a block", "rules: []\nx: 1\n- c\n", ErrSyntax, 3, 0, "", nil},
		{"syntax on line 1", "rules: a: b\n", ErrSyntax, 1, 0, "", nil},
		{"unterminated string", "rules:\n  - name: \"a\n", ErrSyntax, 2, 0, "", nil},
		{"tab indentation", "rules:\n\t- name: a\n", ErrSyntax, 2, 0, "", nil},
		{"empty file", "", ErrEmptyDocument, 1, 1, "", nil},
		{"only comments", "# nothing yet\n", ErrEmptyDocument, 1, 1, "", nil},
		{"null rules", "rules:\n", ErrWrongType, 1, 7, "rules", nil},
		{"two documents", "rules: []\n---\nrules: []\n", ErrSyntax, 2, 1, "", nil},
		{"top-level unknown field", "rulez: []\n", ErrUnknownField, 1, 1, "rulez", nil},
		{"missing rules", "version: 1\n", ErrUnknownField, 1, 1, "version", nil},
		{"unknown field", head + "    limit: 10\n    period: 1m\n    limits: 5\n", ErrUnknownField, 6, 5, "rules[0].limits", nil},
		{"unknown match field", head + "    limit: 10\n    period: 1m\n    match:\n      route: [/x]\n", ErrUnknownField, 7, 7, "rules[0].match.route", nil},
		{"duplicate field", head + "    limit: 10\n    limit: 11\n    period: 1m\n", ErrDuplicateField, 5, 5, "rules[0].limit", nil},
		{"bad algorithm", "rules:\n  - name: a\n    algorithm: token_buckets\n    limit: 1\n    period: 1s\n", ErrUnknownAlgorithm, 3, 16, "rules[0].algorithm", limiter.ErrUnknownAlgorithm},
		{"negative limit", head + "    limit: -5\n    period: 1m\n", ErrInvalidLimit, 4, 12, "rules[0].limit", limiter.ErrInvalidLimit},
		{"limit not a number", head + "    limit: ten\n    period: 1m\n", ErrWrongType, 4, 12, "rules[0].limit", nil},
		{"limit a float", head + "    limit: 1.5\n    period: 1m\n", ErrWrongType, 4, 12, "rules[0].limit", nil},
		{"negative burst", head + "    limit: 5\n    period: 1m\n    burst: -1\n", ErrInvalidBurst, 6, 12, "rules[0].burst", limiter.ErrInvalidBurst},
		{"bad duration", head + "    limit: 10\n    period: 1 minute\n", ErrInvalidPeriod, 5, 13, "rules[0].period", nil},
		{"duration without unit", head + "    limit: 10\n    period: 60\n", ErrInvalidPeriod, 5, 13, "rules[0].period", nil},
		{"zero period", head + "    limit: 10\n    period: 0s\n", ErrInvalidPeriod, 5, 13, "rules[0].period", limiter.ErrInvalidPeriod},
		{"missing period", head + "    limit: 10\n", ErrMissingField, 2, 5, "rules[0].period", nil},
		{"missing name", "rules:\n  - algorithm: gcra\n    limit: 10\n    period: 1s\n", ErrMissingField, 2, 5, "rules[0].name", nil},
		{"bad name", "rules:\n  - name: a b\n    algorithm: gcra\n    limit: 10\n    period: 1s\n", ErrInvalidName, 2, 11, "rules[0].name", nil},
		{"bad CIDR", head + "    limit: 10\n    period: 1m\n    match:\n      ips:\n        - 10.0.0.0/8\n        - 10.0.0.0/33\n", ErrInvalidCIDR, 9, 11, "rules[0].match.ips[1]", nil},
		{"bad route", head + "    limit: 10\n    period: 1m\n    match: {routes: [\"/a/*/b\"]}\n", ErrInvalidMatch, 6, 22, "rules[0].match.routes[0]", nil},
		{"bad method", head + "    limit: 10\n    period: 1m\n    match: {methods: [\"GE T\"]}\n", ErrInvalidMatch, 6, 23, "rules[0].match.methods[0]", nil},
		{"unknown key part", head + "    limit: 10\n    period: 1m\n    key: [user, cookie]\n", ErrInvalidKey, 6, 17, "rules[0].key[1]", nil},
		{"key part twice", head + "    limit: 10\n    period: 1m\n    key: [ip, ip]\n", ErrInvalidKey, 6, 15, "rules[0].key[1]", nil},
		{"headers not a mapping", head + "    limit: 10\n    period: 1m\n    match: {headers: [a]}\n", ErrWrongType, 6, 22, "rules[0].match.headers", nil},
		{"shadow not a bool", head + "    limit: 10\n    period: 1m\n    shadow: sometimes\n", ErrWrongType, 6, 13, "rules[0].shadow", nil},
		{"bad policy", head + "    limit: 10\n    period: 1m\n    unreachable: maybe\n", ErrInvalidPolicy, 6, 18, "rules[0].unreachable", nil},
		{"calendar on a bucket", head + "    limit: 10\n    calendar: day\n", ErrInvalidCalendar, 5, 15, "rules[0].calendar", limiter.ErrInvalidCalendar},
		{"bad calendar", "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 10\n    calendar: fortnight\n", ErrInvalidCalendar, 5, 15, "rules[0].calendar", nil},
		{"bad zone", "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 10\n    calendar: day\n    zone: Mars/Olympus\n", ErrInvalidCalendar, 6, 11, "rules[0].zone", nil},
		{"period and calendar", "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 10\n    period: 1h\n    calendar: day\n", ErrInvalidPeriod, 5, 13, "rules[0].period", nil},
		{"duplicate name", "rules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s}\n  - name: b\n    algorithm: gcra\n    limit: 1\n    period: 1s\n  - name: a\n    algorithm: gcra\n    limit: 2\n    period: 1s\n", ErrDuplicateName, 7, 11, "rules[2].name", nil},
		{"rule not a mapping", "rules:\n  - just a string\n", ErrWrongType, 2, 5, "rules[0]", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("limits.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if tt.alsoWanted != nil && !errors.Is(err, tt.alsoWanted) {
				t.Errorf("error %v does not wrap %v", err, tt.alsoWanted)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not an *Error", err)
			}
			if e.File != "limits.yaml" || e.Line != tt.line || e.Column != tt.col || e.Field != tt.field {
				t.Errorf("at %s:%d:%d %q, want limits.yaml:%d:%d %q (%v)", e.File, e.Line, e.Column, e.Field, tt.line, tt.col, tt.field, err)
			}
			if !strings.HasPrefix(err.Error(), "rules: limits.yaml:") {
				t.Errorf("message %q does not start with the file", err)
			}
		})
	}
}

// Every problem of a file is reported, in file order.
func TestParseReportsEveryProblem(t *testing.T) {
	const y = `rules:
  - name: a
    algorithm: gcra
    limit: 0
    period: 1s
  - name: b
    algorithm: nope
    limit: 1
    period: 1s
    match: {ips: [bad]}
`
	_, err := Parse("x.yaml", []byte(y))
	var lines []int
	for _, want := range []error{ErrInvalidLimit, ErrUnknownAlgorithm, ErrInvalidCIDR} {
		if !errors.Is(err, want) {
			t.Errorf("%v does not report %v", err, want)
		}
	}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		lines = append(lines, e.(*Error).Line)
	}
	if len(lines) != 3 || lines[0] != 4 || lines[1] != 7 || lines[2] != 10 {
		t.Errorf("lines %v, want [4 7 10]", lines)
	}
	if n := strings.Count(err.Error(), "\n"); n != 2 {
		t.Errorf("message has %d newlines: %q", n, err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Load(path); err != nil || s.Len() != 2 || s.Origin() != path {
		t.Fatalf("Load = %v, %v", s, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// Rules built in code are validated the same way, with fields but no
// positions.
func TestNewSetErrors(t *testing.T) {
	ok := Rule{Name: "ok", Algorithm: limiter.GCRA, Limit: 10, Period: time.Second}
	tests := []struct {
		name  string
		rule  Rule
		want  error
		field string
	}{
		{"no algorithm", Rule{Name: "x", Limit: 1, Period: time.Second}, ErrUnknownAlgorithm, "rules[1].algorithm"},
		{"zero limit", Rule{Name: "x", Algorithm: limiter.GCRA, Period: time.Second}, ErrInvalidLimit, "rules[1].limit"},
		{"bad ip", Rule{Name: "x", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second, Match: Match{IPs: []string{"::1/129"}}}, ErrInvalidCIDR, "rules[1].match.ips[0]"},
		{"bad policy", Rule{Name: "x", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second, Unreachable: 9}, ErrInvalidPolicy, "rules[1].unreachable"},
		{"duplicate", ok, ErrDuplicateName, "rules[1].name"},
		{"zone without calendar", Rule{Name: "x", Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Second, Location: time.UTC}, ErrInvalidCalendar, "rules[1].zone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSet(ok, tt.rule)
			var e *Error
			if !errors.Is(err, tt.want) || !errors.As(err, &e) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if e.Field != tt.field || e.File != "" || e.Line != 0 {
				t.Errorf("error at %q %s:%d, want %q", e.Field, e.File, e.Line, tt.field)
			}
			if !strings.HasPrefix(err.Error(), "rules: "+tt.field+": ") {
				t.Errorf("message %q", err)
			}
		})
	}
}

func TestSourceUpdate(t *testing.T) {
	src, err := NewStatic(Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := src.Current()
	if err := src.Update(Rule{Name: "b"}); !errors.Is(err, ErrUnknownAlgorithm) {
		t.Fatalf("Update(invalid) = %v", err)
	}
	if src.Current() != first {
		t.Fatal("an invalid update replaced the set")
	}
	if err := src.Update(Rule{Name: "b", Algorithm: limiter.GCRA, Limit: 2, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, ok := src.Current().Rule("b"); !ok {
		t.Fatal("update not applied")
	}
}

// NewSet copies what it keeps: changing the caller's rule changes nothing.
func TestNewSetCopies(t *testing.T) {
	r := Rule{Name: "a", Algorithm: limiter.GCRA, Limit: 1, Period: time.Second, Key: []string{"ip"}, Match: Match{Users: []string{"u"}}}
	s, err := NewSet(r)
	if err != nil {
		t.Fatal(err)
	}
	r.Key[0] = "user"
	r.Match.Users[0] = "v"
	got, _ := s.Rule("a")
	if got.Key[0] != "ip" || got.Match.Users[0] != "u" {
		t.Fatalf("set shares the caller's slices: %+v", got)
	}
	if len(s.Match(&Descriptor{User: "u"})) != 1 {
		t.Fatal("match changed with the caller's slice")
	}
}

// The example in the package comment is a valid file.
func TestDocExample(t *testing.T) {
	y := docExample(t)
	s, err := Parse("doc.go", []byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if s.Len() != 3 {
		t.Fatalf("%d rules", s.Len())
	}
}

// docExample returns the rule file in the package comment.
func docExample(tb testing.TB) string {
	tb.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		tb.Fatal(err)
	}
	var y strings.Builder
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		code, isCode := strings.CutPrefix(line, "//\t")
		switch {
		case isCode && strings.HasPrefix(code, "rules:"):
			in = true
		case in && !isCode && line != "//":
			in = false
		}
		if in && isCode {
			y.WriteString(code)
		}
		if in {
			y.WriteString("\n")
		}
	}
	return y.String()
}

// laughs returns a few hundred bytes of nested aliases that expand to
// 10^9 nodes, each level made by level(i), the innermost being level 0.
func laughs(level func(i int) string, last string) string {
	var b strings.Builder
	for i := 0; i <= 8; i++ {
		fmt.Fprintf(&b, "a%d: &a%d %s\n", i, i, level(i))
	}
	b.WriteString(last)
	return b.String()
}

// tenOf returns "[e(0), e(1), ..., e(9)]" with open and close for the
// brackets.
func tenOf(open, close string, e func(j int) string) string {
	parts := make([]string, 10)
	for j := range parts {
		parts[j] = e(j)
	}
	return open + strings.Join(parts, ", ") + close
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Documents that would expand beyond a million nodes, or nest beyond 100
// levels, are refused by the YAML reader before anything walks the
// expansion: a small bomb allocates under a megabyte, a large one a
// bounded multiple of its size, which MaxFileBytes bounds.
func TestParseRefusesAliasBombs(t *testing.T) {
	seqLevel := func(i int) string {
		if i == 0 {
			return tenOf("[", "]", func(int) string { return "x" })
		}
		return tenOf("[", "]", func(int) string { return fmt.Sprintf("*a%d", i-1) })
	}
	mapLevel := func(i int) string {
		if i == 0 {
			return tenOf("{", "}", func(j int) string { return fmt.Sprintf("k%d: x", j) })
		}
		return tenOf("{", "}", func(j int) string { return fmt.Sprintf("k%d: *a%d", j, i-1) })
	}
	mergeLevel := func(i int) string {
		if i == 0 {
			return mapLevel(0)
		}
		return tenOf("[", "]", func(int) string { return fmt.Sprintf("{<<: *a%d}", i-1) })
	}
	// One alias of a thousand nodes referred to from every rule, in a file
	// at the size bound.
	var wide strings.Builder
	wide.WriteString("a: &a [" + strings.Repeat("x, ", 1000) + "x]\nrules: [")
	for wide.Len() < MaxFileBytes-10 {
		wide.WriteString("*a, ")
	}
	wide.WriteString("*a]\n")
	tests := []struct {
		name     string
		yaml     string
		want     string // in the message
		maxBytes uint64
	}{
		{"billion laughs, lists", laughs(seqLevel, "rules: *a8\n"), "expands the document beyond", 1 << 20},
		{"billion laughs, mappings", laughs(mapLevel, "rules: [*a8]\n"), "expands the document beyond", 1 << 20},
		{"billion laughs, merge keys", laughs(mergeLevel, "rules:\n  - name: x\n    <<: *a8\n"), "expands the document beyond", 1 << 20},
		{"aliases filling the size bound", wide.String(), "expands the document beyond", 100 * MaxFileBytes},
		{"deep lists", strings.Repeat("[", MaxFileBytes), "deeper than", 100 * MaxFileBytes},
		{"deep mappings", "rules: " + strings.Repeat("{a: ", MaxFileBytes/4-8), "deeper than", 100 * MaxFileBytes},
		{"deep lists within the library's bound", strings.Repeat("[", 500) + strings.Repeat("]", 500), "deeper than", 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = Parse("bomb.yaml", []byte(tt.yaml)) })
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrSyntax) || !strings.Contains(e.Message, tt.want) || e.Line == 0 {
				t.Fatalf("err %v, want ErrSyntax about %q with a line", err, tt.want)
			}
			if n > tt.maxBytes {
				t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", n, len(tt.yaml), tt.maxBytes)
			}
			t.Logf("%d-byte file: %d bytes allocated", len(tt.yaml), n)
		})
	}
	// Aliases that stay small are fine.
	small := "base: &base\n  algorithm: gcra\n  limit: 5\n  period: 1m\n  key: [ip]\nrules:\n  - name: a\n    <<: *base\n"
	if _, err := Parse("small.yaml", []byte(small)); err != nil && strings.Contains(err.Error(), "expands the document") {
		t.Fatalf("small aliases refused: %v", err)
	}
}

// fileOfSize returns a valid rule file of exactly n bytes: one rule,
// padded with a comment.
func fileOfSize(t *testing.T, n int) []byte {
	t.Helper()
	head := ruleFile(5) + "#"
	if n < len(head)+1 {
		t.Fatalf("%d bytes is too small", n)
	}
	return []byte(head + strings.Repeat("x", n-len(head)-1) + "\n")
}

func wantTooLarge(t *testing.T, err error, file string) {
	t.Helper()
	var e *Error
	if !errors.Is(err, ErrFileTooLarge) || !errors.As(err, &e) || e.File != file {
		t.Fatalf("err %v, want ErrFileTooLarge for %s", err, file)
	}
	if msg := err.Error(); !strings.Contains(msg, file) || !strings.Contains(msg, strconv.Itoa(MaxFileBytes)) {
		t.Fatalf("message %q names neither the file nor the limit", msg)
	}
}

// A rule file is at most MaxFileBytes: Parse refuses longer data, and
// Load and Watch read no more than one byte past the bound, so that even
// an endless file is refused at once.
func TestFileSizeBound(t *testing.T) {
	dir := t.TempDir()
	atBound := filepath.Join(dir, "at.yaml")
	over := filepath.Join(dir, "over.yaml")
	must(t, os.WriteFile(atBound, fileOfSize(t, MaxFileBytes), 0o644))
	must(t, os.WriteFile(over, fileOfSize(t, MaxFileBytes+1), 0o644))

	if s, err := Load(atBound); err != nil || s.Len() != 1 {
		t.Fatalf("a file of MaxFileBytes: %v, %v", s, err)
	}
	_, err := Load(over)
	wantTooLarge(t, err, over)
	_, err = Parse("over.yaml", fileOfSize(t, MaxFileBytes+1))
	wantTooLarge(t, err, "over.yaml")
	_, err = Watch(over, DefaultWatchConfig())
	wantTooLarge(t, err, over)

	// A file that grows past the bound keeps the watcher on its last set.
	cfg := DefaultWatchConfig()
	cfg.NoNotify = true
	cfg.PollInterval = time.Hour
	path := filepath.Join(dir, "rules.yaml")
	must(t, os.WriteFile(path, []byte(ruleFile(10)), 0o644))
	w, err := Watch(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	must(t, os.WriteFile(path, fileOfSize(t, MaxFileBytes+1), 0o644))
	wantTooLarge(t, w.Reload(), path)
	if got := limitOf(t, w.Current()); got != 10 {
		t.Fatalf("limit %d after a file too large, want the last set's 10", got)
	}

	// An endless file: the read stops past the bound.
	if _, err := os.Stat("/dev/zero"); err == nil {
		var err error
		n := allocated(func() { _, err = Load("/dev/zero") })
		wantTooLarge(t, err, "/dev/zero")
		if n > 8*MaxFileBytes {
			t.Errorf("reading /dev/zero allocated %d bytes, want at most %d", n, 8*MaxFileBytes)
		}
	}
}

// A list of more than MaxRules rules is refused before any rule is read;
// MaxRules rules load.
func TestMaxRules(t *testing.T) {
	file := func(n int) []byte {
		var b strings.Builder
		b.WriteString("rules:\n")
		for i := range n {
			fmt.Fprintf(&b, "- {name: r%d, algorithm: gcra, limit: 1, period: 1s}\n", i)
		}
		return []byte(b.String())
	}
	if s, err := Parse("max.yaml", file(MaxRules)); err != nil || s.Len() != MaxRules {
		t.Fatalf("MaxRules rules: %v", err)
	}
	_, err := Parse("many.yaml", file(MaxRules+1))
	var e *Error
	if !errors.Is(err, ErrTooManyRules) || !errors.As(err, &e) || e.Line != 2 || e.Field != "rules" ||
		!strings.Contains(e.Message, strconv.Itoa(MaxRules+1)) || !strings.Contains(e.Message, strconv.Itoa(MaxRules)) {
		t.Fatalf("err %v, want ErrTooManyRules at line 2 naming the count and the limit", err)
	}
}

// A file of many bad items costs a bounded multiple of its size: loading
// stops collecting problems once it has as many as it reports. (The
// multiple is mostly the YAML decoder's nodes and each item's position.)
func TestParseManyBadItems(t *testing.T) {
	const size = MaxFileBytes / 4
	var one, many strings.Builder
	one.WriteString("rules:\n  - {name: r, algorithm: gcra, limit: 1, period: 1s, match: {ips: [")
	one.WriteString(strings.Repeat("x,", size/2-100) + "x]}}\n")
	many.WriteString("rules:\n")
	for i := 0; many.Len() < size-20000; i++ {
		fmt.Fprintf(&many, "  - {name: r%d, algorithm: gcra, limit: 1, period: 1s, key: [%sip]}\n", i, strings.Repeat("ip,", 5000))
	}
	for name, data := range map[string]string{"one rule": one.String(), "many rules": many.String()} {
		t.Run(name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = Parse("bad.yaml", []byte(data)) })
			if err == nil || strings.Count(err.Error(), "\n")+1 != maxErrors {
				t.Fatalf("err %v, want %d problems", err, maxErrors)
			}
			if limit := uint64(400 * len(data)); n > limit {
				t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", n, len(data), limit)
			}
			t.Logf("%d-byte file: %d bytes allocated", len(data), n)
		})
	}
}

// badRules returns a file of n rules, each with one error.
func badRules(n int) []byte {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: r%d\n    algorithm: gcra\n    limit: zero\n    period: 1m\n    key: [ip]\n", i)
	}
	return []byte(b.String())
}

// A file of many bad rules reports the first maxErrors of them.
func TestParseManyBadRules(t *testing.T) {
	_, err := Parse("bad.yaml", badRules(5000))
	if err == nil || strings.Count(err.Error(), "\n")+1 != maxErrors {
		t.Fatalf("err of %d lines, want %d: %v", strings.Count(fmt.Sprint(err), "\n")+1, maxErrors, err)
	}
}

// go test -run xxx -bench ParseBadRules ./rules: the cost of a file of n
// bad rules grows linearly with n.
func BenchmarkParseBadRules(b *testing.B) {
	for _, n := range []int{5000, 10000, 20000} {
		data := badRules(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				Parse("bad.yaml", data)
			}
		})
	}
}

// Load reads rule files with the strict YAML reader: a key given twice at
// any depth, an alias bomb and a nesting bomb in a file on disk are
// refused with errors naming file:line:col and the field, before any rule
// is read.
func TestLoadUsesTheStrictReader(t *testing.T) {
	const rule = "rules:\n  - name: a\n    algorithm: gcra\n    limit: 5\n    period: 1m\n"
	bomb := laughs(func(i int) string {
		if i == 0 {
			return tenOf("[", "]", func(int) string { return "x" })
		}
		return tenOf("[", "]", func(int) string { return fmt.Sprintf("*a%d", i-1) })
	}, "rules: *a8\n")
	for _, tc := range []struct {
		name, yaml string
		sentinel   error
		want       string // after the path
	}{
		{"a key twice at the top", rule + "rules: []\n", ErrDuplicateField, `:6:1: rules: the key "rules" is given twice (first at line 1, column 1)`},
		{"a key twice in a rule", rule + "    limit: 6\n", ErrDuplicateField, `:6:5: rules[0].limit: the key "limit" is given twice (first at line 4, column 5)`},
		{"a key twice in a header match", rule + "    match:\n      headers: {x-a: b, x-a: c}\n", ErrDuplicateField, `:7:25: rules[0].match.headers.x-a: the key "x-a" is given twice (first at line 7, column 17)`},
		{"an alias bomb", bomb, ErrSyntax, `:6:45: a5[7]: the alias *a4 expands the document beyond 1000000 nodes`},
		{"a nesting bomb", rule + "    description: " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + "\n", ErrSyntax, `:6:115: rules[0].description`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			set, err := Load(path)
			if set != nil || !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), "rules: "+path+tc.want) {
				t.Fatalf("Load: %v, want %v holding %q", err, tc.sentinel, path+tc.want)
			}
		})
	}
}
