package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// The stand-in record holds at most maxDebtBytes: past it, the hits of a
// key not recorded yet are counted as dropped, and a state sent with
// parts of such a key is charged them all the same (they are not kept).
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
	if d.Remaining != 20 {
		t.Fatalf("%d remaining, want 20: past the bound the parts sent are charged all the same", d.Remaining)
	}
	if _, _, after := rec.counts(); after != dropped+30 {
		t.Fatalf("%d hits dropped, want %d", after, dropped+30)
	}
}

// A record full of this node's own parts that no hand-off carries yet
// refuses room for another key (the stand-in must then not admit its
// hits); once a hand-off carries some parts, their entries are forgotten
// to make room, but not one whose part grew after it was handed, nor one
// a decision holds. Parts sent with a state are forgotten only while no
// member is cut off.
func TestStandinRecordMakesRoom(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rec := newStandins("self", now)
	req := limiter.Request{Name: "room", Hits: 1, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	key := func(i int) limiter.Request {
		r := req
		r.Key = fmt.Sprintf("k%05d", i)
		return r
	}
	n := 0
	for ; ; n++ {
		r := key(n)
		if !rec.reserve(&r) {
			break
		}
		rec.record(&r, 1)
	}
	if recorded, _, dropped := rec.counts(); recorded != int64(n) || dropped != 0 || rec.bytes > maxDebtBytes {
		t.Fatalf("%d keys reserved: %d hits recorded, %d dropped, %d bytes", n, recorded, dropped, rec.bytes)
	}
	extra := key(n)
	if rec.reserve(&extra) {
		t.Fatal("a full record of parts no hand-off carries made room")
	}

	// A hand-off carries the parts of the first half.
	ss := make([]limiter.Snapshot, n/2)
	for i := range ss {
		r := key(i)
		ss[i] = limiter.Snapshot{Name: r.Name, Key: r.Key, Algorithm: r.Algorithm}
	}
	rec.attachHandOff(ss)
	for i := range ss {
		if ss[i].Settle == nil || partHits(ss[i].Settle.Parts, "self", rec.m[debtKey{req.Name, ss[i].Key}].gen) != 1 {
			t.Fatalf("%s: hand-off state without its part: %+v", ss[i].Key, ss[i].Settle)
		}
	}
	grown, pinned := key(0), key(1)
	rec.record(&grown, 1) // grew after the hand-off
	if !rec.reserve(&pinned) {
		t.Fatal("no room for a key held already")
	}
	if !rec.reserve(&extra) {
		t.Fatal("no room made from parts a hand-off carries")
	}
	rec.record(&extra, 1)
	_, forgotten := rec.refusals()
	if forgotten == 0 || forgotten > int64(n/2) {
		t.Fatalf("%d entries forgotten, want 1 to %d", forgotten, n/2)
	}
	for i := range n {
		r := key(i)
		e, ok := rec.m[debtKey{r.Name, r.Key}]
		switch {
		case i >= n/2 && !ok:
			t.Fatalf("%s forgotten: no hand-off carries its part", r.Key)
		case (i == 0 || i == 1) && !ok:
			t.Fatalf("%s forgotten: grown after its hand-off, or held by a decision", r.Key)
		case i == 0 && partHits(e.parts, "self", e.gen) != 2:
			t.Fatalf("%s: parts %+v, want 2 hits of its own", r.Key, e.parts)
		}
	}
	rec.record(&pinned, 0)

	// Parts sent with a state, kept while a member is cut off.
	sent := newStandins("other", now)
	r := key(0)
	sent.record(&r, 5)
	sn := []limiter.Snapshot{{Name: r.Name, Key: r.Key, Algorithm: r.Algorithm}}
	sent.attachParts(sn, false)
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	recv := newStandins("self", now)
	rg, err := ring.New(ring.DefaultConfig())
	if err == nil {
		err = rg.SetMembers([]ring.Member{{Name: "self", Addr: "127.0.0.1:1"}, {Name: "cut", Addr: "127.0.0.1:2"}})
	}
	if err != nil {
		t.Fatal(err)
	}
	recv.full.Store(rg)
	five := r
	five.Hits = 5
	if _, err := store.CheckAt(five, now); err != nil {
		t.Fatal(err)
	}
	snap, _ := store.Snapshot(r.Name, r.Key, now)
	snap.Settle = sn[0].Settle
	if _, err := recv.merge(store, &snap, now); err != nil {
		t.Fatal(err)
	}
	e := recv.m[debtKey{r.Name, r.Key}]
	if e == nil || !hasHits(e.parts) {
		t.Fatal("parts sent not kept")
	}
	if recv.forgettableLocked(e, true) {
		t.Error("parts sent are forgotten while a member is cut off")
	}
	if !recv.forgettableLocked(e, false) {
		t.Error("parts sent, counted by the state, are not forgotten once no member is cut off")
	}

	// This node's own part restored from its data directory (a closed
	// generation) is kept until a hand-off carries it.
	restored := newStandins("self", now)
	own := snap
	own.Settle = &limiter.Settlement{Request: r, Parts: []limiter.SettlePart{{Origin: "self", Gen: 3, Hits: 4}}}
	restored.restore([]limiter.Snapshot{own})
	e = restored.m[debtKey{r.Name, r.Key}]
	if e == nil || restored.forgettableLocked(e, false) {
		t.Fatalf("a restored part of this node's own, no hand-off carrying it, may be forgotten: %+v", e)
	}
	ho := []limiter.Snapshot{{Name: r.Name, Key: r.Key, Algorithm: r.Algorithm}}
	restored.attachHandOff(ho)
	if !restored.forgettableLocked(e, false) {
		t.Error("a restored part of this node's own, carried by a hand-off, is kept")
	}
}

// A stand-in's hits charged to a state of another algorithm go on with
// that state: node 0 admits 30 of a key under token_bucket, standing in;
// node 2, the replica, holding 60 of the key under fixed_window, is sent
// node 0's state and hands its own on to the owner, node 1 (60 too). The
// owner meets node 2's state first and node 0's after: the key counts 90,
// not 120 (node 2's state without the part, then the part again).
func TestStandinPartsOfAnotherAlgorithmTravel(t *testing.T) {
	now := time.Unix(1_700_000_000, 0).Truncate(24 * time.Hour).Add(time.Hour)
	newStore := func() *limiter.Store {
		s, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	owned := limiter.Request{Name: "algo", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow}
	standInReq := owned
	standInReq.Algorithm = limiter.TokenBucket

	standIn, standInStore := newStandins("node-0", now), newStore()
	standInReq.Hits = 30
	if _, err := standInStore.CheckAt(standInReq, now); err != nil {
		t.Fatal(err)
	}
	standIn.record(&standInReq, 30)
	fromStandIn := func() limiter.Snapshot {
		sn, _ := standInStore.Snapshot(owned.Name, owned.Key, now)
		ss := []limiter.Snapshot{sn}
		standIn.attachHandOff(ss)
		return ss[0]
	}

	replica, replicaStore := newStandins("node-2", now), newStore()
	owner, ownerStore := newStandins("node-1", now), newStore()
	owned.Hits = 60
	for _, s := range []*limiter.Store{replicaStore, ownerStore} {
		if _, err := s.CheckAt(owned, now); err != nil {
			t.Fatal(err)
		}
	}
	sn := fromStandIn()
	if _, err := replica.merge(replicaStore, &sn, now); err != nil {
		t.Fatal(err)
	}
	fromReplica, _ := replicaStore.Snapshot(owned.Name, owned.Key, now)
	ss := []limiter.Snapshot{fromReplica}
	replica.attachHandOff(ss)
	if ss[0].Settle == nil {
		t.Fatal("the replica's state goes without the stand-in's part it counts")
	}
	for _, sn := range []limiter.Snapshot{ss[0], fromStandIn()} {
		if _, err := owner.merge(ownerStore, &sn, now); err != nil {
			t.Fatal(err)
		}
	}
	owned.Hits = 0
	if d, _ := ownerStore.CheckAt(owned, now); d.Remaining != 10 {
		t.Fatalf("%d remaining at the owner, want 10 (60 + 30 once)", d.Remaining)
	}
}
