package labelset

import (
	"strings"
	"testing"
)

func TestLabel(t *testing.T) {
	s := New(2, 8)
	for i, step := range []struct{ in, want string }{
		{"a", "a"},
		{"toolong!!", Overflow}, // over maxLen: not admitted, takes no room
		{"\xff", Overflow},      // not UTF-8
		{"b", "b"},
		{"c", Overflow}, // full
		{"a", "a"},      // admitted values stay
		{"b", "b"},
		{Overflow, Overflow},
	} {
		if got := s.Label(step.in); got != step.want {
			t.Errorf("step %d: Label(%q) = %q, want %q", i, step.in, got, step.want)
		}
	}
	if s.Len() != 2 {
		t.Errorf("Len %d, want 2", s.Len())
	}
	if got := New(1, 8).Label(strings.Repeat("x", 8)); got != strings.Repeat("x", 8) {
		t.Errorf("a value of maxLen bytes: %q", got)
	}
}
