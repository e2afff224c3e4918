package limiter

import (
	"testing"
	"time"
)

// Concurrent callers read the clock before taking the store's lock, so a
// fixed window may see a now older than the window it stored: the hit
// counts in the stored window, and the window before it does not reopen.
func TestFixedWindowOlderNow(t *testing.T) {
	s, err := NewStore(DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "w", Key: "k", Hits: 1, Limit: 2, Period: time.Second, Algorithm: FixedWindow}
	second := time.Unix(100, 0) // a window's start
	steps := []struct {
		at          time.Time
		wantAllowed bool
		wantReset   time.Time
	}{
		{second.Add(time.Millisecond), true, second.Add(time.Second)},
		{second.Add(-time.Millisecond), true, second.Add(time.Second)}, // older: counts in the stored window
		{second.Add(-2 * time.Millisecond), false, second.Add(time.Second)},
		{second.Add(2 * time.Millisecond), false, second.Add(time.Second)},
		{second.Add(time.Second), true, second.Add(2 * time.Second)},
	}
	for i, st := range steps {
		d, err := s.CheckAt(req, st.at)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != st.wantAllowed || !d.ResetAt.Equal(st.wantReset) {
			t.Fatalf("step %d: allowed %v reset %v, want %v %v", i, d.Allowed, d.ResetAt, st.wantAllowed, st.wantReset)
		}
	}
}

// The sliding window counter likewise decides a now older than its stored
// window as at that window's start, keeping its counts where they are.
func TestSlidingCounterOlderNow(t *testing.T) {
	s, err := NewStore(DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "w", Key: "k", Hits: 1, Limit: 2, Period: time.Second, Algorithm: SlidingWindowCounter}
	second := time.Unix(100, 0) // a window's start
	for i, st := range []struct {
		at          time.Time
		wantAllowed bool
	}{
		{second.Add(time.Millisecond), true},
		{second.Add(-time.Millisecond), true}, // older: counts in the stored window
		{second.Add(2 * time.Millisecond), false},
		{second.Add(-2 * time.Millisecond), false},
	} {
		d, err := s.CheckAt(req, st.at)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != st.wantAllowed {
			t.Fatalf("step %d: allowed %v, want %v", i, d.Allowed, st.wantAllowed)
		}
	}
}
