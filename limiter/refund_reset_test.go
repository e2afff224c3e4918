package limiter

import (
	"testing"
	"time"
)

// TestRefundAfterAResetTakesNoOnesHits: a request charges 3 hits, an
// authorised caller resets the key, others charge 4, and the first
// request's refund, naming its charge (Request.Charged), arrives: the
// hits it names were cleared by the reset, so it gives nothing back and
// the key still counts the others' 4, for every algorithm, also when the
// store swept the key between the reset and the others' charge (the key
// was fresh). A refund of the others' charge, made after the reset, still
// gives its hits back.
func TestRefundAfterAResetTakesNoOnesHits(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		for _, c := range []struct {
			name  string
			cfg   StoreConfig
			sweep bool
		}{
			{"", DefaultStoreConfig(), false},
			{"/strictest", StoreConfig{Shards: 1, KeepStrictest: true}, false},
			{"/swept", DefaultStoreConfig(), true},
		} {
			cfg := c.cfg
			t.Run(a.String()+c.name, func(t *testing.T) {
				s, err := NewStore(cfg)
				if err != nil {
					t.Fatal(err)
				}
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				check := func(at time.Duration, hits int64, b Behavior, charged Window) Decision {
					t.Helper()
					r := base
					r.Hits, r.Behavior, r.Charged = hits, b, charged
					d, err := s.CheckAt(r, t0.Add(at))
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				mine := check(time.Second, 3, 0, Window{})
				if !mine.Allowed || mine.Window.IsZero() {
					t.Fatalf("the charge: %+v", mine)
				}
				check(2*time.Second, 0, Reset, Window{})
				if c.sweep {
					s.Sweep(t0.Add(2 * time.Second))
				}
				theirs := check(3*time.Second, 4, 0, Window{})
				if !theirs.Allowed || theirs.Remaining != 6 {
					t.Fatalf("the others' charge after the reset: %+v", theirs)
				}
				if d := check(4*time.Second, 3, Refund, mine.Window); !d.Window.IsZero() || d.Remaining != 6 {
					t.Errorf("the refund of a charge the reset cleared: %+v, want nothing given back (remaining 6)", d)
				}
				if d := check(5*time.Second, 4, Refund, theirs.Window); d.Window != theirs.Window || d.Remaining != 10 {
					t.Errorf("the refund of the charge made after the reset: %+v, want its 4 back (remaining 10)", d)
				}
			})
		}
	}
}
