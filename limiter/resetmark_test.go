package limiter

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// The reset's mark travels with the key's state: every way a state
// leaves a store (Snapshot, Range, Changed, the state format) carries it,
// and Merge keeps the later of the store's own mark and the received one.

// markCarriers are the ways a key's state leaves one store for another,
// each returning what old exports of (name, key) at now.
var markCarriers = []struct {
	name   string
	export func(t *testing.T, old *Store, now time.Time) []Snapshot
}{
	{"Snapshot", func(t *testing.T, old *Store, now time.Time) []Snapshot {
		if sn, ok := old.Snapshot("n", "k", now); ok {
			return []Snapshot{sn}
		}
		return nil
	}},
	{"Range", func(t *testing.T, old *Store, now time.Time) []Snapshot {
		var out []Snapshot
		old.Range(now, func(sn Snapshot) bool { out = append(out, sn); return true })
		return out
	}},
	{"Changed", func(t *testing.T, old *Store, now time.Time) []Snapshot {
		var out []Snapshot
		old.Changed(now, func(sn Snapshot) { out = append(out, sn) })
		return out
	}},
	{"state format", func(t *testing.T, old *Store, now time.Time) []Snapshot {
		var out []Snapshot
		old.Range(now, func(sn Snapshot) bool {
			b, err := sn.MarshalBinary()
			if err != nil {
				t.Fatalf("encoding %+v: %v", sn, err)
			}
			var back Snapshot
			if err := back.UnmarshalBinary(b); err != nil {
				t.Fatalf("decoding %+v from %x: %v", sn, b, err)
			}
			if back.ResetAt != sn.ResetAt || back.ResetUntil != sn.ResetUntil || !sameSnapshot(back, sn) {
				t.Fatalf("%+v decoded as %+v", sn, back)
			}
			out = append(out, back)
			return true
		})
		return out
	}},
}

// TestResetMarkTravels: a key charged 3 (mine), reset with 0 or 1 hits,
// then carried to another store by each carrier: there, after others
// charge 4, a refund naming my charge gives nothing back, and a refund of
// theirs gives their 4 back, for every algorithm. A reset of 0 hits
// leaves the state fresh: the mark travels alone (Range, Changed and the
// state format carry it; Snapshot reports no live state).
func TestResetMarkTravels(t *testing.T) {
	for _, a := range Algorithms {
		for _, c := range markCarriers {
			for _, resetHits := range []int64{0, 1} {
				name := a.String() + "/" + c.name + "/reset" + string(rune('0'+resetHits))
				t.Run(name, func(t *testing.T) {
					old, err := NewStore(StoreConfig{Shards: 4, TrackChanges: true})
					if err != nil {
						t.Fatal(err)
					}
					nu := newTestStore(t)
					base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
					mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
					attackCheck(t, old, base, t0, 2*time.Second, resetHits, Reset, Window{})
					snaps := c.export(t, old, t0.Add(2*time.Second))
					if c.name != "Snapshot" || resetHits > 0 {
						if len(snaps) != 1 || snaps[0].ResetAt != t0.Add(2*time.Second).UnixNano() || snaps[0].ResetUntil <= snaps[0].ResetAt {
							t.Fatalf("exported %+v, want one state with the reset's mark", snaps)
						}
						if resetHits == 0 && !snaps[0].MarkOnly() {
							t.Fatalf("exported %+v, want the mark alone", snaps[0])
						}
					}
					if _, err := nu.Merge(snaps, t0.Add(2*time.Second)); err != nil {
						t.Fatal(err)
					}
					recount(t, nu)
					theirs := attackCheck(t, nu, base, t0, 3*time.Second, 4, 0, Window{})
					want := 10 - resetHits - 4
					if !theirs.Allowed || theirs.Remaining != want {
						t.Fatalf("the others' charge on the new store: %+v, want remaining %d", theirs, want)
					}
					if c.name == "Snapshot" && resetHits == 0 {
						return // nothing carried: the gap the other carriers close
					}
					if d := attackCheck(t, nu, base, t0, 3*time.Second, 3, Refund, mine.Window); d.Remaining != want {
						t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d", d.Remaining, want)
					}
					if d := attackCheck(t, nu, base, t0, 3*time.Second, 4, Refund, theirs.Window); d.Remaining != want+4 {
						t.Errorf("the refund of the others' charge after the reset: remaining %d, want %d", d.Remaining, want+4)
					}
				})
			}
		}
	}
}

