package yamlfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// bomb returns a document of depth levels, each a list of width aliases
// of the level below: width^depth nodes expanded ("billion laughs").
func bomb(width, depth int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "a0: &a0 [%s]\n", strings.TrimSuffix(strings.Repeat("lol, ", width), ", "))
	for i := 1; i < depth; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), width), ", "))
	}
	return b.String()
}

// nested returns a value nested depth levels deep in flow lists.
func nested(depth int) string {
	return strings.Repeat("[", depth-1) + "x" + strings.Repeat("]", depth-1)
}

func TestParse(t *testing.T) {
	small := Config{MaxBytes: 1 << 20, MaxDepth: 5, MaxNodes: 50}
	for _, tc := range []struct {
		name   string
		cfg    Config
		in     string
		want   error // nil: accepted
		pos    string
		field  string
		inText string // in the message
	}{
		{name: "plain", in: "a: 1\nb: [x, y]\n"},
		{name: "empty", in: ""},
		{name: "only comments", in: "# nothing\n"},
		{name: "same key in two mappings", in: "a: {k: 1}\nb: {k: 2}\n"},
		{name: "aliases within the budget", cfg: small, in: "a: &x [1, 2]\nb: *x\nc: *x\n"},
		{name: "duplicate at the top", in: "a: 1\nb: 2\na: 3\n", want: ErrDuplicateKey, pos: "f.yaml:3:1", field: "a", inText: "first at line 1, column 1"},
		{name: "duplicate at depth", in: "rules:\n  - name: x\n    match:\n      headers:\n        h: 1\n        h: 2\n",
			want: ErrDuplicateKey, pos: "f.yaml:6:9", field: "rules[0].match.headers.h", inText: "first at line 5, column 9"},
		{name: "duplicate in a flow mapping", in: "a: [{k: 1, k: 2}]\n", want: ErrDuplicateKey, pos: "f.yaml:1:12", field: "a[0].k"},
		{name: "duplicate through an alias key", in: "a: &k name\nm: {name: 1, *k : 2}\n", want: ErrDuplicateKey, pos: "f.yaml:2:14", field: "m.name"},
		{name: "duplicate quoted and plain", in: "a: 1\n\"a\": 2\n", want: ErrDuplicateKey, pos: "f.yaml:2:1"},
		{name: "duplicate inside an anchored node", in: "x: &a {k: 1, k: 2}\n", want: ErrDuplicateKey, pos: "f.yaml:1:14", field: "x.k"},
		{name: "billion laughs", in: bomb(10, 9), want: ErrTooManyNodes, pos: "f.yaml:6:45", field: "a5[7]", inText: "alias *a4 expands the document beyond 1000000 nodes"},
		{name: "bomb one past a small budget", cfg: small, in: "a: &x [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]\nb: *x\nc: *x\n",
			want: ErrTooManyNodes, pos: "f.yaml:3:4", field: "c"},
		{name: "alias inside its own anchor", in: "a: &x [1, *x]\n", want: ErrTooManyNodes, pos: "f.yaml:1:11", field: "a[1]", inText: "never ends"},
		{name: "nodes without aliases", cfg: small, in: "[" + strings.Repeat("1, ", 50) + "1]", want: ErrTooManyNodes, pos: "f.yaml:1:149", field: "[49]"},
		{name: "depth at the bound", cfg: small, in: nested(5)},
		{name: "depth one past the bound", cfg: small, in: nested(6), want: ErrTooDeep, pos: "f.yaml:1:6", field: "[0][0][0][0][0]"},
		{name: "mapping depth past the bound", cfg: small, in: "a:\n b:\n  c:\n   d:\n    e: x\n", want: ErrTooDeep, pos: "f.yaml:5:5", field: "a.b.c.d"},
		{name: "depth through an alias", cfg: small, in: "a: &x [[x]]\nb: [[*x]]\n", want: ErrTooDeep, pos: "f.yaml:2:6", field: "b[0][0]", inText: "alias *x expands"},
		{name: "alias depth at the bound", cfg: small, in: "a: &x [[x]]\nb: [*x]\n"},
		{name: "depth beyond the library's bound", in: "a: '[' # [\nb: " + nested(20000), want: ErrTooDeep, pos: "f.yaml:2:104"},
		{name: "block depth beyond the library's bound", in: strings.Repeat("- ", 10001) + "x", want: ErrTooDeep, pos: "f.yaml"},
		{name: "syntax", in: "a: 1\nb: [\n", want: ErrSyntax, pos: "f.yaml:3"},
		{name: "syntax on the first line", in: "a: b: c\n", want: ErrSyntax, pos: "f.yaml:1"},
		{name: "two documents", in: "a: 1\n---\nb: 2\n", want: ErrSyntax, pos: "f.yaml:2:1", inText: "more than one"},
		{name: "undefined alias", in: "a: *x\n", want: ErrSyntax, pos: "f.yaml:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == (Config{}) {
				cfg = DefaultConfig()
			}
			root, err := Parse("f.yaml", []byte(tc.in), cfg)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if root == nil && strings.TrimSpace(strings.Split(tc.in, "#")[0]) != "" {
					t.Fatal("no root for a document")
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want an *Error wrapping %v", err, tc.want)
			}
			if root != nil {
				t.Error("a root beside an error")
			}
			if e.Position() != tc.pos || tc.field != "" && e.Field != tc.field || !strings.Contains(e.Message, tc.inText) {
				t.Errorf("got %s (field %q), want %s, field %q, a message holding %q", err, e.Field, tc.pos, tc.field, tc.inText)
			}
		})
	}
}

