package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// The stand-in record holds at most maxDebtBytes: past it, the hits of a
// key not recorded yet are counted as dropped, and a state sent with
// parts of such a key is merged alone, the larger state winning, as it
// was before stand-in hits were recorded.
func TestStandinRecordBound(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rec := newStandins("self", now)
	req := limiter.Request{Name: "bound", Hits: 1, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	perKey := entrySize(req.Name, "k00000") + int64(len("self")) + partOverhead
	n := int(maxDebtBytes/perKey) + 100
	for i := range n {
		r := req
		r.Key = fmt.Sprintf("k%05d", i)
		rec.record(&r, 1)
	}
	recorded, _, dropped := rec.counts()
	if rec.bytes > maxDebtBytes || dropped == 0 || recorded+dropped != int64(n) {
		t.Fatalf("%d bytes (bound %d), %d hits recorded, %d dropped, of %d", rec.bytes, maxDebtBytes, recorded, dropped, n)
	}

	// A state of a key not recorded, sent with parts: merged alone.
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := req
	r.Key, r.Hits = "new", 30
	if _, err := other.CheckAt(r, now); err != nil {
		t.Fatal(err)
	}
	sn, _ := other.Snapshot(r.Name, r.Key, now)
	sn.Settle = &limiter.Settlement{Request: r, Parts: []limiter.SettlePart{{Origin: "other", Gen: 1, Hits: 30}}}
	r.Hits = 50
	if _, err := store.CheckAt(r, now); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.merge(store, &sn, now); err != nil {
		t.Fatal(err)
	}
	r.Hits = 0
	d, _ := store.CheckAt(r, now)
	if d.Remaining != 50 {
		t.Fatalf("%d remaining, want 50: past the bound the larger state wins", d.Remaining)
	}
	if _, _, after := rec.counts(); after != dropped+30 {
		t.Fatalf("%d hits dropped, want %d", after, dropped+30)
	}
}
