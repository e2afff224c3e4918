package cluster

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Forged settlements, from a peer or a data directory, against a node
// that counts 80 of a key of 100 (50 its own, 30 of node-0's part, which
// it holds): none lowers the count, whatever parts it claims, and a
// restored part of this node's own name at the largest generation does
// lose the hits of its next parts (their generations wrap).
func TestAtk19ForgedSettlements(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	req := limiter.Request{Name: "forged", Key: "k", Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	held := limiter.SettlePart{Origin: "node-0", Gen: 5, Hits: 30}
	setup := func(t *testing.T) (*standins, *limiter.Store) {
		t.Helper()
		store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		r := req
		r.Hits = 80
		if _, err := store.CheckAt(r, now); err != nil {
			t.Fatal(err)
		}
		sn, _ := store.Snapshot(req.Name, req.Key, now)
		sn.Settle = &limiter.Settlement{Request: req, Parts: []limiter.SettlePart{held}}
		rec := newStandins("self", now)
		rec.restore([]limiter.Snapshot{sn})
		return rec, store
	}
	// sent returns a state of the key counting hits, with parts.
	sent := func(t *testing.T, hits int64, parts ...limiter.SettlePart) limiter.Snapshot {
		t.Helper()
		other, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		r := req
		r.Hits = hits
		if _, err := other.CheckAt(r, now); err != nil {
			t.Fatal(err)
		}
		sn, _ := other.Snapshot(req.Name, req.Key, now)
		if len(parts) > 0 {
			sn.Settle = &limiter.Settlement{Request: req, Parts: parts}
		}
		return sn
	}
	for _, tc := range []struct {
		name  string
		sn    func(t *testing.T) limiter.Snapshot
		least int64 // hits the key counts at least after the merge
	}{
		{"a smaller state claiming the held part", func(t *testing.T) limiter.Snapshot { return sent(t, 1, held) }, 80},
		{"a smaller state claiming the held part larger", func(t *testing.T) limiter.Snapshot {
			return sent(t, 1, limiter.SettlePart{Origin: "node-0", Gen: 5, Hits: 100})
		}, 80},
		{"a smaller state claiming parts of this node", func(t *testing.T) limiter.Snapshot {
			return sent(t, 1, limiter.SettlePart{Origin: "self", Gen: 1, Hits: 80}, held)
		}, 80},
		{"a state with parts of negative hits", func(t *testing.T) limiter.Snapshot {
			return sent(t, 1, limiter.SettlePart{Origin: "node-0", Gen: 5, Hits: -1000}, limiter.SettlePart{Origin: "node-1", Gen: 1, Hits: math.MinInt64})
		}, 80},
		{"a state of a new part", func(t *testing.T) limiter.Snapshot {
			return sent(t, 10, limiter.SettlePart{Origin: "node-2", Gen: 1, Hits: 10})
		}, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, store := setup(t)
			sn := tc.sn(t)
			if _, err := rec.merge(store, &sn, now); err != nil {
				t.Logf("merge: %v", err)
			}
			peek := req
			if d, _ := store.CheckAt(peek, now); 100-d.Remaining < tc.least {
				t.Errorf("the key counts %d after the merge, want at least %d", 100-d.Remaining, tc.least)
			}
		})
	}

	t.Run("own part at the largest generation", func(t *testing.T) {
		rec, store := setup(t)
		sn, _ := store.Snapshot(req.Name, req.Key, now)
		sn.Key = "other"
		r := req
		r.Key = "other"
		sn.Settle = &limiter.Settlement{Request: r, Parts: []limiter.SettlePart{{Origin: "self", Gen: math.MaxUint64, Hits: 7}, {Origin: "self", Gen: 1, Hits: 9}}}
		rec.restore([]limiter.Snapshot{sn})
		// Two stand-in records of the key. The generations wrap past
		// the largest (to 0, then the restored 1, whose part then
		// grows): no hit is lost, every one is in a part of this node.
		r.Hits = 1
		rec.record(&r, 1)
		rec.record(&r, 1)
		var own int64
		for _, p := range rec.m[debtKey{r.Name, r.Key}].parts {
			if p.Origin == "self" {
				own += p.Hits
			}
		}
		if own != 7+9+2 {
			t.Errorf("parts %+v: this node's hold %d hits, want %d", rec.m[debtKey{r.Name, r.Key}].parts, own, 7+9+2)
		}
	})
}