// A bomb is refused at the cost of decoding its text, never of its
// expansion: a 590-byte document of ten levels of ten aliases (ten billion
// nodes expanded) and one of a million-node alias inside the size bound
// allocate a bounded multiple of their size.
func TestBombAllocation(t *testing.T) {
	wide := "a: &a [" + strings.Repeat("x, ", 1000) + "x]\nb: [" + strings.Repeat("*a, ", 20_000) + "*a]\n"
	for _, tc := range []struct {
		name string
		doc  string
	}{{"ten levels of ten", bomb(10, 10)}, {"20,000 aliases of a thousand nodes", wide}} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Parse("f", []byte(tc.doc), DefaultConfig())
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTooManyNodes) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Logf("%s: %d bytes allocated for a %d-byte document", tc.name, after.TotalAlloc-before.TotalAlloc, len(tc.doc))
		if n := after.TotalAlloc - before.TotalAlloc; n > 200*uint64(len(tc.doc)) {
			t.Errorf("%s: %d bytes allocated for a %d-byte document", tc.name, n, len(tc.doc))
		}
	}
}

// The size bound holds exactly: data of MaxBytes is read and parsed, one
// byte more is refused by both.
func TestSizeBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBytes = 64
	at := []byte("a: " + strings.Repeat("x", 60) + "\n")
	if len(at) != 64 {
		t.Fatalf("%d bytes", len(at))
	}
	past := append([]byte("#"), at...)
	dir := t.TempDir()
	for _, tc := range []struct {
		data []byte
		ok   bool
	}{{at, true}, {past, false}} {
		path := filepath.Join(dir, fmt.Sprint(len(tc.data)))
		if err := os.WriteFile(path, tc.data, 0o600); err != nil {
			t.Fatal(err)
		}
		data, rerr := ReadFile(path, cfg)
		_, perr := Parse(path, tc.data, cfg)
		for _, err := range []error{rerr, perr} {
			if tc.ok && err != nil {
				t.Errorf("%d bytes refused: %v", len(tc.data), err)
			}
			if !tc.ok && (!errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), path+": the file is larger than the limit of 64 bytes")) {
				t.Errorf("%d bytes: %v, want ErrTooLarge naming the file", len(tc.data), err)
			}
		}
		if tc.ok && string(data) != string(tc.data) {
			t.Errorf("read %q", data)
		}
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), cfg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{MaxBytes: 0, MaxDepth: 1, MaxNodes: 1},
		{MaxBytes: 1, MaxDepth: 0, MaxNodes: 1},
		{MaxBytes: 1, MaxDepth: maxLibraryDepth + 1, MaxNodes: 1},
		{MaxBytes: 1, MaxDepth: 1, MaxNodes: 0},
	} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", c, err)
		}
		if _, err := Parse("f", []byte("a: 1"), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Parse with %+v: %v", c, err)
		}
	}
}

// expanded counts the nodes of n with its aliases expanded, as a caller
// that follows every alias visits them, giving up past limit.
func expanded(n *yaml.Node, limit int) int {
	count := 1
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		count += expanded(n.Alias, limit)
	}
	for _, c := range n.Content {
		if count > limit {
			break
		}
		count += expanded(c, limit)
	}
	return count
}

// height is n's depth of nesting with its aliases expanded.
func height(n *yaml.Node) int {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return height(n.Alias)
	}
	h := 1
	for _, c := range n.Content {
		h = max(h, 1+height(c))
	}
	return h
}

// FuzzParse: no input panics, and every document Parse accepts is within
// its bounds as a caller that follows aliases sees it, with no key given
// twice in a mapping.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"a: 1\n", "a: &x [1, 2]\nb: *x\nc: [*x, *x]\n", bomb(4, 4), "a: &x [1, *x]\n",
		"a: 1\na: 2\n", nested(8), "{a: {b: [c, &y {d: e}]}, f: *y}", "- &k k\n- {*k : 1, k: 2}\n",
		"a: 1\n---\nb: 2\n", "? [a]\n: b\n", "<<: *x\n", "%YAML 1.1\n---\na: 1\n",
	} {
		f.Add([]byte(s))
	}
	cfg := Config{MaxBytes: 4096, MaxDepth: 8, MaxNodes: 200}
	f.Fuzz(func(t *testing.T, data []byte) {
		root, err := Parse("f", data, cfg)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "f" || e.Message == "" {
				t.Fatalf("not an *Error naming the file: %#v", err)
			}
			return
		}
		if root == nil {
			return
		}
		if n := expanded(root, cfg.MaxNodes); n > cfg.MaxNodes {
			t.Fatalf("accepted %d nodes expanded, beyond %d", n, cfg.MaxNodes)
		}
		if h := height(root); h > cfg.MaxDepth {
			t.Fatalf("accepted a depth of %d, beyond %d", h, cfg.MaxDepth)
		}
		var dup func(n *yaml.Node)
		dup = func(n *yaml.Node) {
			if n.Kind == yaml.MappingNode {
				seen := map[string]bool{}
				for i := 0; i+1 < len(n.Content); i += 2 {
					// Scalar keys only: a sequence or mapping key has
					// no Value, and is no scalar key "" given before.
					k := Deref(n.Content[i])
					if k.Kind != yaml.ScalarNode {
						continue
					}
					if seen[k.Value] {
						t.Fatalf("accepted the key %q twice", k.Value)
					}
					seen[k.Value] = true
				}
			}
			for _, c := range n.Content {
				dup(c)
			}
		}
		dup(root)
	})
}
