package fakeclock

import (
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSteps(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(start)
	for i, st := range []struct {
		move func()
		want time.Time
	}{
		{func() {}, start},
		{func() { c.Advance(time.Second) }, start.Add(time.Second)},
		{func() { c.Advance(-time.Millisecond) }, start.Add(999 * time.Millisecond)},
		{func() { c.Set(start.Add(time.Hour)) }, start.Add(time.Hour)},
		{func() { c.Set(start) }, start},
	} {
		st.move()
		if got := c.Now(); !got.Equal(st.want) {
			t.Fatalf("step %d: Now = %v, want %v", i, got, st.want)
		}
	}
}

// A clock started at time.Now() reads the wall time alone.
func TestNoMonotonicReading(t *testing.T) {
	c := New(time.Now())
	for i, move := range []func(){func() {}, func() { c.Advance(time.Second) }, func() { c.Set(time.Now()) }} {
		move()
		if s := c.Now().String(); strings.Contains(s, "m=") {
			t.Fatalf("step %d: Now = %s, with a monotonic clock reading", i, s)
		}
	}
}

func TestConcurrentAdvance(t *testing.T) {
	start := time.Unix(1000, 0)
	c := New(start)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(800*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now = %v, want %v", got, want)
	}
}
