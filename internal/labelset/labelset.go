// Package labelset bounds the values of a metric label that come from
// requests: the first values seen get their own label value, up to a
// number and a length; every other value is counted under Overflow, so
// that callers sending arbitrary values cannot grow a metrics registry
// without bound.
package labelset

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// Overflow is the label value of the values a Set does not admit.
const Overflow = "_other"

// Set admits at most max distinct values of at most maxLen bytes each.
// Its methods are safe for concurrent use.
type Set struct {
	max, maxLen int

	mu   sync.Mutex // guards seen
	seen map[string]struct{}
}

// New returns an empty set that admits max values of at most maxLen
// bytes.
func New(max, maxLen int) *Set {
	return &Set{max: max, maxLen: maxLen, seen: make(map[string]struct{})}
}

// Label returns v when the set holds it, or admits it now (there is room,
// and v is valid UTF-8 of at most maxLen bytes); Overflow otherwise.
func (s *Set) Label(v string) string {
	if len(v) > s.maxLen || !utf8.ValidString(v) {
		return Overflow
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[v]; ok {
		return v
	}
	if len(s.seen) >= s.max {
		return Overflow
	}
	v = strings.Clone(v) // not the request's memory
	s.seen[v] = struct{}{}
	return v
}

// Len returns how many values the set has admitted.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}
