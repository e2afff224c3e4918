package limiter

import (
	"testing"
	"time"
)

// A clock step or a state received from a peer whose clock is ahead,
// combined with another algorithm, a refund or a reset: no count is
// lowered and no key held longer than its limit allows.

// A clock stepped back by more than the 100 ms read as a late reading,
// across a window boundary, then a check of another algorithm: the spent
// sliding window counter is bounded by now as its own algorithm reads it
// before it is converted, so its consumption carries over.
func TestStepBackThenSwitchKeepsSlidingCounter(t *testing.T) {
	for _, back := range []time.Duration{101 * time.Millisecond, time.Second, time.Hour} {
		for _, to := range Algorithms {
			if to == SlidingWindowCounter {
				continue
			}
			swc := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: SlidingWindowCounter, Hits: 10}
			spentAt := t0.Add(10*time.Second + 50*time.Millisecond) // window [10 s, 11 s)
			now := spentAt.Add(-back)                               // before the window began

			// Control: the same step back without a switch keeps it spent.
			ctl := newTestStore(t)
			if d, _ := ctl.CheckAt(swc, spentAt); !d.Allowed {
				t.Fatal("control: first spend denied")
			}
			probe := swc
			probe.Hits = 1
			if d, _ := ctl.CheckAt(probe, now); d.Allowed {
				t.Fatalf("control: step back %v alone admitted a spent key", back)
			}

			s := newTestStore(t)
			if d, _ := s.CheckAt(swc, spentAt); !d.Allowed {
				t.Fatal("first spend denied")
			}
			other := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: to, Hits: 10}
			d, err := s.CheckAt(other, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Errorf("step back %v, then %v: a sliding_window_counter key spent 10/10 admitted 10 more hits (Remaining %d)", back, to, d.Remaining)
			}
		}
	}
}

// The same through a state received from a peer whose clock is 2 s
// ahead: it is clamped as its own algorithm reads it before it is
// converted.
func TestReceivedSlidingCounterAheadThenSwitch(t *testing.T) {
	peer := newTestStore(t)
	swc := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: SlidingWindowCounter, Hits: 10}
	ahead := t0.Add(2 * time.Second)
	if d, _ := peer.CheckAt(swc, ahead); !d.Allowed {
		t.Fatal("spend denied")
	}
	sn, ok := peer.Snapshot("n", "k", ahead)
	if !ok {
		t.Fatal("no snapshot")
	}
	s := newTestStore(t)
	if n, err := s.Merge([]Snapshot{sn}, t0); err != nil || n != 1 {
		t.Fatalf("merge: %d, %v", n, err)
	}
	ctl := newTestStore(t)
	ctl.Merge([]Snapshot{sn}, t0)
	probe := swc
	probe.Hits = 1
	if d, _ := ctl.CheckAt(probe, t0); d.Allowed {
		t.Fatal("control: the received state with its own algorithm admitted")
	}
	other := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: TokenBucket, Hits: 10}
	if d, _ := s.CheckAt(other, t0); d.Allowed {
		t.Errorf("a received sliding_window_counter state spent 10/10 (peer clock 2 s ahead) admitted 10 more hits as token_bucket")
	}
}

// A refund or a reset that leaves a GCRA key's arrival time at now
// records a lead of 0, which a clock stepped back then bounds: the key is
// read as not spent, not held for the length of the step.
func TestRefundThenStepBackReleasesGCRA(t *testing.T) {
	for _, give := range []struct {
		name string
		edit func(r *Request)
	}{
		{"refund of 3", func(r *Request) { r.Behavior = Refund }},
		{"reset (hits 0)", func(r *Request) { r.Hits, r.Behavior = 0, Reset }},
	} {
		for _, a := range Algorithms {
			s := newTestStore(t)
			req := Request{Name: "n", Key: "k", Limit: 10, Period: time.Second, Algorithm: a, Hits: 3}
			at := t0.Add(time.Hour)
			if d, _ := s.CheckAt(req, at); !d.Allowed {
				t.Fatal("spend denied")
			}
			r := req
			give.edit(&r)
			s.CheckAt(r, at)
			probe := req
			probe.Hits = 1
			d, _ := s.CheckAt(probe, t0) // the clock stepped back an hour
			if !d.Allowed && d.RetryAfter > time.Second {
				t.Errorf("%v: 3 hits taken, then a %s, then the clock stepped back 1 h: a 10/s key denied, RetryAfter %v", a, give.name, d.RetryAfter)
			}
		}
	}
}
