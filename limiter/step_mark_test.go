package limiter

import (
	"strconv"
	"testing"
	"time"
)

// Neighbours of TestResetMarkAcrossAClockAheadCharge and
// TestRefundOfTheResettingChargeGivesItBack: a decision that reads a state
// written after its now marks the key as a reset at now does, and a
// charge at a reset's own instant names that instant's epoch since it.

// markStep is one decision of a markTrace: at t0+at, hits with behavior
// b; refund names the charge of an earlier step (its index), or -1.
type markStep struct {
	at     time.Duration
	hits   int64
	b      Behavior
	refund int
}

// markTrace runs steps on a store of every algorithm (with and without
// KeepStrictest) at a limit of 10 per hour and calls check with the
// decisions.
func markTrace(t *testing.T, steps []markStep, check func(t *testing.T, a Algorithm, d []Decision)) {
	t.Helper()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		for _, keep := range []bool{false, true} {
			t.Run(a.String()+"/strictest="+strconv.FormatBool(keep), func(t *testing.T) {
				s, err := NewStore(StoreConfig{Shards: 1, KeepStrictest: keep})
				if err != nil {
					t.Fatal(err)
				}
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				var ds []Decision
				for _, st := range steps {
					var charged Window
					if st.refund >= 0 {
						charged = ds[st.refund].Window
					}
					ds = append(ds, attackCheck(t, s, base, t0, st.at, st.hits, st.b, charged))
				}
				check(t, a, ds)
			})
		}
	}
}

const noRefund = -1

// TestClockAheadChargeWithoutAReset: a key charged 3, then charged 1 with
// the clock two hours ahead (its state fresh on that clock), then by
// others 4 with the clock set right: the refund of the first 3 gives
// nothing back. The clock ahead released them already; the key counts
// the others' 4 and the 1.
func TestClockAheadChargeWithoutAReset(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[3].Remaining != d[2].Remaining {
			t.Errorf("the refund of the charge before the clock ran ahead: remaining %d, want %d", d[3].Remaining, d[2].Remaining)
		}
	})
}

// TestResetMarkAcrossAClockBehindCharge: as
// TestResetMarkAcrossAClockAheadCharge with the clock two hours behind for
// the charge of 1: the mark lasts on that clock, and the refund of a
// charge the reset cleared gives nothing back.
func TestResetMarkAcrossAClockBehindCharge(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{-2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
	})
}

// TestResetMarkAcrossAClockAheadChargeRefundFirst: the refund of the
// charge the reset cleared is the first decision after the clock is set
// right (before any write has marked the key), then again after others
// charged 4: it gives nothing back either time, and the others' refund,
// at the instant of their charge, gives their 4 back.
func TestResetMarkAcrossAClockAheadChargeRefundFirst(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 0, 0, noRefund}, // a peek: what the key has left
		{3 * time.Second, 3, Refund, 0},
		{3 * time.Second, 4, 0, noRefund},
		{3 * time.Second, 0, 0, noRefund}, // a peek between
		{3 * time.Second, 3, Refund, 0},
		{3 * time.Second, 4, Refund, 5},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the first refund after the clock was set right: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
		if !d[5].Allowed || d[5].Remaining != d[3].Remaining-4 {
			t.Fatalf("the others' charge: %+v, want remaining %d", d[5], d[3].Remaining-4)
		}
		if d[7].Remaining != d[5].Remaining {
			t.Errorf("the refund after the others' charge: remaining %d, want %d", d[7].Remaining, d[5].Remaining)
		}
		if d[8].Remaining != d[3].Remaining {
			t.Errorf("the others' refund (window %v): remaining %d, want %d", d[5].Window, d[8].Remaining, d[3].Remaining)
		}
	})
}

