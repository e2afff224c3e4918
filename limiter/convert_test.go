package limiter

import (
	"fmt"
	"testing"
	"time"
)

// TestAlgorithmSwitchKeepsConsumption switches a key between every pair of
// algorithms, after every amount of consumption and at several instants of
// the period, with the same Limit, Period and Burst (a rules rollout that
// changes a key's algorithm), and asserts the bound doc.go states: with r
// what the old algorithm has Remaining at the switch s,
//
//   - at s the new algorithm has Remaining r too: never more (a spent key
//     stays spent), and
//   - a check of one hit with the new algorithm at s, then greedy takes at
//     every step of the period, admit no more in total than the same on a
//     key of the new algorithm that was fresh and took Limit-r hits at s.
//
// The check converts the key (a peek keeps nothing). A switch that
// discarded the old state would admit the whole Limit at s.
func TestAlgorithmSwitchKeepsConsumption(t *testing.T) {
	const limit, period = 10, time.Second
	for _, from := range Algorithms {
		for _, to := range Algorithms {
			if from == to {
				continue
			}
			t.Run(from.String()+">"+to.String(), func(t *testing.T) {
				for _, spent := range []int64{1, 4, limit} {
					for _, after := range []time.Duration{0, period / 3, 2 * period / 3, period - 1} {
						checkSwitch(t, from, to, spent, after)
					}
				}
			})
		}
	}
}

func checkSwitch(t *testing.T, from, to Algorithm, spent int64, after time.Duration) {
	t.Helper()
	const limit, period = 10, time.Second
	old := Request{Name: "rule", Key: "k", Hits: spent, Limit: limit, Period: period, Algorithm: from}
	s := newTestStore(t)
	mustCheck(t, s, old, t0)
	at := t0.Add(after)
	old.Hits = 0
	r := mustCheck(t, s, old, at).Remaining

	req := old
	req.Algorithm = to
	if d := mustCheck(t, s, req, at); d.Remaining != r || (r == 0) == d.Allowed {
		t.Fatalf("spent %d, switched %v later: %v had Remaining %d, %v peeks %+v", spent, after, from, r, to, d)
	}
	ref := newTestStore(t)
	if r < limit {
		if took, _, err := ref.TakeAt(req, limit-r, at); err != nil || took != limit-r {
			t.Fatalf("the reference key took %d of %d: %v", took, limit-r, err)
		}
	}
	req.Hits = 1
	var got, want int64
	if mustCheck(t, s, req, at).Allowed {
		got++
	}
	if mustCheck(t, ref, req, at).Allowed {
		want++
	}
	for step := time.Duration(0); step <= period; step += period / 40 {
		now := at.Add(step)
		g, _, err := s.TakeAt(req, limit, now)
		if err != nil {
			t.Fatal(err)
		}
		w, _, err := ref.TakeAt(req, limit, now)
		if err != nil {
			t.Fatal(err)
		}
		got, want = got+g, want+w
		if got > want {
			t.Fatalf("spent %d, switched %v later: by %v after the switch the key admitted %d, a key of %v that took %d at the switch %d",
				spent, after, step, got, to, limit-r, want)
		}
	}
}