// The stand-in record filled to its bound with keys of short names (the
// most entries): the heap it takes is what it counts, within a quarter.
func TestAtk19StandinRecordHeap(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	reqs := make([]limiter.Request, 0, 8000)
	for i := range cap(reqs) {
		reqs = append(reqs, limiter.Request{Name: "n", Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rec := newStandins("node-0", now)
	for i := range reqs {
		rec.record(&reqs[i], 1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d entries, %d bytes counted, %d bytes of heap (bound %d)", len(rec.m), rec.bytes, heap, maxDebtBytes)
	// The requests stay alive through both readings, so that the heap
	// read is the record's alone (their keys the record shares).
	if heap > rec.bytes*5/4 || heap < rec.bytes*3/4 {
		t.Errorf("the record counts %d bytes and takes %d of heap: its estimate is off by more than a quarter", rec.bytes, heap)
	}
	runtime.KeepAlive(rec)
	runtime.KeepAlive(reqs)
}

// A node standing in for a key's owner (the ring with a member cut off
// gives the member the key) with its stand-in record full of parts no
// hand-off carries: a check of the key is refused, consuming nothing, and
// a settlement of hits admitted elsewhere under PolicyAllow waits in the
// debts rather than count as settled. Once a hand-off carries the parts
// that fill the record, the settlement is charged and recorded as this
// node's part.
func TestAtk19StandinFullSettlementWaits(t *testing.T) {
	n, err := New(TestConfig("self"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("still %s after 20s", what)
			}
			runtime.Gosched()
		}
	}
	waitFor("not ready", n.Ready)
	full, err := ring.New(n.ring.Config())
	if err == nil {
		err = full.SetMembers([]ring.Member{{Name: "self", Addr: "127.0.0.1:1"}, {Name: "cut", Addr: "127.0.0.1:2"}})
	}
	if err != nil {
		t.Fatal(err)
	}
	n.standins.full.Store(full)
	var key limiter.Request
	for i := 0; ; i++ {
		key = limiter.Request{Name: "full", Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: limiter.TokenBucket}
		if o, _ := full.Owner(key.Name, key.Key); o.Name == "cut" {
			break
		}
	}
	var fill []limiter.Snapshot
	for i := 0; ; i++ {
		r := limiter.Request{Name: "fill", Key: fmt.Sprintf("f%d", i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow}
		if !n.standins.reserve(&r) {
			break
		}
		n.standins.record(&r, 1)
		fill = append(fill, limiter.Snapshot{Name: r.Name, Key: r.Key, Algorithm: r.Algorithm})
	}

	// Set again: the node's start may have published its ring since
	// (a single node has no membership changes after).
	n.standins.full.Store(full)
	d, err := n.Check(context.Background(), key)
	if err != nil || d.Allowed {
		t.Fatalf("a check standing in with the record full: %+v, %v; want refused", d, err)
	}
	if _, ok := n.store.Snapshot(key.Name, key.Key, n.now()); ok {
		t.Fatal("the refused check consumed")
	}
	five := key
	five.Hits = 5
	n.debts.add(&five, 5, false)
	for range 3 {
		n.settle()
	}
	if s := n.Stats().Settle; s.Settled != 0 || s.Recorded != 5 {
		t.Fatalf("settle stats %+v with the record full: want 5 recorded, none settled", s)
	}
	if n.standins.full.Load() != full {
		t.Fatal("the ring with the member cut off was replaced meanwhile")
	}

	n.standins.attachHandOff(fill)
	waitFor("unsettled", func() bool { n.settle(); return n.Stats().Settle.Settled == 5 })
	n.standins.mu.Lock()
	e := n.standins.m[debtKey{key.Name, key.Key}]
	own := int64(0)
	if e != nil {
		own = n.standins.ownHits(e.parts)
	}
	n.standins.mu.Unlock()
	if own != 5 {
		t.Fatalf("the settled hits are not this node's part: %d own hits recorded, want 5", own)
	}
	peek := key
	peek.Hits = 0
	if d, err := n.Check(context.Background(), peek); err != nil || d.Remaining != 95 {
		t.Fatalf("after the settlement: %+v, %v; want 95 remaining", d, err)
	}
}