// TestResetAfterAClockStep: after the clock ahead and set right, others
// charge 4 (the key marked at their charge), the key is reset again, and
// a third caller charges 2: neither the first refund nor the others'
// gives anything back, the third's gives its 2 back.
func TestResetAfterAClockStep(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{3500 * time.Millisecond, 0, Reset, noRefund},
		{4 * time.Second, 2, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
		{4 * time.Second, 4, Refund, 3},
		{4 * time.Second, 2, Refund, 5},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if !d[5].Allowed || d[5].Remaining != 8 {
			t.Fatalf("the third's charge after the second reset: %+v", d[5])
		}
		if d[6].Remaining != 8 || d[7].Remaining != 8 {
			t.Errorf("the refunds of charges a reset cleared: remaining %d and %d, want 8", d[6].Remaining, d[7].Remaining)
		}
		if d[8].Remaining != 10 {
			t.Errorf("the third's refund (window %v): remaining %d, want 10", d[5].Window, d[8].Remaining)
		}
	})
}

// TestResetAtTheInstantOfACharge: a charge of 3 and a Reset at the same
// instant, the charge first, then others' 4 a second later: the refund of
// the 3 gives nothing back (the reset cleared it), though the reset's
// instant is its own.
func TestResetAtTheInstantOfACharge(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 5, 0, noRefund},
		{2 * time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{3 * time.Second, 3, Refund, 1},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[4].Remaining != 6 {
			t.Errorf("the refund of a charge at the reset's instant, before it (window %v): remaining %d, want 6", d[1].Window, d[4].Remaining)
		}
	})
}

// TestRefundsOfChargesAtAResetsInstant: a Reset with Hits 3 and others' 2
// at the same instant: each refund gives its own hits back, and the key
// ends fresh.
func TestRefundsOfChargesAtAResetsInstant(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 5, 0, noRefund},
		{2 * time.Second, 3, Reset, noRefund},
		{2 * time.Second, 2, 0, noRefund},
		{2 * time.Second, 2, Refund, 2},
		{2 * time.Second, 3, Refund, 1},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[2].Remaining != 5 {
			t.Fatalf("after the two charges: %+v", d[2])
		}
		if d[3].Remaining != 7 || d[4].Remaining != 10 {
			t.Errorf("the refunds of 2 (%v) and 3 (%v): remaining %d and %d, want 7 and 10", d[2].Window, d[1].Window, d[3].Remaining, d[4].Remaining)
		}
	})
}

// TestRefundOfAChargeAMicrosecondAfterAReset: a charge a microsecond after
// a Reset with Hits names the instant the resetting charge's epoch names:
// its refund gives back no more than its 1 hit, and the refund of the
// resetting charge then no more than its 3.
func TestRefundOfAChargeAMicrosecondAfterAReset(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 5, 0, noRefund},
		{2 * time.Second, 3, Reset, noRefund},
		{2*time.Second + time.Microsecond, 1, 0, noRefund},
		{2*time.Second + time.Microsecond, 1, Refund, 2},
		{2*time.Second + time.Microsecond, 3, Refund, 1},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[2].Remaining != 6 {
			t.Fatalf("after the two charges: %+v", d[2])
		}
		if d[3].Remaining > 7 || d[4].Remaining > 10 || d[4].Remaining < d[3].Remaining {
			t.Errorf("the refunds of 1 (%v) and 3 (%v): remaining %d and %d, want at most 7 and 10", d[2].Window, d[1].Window, d[3].Remaining, d[4].Remaining)
		}
		t.Logf("remaining %d after the first refund, %d after the second", d[3].Remaining, d[4].Remaining)
	})
}

