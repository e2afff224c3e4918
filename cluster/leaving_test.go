package cluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
)

// A leaving node holds every hand-off state it takes until its last
// passes take them; once a take finds none it is sealed and refuses more,
// naming why, as it does states beyond maxForeign: a state it took is
// always taken by a later pass, never held after the last.
func TestLeavingHoldsUntilSealed(t *testing.T) {
	tr := newTransfers()
	defer tr.cancel()
	held := func(n int, from string) []foreignState {
		out := make([]foreignState, n)
		for i := range out {
			out[i] = foreignState{from: from, state: limiter.Snapshot{Name: "api", Key: fmt.Sprintf("%s-%d", from, i)}}
		}
		return out
	}
	if err := tr.holdLeaving(held(3, "a")); err != nil {
		t.Fatal(err)
	}
	if got := tr.takeForeignOrSeal(false); len(got) != 3 || got[0].from != "a" {
		t.Fatalf("took %+v, want the 3 states from a", got)
	}
	if err := tr.holdLeaving(held(2, "b")); err != nil {
		t.Fatalf("refused after a take that found states: %v", err)
	}
	if got := tr.takeForeignOrSeal(false); len(got) != 2 {
		t.Fatalf("took %d states, want 2", len(got))
	}
	if got := tr.takeForeignOrSeal(false); len(got) != 0 {
		t.Fatalf("took %d states, want none", len(got))
	}
	err := tr.holdLeaving(held(1, "c"))
	if err == nil || !strings.Contains(err.Error(), "passed on its last") {
		t.Errorf("sealed: got %v, want a refusal", err)
	}
	if got := tr.takeForeign(); len(got) != 0 {
		t.Errorf("sealed node holds %d states", len(got))
	}

	// Beyond maxForeign: refused whole; a seal with states still held
	// returns them (lost, counted by Leave) and seals.
	tr = newTransfers()
	defer tr.cancel()
	if err := tr.holdLeaving(held(maxForeign, "a")); err != nil {
		t.Fatal(err)
	}
	if err := tr.holdLeaving(held(1, "b")); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("over maxForeign: got %v, want a refusal", err)
	}
	if got := tr.takeForeignOrSeal(true); len(got) != maxForeign {
		t.Errorf("sealing took %d states, want %d", len(got), maxForeign)
	}
	if err := tr.holdLeaving(held(1, "b")); err == nil {
		t.Error("a node sealed with states held takes more")
	}
}
