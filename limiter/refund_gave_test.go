package limiter

import (
	"testing"
	"time"
)

// RefundAt reports the whole hits a refund without Charged gave back,
// never more than the key counts fewer: every algorithm, steps of one key.
func TestRefundAtReportsWhatItGaveBack(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	steps := []struct {
		name     string
		at       time.Duration
		hits     int64
		behavior Behavior
		charged  bool // name the window of the first consumption
		wantGave int64
		// wantDrained is wantGave for the algorithms that drain (a bucket,
		// GCRA): what drained since leaves a fraction of a hit, not given.
		wantDrained int64
	}{
		{"consume 30", 0, 30, 0, false, 0, 0},
		{"give back 10 of 30", time.Millisecond, 10, Refund, false, 10, 10},
		{"give back 50 of 20, drained a little", 2 * time.Millisecond, 50, Refund, false, 20, 19},
		{"give back on nothing", 3 * time.Millisecond, 5, Refund, false, 0, 0},
		{"consume 8", 4 * time.Millisecond, 8, 0, false, 0, 0},
		{"give back 3 naming a charge", 5 * time.Millisecond, 3, Refund, true, 0, 0},
		{"a peek", 6 * time.Millisecond, 0, 0, false, 0, 0},
	}
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			var first Window
			for _, st := range steps {
				req := Request{Name: "r", Key: "k", Hits: st.hits, Behavior: st.behavior, Limit: 100, Period: time.Hour, Algorithm: a}
				if st.charged {
					req.Charged = first
				}
				peek := req
				peek.Behavior, peek.Charged = 0, Window{}
				before := remainingAt(t, s, peek, t0.Add(st.at))
				d, gave, err := s.RefundAt(req, t0.Add(st.at))
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				if first.IsZero() {
					first = d.Window
				}
				want := st.wantGave
				if a.HasBurst() {
					want = st.wantDrained
				}
				if gave != want {
					t.Errorf("%s: gave %d, want %d", st.name, gave, want)
				}
				if st.behavior == Refund && d.Remaining-before < gave {
					t.Errorf("%s: gave %d, but remaining went from %d to %d", st.name, gave, before, d.Remaining)
				}
			}
		})
	}
}