// TestRefundsAcrossAResetMadeAhead: a key charged (3 at 30 minutes, on a
// clock ahead, or 9 at 1s, on a clock right), reset on a clock ahead
// while the charge still counts (at 40 and 50 minutes), then, with the
// clock set right, charged 4 by others: the refund of the first charge
// gives nothing back, the others' gives their 4 back; and after a Reset
// with Hits 2 made ahead, the others' 4 and the reset's 2 go back (but
// for the log, whose entry of the reset a step back merged into the
// others' instant: it gives the reset's 2 back to no one).
func TestRefundsAcrossAResetMadeAhead(t *testing.T) {
	for _, c := range []struct {
		first, reset time.Duration
		hits         int64
	}{{30 * time.Minute, 40 * time.Minute, 3}, {time.Second, 50 * time.Minute, 9}} {
		t.Run("charged at "+c.first.String(), func(t *testing.T) {
			markTrace(t, []markStep{
				{c.first, c.hits, 0, noRefund},
				{c.reset, 0, Reset, noRefund},
				{3 * time.Second, 4, 0, noRefund},
				{4 * time.Second, c.hits, Refund, 0},
				{4 * time.Second, 4, Refund, 2},
			}, func(t *testing.T, a Algorithm, d []Decision) {
				if !d[2].Allowed || d[2].Remaining != 6 {
					t.Fatalf("the others' charge: %+v", d[2])
				}
				if d[3].Remaining != 6 {
					t.Errorf("the refund of the charge the reset cleared (%v): remaining %d, want 6", d[0].Window, d[3].Remaining)
				}
				if d[4].Remaining != 10 {
					t.Errorf("the others' refund (%v): remaining %d, want 10", d[2].Window, d[4].Remaining)
				}
			})
		})
	}
	t.Run("a reset with hits", func(t *testing.T) {
		markTrace(t, []markStep{
			{time.Second, 5, 0, noRefund},
			{50 * time.Minute, 2, Reset, noRefund},
			{3 * time.Second, 4, 0, noRefund},
			{4 * time.Second, 4, Refund, 2},
			{4 * time.Second, 2, Refund, 1},
		}, func(t *testing.T, a Algorithm, d []Decision) {
			if !d[2].Allowed || d[2].Remaining != 4 {
				t.Fatalf("the others' charge: %+v", d[2])
			}
			want := int64(10)
			if a == SlidingWindowLog {
				want = 8
			}
			if d[3].Remaining != 8 || d[4].Remaining != want {
				t.Errorf("the refunds of 4 (%v) and 2 (%v): remaining %d and %d, want 8 and %d", d[2].Window, d[1].Window, d[3].Remaining, d[4].Remaining, want)
			}
		})
	})
}

// TestResetMarkAcrossAClockAheadReset: after a charge of 3 and a reset, a
// second reset with the clock two hours ahead finds the key fresh on that
// clock and its mark lapsed, and leaves a drop mark; once the clock is set
// right, the others' charge of 4 turns it into a reset's mark at the
// second reset, and the refund of the 3 gives nothing back.
func TestResetMarkAcrossAClockAheadReset(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{2 * time.Hour, 0, Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
	})
}

// TestStepMarkOutlastsGCRAReach: the mark a clock step leaves on a GCRA
// key lasts at least the capacity's drain at its interval, rounded up
// (7 per hour: 514285714286 ns a hit, 2 ns past the hour for 7), as long
// as a refund of a charge made before the step could give anything back.
func TestStepMarkOutlastsGCRAReach(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	s, err := NewStore(StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	base := Request{Name: "n", Key: "k", Limit: 7, Period: time.Hour, Algorithm: GCRA}
	attackCheck(t, s, base, t0, time.Hour, 1, 0, Window{})
	attackCheck(t, s, base, t0, time.Second, 1, 0, Window{}) // the clock set back: a step
	sh := &s.shards[0]
	e := sh.m[string(appendStoreKey(nil, "n", "k"))]
	m, ok := sh.resets[e]
	reach := t0.Add(time.Second).UnixNano() + base.Capacity()*gcraInterval(&base)
	if !ok || m.until < reach {
		t.Errorf("the step's mark %+v (ok %v) ends before %d, the reach of a charge of %d made at the step", m, ok, reach, base.Capacity())
	}
}

// TestRefundAfterAClockAheadSweep: a key charged 3, then swept with the
// clock two hours ahead (its state fresh on that clock), then charged 4
// by others with the clock set right: the refund of the 3 gives nothing
// back, as after TestClockAheadChargeWithoutAReset's charge ahead, and
// the others' refund gives their 4 back. The shard remembers the reading
// it dropped a key at, and a decision before it that writes a key with no
// live state marks the key as a reset at that reading would.
func TestRefundAfterAClockAheadSweep(t *testing.T) {
	sweepTrace(t, time.Second, 2*time.Hour, 3*time.Second)
}

// TestRefundAfterAClockAheadSweepOfAChargeAhead: as
// TestRefundAfterAClockAheadSweep with the first charge also made on the
// clock ahead (30 minutes), before the sweep at two hours: its instant or
// window lies after the others' now, and its refund gives nothing back.
func TestRefundAfterAClockAheadSweepOfAChargeAhead(t *testing.T) {
	sweepTrace(t, 30*time.Minute, 2*time.Hour, 3*time.Second)
}

// TestRefundAfterAClockBehindThenAheadSweep: the key charged 3 with the
// clock right, charged 1 with it two hours behind (a step back, which
// marks the key), swept with it two hours ahead, then charged 4 by others
// with the clock set right: the refund of the 3 gives nothing back.
func TestRefundAfterAClockBehindThenAheadSweep(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, -2*time.Hour, 1, 0, Window{})
			if n := s.Sweep(t0.Add(4 * time.Hour)); n != 1 {
				t.Fatalf("the sweep ahead dropped %d keys", n)
			}
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("the refund of the charge before the sweep ahead: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
			if d := attackCheck(t, s, base, t0, 4*time.Second, 4, Refund, theirs.Window); d.Remaining != theirs.Remaining+4 {
				t.Errorf("the others' refund (%v): remaining %d, want %d", theirs.Window, d.Remaining, theirs.Remaining+4)
			}
		})
	}
}

