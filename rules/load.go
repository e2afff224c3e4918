package rules

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/yamlfile"
	"github.com/sluicehq/sluice/limiter"
)

// MaxFileBytes bounds a rule file: Load and Watch read at most one byte
// more than this before refusing the file, and Parse refuses longer data,
// with an [*Error] wrapping [ErrFileTooLarge] that names the file and the
// limit. A rule takes one or two hundred bytes, so 1 MiB holds thousands;
// the bound is no larger because decoding YAML into nodes allocates up to
// about a hundred times the size of a file of tiny nodes, so that a file
// at the bound costs about 100 MB while it is read.
const MaxFileBytes = 1 << 20

// MaxRules bounds the rules of one file: Parse refuses a longer list,
// before it looks at any rule, with an [*Error] wrapping
// [ErrTooManyRules]. Every rule a request matches is enforced on it, so a
// real set is far smaller; the bound keeps the work of a hostile file of
// tiny rules in proportion to the bound, not to the file.
const MaxRules = 10_000

// Load reads and parses the rule file at path. See Parse.
func Load(path string) (*Set, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readFile reads the rule file at path, refusing one longer than
// MaxFileBytes without reading the rest of it.
func readFile(path string) ([]byte, error) {
	data, err := yamlfile.ReadFile(path, readerConfig)
	switch {
	case errors.Is(err, yamlfile.ErrTooLarge):
		return nil, errFileTooLarge(path)
	case err != nil:
		return nil, fmt.Errorf("rules: %w", err)
	}
	return data, nil
}

// readerConfig bounds a rule file: MaxFileBytes, and the nesting and the
// nodes, aliases expanded, of every file sluice reads.
var readerConfig = func() yamlfile.Config {
	c := yamlfile.DefaultConfig()
	c.MaxBytes = MaxFileBytes
	return c
}()

func errFileTooLarge(file string) error {
	return &Error{File: file, Message: fmt.Sprintf("the file is larger than the limit of %d bytes (MaxFileBytes)", MaxFileBytes), Err: ErrFileTooLarge}
}

// Parse parses and validates a YAML rule file; file names it in errors.
// Everything is checked: syntax, unknown fields, types, algorithms, rates
// (by validating a sample limiter.Request per rule), CIDRs, key parts and
// duplicate names. The problems found, up to 20, are reported as
// [*Error] values with their file, line and column (several are joined);
// nothing is returned unless all of the file is valid. Data longer than
// MaxFileBytes, a key given twice in a mapping, a nesting deeper than 100
// levels, aliases that expand the document beyond a million nodes and a
// list of more than MaxRules rules are refused before any rule is read.
func Parse(file string, data []byte) (*Set, error) {
	if len(data) > MaxFileBytes {
		return nil, errFileTooLarge(file)
	}
	l := &loader{file: file}
	root := l.document(data)
	if root == nil {
		return nil, joinErrors(l.errs)
	}
	var rules []Rule
	l.mapping(root, "", func(key string, k, v *yaml.Node) {
		switch key {
		case "rules":
			rules = l.rules(v)
		default:
			l.unknown(k, "", key, "rules")
		}
	})
	if l.find(root, "rules") == nil && len(l.errs) == 0 {
		l.errorf(root, "rules", ErrMissingField, "missing field rules (write \"rules: []\" for none)")
	}
	if len(l.errs) > 0 && rules == nil || len(l.errs) >= maxErrors {
		sortErrors(l.errs)
		return nil, joinErrors(l.errs)
	}
	s, errs := newSet(rules, l.position, l.reported)
	l.errs = append(l.errs, errs...)
	if len(l.errs) > 0 {
		sortErrors(l.errs)
		return nil, joinErrors(l.errs)
	}
	s.origin = file
	return s, nil
}

// loader walks a parsed YAML document, collecting errors with positions.
type loader struct {
	file      string
	errs      []*Error
	ruleNodes []*yaml.Node            // each rule's mapping
	pos       []map[string]*yaml.Node // each rule's field nodes, by field path
	// byRule indexes the fields of errs by rule, for reported; indexed
	// holds how many of errs it covers.
	byRule  map[int][]string
	indexed int
}

// reported says whether field of rule i, one of its parents, or (with
// field "") anything in rule i already failed to parse. The errors are
// indexed by rule, so that a file of many bad rules costs linear time.
func (l *loader) reported(i int, field string) bool {
	if l.byRule == nil {
		l.byRule = map[int][]string{}
	}
	for ; l.indexed < len(l.errs); l.indexed++ {
		f, ok := strings.CutPrefix(l.errs[l.indexed].Field, "rules[")
		if !ok {
			continue
		}
		end := strings.IndexByte(f, ']')
		if end < 0 {
			continue
		}
		k, err := strconv.Atoi(f[:end])
		if err != nil {
			continue
		}
		l.byRule[k] = append(l.byRule[k], f[end+1:])
	}
	for _, f := range l.byRule[i] {
		if f != "" && f[0] != '.' && f[0] != '[' {
			continue
		}
		f = strings.TrimPrefix(f, ".")
		if field == "" || f == "" || f == field || strings.HasPrefix(field, f+".") || strings.HasPrefix(field, f+"[") {
			return true
		}
		if field == "period" && f == "calendar" { // the rate is unknown without it
			return true
		}
	}
	return false
}

// document parses data and returns the root mapping, or nil after
// recording why there is none.
func (l *loader) document(data []byte) *yaml.Node {
	root, err := yamlfile.Parse(l.file, data, readerConfig)
	if err != nil {
		l.reader(err)
		return nil
	}
	if root == nil {
		l.errs = append(l.errs, &Error{File: l.file, Line: 1, Column: 1, Message: "the file holds no document", Err: ErrEmptyDocument})
		return nil
	}
	root = yamlfile.Deref(root)
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		l.errorf(root, "", ErrEmptyDocument, "the document is empty (write \"rules: []\" for no rules)")
		return nil
	}
	if root.Kind != yaml.MappingNode {
		l.errorf(root, "", ErrWrongType, "the document must be a mapping with a rules list, not %s", kindName(root))
		return nil
	}
	return root
}

