package limiter

import (
	"os"
	"testing"
	"time"
)

// TestKeepStrictestCalendarMoved attacks a calendar window's key after it
// moves to another store (a hand-off, a replica's take-over, a restore
// from disk): its Snapshot carries no rate, so the receiving store
// charges it at the rate of the first check after it. A caller who spent
// the day's 10 hits checks the moved key at 10 hits a second and, if the
// fixed window's count is placed in the one-second window, is admitted
// again a second later: the day's count is lowered without a Reset.
func TestKeepStrictestCalendarMoved(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") == "" {
		t.Skip("attack: a calendar window's rate does not travel (SLUICE_ATTACK=1)")
	}
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	day := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Algorithm: FixedWindow, Calendar: Day}
	lax := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: FixedWindow}
	for _, moved := range []bool{false, true} {
		from := newStrictStore(t)
		if d, err := from.CheckAt(day, t0); err != nil || !d.Allowed {
			t.Fatalf("spending: %+v %v", d, err)
		}
		s := from
		if moved {
			s = newStrictStore(t)
			sn := snapOf(t, from, day, t0)
			mustMerge(t, s, []Snapshot{sn}, t0)
		}
		admitted := 0
		for i := range 5 {
			now := t0.Add(time.Duration(i) * 1500 * time.Millisecond)
			if d, err := s.CheckAt(lax, now); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				admitted++
			}
		}
		if admitted > 0 {
			t.Errorf("moved=%v: a day's spent calendar window admitted %d hits at 10 a second", moved, admitted)
		}
	}
}
