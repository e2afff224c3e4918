package limiter

import (
	"fmt"
	"testing"
	"time"
)

// TestMergeNeverLowers merges into a spent key (10 a minute) a state that
// another node charged with one hit at a far slower rate (10 in 10 hours),
// so that it lasts longer: of every algorithm, the key's own included.
// Whatever it is, the spent key stays spent at its own rate, and as spent
// under the incoming state's rate.
func TestMergeNeverLowers(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	now := t0.Add(time.Second)
	for _, a := range Algorithms {
		for _, b := range Algorithms {
			t.Run(fmt.Sprintf("%s<-%s", a, b), func(t *testing.T) {
				mine := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Period: time.Minute, Algorithm: a}
				theirs := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: 10 * time.Hour, Algorithm: b}
				s, other := newTestStore(t), newTestStore(t)
				for _, c := range []struct {
					s *Store
					r Request
				}{{s, mine}, {other, theirs}} {
					if d, err := c.s.CheckAt(c.r, t0); err != nil || !d.Allowed {
						t.Fatalf("charging %s: %+v %v", c.r.Algorithm, d, err)
					}
				}
				mustMerge(t, s, []Snapshot{snapOf(t, other, theirs, now)}, now)
				one := mine
				one.Hits = 1
				if d, err := s.CheckAt(one, now); err != nil || d.Allowed {
					t.Fatalf("after the merge, the spent key admitted a hit at its own rate: %+v %v", d, err)
				}
			})
		}
	}
}
