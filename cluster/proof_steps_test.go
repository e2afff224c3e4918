package cluster

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
)

// TestProofSteps runs the table of member proofs through a transcript:
// who the ring may hold, who is due for a challenge and when, as members
// come, answer, fail, change address and go.
func TestProofSteps(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	self := ring.Member{Name: "a", Addr: "127.0.0.1:1"}
	b := ring.Member{Name: "b", Addr: "127.0.0.1:2"}
	b2 := ring.Member{Name: "b", Addr: "127.0.0.1:9"}
	c := ring.Member{Name: "c", Addr: "127.0.0.1:3"}
	bad := errors.New("wrong answer")
	type step struct {
		at      time.Duration
		admit   []ring.Member // candidates given to admit, when not nil
		answer  *ring.Member  // a member's answer, with err
		err     error
		wantIn  []string // names the ring may hold after admit
		wantDue []string // names due at this step
		// wantNext is when the next attempt falls due, from t0; -1: none.
		wantNext time.Duration
		wantRef  []string // refused members
	}
	p := newProofs(false, "a", 100*time.Millisecond, 400*time.Millisecond)
	for i, s := range []step{
		{at: 0, admit: []ring.Member{self, b, c}, wantIn: []string{"a"}, wantDue: []string{"b", "c"}, wantNext: -1},
		{at: 0, wantDue: nil, wantNext: -1}, // both in flight
		{at: 5 * time.Millisecond, answer: &b, wantRef: nil, wantNext: -1},
		{at: 5 * time.Millisecond, admit: []ring.Member{self, b, c}, wantIn: []string{"a", "b"}, wantNext: -1},
		{at: 10 * time.Millisecond, answer: &c, err: bad, wantRef: []string{"c"}, wantNext: 110 * time.Millisecond},
		{at: 50 * time.Millisecond, wantNext: 110 * time.Millisecond},
		{at: 110 * time.Millisecond, wantDue: []string{"c"}, wantNext: -1, wantRef: []string{"c"}},
		{at: 120 * time.Millisecond, answer: &c, err: bad, wantNext: 320 * time.Millisecond, wantRef: []string{"c"}},
		{at: 320 * time.Millisecond, wantDue: []string{"c"}, wantNext: -1},
		{at: 330 * time.Millisecond, answer: &c, err: bad, wantNext: 730 * time.Millisecond},
		{at: 730 * time.Millisecond, wantDue: []string{"c"}, wantNext: -1},
		// The backoff stops growing at its maximum.
		{at: 740 * time.Millisecond, answer: &c, err: bad, wantNext: 1140 * time.Millisecond},
		// b's address changes: it proves itself again, and an answer
		// from its old address counts for nothing.
		{at: time.Second, admit: []ring.Member{self, b2, c}, wantIn: []string{"a"}, wantDue: []string{"b"}, wantNext: 1140 * time.Millisecond},
		{at: time.Second, answer: &b, wantNext: 1140 * time.Millisecond},
		{at: time.Second, admit: []ring.Member{self, b2, c}, wantIn: []string{"a"}, wantNext: 1140 * time.Millisecond},
		{at: time.Second, answer: &b2, wantNext: 1140 * time.Millisecond},
		{at: time.Second, admit: []ring.Member{self, b2, c}, wantIn: []string{"a", "b"}, wantNext: 1140 * time.Millisecond},
		// c goes and comes back: it starts over, due at once.
		{at: 2 * time.Second, admit: []ring.Member{self, b2}, wantIn: []string{"a", "b"}, wantNext: -1, wantRef: nil},
		{at: 2 * time.Second, admit: []ring.Member{self, b2, c}, wantIn: []string{"a", "b"}, wantDue: []string{"c"}, wantNext: -1},
		{at: 2 * time.Second, answer: &c, wantNext: -1},
		{at: 2 * time.Second, admit: []ring.Member{self, b2, c}, wantIn: []string{"a", "b", "c"}, wantNext: -1},
	} {
		now := t0.Add(s.at)
		if s.answer != nil {
			p.done(*s.answer, s.err, now)
		}
		if s.admit != nil {
			if got := names(p.admit(s.admit, now)); !slices.Equal(got, s.wantIn) {
				t.Fatalf("step %d: ring may hold %v, want %v", i, got, s.wantIn)
			}
		}
		due, next := p.due(now)
		if got := names(due); !slices.Equal(got, s.wantDue) {
			t.Fatalf("step %d: due %v, want %v", i, got, s.wantDue)
		}
		wantNext := time.Time{}
		if s.wantNext >= 0 {
			wantNext = t0.Add(s.wantNext)
		}
		if !next.Equal(wantNext) {
			t.Fatalf("step %d: next due %v, want %v", i, next, wantNext)
		}
		var ref []string
		for _, r := range p.refused() {
			ref = append(ref, r.Name)
		}
		if s.wantRef != nil && !slices.Equal(ref, s.wantRef) {
			t.Fatalf("step %d: refused %v, want %v", i, ref, s.wantRef)
		}
	}
	if r := p.refused(); len(r) != 0 {
		t.Fatalf("refused at the end: %+v", r)
	}
}

// TestProofOpen: with peer authentication off, every candidate is used at
// once and nobody is challenged.
func TestProofOpen(t *testing.T) {
	p := newProofs(true, "a", time.Millisecond, time.Second)
	ms := []ring.Member{{Name: "a", Addr: "x:1"}, {Name: "rogue", Addr: "x:2"}}
	if got := p.admit(ms, time.Now()); len(got) != 2 {
		t.Fatalf("open admit: %v, want both", got)
	}
	if due, _ := p.due(time.Now()); len(due) != 0 {
		t.Fatalf("open: %v due", due)
	}
}

func names(ms []ring.Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}