// reader records an error of the YAML reader under the package's
// sentinel for it.
func (l *loader) reader(err error) {
	var ye *yamlfile.Error
	if !errors.As(err, &ye) {
		l.errs = append(l.errs, &Error{File: l.file, Message: err.Error(), Err: ErrSyntax, Cause: err})
		return
	}
	sentinel := ErrSyntax
	switch {
	case errors.Is(err, yamlfile.ErrTooLarge):
		sentinel = ErrFileTooLarge
	case errors.Is(err, yamlfile.ErrDuplicateKey):
		sentinel = ErrDuplicateField
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: ye.Line, Column: ye.Column, Field: ye.Field, Message: ye.Message, Err: sentinel, Cause: err})
}

func (l *loader) rules(n *yaml.Node) []Rule {
	n = yamlfile.Deref(n)
	if n.Kind != yaml.SequenceNode {
		l.errorf(n, "rules", ErrWrongType, "rules must be a list, not %s", kindName(n))
		return nil
	}
	if len(n.Content) > MaxRules {
		l.errorf(n, "rules", ErrTooManyRules, "the list holds %d rules, more than the limit of %d (MaxRules)", len(n.Content), MaxRules)
		return nil
	}
	rules := make([]Rule, len(n.Content))
	l.ruleNodes = make([]*yaml.Node, len(n.Content))
	l.pos = make([]map[string]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		if len(l.errs) >= maxErrors {
			break // the report is full; Parse returns it
		}
		item = yamlfile.Deref(item)
		l.ruleNodes[i] = item
		l.pos[i] = map[string]*yaml.Node{}
		l.rule(i, item, &rules[i])
	}
	return rules
}

var ruleFields = "name, description, match, key, algorithm, limit, period, calendar, zone, burst, unreachable, shadow, missing"