// TestRefundAfterAClockAheadEviction: as TestRefundAfterAClockAheadSweep
// with the key evicted (MaxEntries 1) by another key's charge on the clock
// ahead rather than swept.
func TestRefundAfterAClockAheadEviction(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(StoreConfig{Shards: 1, MaxEntries: 1})
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			other := base
			other.Key = "other"
			mine := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, other, t0, 2*time.Hour, 1, 0, Window{})
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("the refund of the charge before the eviction ahead: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
			if d := attackCheck(t, s, base, t0, 4*time.Second, 4, Refund, theirs.Window); d.Remaining != theirs.Remaining+4 {
				t.Errorf("the others' refund (%v): remaining %d, want %d", theirs.Window, d.Remaining, theirs.Remaining+4)
			}
		})
	}
}

// TestRefundAfterASweepWithTheClockRight: a sweep at the clock's own
// reading marks nothing: a key charged after it, and refunded, gives its
// hits back with the window or instant the charge named unchanged.
func TestRefundAfterASweepWithTheClockRight(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			if n := s.Sweep(t0.Add(2 * time.Hour)); n != 1 {
				t.Fatalf("the sweep dropped %d keys", n)
			}
			theirs := attackCheck(t, s, base, t0, 2*time.Hour+time.Second, 4, 0, Window{})
			if theirs.Window.Start != theirs.Window.End && theirs.Window.Start != t0.Add(2*time.Hour).UnixNano() {
				t.Errorf("the charge after the sweep names %v", theirs.Window)
			}
			if d := attackCheck(t, s, base, t0, 2*time.Hour+2*time.Second, 4, Refund, theirs.Window); d.Remaining != 10 {
				t.Errorf("the refund after the sweep (%v): remaining %d, want 10", theirs.Window, d.Remaining)
			}
			if len(s.shards[0].resets) != 0 {
				t.Errorf("the sweep at the clock's reading left marks: %v", s.shards[0].resets)
			}
		})
	}
}

// sweepTrace: a key charged 3 at first, swept at sweep (its state fresh
// then), charged 4 by others at then: the refund of the 3 gives nothing
// back, the others' gives their 4 back.
func sweepTrace(t *testing.T, first, sweep, then time.Duration) {
	t.Helper()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, first, 3, 0, Window{})
			if n := s.Sweep(t0.Add(sweep)); n != 1 {
				t.Fatalf("the sweep ahead dropped %d keys", n)
			}
			theirs := attackCheck(t, s, base, t0, then, 4, 0, Window{})
			if !theirs.Allowed || theirs.Remaining != 6 {
				t.Fatalf("the others' charge: %+v", theirs)
			}
			if d := attackCheck(t, s, base, t0, then+time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("the refund of the charge before the sweep ahead (%v): remaining %d, want %d", mine.Window, d.Remaining, theirs.Remaining)
			}
			if d := attackCheck(t, s, base, t0, then+time.Second, 4, Refund, theirs.Window); d.Remaining != theirs.Remaining+4 {
				t.Errorf("the others' refund (%v): remaining %d, want %d", theirs.Window, d.Remaining, theirs.Remaining+4)
			}
		})
	}
}

