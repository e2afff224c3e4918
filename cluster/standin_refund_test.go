package cluster

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// A refund through a stand-in lowers its open part by the hits it gave
// back, never below zero, and no other part: one restored from before a
// restart, another stand-in's, or any part once this node has granted a
// lease standing in. Steps of one record.
func TestStandinRefundLowersTheOpenPartOnly(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	req := limiter.Request{Name: "refund", Key: "k", Hits: 1, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	restored := limiter.SettlePart{Origin: "self", Gen: 3, Hits: 7}
	other := limiter.SettlePart{Origin: "node-0", Gen: 5, Hits: 30}
	rec := newStandins("self", now)
	rec.restore([]limiter.Snapshot{{Name: req.Name, Key: req.Key, Algorithm: req.Algorithm,
		Settle: &limiter.Settlement{Request: req, Parts: []limiter.SettlePart{restored, other}}}})
	if !rec.reserve(&req) {
		t.Fatal("no room")
	}
	rec.record(&req, 20)
	open := func() int64 {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		e := rec.m[debtKey{req.Name, req.Key}]
		return partHits(e.parts, "self", e.gen)
	}
	for _, st := range []struct {
		name             string
		gave             int64
		algo             limiter.Algorithm
		leased           bool
		wantOpen, wantBy int64
	}{
		{"gives back 5", 5, limiter.FixedWindow, false, 15, 5},
		{"of another algorithm", 5, limiter.GCRA, false, 15, 5},
		{"gives back 40 of 15", 40, limiter.FixedWindow, false, 0, 20},
		{"nothing left to lower", 3, limiter.FixedWindow, false, 0, 20},
	} {
		r := req
		r.Algorithm = st.algo
		rec.refunded(&r, st.gave)
		if got := open(); got != st.wantOpen {
			t.Errorf("%s: open part %d, want %d", st.name, got, st.wantOpen)
		}
		if got := rec.refundedHits.Load(); got != st.wantBy {
			t.Errorf("%s: %d given back off parts, want %d", st.name, got, st.wantBy)
		}
	}
	rec.record(&req, 10)
	rec.leasedStandingIn.Store(true)
	rec.refunded(&req, 4)
	if got := open(); got != 10 {
		t.Errorf("after a lease standing in: open part %d, want 10", got)
	}
	sets := rec.settlements()[debtKey{req.Name, req.Key}]
	if sets == nil || partHits(sets.Parts, "self", 3) != 7 || partHits(sets.Parts, "node-0", 5) != 30 {
		t.Errorf("other parts changed: %+v", sets)
	}
}
