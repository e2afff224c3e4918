package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeAfter records the durations Wait asks for and returns channels that
// fire only when the test fires them.
type fakeAfter struct {
	asked []time.Duration
	ch    chan time.Time
}

func newFakeAfter() *fakeAfter { return &fakeAfter{ch: make(chan time.Time, 1)} }

func (f *fakeAfter) after(d time.Duration) <-chan time.Time {
	f.asked = append(f.asked, d)
	return f.ch
}

func TestWait(t *testing.T) {
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()

	t.Run("not allowed", func(t *testing.T) {
		f := newFakeAfter()
		if err := Wait(ctx, Decision{RetryAfter: time.Second}, f.after); !errors.Is(err, ErrNotAllowed) {
			t.Fatalf("Wait = %v", err)
		}
		if len(f.asked) != 0 {
			t.Fatalf("asked for %v", f.asked)
		}
	})
	t.Run("no delay", func(t *testing.T) {
		f := newFakeAfter()
		if err := Wait(ctx, Decision{Allowed: true}, f.after); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if err := Wait(canceled, Decision{Allowed: true}, f.after); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait on a canceled context = %v", err)
		}
		if len(f.asked) != 0 {
			t.Fatalf("asked for %v", f.asked)
		}
	})
	t.Run("delay passes", func(t *testing.T) {
		f := newFakeAfter()
		f.ch <- t0
		if err := Wait(ctx, Decision{Allowed: true, Delay: 300 * time.Millisecond}, f.after); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if len(f.asked) != 1 || f.asked[0] != 300*time.Millisecond {
			t.Fatalf("asked for %v", f.asked)
		}
	})
	t.Run("context ends first", func(t *testing.T) {
		f := newFakeAfter() // never fires
		if err := Wait(canceled, Decision{Allowed: true, Delay: time.Hour}, f.after); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v", err)
		}
		if len(f.asked) != 1 || f.asked[0] != time.Hour {
			t.Fatalf("asked for %v", f.asked)
		}
	})
	t.Run("real timer, context ends first", func(t *testing.T) {
		if err := Wait(canceled, Decision{Allowed: true, Delay: time.Hour}, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v", err)
		}
	})
}

// TestWaitPacesLeakyBucket admits a burst into a leaky bucket at one instant
// and waits each request out with a fake timer: the waits are the outflow
// schedule, one every Period/Limit.
func TestWaitPacesLeakyBucket(t *testing.T) {
	s := newTestStore(t)
	req := Request{Name: "api", Key: "k", Hits: 1, Limit: 4, Period: time.Second, Burst: 5, Algorithm: LeakyBucket}
	f := newFakeAfter()
	var waited []time.Duration
	for range 6 {
		d, err := s.CheckAt(req, t0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Delay > 0 {
			f.ch <- t0
		}
		err = Wait(context.Background(), d, f.after)
		switch {
		case d.Allowed && err != nil:
			t.Fatalf("Wait = %v", err)
		case !d.Allowed && !errors.Is(err, ErrNotAllowed):
			t.Fatalf("Wait on a rejection = %v", err)
		}
		waited = append(waited, d.Delay)
	}
	const q = 250 * time.Millisecond
	want := []time.Duration{0, q, 2 * q, 3 * q, 4 * q, 0}
	for i := range want {
		if waited[i] != want[i] {
			t.Fatalf("delays %v, want %v", waited, want)
		}
	}
	if len(f.asked) != 4 {
		t.Fatalf("timer asked for %v", f.asked)
	}
	// Half a slot later, the first two have left and the queue holds 3.5:
	// the next request waits for them.
	d, err := s.CheckAt(req, t0.Add(q+q/2))
	if err != nil || !d.Allowed || d.Delay != 3*q+q/2 {
		t.Fatalf("after 375ms: %+v, %v", d, err)
	}
}