// TestHandOffFromAClockAhead: a key charged 3 and reset, then charged 1
// on its owner with the clock four minutes ahead (the state fresh there),
// handed off to a store whose clock is right, and charged 4 by others
// there: the refund of the 3 gives nothing back on the new owner, which
// reads the state as written at its now and marks the key. GCRA aside:
// a received GCRA state tells no time it was written at (no tatLead),
// and its TAT four minutes ahead reads as the burst spent.
func TestHandOffFromAClockAhead(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		if a == GCRA {
			continue
		}
		t.Run(a.String(), func(t *testing.T) {
			old, _ := NewStore(DefaultStoreConfig())
			nu, _ := NewStore(DefaultStoreConfig())
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Minute, Algorithm: a}
			mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, old, base, t0, 2*time.Second, 0, Reset, Window{})
			attackCheck(t, old, base, t0, 4*time.Minute, 1, 0, Window{})
			sn, ok := old.Snapshot("n", "k", t0.Add(4*time.Minute))
			if !ok {
				t.Fatal("no snapshot")
			}
			if _, err := nu.Merge([]Snapshot{sn}, t0.Add(3*time.Second)); err != nil {
				t.Fatal(err)
			}
			theirs := attackCheck(t, nu, base, t0, 3*time.Second, 4, 0, Window{})
			if !theirs.Allowed {
				t.Fatalf("the others' charge: %+v", theirs)
			}
			if d := attackCheck(t, nu, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("on the new owner, the refund of a charge the reset cleared: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
			if d := attackCheck(t, nu, base, t0, 4*time.Second, 4, Refund, theirs.Window); d.Remaining != theirs.Remaining+4 {
				t.Errorf("on the new owner, the others' refund (%v): remaining %d, want %d", theirs.Window, d.Remaining, theirs.Remaining+4)
			}
		})
	}
}

// Neighbours of TestResetMarkAcrossAClockAheadReset: a write with the
// clock ahead that finds the key's state gone fresh and leaves it so
// leaves a drop mark, which a write with the clock set right turns into a
// reset's mark at the drop.

// TestResetMarkAcrossAClockAheadResetRefundFirst: the refund of the
// charge the first reset cleared comes first once the clock is set right
// (on a key with no live state: a peek), then after the others' charge:
// it gives nothing back either time, and the others' refund gives their 4
// back.
func TestResetMarkAcrossAClockAheadResetRefundFirst(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{2 * time.Hour, 0, Reset, noRefund},
		{3 * time.Second, 3, Refund, 0},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
		{4 * time.Second, 4, Refund, 4},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[3].Remaining != 10 || !d[4].Allowed || d[4].Remaining != 6 {
			t.Fatalf("the first refund and the others' charge: %+v, %+v", d[3], d[4])
		}
		if d[5].Remaining != 6 {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want 6", d[5].Remaining)
		}
		if d[6].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[4].Window, d[6].Remaining)
		}
	})
}

// TestClockAheadResetOfAStateGoneFresh: a key charged 3, reset with the
// clock two hours ahead (its state fresh on that clock, no mark), then
// charged 4 by others with the clock set right: the refund of the 3 gives
// nothing back, the others' gives their 4 back.
func TestClockAheadResetOfAStateGoneFresh(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Hour, 0, Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
		{4 * time.Second, 4, Refund, 2},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if !d[2].Allowed || d[2].Remaining != 6 {
			t.Fatalf("the others' charge: %+v", d[2])
		}
		if d[3].Remaining != 6 {
			t.Errorf("the refund of the charge before the reset ahead: remaining %d, want 6", d[3].Remaining)
		}
		if d[4].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[2].Window, d[4].Remaining)
		}
	})
}

