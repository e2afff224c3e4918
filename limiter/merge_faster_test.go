package limiter

import (
	"fmt"
	"testing"
	"time"
)

// TestMergeFasterRateNeverLowers merges into a spent key (10 a minute) a
// state that another node charged with one hit at a far faster rate (10
// a second), whose window starts later than the key's: of every
// algorithm, on stores with and without KeepStrictest; and the spent
// state into the other node's. The spent key stays spent at its own rate,
// on both nodes.
func TestMergeFasterRateNeverLowers(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	now := t0.Add(50 * time.Millisecond) // the buckets' hit still held
	for _, strict := range []bool{false, true} {
		for _, a := range Algorithms {
			t.Run(fmt.Sprintf("%s/strict=%v", a, strict), func(t *testing.T) {
				mine := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Period: time.Minute, Algorithm: a}
				theirs := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: a}
				s, other := newTestStore(t), newTestStore(t)
				if strict {
					s, other = newStrictStore(t), newStrictStore(t)
				}
				if d, err := s.CheckAt(mine, t0.Add(-20*time.Second)); err != nil || !d.Allowed {
					t.Fatalf("spending: %+v %v", d, err)
				}
				if d, err := other.CheckAt(theirs, t0); err != nil || !d.Allowed {
					t.Fatalf("charging the other: %+v %v", d, err)
				}
				spent := snapOf(t, s, mine, now)
				mustMerge(t, s, []Snapshot{snapOf(t, other, theirs, now)}, now)
				// The other way: the spent state, whose window began
				// earlier, into the node that charged one hit.
				mustMerge(t, other, []Snapshot{spent}, now)
				if d, err := other.CheckAt(mine, now); err != nil || d.Allowed {
					t.Fatalf("the other node, after receiving the spent state, admitted its limit: %+v %v", d, err)
				}
				one := mine
				one.Hits = 1
				if d, err := s.CheckAt(one, now); err != nil || d.Allowed {
					t.Fatalf("after the merge, the spent key admitted a hit at its own rate: %+v %v", d, err)
				}
			})
		}
	}
}

// TestMergeLogKeepsRecentHits merges into a sliding window log that holds
// 10 recent hits (of 20 an hour) another node's log of 11 hits that are
// about to leave the window: the merged key, a second later, still counts
// the 10 recent hits.
func TestMergeLogKeepsRecentHits(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	req := Request{Name: "n", Key: "k", Limit: 20, Period: time.Hour, Algorithm: SlidingWindowLog}
	old, recent := req, req
	old.Hits, recent.Hits = 11, 10
	now := t0.Add(time.Hour - 500*time.Millisecond)
	s, other := newTestStore(t), newTestStore(t)
	if d, err := other.CheckAt(old, t0); err != nil || !d.Allowed {
		t.Fatalf("charging the other: %+v %v", d, err)
	}
	if d, err := s.CheckAt(recent, now.Add(-time.Second)); err != nil || !d.Allowed {
		t.Fatalf("charging: %+v %v", d, err)
	}
	mustMerge(t, s, []Snapshot{snapOf(t, other, old, now)}, now)
	peek := req
	if d, err := s.CheckAt(peek, now.Add(time.Second)); err != nil || d.Remaining > 10 {
		t.Fatalf("a second later, the merged log counts %d of 20: the 10 recent hits are lost", 20-d.Remaining)
	}
}