func (l *loader) rule(i int, n *yaml.Node, r *Rule) {
	base := fmt.Sprintf("rules[%d]", i)
	if n.Kind != yaml.MappingNode {
		l.errorf(n, base, ErrWrongType, "a rule must be a mapping, not %s", kindName(n))
		return
	}
	pos := l.pos[i]
	var calendar, period bool
	l.mapping(n, base, func(key string, k, v *yaml.Node) {
		f := base + "." + key
		pos[key] = v
		switch key {
		case "name":
			r.Name, _ = l.str(v, f)
		case "description":
			l.str(v, f)
		case "match":
			l.match(i, v, f, &r.Match)
		case "key":
			r.Key = l.strList(v, f, pos, "key", true)
		case "algorithm":
			if s, ok := l.str(v, f); ok {
				a, err := limiter.ParseAlgorithm(s)
				if err != nil {
					l.errorfCause(v, f, ErrUnknownAlgorithm, err, "unknown algorithm %q (want one of %v)", s, limiter.Algorithms)
				}
				r.Algorithm = a
			}
		case "limit":
			r.Limit, _ = l.int(v, f)
		case "burst":
			r.Burst, _ = l.int(v, f)
		case "period":
			period = true
			if s, ok := l.str(v, f); ok {
				d, err := time.ParseDuration(s)
				if err != nil {
					l.errorfCause(v, f, ErrInvalidPeriod, err, "period %q is not a Go duration such as 1m or 500ms", s)
				}
				r.Period = d
			}
		case "calendar":
			calendar = true
			if s, ok := l.str(v, f); ok {
				c, err := limiter.ParseCalendar(s)
				if err != nil || c == limiter.NoCalendar {
					l.errorfCause(v, f, ErrInvalidCalendar, err, "unknown calendar %q (want minute, hour, day, week, month or year)", s)
				}
				r.Calendar = c
			}
		case "zone":
			if s, ok := l.str(v, f); ok {
				if err := limiter.CheckZoneName(s); err != nil {
					l.errorfCause(v, f, ErrInvalidCalendar, err, "time zone %q is not an IANA zone name such as Europe/Paris", s)
					break
				}
				loc, err := time.LoadLocation(s)
				if err != nil {
					// As transport's codec refuses a time_zone that does not load.
					l.errorfCause(v, f, ErrInvalidCalendar, fmt.Errorf("%w: %w", limiter.ErrInvalidLocation, err), "unknown time zone %q", s)
				}
				r.Location = loc
			}
		case "unreachable":
			if s, ok := l.str(v, f); ok {
				p, err := sluice.ParsePolicy(s)
				if err != nil || p == sluice.PolicyDefault {
					l.errorfCause(v, f, ErrInvalidPolicy, err, "unreachable %q must be local, allow or deny", s)
				}
				r.Unreachable = p
			}
		case "shadow":
			r.Shadow, _ = l.bool(v, f)
		case "missing":
			if s, ok := l.str(v, f); ok {
				m, err := ParseMissing(s)
				if err != nil {
					l.errorfCause(v, f, ErrInvalidMissing, err, "missing %q must be skip, deny or shared", s)
				}
				r.Missing = m
			}
		default:
			l.unknown(k, base, key, ruleFields)
		}
	})
	for _, req := range []string{"name", "algorithm", "limit"} {
		if pos[req] == nil {
			l.errorf(n, base+"."+req, ErrMissingField, "missing field %s", req)
		}
	}
	if !period && !calendar {
		l.errorf(n, base+".period", ErrMissingField, "missing field period (or calendar, for fixed_window)")
	}
}

func (l *loader) match(i int, n *yaml.Node, base string, m *Match) {
	n = yamlfile.Deref(n)
	if n.Kind != yaml.MappingNode {
		l.errorf(n, base, ErrWrongType, "match must be a mapping, not %s", kindName(n))
		return
	}
	pos := l.pos[i]
	l.mapping(n, base, func(key string, k, v *yaml.Node) {
		f := base + "." + key
		rel := "match." + key
		pos[rel] = v
		switch key {
		case "routes":
			m.Routes = l.strList(v, f, pos, rel, false)
		case "methods":
			m.Methods = l.strList(v, f, pos, rel, false)
		case "headers":
			m.Headers = l.strMap(v, f, pos, rel)
		case "ips":
			m.IPs = l.strList(v, f, pos, rel, false)
		case "users":
			m.Users = l.strList(v, f, pos, rel, false)
		case "descriptors":
			m.Descriptors = l.strMap(v, f, pos, rel)
		default:
			l.unknown(k, base, key, "routes, methods, headers, ips, users, descriptors")
		}
	})
}

// mapping calls f for each key of the mapping n, rejecting non-string
// keys (the reader has refused repeated ones).
func (l *loader) mapping(n *yaml.Node, base string, f func(key string, k, v *yaml.Node)) {
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := yamlfile.Deref(n.Content[j]), n.Content[j+1]
		if k.Kind != yaml.ScalarNode {
			l.errorf(k, base, ErrWrongType, "a mapping key must be a string, not %s", kindName(k))
			continue
		}
		f(k.Value, k, v)
	}
}

