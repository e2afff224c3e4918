package cluster

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Parts restored from a data directory join the record as they were
// written, without being written again; this node's own restored part is
// closed, so that its next stand-in hits start a part of a later
// generation, which marks the key for the next segment.
func TestStandinRestoredParts(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rec := newStandins("self", now)
	rec.keepDirty()
	req := limiter.Request{Name: "n", Key: "k", Hits: 30, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CheckAt(req, now); err != nil {
		t.Fatal(err)
	}
	sn, _ := store.Snapshot(req.Name, req.Key, now)
	charge := req
	charge.Hits = 0
	// A generation of an earlier run whose clock read later than this
	// one's does now.
	restoredGen := uint64(now.Add(time.Hour).UnixNano())
	sn.Settle = &limiter.Settlement{Request: charge, Parts: []limiter.SettlePart{
		{Origin: "self", Gen: restoredGen, Hits: 20}, {Origin: "other", Gen: 3, Hits: 10}}}
	rec.restore([]limiter.Snapshot{sn})

	sets := rec.settlements()
	got, ok := sets[debtKey{req.Name, req.Key}]
	if !ok || len(got.Parts) != 2 || got.Parts[0] != sn.Settle.Parts[0] || got.Parts[1] != sn.Settle.Parts[1] || got.Request != charge {
		t.Fatalf("restored settlement %+v, want %+v", got, sn.Settle)
	}
	if d := rec.takeDirty(); len(d) != 0 {
		t.Fatalf("restored parts marked for writing: %v", d)
	}

	one := req
	one.Hits = 1
	rec.record(&one, 1)
	if d := rec.takeDirty(); len(d) != 1 || d[0] != (debtKey{req.Name, req.Key}) {
		t.Fatalf("a stand-in hit marked %v, want the key", d)
	}
	parts := rec.settlements()[debtKey{req.Name, req.Key}].Parts
	if len(parts) != 3 || parts[2].Origin != "self" || parts[2].Gen <= restoredGen || parts[2].Hits != 1 || parts[0].Hits != 20 {
		t.Fatalf("parts %+v after a stand-in hit, want the restored two unchanged and a new part of self after generation %d", parts, restoredGen)
	}
	if d := rec.takeDirty(); len(d) != 0 {
		t.Fatalf("taken twice: %v", d)
	}
}