// TestMergeKeepsTheLaterMark: a store whose own mark is a reset at 2s
// keeps it over a received mark of 1.5s, and takes a received mark of
// 3.5s over it; neither changes what the key counts.
func TestMergeKeepsTheLaterMark(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newTestStore(t)
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			attackCheck(t, s, base, t0, time.Second, 3, 0, Window{})
			attackCheck(t, s, base, t0, 2*time.Second, 0, Reset, Window{})
			after := attackCheck(t, s, base, t0, 3*time.Second, 2, 0, Window{})
			until := t0.Add(time.Hour).UnixNano()
			mark := func(at time.Duration) {
				t.Helper()
				before := attackCheck(t, s, base, t0, 3*time.Second, 0, 0, Window{})
				sn := Snapshot{Name: "n", Key: "k", Algorithm: a, ResetAt: t0.Add(at).UnixNano(), ResetUntil: until}
				if _, err := s.Merge([]Snapshot{sn}, t0.Add(3*time.Second)); err != nil {
					t.Fatal(err)
				}
				recount(t, s)
				if d := attackCheck(t, s, base, t0, 3*time.Second, 0, 0, Window{}); d.Remaining != before.Remaining {
					t.Fatalf("merging a mark at %v changed the count: remaining %d, was %d", at, d.Remaining, before.Remaining)
				}
			}
			own, _ := s.Snapshot("n", "k", t0.Add(3*time.Second))
			mark(1500 * time.Millisecond)
			if sn, _ := s.Snapshot("n", "k", t0.Add(3*time.Second)); sn.ResetAt != t0.Add(2*time.Second).UnixNano() || sn.ResetUntil != max(until, own.ResetUntil) {
				t.Fatalf("after an earlier mark: %+v, want the reset at 2s until the later of %d and %d", sn, until, own.ResetUntil)
			}
			mark(3500 * time.Millisecond)
			// A snapshot carries a mark's instant at most at its own now.
			if sn, _ := s.Snapshot("n", "k", t0.Add(3500*time.Millisecond)); sn.ResetAt != t0.Add(3500*time.Millisecond).UnixNano() {
				t.Fatalf("after a later mark: %+v, want the mark at 3.5s", sn)
			}
			// The charge at 3s is before the later mark: its refund gives
			// nothing back (over-counts, never under).
			if d := attackCheck(t, s, base, t0, 3*time.Second, 2, Refund, after.Window); d.Remaining != 8 {
				t.Errorf("the refund of a charge before the later mark: remaining %d, want 8", d.Remaining)
			}
		})
	}
}

// TestForgedResetMarks: marks no store could have written are refused
// with ErrInvalidSnapshot, the key's state untouched; a mark within the
// bounds, however far ahead, never lowers what a key counts.
func TestForgedResetMarks(t *testing.T) {
	now := t0.Add(3 * time.Second)
	n := now.UnixNano()
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newTestStore(t)
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, s, base, t0, time.Second, 9, 0, Window{})
			live, _ := s.Snapshot("n", "k", now)
			for _, f := range []struct {
				name      string
				at, until int64
				alone     bool
				msg       string
				invalid   bool // refused by Validate, not only by its times at now
			}{
				{"instant past the skew", n + int64(MaxClockSkew) + 1, n + int64(time.Hour), false, "ResetAt", false},
				{"largest instant", math.MaxInt64 - 1, math.MaxInt64, true, "ResetAt", false},
				{"end past the state life", n, n + int64(MaxClockSkew+MaxStateLife) + 1, false, "ResetUntil", false},
				{"end before instant", n, n - 1, false, "reset mark", true},
				{"negative instant", -5, n, true, "reset mark", true},
				{"end without instant", 0, n + 1, false, "reset mark", true},
				{"instant without end", n, 0, true, "reset mark", true},
			} {
				sn := live
				if f.alone {
					sn = Snapshot{Name: "n", Key: "k", Algorithm: a}
				}
				sn.ResetAt, sn.ResetUntil = f.at, f.until
				changed, err := s.Merge([]Snapshot{sn}, now)
				if changed != 0 || !errors.Is(err, ErrInvalidSnapshot) || !strings.Contains(err.Error(), f.msg) {
					t.Errorf("%s: merged %d, error %v, want ErrInvalidSnapshot naming %q", f.name, changed, err, f.msg)
				}
				if b, err := sn.MarshalBinary(); f.invalid && err == nil {
					t.Errorf("%s: encoded as %x", f.name, b)
				}
			}
			// A mark alone that carries a state is no mark alone.
			bad := Snapshot{Name: "n", Key: "k", Algorithm: a, Words: [3]int64{1, 1, 0}, ResetAt: n, ResetUntil: n + 1}
			if _, err := s.Merge([]Snapshot{bad}, now); !errors.Is(err, ErrInvalidSnapshot) {
				t.Errorf("a mark alone with words: %v", err)
			}
			recount(t, s)
			if d := attackCheck(t, s, base, t0, 3*time.Second, 0, 0, Window{}); d.Remaining != 1 {
				t.Fatalf("after the refused marks: remaining %d, want 1", d.Remaining)
			}
			// The furthest a mark may reach: it changes no count.
			far := Snapshot{Name: "n", Key: "k", Algorithm: a, ResetAt: n + int64(MaxClockSkew), ResetUntil: n + int64(MaxClockSkew+MaxStateLife)}
			if _, err := s.Merge([]Snapshot{far}, now); err != nil {
				t.Fatal(err)
			}
			recount(t, s)
			if d := attackCheck(t, s, base, t0, 3*time.Second, 0, 0, Window{}); d.Remaining != 1 {
				t.Fatalf("after a mark 5m ahead: remaining %d, want 1", d.Remaining)
			}
			if d := attackCheck(t, s, base, t0, 3*time.Second, 9, Refund, mine.Window); d.Remaining != 1 {
				t.Errorf("a refund after a mark 5m ahead: remaining %d, want 1 (nothing back)", d.Remaining)
			}
		})
	}
}