func (l *loader) find(n *yaml.Node, key string) *yaml.Node {
	for j := 0; j+1 < len(n.Content); j += 2 {
		if yamlfile.Deref(n.Content[j]).Value == key {
			return n.Content[j+1]
		}
	}
	return nil
}

func (l *loader) unknown(k *yaml.Node, base, key, want string) {
	l.errorf(k, join(base, key), ErrUnknownField, "unknown field %q (want one of %s)", key, want)
}

// str returns a scalar's text; any non-null scalar is accepted as text.
func (l *loader) str(n *yaml.Node, field string) (string, bool) {
	n = yamlfile.Deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		l.errorf(n, field, ErrWrongType, "want a string, not %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (l *loader) int(n *yaml.Node, field string) (int64, bool) {
	n = yamlfile.Deref(n)
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		l.errorf(n, field, ErrWrongType, "want an integer, not %s", kindName(n))
		return 0, false
	}
	return v, true
}

func (l *loader) bool(n *yaml.Node, field string) (bool, bool) {
	n = yamlfile.Deref(n)
	var v bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		l.errorf(n, field, ErrWrongType, "want true or false, not %s", kindName(n))
		return false, false
	}
	return v, true
}

// strList reads a list of strings, recording each item's node as
// rel[i]. With scalarOK a single string stands for a list of one.
func (l *loader) strList(n *yaml.Node, field string, pos map[string]*yaml.Node, rel string, scalarOK bool) []string {
	n = yamlfile.Deref(n)
	if scalarOK && n.Kind == yaml.ScalarNode && n.ShortTag() != "!!null" {
		pos[rel+"[0]"] = n
		return []string{n.Value}
	}
	if n.Kind != yaml.SequenceNode {
		l.errorf(n, field, ErrWrongType, "want a list of strings, not %s", kindName(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for j, item := range n.Content {
		s, ok := l.str(item, fmt.Sprintf("%s[%d]", field, j))
		if ok {
			pos[fmt.Sprintf("%s[%d]", rel, len(out))] = yamlfile.Deref(item)
			out = append(out, s)
		}
	}
	return out
}

// strMap reads a mapping of strings to strings, recording each value's
// node as rel.name.
func (l *loader) strMap(n *yaml.Node, field string, pos map[string]*yaml.Node, rel string) map[string]string {
	n = yamlfile.Deref(n)
	if n.Kind != yaml.MappingNode {
		l.errorf(n, field, ErrWrongType, "want a mapping of names to strings, not %s", kindName(n))
		return nil
	}
	out := make(map[string]string, len(n.Content)/2)
	l.mapping(n, field, func(key string, k, v *yaml.Node) {
		if s, ok := l.str(v, field+"."+key); ok {
			pos[rel+"."+key] = k
			out[key] = s
		}
	})
	return out
}

func (l *loader) errorf(n *yaml.Node, field string, err error, format string, a ...any) {
	l.errorfCause(n, field, err, nil, format, a...)
}

// errorfCause records an error, unless maxErrors are recorded already: a
// file of many bad items costs no more errors than are reported.
func (l *loader) errorfCause(n *yaml.Node, field string, err, cause error, format string, a ...any) {
	if len(l.errs) >= maxErrors {
		return
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: n.Line, Column: n.Column, Field: field, Message: fmt.Sprintf(format, a...), Err: err, Cause: cause})
}

// position finds the node of a field of rule i: the field itself, else
// its closest recorded parent, else the rule.
func (l *loader) position(i int, field string) (string, int, int) {
	if i >= len(l.pos) {
		return l.file, 0, 0
	}
	for f := field; f != ""; f = parentField(f) {
		if n := l.pos[i][f]; n != nil {
			return l.file, n.Line, n.Column
		}
	}
	n := l.ruleNodes[i]
	return l.file, n.Line, n.Column
}

func parentField(f string) string {
	if j := strings.LastIndexAny(f, ".["); j > 0 {
		return f[:j]
	}
	return ""
}

func join(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		}
		return fmt.Sprintf("%s %s", strings.TrimPrefix(n.ShortTag(), "!!"), n.Value)
	}
	return "nothing"
}

// sortErrors orders errors by position, stable for equal positions.
func sortErrors(errs []*Error) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
}
