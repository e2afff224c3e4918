package rules

import "sync/atomic"

// Source holds a Set built in code. Current is lock-free; Update swaps in
// a new set atomically. It is safe for concurrent use.
type Source struct {
	cur atomic.Pointer[Set]
}

// NewStatic validates rules (see NewSet) and returns a Source holding them.
func NewStatic(rules ...Rule) (*Source, error) {
	s, err := NewSet(rules...)
	if err != nil {
		return nil, err
	}
	src := &Source{}
	src.cur.Store(s)
	return src, nil
}

// NewSource returns a Source holding set, one loaded with Parse say; a nil
// set is an empty one.
func NewSource(set *Set) *Source {
	if set == nil {
		set = &Set{byName: map[string]*Rule{}}
	}
	src := &Source{}
	src.cur.Store(set)
	return src
}

// Current returns the current set.
func (s *Source) Current() *Set { return s.cur.Load() }

// Update validates rules and, when they are all valid, makes them the
// current set; otherwise the current set stays.
func (s *Source) Update(rules ...Rule) error {
	set, err := NewSet(rules...)
	if err != nil {
		return err
	}
	s.cur.Store(set)
	return nil
}
