// Package yamlfile is the one strict YAML reader of sluice's files: rule
// files, envoyproxy/ratelimit configuration files and the daemon's
// configuration file.
//
// ReadFile reads a file up to a bound of bytes; Parse decodes one YAML
// document into nodes and refuses, before any caller walks it, a document
// that holds a key given twice in one mapping (at any depth), that nests
// deeper than a bound, or whose aliases expand it beyond a bound of nodes
// ("billion laughs"). Every refusal is an [*Error] with the file, the line
// and column, the path of the field and a message. What the fields mean,
// and which fields are known, is each caller's schema.
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The sentinels an [*Error] wraps.
var (
	// ErrTooLarge: the file is longer than Config.MaxBytes.
	ErrTooLarge = errors.New("yamlfile: file too large")
	// ErrSyntax: the text is not YAML, or holds more than one document.
	ErrSyntax = errors.New("yamlfile: invalid YAML")
	// ErrDuplicateKey: a mapping gives one key twice.
	ErrDuplicateKey = errors.New("yamlfile: duplicate key")
	// ErrTooDeep: the document, its aliases expanded, nests deeper than
	// Config.MaxDepth.
	ErrTooDeep = errors.New("yamlfile: nested too deep")
	// ErrTooManyNodes: the document, its aliases expanded, has more than
	// Config.MaxNodes nodes, or an alias refers to a node that holds it.
	ErrTooManyNodes = errors.New("yamlfile: too many nodes")
	// ErrInvalidConfig: a Config out of range.
	ErrInvalidConfig = errors.New("yamlfile: invalid config")
)

// Error is a document Parse or ReadFile refuses.
type Error struct {
	File   string // the name given to Parse or ReadFile
	Line   int    // 1-based; 0 for the file as a whole
	Column int    // 1-based; 0 when unknown (the YAML library reports no column for syntax errors)
	// Field is the path of the offending node: "rules[2].match.headers",
	// "" for the document itself.
	Field   string
	Message string
	Err     error // one of the sentinels
}

// Error formats e as "yamlfile: file:line:col: field: message".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("yamlfile: ")
	b.WriteString(e.Position())
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Position formats the file, line and column as "file:line:col", leaving
// out what is unknown.
func (e *Error) Position() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
		if e.Column > 0 {
			s += ":" + strconv.Itoa(e.Column)
		}
	}
	return s
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// Config bounds what Parse and ReadFile accept.
type Config struct {
	// MaxBytes bounds the file: ReadFile reads at most one byte more
	// before refusing it, Parse refuses longer data. Decoding YAML into
	// nodes allocates up to about a hundred times the size of a file of
	// tiny nodes, before any other bound applies.
	MaxBytes int64
	// MaxDepth bounds nesting, aliases expanded: a scalar document is one
	// level deep, a mapping of scalars two.
	MaxDepth int
	// MaxNodes bounds the nodes of the document with every alias
	// expanded (an alias counts as one node plus those it stands for).
	// Callers that walk aliases visit at most this many nodes.
	MaxNodes int
}

// DefaultConfig returns the bounds sluice's files are read with: 1 MiB,
// 100 levels, a million nodes.
func DefaultConfig() Config {
	return Config{MaxBytes: 1 << 20, MaxDepth: 100, MaxNodes: 1_000_000}
}

// Validate reports a bound that is not positive, or a MaxDepth above the
// YAML library's own bound of 10000 levels.
func (c Config) Validate() error {
	switch {
	case c.MaxBytes <= 0:
		return fmt.Errorf("%w: MaxBytes %d is not positive", ErrInvalidConfig, c.MaxBytes)
	case c.MaxDepth <= 0 || c.MaxDepth > maxLibraryDepth:
		return fmt.Errorf("%w: MaxDepth %d is not in [1, %d]", ErrInvalidConfig, c.MaxDepth, maxLibraryDepth)
	case c.MaxNodes <= 0:
		return fmt.Errorf("%w: MaxNodes %d is not positive", ErrInvalidConfig, c.MaxNodes)
	}
	return nil
}

// maxLibraryDepth is the depth beyond which the YAML library refuses a
// document itself ("exceeded max depth of 10000").
const maxLibraryDepth = 10000