// TestPeekKeepsNothing peeks at a key of every algorithm with every
// parameter a caller can change (another algorithm, a higher or lower
// limit, a longer or shorter period, a burst, DrainOverLimit, Refund),
// spent or partly spent, received from a peer or not, and asserts that the
// store's snapshot of the key, its byte count and its list of changed keys
// are what they were; TakeAt that takes nothing keeps nothing either. A
// peek at limit 3,000,000 followed by a check at limit 3 finds the key
// spent.
func TestPeekKeepsNothing(t *testing.T) {
	base := Request{Name: "api", Key: "k", Limit: 3, Period: time.Second, Algorithm: GCRA}
	type peek struct {
		name string
		edit func(r *Request)
	}
	peeks := []peek{
		{"limit 3,000,000", func(r *Request) { r.Limit = 3_000_000 }},
		{"limit 1", func(r *Request) { r.Limit = 1 }},
		{"period 1µs", func(r *Request) { r.Period = time.Microsecond }},
		{"period 1000h", func(r *Request) { r.Period = 1000 * time.Hour }},
		{"burst 100", func(r *Request) { r.Burst = 100 }},
		{"drain_over_limit", func(r *Request) { r.Behavior = DrainOverLimit }},
		{"refund", func(r *Request) { r.Behavior = Refund }},
	}
	for _, a := range Algorithms {
		if a == FixedWindow {
			peeks = append(peeks, peek{"calendar day", func(r *Request) {
				r.Calendar, r.Period = Day, 0
			}})
		}
		for _, b := range Algorithms {
			if b != a {
				peeks = append(peeks, peek{"algorithm " + b.String(), func(r *Request) { r.Algorithm = b }})
			}
		}
		for _, spent := range []int64{1, 3} {
			for _, received := range []bool{false, true} {
				s, err := NewStore(StoreConfig{Shards: 1, TrackChanges: true})
				if err != nil {
					t.Fatal(err)
				}
				req := base
				req.Algorithm, req.Hits = a, spent
				mustCheck(t, s, req, t0)
				if received {
					sn, _ := s.Snapshot(req.Name, req.Key, t0)
					s.Forget(req.Name, req.Key)
					mustMerge(t, s, []Snapshot{sn}, t0)
				}
				s.Changed(t0, func(Snapshot) {})
				now := t0.Add(100 * time.Millisecond)
				before := storeState(s, req, now)
				for _, p := range peeks {
					r := req
					r.Hits = 0
					p.edit(&r)
					if r.Algorithm.HasBurst() != a.HasBurst() && r.Burst != 0 && !r.Algorithm.HasBurst() {
						r.Burst = 0
					}
					if r.Calendar != NoCalendar && r.Algorithm != FixedWindow {
						continue
					}
					d, err := s.CheckAt(r, now)
					if err != nil {
						t.Fatalf("%v, %s: %v", a, p.name, err)
					}
					if after := storeState(s, req, now); after != before {
						t.Fatalf("%v spent %d (received %v): a peek with %s changed the store:\n%s\n%s", a, spent, received, p.name, before, after)
					}
					if d.Remaining > 0 {
						continue
					}
					if took, _, err := s.TakeAt(r, 1, now); err != nil || took != 0 {
						t.Fatalf("%v, %s: a peek left nothing, TakeAt took %d: %v", a, p.name, took, err)
					}
					if after := storeState(s, req, now); after != before {
						t.Fatalf("%v spent %d (received %v): a take of none with %s changed the store:\n%s\n%s", a, spent, received, p.name, before, after)
					}
				}
				if n := s.Changed(now, func(Snapshot) {}); n != 0 {
					t.Fatalf("%v: peeks listed %d changed keys", a, n)
				}
			}
		}
		peeks = peeks[:7]
	}

	// The attack of a peek at a far higher limit: the spent key stays spent.
	s := newTestStore(t)
	spent := base
	spent.Hits = 3
	mustCheck(t, s, spent, t0)
	high := base
	high.Hits, high.Limit = 0, 3_000_000
	mustCheck(t, s, high, t0)
	check := base
	check.Hits = 1
	if d := mustCheck(t, s, check, t0.Add(time.Millisecond)); d.Allowed {
		t.Fatalf("a peek at limit 3,000,000 re-admitted a spent key: %+v", d)
	}
}

// storeState is what s holds for req's key, and its counters, as text.
func storeState(s *Store, req Request, now time.Time) string {
	sn, ok := s.Snapshot(req.Name, req.Key, now)
	cp := copyState(s, &req)
	return fmt.Sprintf("%v %#v received %v, %d keys, %d bytes", ok, sn, cp.st.isReceived(), s.Len(), s.Bytes())
}
