package daemon

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/labelset"
)

// hitCounters keeps the series of admitted domains and keys only: hits
// on keys beyond the label set's room count under _other and are never
// kept, so that a caller sending new keys cannot grow it; kept series
// keep counting, and a stat that never counted has no series.
func TestHitCountersKeepOnlyAdmittedKeys(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "h"}, []string{"domain", "key", "stat"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(vec)
	series := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[string]float64)
		for _, mf := range mfs {
			for _, x := range mf.GetMetric() {
				l := x.GetLabel()
				m[l[0].GetValue()+"/"+l[1].GetValue()+"/"+l[2].GetValue()] = x.GetCounter().GetValue()
			}
		}
		return m
	}
	c := newHitCounters(vec, labelset.New(2, 16), labelset.New(3, 16))
	kept := func() int {
		n := 0
		c.known.Range(func(any, any) bool { n++; return true })
		return n
	}
	for _, s := range []struct {
		domain, key       string
		within, over      uint64
		wantKept, wantSer int
	}{
		{domain: "a", key: "a.k0", within: 1, wantKept: 1, wantSer: 2},
		{domain: "a", key: "a.k0", within: 1, wantKept: 1, wantSer: 2},
		{domain: "a", key: "a.k0", over: 1, wantKept: 1, wantSer: 3},
		{domain: "a", key: "a.k1", within: 1, wantKept: 2, wantSer: 5},
		{domain: "b", key: "a.k1", within: 1, wantKept: 3, wantSer: 7},
		{domain: "b", key: "b.k2", within: 1, wantKept: 4, wantSer: 9},
		// The key set is full: new keys count under _other, unkept.
		{domain: "b", key: "b.k3", within: 1, wantKept: 4, wantSer: 11},
		{domain: "b", key: "b.k4", within: 1, wantKept: 4, wantSer: 11},
		// So is the domain set; and a key too long is never admitted.
		{domain: "c", key: "a.k0", within: 1, wantKept: 4, wantSer: 13},
		{domain: "a", key: "a.0123456789abcdef", within: 1, wantKept: 4, wantSer: 15},
	} {
		c.add(&envoyrls.Hit{Domain: s.domain, Key: s.key, TotalHits: s.within + s.over, WithinLimit: s.within, OverLimit: s.over})
		if got := kept(); got != s.wantKept {
			t.Fatalf("after %+v: %d kept, want %d", s, got, s.wantKept)
		}
		if got := len(series()); got != s.wantSer {
			t.Fatalf("after %+v: %d series, want %d", s, got, s.wantSer)
		}
	}
	for _, w := range []struct {
		domain, key, stat string
		want              float64
	}{
		{"a", "a.k0", "total_hits", 3}, {"a", "a.k0", "within_limit", 2}, {"a", "a.k0", "over_limit", 1},
		{"b", "_other", "total_hits", 2}, {"_other", "a.k0", "total_hits", 1}, {"a", "_other", "within_limit", 1},
	} {
		name := fmt.Sprint(w.domain, "/", w.key, "/", w.stat)
		if got := series()[name]; got != w.want {
			t.Errorf("%s: %v, want %v", name, got, w.want)
		}
	}
}