// ReadFile reads the file at path, refusing one longer than c.MaxBytes
// with an [*Error] wrapping [ErrTooLarge], of which it reads no more than
// one byte beyond the bound. Errors opening or reading the file are
// returned as the os package gives them.
func ReadFile(path string, c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, c.MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > c.MaxBytes {
		return nil, tooLarge(path, c)
	}
	return data, nil
}

func tooLarge(file string, c Config) *Error {
	return &Error{File: file, Err: ErrTooLarge, Message: fmt.Sprintf("the file is larger than the limit of %d bytes", c.MaxBytes)}
}

// Parse decodes data, the text of the file named file, as one YAML
// document and returns its root node (the document node's content), or
// nil when data holds no document at all (it is empty, or only
// comments). A refused document is an [*Error]: longer than c.MaxBytes
// (ErrTooLarge), not YAML or more than one document (ErrSyntax), a key
// given twice in a mapping (ErrDuplicateKey, naming both positions), a
// nesting deeper than c.MaxDepth (ErrTooDeep), more than c.MaxNodes nodes
// with its aliases expanded, or an alias inside the node it refers to
// (ErrTooManyNodes). Aliases are left in place, never expanded: the
// bounds are checked on their expanded size before the caller walks
// them. Keys are compared by their text, aliases followed; keys that are
// not scalars are left to the caller's schema.
func Parse(file string, data []byte, c Config) (root *yaml.Node, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if int64(len(data)) > c.MaxBytes {
		return nil, tooLarge(file, c)
	}
	defer func() {
		// The YAML library is outside input's first reader: whatever it
		// panics on is a file refused, not a process lost.
		if p := recover(); p != nil {
			root, err = nil, &Error{File: file, Err: ErrSyntax, Message: fmt.Sprintf("the YAML decoder failed: %v", p)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(file, data, err, c)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, &Error{File: file, Line: extra.Line, Column: extra.Column, Err: ErrSyntax, Message: "the file holds more than one YAML document"}
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(file, data, err, c)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root = doc.Content[0]
	w := &walker{file: file, cfg: c}
	if _, err := w.walk(root, 1); err != nil {
		return nil, err
	}
	return root, nil
}

// syntaxError turns the YAML library's error ("yaml: line 3: did not find
// expected key") into an *Error.
func syntaxError(file string, data []byte, err error, c Config) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: file, Line: 1, Err: ErrSyntax, Message: msg} // the library names no line on the first
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		num, text, _ := strings.Cut(rest, ": ")
		if n, err := strconv.Atoi(num); err == nil {
			e.Line, e.Message = n, text
			if parserProblems[text] {
				e.Line++ // the library reports its parser's marks 0-based, its scanner's 1-based
			}
		}
	}
	if strings.HasPrefix(e.Message, "exceeded max depth") {
		e.Err, e.Message = ErrTooDeep, fmt.Sprintf("the document nests deeper than %d levels", c.MaxDepth)
		e.Line, e.Column = flowDepth(data, c.MaxDepth)
	}
	return e
}