// TestClockAheadResetOfAStateGoneFreshThenASweep: as
// TestClockAheadResetOfAStateGoneFresh with a sweep while the clock is
// still ahead, which drops the entry the reset left: the decisions with
// the clock set right come before the sweep's reading, and the refund of
// the 3 gives nothing back.
func TestClockAheadResetOfAStateGoneFreshThenASweep(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, 2*time.Hour, 0, Reset, Window{})
			if n := s.Sweep(t0.Add(2*time.Hour + time.Second)); n != 1 {
				t.Fatalf("the sweep ahead dropped %d keys", n)
			}
			theirs := attackCheck(t, s, base, t0, 3*time.Second, 4, 0, Window{})
			if d := attackCheck(t, s, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
				t.Errorf("the refund of the charge before the reset ahead: remaining %d, want %d", d.Remaining, theirs.Remaining)
			}
		})
	}
}

// TestClockAheadRefundAfterAReset: as TestResetMarkAcrossAClockAheadReset
// with a refund of 1 that names no charge, rather than a reset, as the
// write with the clock ahead that leaves the key fresh.
func TestClockAheadRefundAfterAReset(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{2 * time.Hour, 1, Refund, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
	})
}

// TestClockBehindThenAheadReset: after a charge of 3 and a reset, a charge
// of 1 with the clock two hours behind (the reset's mark lasts on that
// clock), a reset with it three hours ahead (the mark lapsed, the state
// fresh), then the others' 4 with the clock set right: the refund of the
// 3 gives nothing back, the others' gives their 4 back.
func TestClockBehindThenAheadReset(t *testing.T) {
	markTrace(t, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, Reset, noRefund},
		{-2 * time.Hour, 1, 0, noRefund},
		{3 * time.Hour, 0, Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
		{4 * time.Second, 4, Refund, 4},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if !d[4].Allowed || d[4].Remaining != 6 {
			t.Fatalf("the others' charge: %+v", d[4])
		}
		if d[5].Remaining != 6 {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want 6", d[5].Remaining)
		}
		if d[6].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[4].Window, d[6].Remaining)
		}
	})
}

// TestDropMarkAfterItsInstant: a drop mark changes nothing at or after its
// instant: after a charge of 3 and a reset two hours later (the state gone
// fresh), a charge of 4 a second after the reset names its own window or
// instant, as on a key never charged, and its refund gives the 4 back;
// the mark travels in no snapshot, and once the key is charged it is gone.
func TestDropMarkAfterItsInstant(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(StoreConfig{Shards: 1})
			if err != nil {
				t.Fatal(err)
			}
			fresh, _ := NewStore(StoreConfig{Shards: 1})
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, 2*time.Hour, 0, Reset, Window{})
			if _, ok := s.ResetMark("n", "k", t0.Add(time.Second)); ok {
				t.Errorf("the drop mark is reported as a reset's")
			}
			s.Range(t0.Add(time.Second), func(sn Snapshot) bool {
				t.Errorf("the drop mark travels: %+v", sn)
				return true
			})
			mine := attackCheck(t, s, base, t0, 2*time.Hour+time.Second, 4, 0, Window{})
			want := attackCheck(t, fresh, base, t0, 2*time.Hour+time.Second, 4, 0, Window{})
			if mine != want {
				t.Errorf("the charge after the drop mark: %+v, on a key never charged %+v", mine, want)
			}
			if d := attackCheck(t, s, base, t0, 2*time.Hour+2*time.Second, 4, Refund, mine.Window); d.Remaining != 10 {
				t.Errorf("the refund after the drop mark: remaining %d, want 10", d.Remaining)
			}
			if len(s.shards[0].resets) != 0 {
				t.Errorf("marks after the charge: %v", s.shards[0].resets)
			}
		})
	}
}

