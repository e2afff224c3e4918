package rules

import (
	"fmt"
	"maps"
	"slices"
)

// Set is an immutable, validated list of rules, safe for concurrent use. A
// nil *Set is empty.
type Set struct {
	rules  []*Rule
	byName map[string]*Rule
	origin string // the file it was loaded from; "" for code
}

// NewSet validates rules and returns them as a Set, in the given order. It
// copies everything it keeps; the caller may reuse rules. Every problem is
// reported, as an [*Error] or several joined; Field names the rule by its
// index ("rules[1].limit").
func NewSet(rules ...Rule) (*Set, error) {
	s, errs := newSet(rules, nil, nil)
	if err := joinErrors(errs); err != nil {
		return nil, err
	}
	return s, nil
}

// positioner gives the position of a field of rule i, for errors.
type positioner func(i int, field string) (file string, line, col int)

// newSet builds a set. pos, when set, positions errors; reported, when
// set, says which fields of rule i already failed to parse, so that
// their consequences are not reported again.
func newSet(rules []Rule, pos positioner, reported func(i int, field string) bool) (*Set, []*Error) {
	s := &Set{rules: make([]*Rule, 0, len(rules)), byName: make(map[string]*Rule, len(rules))}
	var errs []*Error
	fail := func(i int, f fieldError) {
		e := &Error{Field: fmt.Sprintf("rules[%d].%s", i, f.field), Message: f.msg, Err: f.err, Cause: f.cause}
		if pos != nil {
			e.File, e.Line, e.Column = pos(i, f.field)
		}
		errs = append(errs, e)
	}
	first := make(map[string]int, len(rules))
	for i := range rules {
		if len(errs) >= maxErrors {
			break // no more is reported
		}
		r := cloneRule(&rules[i])
		c, ferrs := r.compile()
		for _, f := range ferrs {
			if reported == nil || !reported(i, f.field) {
				fail(i, f)
			}
		}
		if reported != nil && reported(i, "") {
			ferrs = append(ferrs, fieldError{}) // it failed to parse
		}
		if j, dup := first[r.Name]; dup && r.Name != "" {
			where := fmt.Sprintf("rules[%d]", j)
			if pos != nil {
				if _, line, _ := pos(j, "name"); line > 0 {
					where = fmt.Sprintf("line %d", line)
				}
			}
			fail(i, fieldError{field: "name", err: ErrDuplicateName, msg: fmt.Sprintf("rule name %q is already used at %s", r.Name, where)})
			continue
		}
		first[r.Name] = i
		if len(ferrs) > 0 {
			continue
		}
		r.c = c
		s.rules = append(s.rules, r)
		s.byName[r.Name] = r
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

func cloneRule(r *Rule) *Rule {
	c := *r
	c.Key = slices.Clone(r.Key)
	c.Match.Routes = slices.Clone(r.Match.Routes)
	c.Match.Methods = slices.Clone(r.Match.Methods)
	c.Match.Headers = maps.Clone(r.Match.Headers)
	c.Match.IPs = slices.Clone(r.Match.IPs)
	c.Match.Users = slices.Clone(r.Match.Users)
	c.Match.Descriptors = maps.Clone(r.Match.Descriptors)
	c.c = nil
	return &c
}

// Len returns the number of rules.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.rules)
}

// Rules returns the rules in order. The slice is the caller's; the rules
// are shared and must not be modified.
func (s *Set) Rules() []*Rule {
	if s == nil {
		return nil
	}
	return slices.Clone(s.rules)
}

// Rule returns the rule named name.
func (s *Set) Rule(name string) (*Rule, bool) {
	if s == nil {
		return nil, false
	}
	r, ok := s.byName[name]
	return r, ok
}

// Origin returns the file the set was loaded from, or "" for a set built
// in code.
func (s *Set) Origin() string {
	if s == nil {
		return ""
	}
	return s.origin
}

// Match returns the rules whose conditions all hold for d, in set order.
// It allocates only the result.
func (s *Set) Match(d *Descriptor) []*Rule { return s.AppendMatch(nil, d) }

// AppendMatch appends the rules that match d to dst and returns it; with
// a dst of enough capacity it does not allocate.
func (s *Set) AppendMatch(dst []*Rule, d *Descriptor) []*Rule {
	if s == nil {
		return dst
	}
	for _, r := range s.rules {
		if r.c.matches(d) {
			dst = append(dst, r)
		}
	}
	return dst
}
