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

// AfterFunc calls fire when the clock is moved past them, in any order of
// moves, and never once stopped.
func TestAfterFunc(t *testing.T) {
	c := New(time.Unix(1_000, 0))
	fired := make(chan int, 8)
	stops := map[int]func() bool{}
	for i, d := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		stops[i] = c.AfterFunc(d, func() { fired <- i })
	}
	for i, st := range []struct {
		move func()
		want []int // the timers that fire, in any order
	}{
		{func() { c.Advance(999 * time.Millisecond) }, nil},
		{func() { c.Advance(time.Millisecond) }, []int{0}},
		{func() {
			if !stops[1]() {
				t.Error("stop of a pending timer reports false")
			}
		}, nil},
		{func() { c.Set(time.Unix(1_010, 0)) }, []int{2}},
		{func() {
			if stops[2]() {
				t.Error("stop of a fired timer reports true")
			}
		}, nil},
	} {
		st.move()
		got := map[int]bool{}
		for range st.want {
			got[<-fired] = true
		}
		for _, w := range st.want {
			if !got[w] {
				t.Fatalf("step %d: timer %d did not fire", i, w)
			}
		}
		select {
		case f := <-fired:
			t.Fatalf("step %d: timer %d fired too", i, f)
		default:
		}
	}
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	<-done
}