// TestHandOffOfAMarkAhead: a key whose mark lies after the clock's now by
// more than MaxClockSkew (a sweep made with the clock two hours ahead, or
// a reset ten minutes ahead, then the others' 4 with the clock set right) is handed off to a store whose clock
// is right: the snapshot carries the mark's instant at most now (as a
// node up to MaxClockSkew behind still takes it), the new owner takes the state (it would refuse
// a mark further ahead, and count none of the key's hits), counts the
// others' 4, and gives nothing back to a refund of the charge made before.
func TestHandOffOfAMarkAhead(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, how := range []string{"sweep", "reset"} {
		for _, a := range Algorithms {
			t.Run(how+"/"+a.String(), func(t *testing.T) {
				old, _ := NewStore(DefaultStoreConfig())
				nu, _ := NewStore(DefaultStoreConfig())
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
				if how == "sweep" {
					old.Sweep(t0.Add(2 * time.Hour))
				} else {
					attackCheck(t, old, base, t0, 10*time.Minute, 0, Reset, Window{})
				}
				theirs := attackCheck(t, old, base, t0, 3*time.Second, 4, 0, Window{})
				now := t0.Add(4 * time.Second)
				sn, ok := old.Snapshot("n", "k", now)
				if !ok || !sn.HasResetMark() {
					t.Fatalf("no snapshot with a mark: %+v %v", sn, ok)
				}
				if sn.ResetAt > now.UnixNano() {
					t.Errorf("the mark's instant %v is after now (%v)", nsTime(sn.ResetAt), now)
				}
				if _, err := nu.Merge([]Snapshot{sn}, now); err != nil {
					t.Fatalf("the new owner refused the state: %v", err)
				}
				if d := attackCheck(t, nu, base, t0, 4*time.Second, 0, 0, Window{}); d.Remaining != theirs.Remaining {
					t.Errorf("on the new owner: remaining %d, want %d", d.Remaining, theirs.Remaining)
				}
				if d := attackCheck(t, nu, base, t0, 5*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
					t.Errorf("on the new owner, the refund of the charge before the mark: remaining %d, want %d", d.Remaining, theirs.Remaining)
				}
			})
		}
	}
}

// TestRefundOfAChargeAheadAfterAChargeAhead: a key charged 3 with the
// clock 30 minutes ahead, then 1 with it two hours ahead (the first
// charge's state fresh on that clock), then 4 by others with the clock
// set right: the refund of the 3 gives nothing back.
func TestRefundOfAChargeAheadAfterAChargeAhead(t *testing.T) {
	markTrace(t, []markStep{
		{30 * time.Minute, 3, 0, noRefund},
		{2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if d[3].Remaining != d[2].Remaining {
			t.Errorf("the refund of the charge made ahead (%v): remaining %d, want %d", d[0].Window, d[3].Remaining, d[2].Remaining)
		}
	})
}

// TestResetAfterAResetMadeAhead: a key charged 3 with the clock 30
// minutes ahead and reset at 40 minutes (its mark after the clock set
// right), charged 4 by others with the clock set right, reset again, and
// charged 2 by a third: neither the first refund nor the others' gives
// anything back, the third's gives its 2 back. The others' charge is
// named by the first mark's epoch, as the third's would be but for the
// second reset, which moves the mark's instant one epoch later.
func TestResetAfterAResetMadeAhead(t *testing.T) {
	markTrace(t, []markStep{
		{30 * time.Minute, 3, 0, noRefund},
		{40 * time.Minute, 0, Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{3500 * time.Millisecond, 0, Reset, noRefund},
		{4 * time.Second, 2, 0, noRefund},
		{4 * time.Second, 3, Refund, 0},
		{4 * time.Second, 4, Refund, 2},
		{4 * time.Second, 2, Refund, 4},
	}, func(t *testing.T, a Algorithm, d []Decision) {
		if !d[4].Allowed || d[4].Remaining != 8 {
			t.Fatalf("the third's charge after the second reset: %+v", d[4])
		}
		if d[5].Remaining != 8 || d[6].Remaining != 8 {
			t.Errorf("the refunds of charges a reset cleared (%v, %v): remaining %d and %d, want 8", d[0].Window, d[2].Window, d[5].Remaining, d[6].Remaining)
		}
		if d[7].Remaining != 10 {
			t.Errorf("the third's refund (window %v): remaining %d, want 10", d[4].Window, d[7].Remaining)
		}
	})
}
