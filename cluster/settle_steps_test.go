package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// The record of hits to settle sums hits per key, keeps the last request's
// parameters, holds at most maxDebtBytes, counts what it cannot hold as
// dropped, and gives everything back on take.
func TestDebtsSteps(t *testing.T) {
	req := func(key string, limit int64) *limiter.Request {
		return &limiter.Request{Name: "n", Key: key, Hits: 1, Limit: limit, Period: time.Hour, Algorithm: limiter.FixedWindow}
	}
	d := newDebts()
	for i, st := range []struct {
		do                        func()
		wantRecorded, wantDropped int64
		wantKeys                  int
	}{
		{func() { d.add(req("a", 10), 3, true) }, 3, 0, 1},
		{func() { d.add(req("a", 20), 2, false) }, 5, 0, 1},
		{func() { d.add(req("b", 10), 0, true) }, 5, 0, 1}, // nothing admitted: nothing recorded
		{func() {
			for k := 0; ; k++ {
				before := d.dropped.Load()
				d.add(req(fmt.Sprintf("k%08d", k), 10), 1, true)
				if d.dropped.Load() > before {
					return
				}
			}
		}, -1, 1, -1},
		{func() { d.add(req("a", 30), 1, true) }, -1, 1, -1}, // a key held takes more even when full
	} {
		st.do()
		d.mu.Lock()
		keys, bytes := len(d.m), d.bytes
		d.mu.Unlock()
		if st.wantRecorded >= 0 && d.recorded.Load() != st.wantRecorded {
			t.Fatalf("step %d: recorded %d, want %d", i, d.recorded.Load(), st.wantRecorded)
		}
		if d.dropped.Load() != st.wantDropped {
			t.Fatalf("step %d: dropped %d, want %d", i, d.dropped.Load(), st.wantDropped)
		}
		if st.wantKeys >= 0 && keys != st.wantKeys {
			t.Fatalf("step %d: %d keys, want %d", i, keys, st.wantKeys)
		}
		if bytes > maxDebtBytes {
			t.Fatalf("step %d: %d bytes held, bound %d", i, bytes, maxDebtBytes)
		}
	}
	ds := d.take()
	var a debt
	for _, x := range ds {
		if x.req.Key == "a" {
			a = x
		}
	}
	if a.req.Hits != 6 || a.req.Limit != 30 || !a.local {
		t.Fatalf("key a: %+v, want 6 hits at limit 30, local", a)
	}
	if d.take() != nil || d.bytes != 0 {
		t.Fatal("take left something behind")
	}
}