// flowDepth returns the line and column of the first '[' or '{' that
// opens a flow collection more than limit deep in data, or 0, 0 when
// there is none (the document nests in block style). It skips quoted
// text and comments, as far as a scan without a parser can tell them.
func flowDepth(data []byte, limit int) (line, col int) {
	line, col = 1, 0
	depth := 0
	var quote byte
	comment := false
	for i, c := range data {
		col++
		if c == '\n' {
			line, col, comment = line+1, 0, false
			continue
		}
		switch {
		case comment:
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '#' && (i == 0 || data[i-1] == ' ' || data[i-1] == '\t'):
			comment = true
		case c == '"' || c == '\'':
			quote = c
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return line, col
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return 0, 0
}

// parserProblems are the YAML library's parser errors, as opposed to its
// scanner's.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected key":              true,
	"did not find expected '-' indicator":    true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
	"found duplicate %TAG directive":         true,
}

// walker checks a decoded document against its Config.
type walker struct {
	file  string
	cfg   Config
	nodes int // nodes so far, aliases expanded; never far beyond cfg.MaxNodes
	// anchored holds the expanded size of each anchored node walked, for
	// the aliases that refer to it; created at the first anchor.
	anchored map[*yaml.Node]expansion
	path     []step // the field path to the node being walked
}

// expansion is what an anchored node stands for, aliases expanded.
type expansion struct {
	nodes, height int
	done          bool // false while the node itself is walked
}

// step is one element of a field path: a mapping's key, or else a list's
// index.
type step struct {
	key   *yaml.Node
	index int
}

// walk checks n, at depth (1 for the root), and returns its height
// (1 for a scalar), aliases expanded.
func (w *walker) walk(n *yaml.Node, depth int) (int, error) {
	if depth > w.cfg.MaxDepth {
		return 0, w.errorf(n, ErrTooDeep, "the document nests deeper than %d levels", w.cfg.MaxDepth)
	}
	start := w.nodes
	if w.nodes++; w.nodes > w.cfg.MaxNodes {
		return 0, w.tooMany(n)
	}
	if n.Anchor != "" && n.Kind != yaml.AliasNode {
		if w.anchored == nil {
			w.anchored = make(map[*yaml.Node]expansion)
		}
		w.anchored[n] = expansion{}
	}
	height := 1
	switch n.Kind {
	case yaml.AliasNode:
		x, ok := w.anchored[n.Alias]
		if n.Alias == nil || !ok || !x.done {
			return 0, w.errorf(n, ErrTooManyNodes, "the alias *%s refers to a node that holds it: its expansion never ends", n.Value)
		}
		if w.nodes += x.nodes; w.nodes > w.cfg.MaxNodes {
			return 0, w.tooMany(n)
		}
		if depth-1+x.height > w.cfg.MaxDepth {
			return 0, w.errorf(n, ErrTooDeep, "the alias *%s expands the document deeper than %d levels", n.Value, w.cfg.MaxDepth)
		}
		return x.height, nil
	case yaml.MappingNode:
		var seen map[string]*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if key := Deref(k); key.Kind == yaml.ScalarNode {
				if seen == nil {
					seen = make(map[string]*yaml.Node, len(n.Content)/2)
				}
				if first, dup := seen[key.Value]; dup {
					w.path = append(w.path, step{key: key})
					return 0, w.errorf(k, ErrDuplicateKey, "the key %q is given twice (first at line %d, column %d)", key.Value, first.Line, first.Column)
				}
				seen[key.Value] = k
			}
			hk, err := w.walk(k, depth+1)
			if err != nil {
				return 0, err
			}
			w.path = append(w.path, step{key: Deref(k)})
			hv, err := w.walk(v, depth+1)
			if err != nil {
				return 0, err
			}
			w.path = w.path[:len(w.path)-1]
			height = max(height, 1+hk, 1+hv)
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for i, c := range n.Content {
			w.path = append(w.path, step{index: i})
			h, err := w.walk(c, depth+1)
			if err != nil {
				return 0, err
			}
			w.path = w.path[:len(w.path)-1]
			height = max(height, 1+h)
		}
	}
	if n.Anchor != "" {
		w.anchored[n] = expansion{nodes: w.nodes - start, height: height, done: true}
	}
	return height, nil
}

func (w *walker) tooMany(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		return w.errorf(n, ErrTooManyNodes, "the alias *%s expands the document beyond %d nodes", n.Value, w.cfg.MaxNodes)
	}
	return w.errorf(n, ErrTooManyNodes, "the document, its aliases expanded, has more than %d nodes", w.cfg.MaxNodes)
}

func (w *walker) errorf(n *yaml.Node, sentinel error, format string, a ...any) *Error {
	return &Error{File: w.file, Line: n.Line, Column: n.Column, Field: w.field(), Err: sentinel, Message: fmt.Sprintf(format, a...)}
}

// field formats the path: "rules[2].match.headers".
func (w *walker) field() string {
	var b strings.Builder
	for _, s := range w.path {
		switch {
		case s.key == nil:
			fmt.Fprintf(&b, "[%d]", s.index)
		case s.key.Kind == yaml.ScalarNode:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key.Value)
		default:
			b.WriteString(".?") // a key that is not text
		}
	}
	return b.String()
}

// Deref follows n's aliases to the node they name. Parse has checked that
// every alias names one.
func Deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}