// TestShiftTimesKeepsTheMarksInstant: moving a state to a clock ahead or
// behind leaves the mark's instant (the clock that dated the charges it
// cleared) and moves its end only later.
func TestShiftTimesKeepsTheMarksInstant(t *testing.T) {
	for _, alone := range []bool{false, true} {
		for _, d := range []time.Duration{time.Second, -time.Second} {
			sn := Snapshot{Name: "n", Key: "k", Algorithm: GCRA, ResetAt: 100, ResetUntil: 1000}
			if !alone {
				sn.ExpireAt, sn.Words = 2000, [3]int64{1500, 10, 0}
			}
			sn.ShiftTimes(d)
			if sn.ResetAt != 100 || sn.ResetUntil != max(1000, 1000+int64(d)) {
				t.Errorf("alone %v, shifted %v: mark at %d until %d", alone, d, sn.ResetAt, sn.ResetUntil)
			}
			if err := sn.Validate(); err != nil {
				t.Errorf("alone %v, shifted %v: %v", alone, d, err)
			}
		}
	}
}

// TestStateFormatResetMark: a state with a mark is written in version 3,
// and reads back with it; a state without one is still written in
// version 1 (TestStateFormatVersions), and a mark alone of every
// algorithm round-trips.
func TestStateFormatResetMark(t *testing.T) {
	sn := goldenSnapshot()
	sn.ResetAt, sn.ResetUntil = 1_999_999_999e9+5, 2e18
	b, err := sn.MarshalBinary()
	if err != nil || b[0] != 3 {
		t.Fatalf("written as %x, %v, want version 3", b, err)
	}
	var back Snapshot
	if err := back.UnmarshalBinary(b); err != nil || !sameSnapshot(back, sn) {
		t.Fatalf("read back %+v, %v, want %+v", back, err, sn)
	}
	for _, a := range Algorithms {
		alone := Snapshot{Name: "n", Key: "k", Algorithm: a, ResetAt: 5, ResetUntil: 7}
		b, err := alone.MarshalBinary()
		var back Snapshot
		if err != nil || back.UnmarshalBinary(b) != nil || !sameSnapshot(back, alone) || !back.MarkOnly() {
			t.Errorf("%s: a mark alone written as %x (%v) read back as %+v", a, b, err, back)
		}
	}
}

// TestMergeChargedKeepsTheMark: a stand-in's merge (MergeCharged) takes
// the mark of the state it merges too, into a store that holds a live
// state of the key, none, or whatever the mark comes alone: a refund of a
// charge made before the reset gives nothing back there.
func TestMergeChargedKeepsTheMark(t *testing.T) {
	for _, a := range Algorithms {
		for _, c := range []struct {
			name      string
			own       int64 // hits the receiving store holds of its own
			resetHits int64
		}{{"own state", 2, 1}, {"no state", 0, 1}, {"mark alone", 2, 0}} {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				old, nu := newTestStore(t), newTestStore(t)
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				mine := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
				attackCheck(t, old, base, t0, 2*time.Second, c.resetHits, Reset, Window{})
				if c.own > 0 {
					attackCheck(t, nu, base, t0, 1500*time.Millisecond, c.own, 0, Window{})
				}
				var sn Snapshot
				old.Range(t0.Add(2*time.Second), func(s Snapshot) bool { sn = s; return false })
				if !sn.HasResetMark() {
					t.Fatalf("exported %+v, want a mark", sn)
				}
				if _, _, err := nu.MergeCharged(&sn, base, 0, t0.Add(2*time.Second)); err != nil {
					t.Fatal(err)
				}
				recount(t, nu)
				before := attackCheck(t, nu, base, t0, 3*time.Second, 0, 0, Window{})
				if d := attackCheck(t, nu, base, t0, 3*time.Second, 3, Refund, mine.Window); d.Remaining != before.Remaining {
					t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d (nothing back)", d.Remaining, before.Remaining)
				}
			})
		}
	}
}
