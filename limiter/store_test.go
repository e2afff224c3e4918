package limiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// held reports whether s holds an entry for (name, key).
func held(s *Store, name, key string) bool {
	k := appendStoreKey(nil, name, key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, ok := sh.m[string(k)]
	return ok
}

// logCount is how many sliding window logs s holds.
func logCount(s *Store) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.logs)
		sh.mu.Unlock()
	}
	return n
}

// counted is the number of entries in s's maps, which Len must match.
func counted(s *Store) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

func mustCheck(t testing.TB, s *Store, req Request, now time.Time) Decision {
	t.Helper()
	d, err := s.CheckAt(req, now)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStoreConfigValidate(t *testing.T) {
	if err := DefaultStoreConfig().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	for _, c := range []StoreConfig{
		{Shards: 0},
		{Shards: -4},
		{Shards: 3},
		{Shards: 96},
		{Shards: 1 << 17},
		{Shards: 4, MaxEntries: -1},
		{Shards: 8, MaxEntries: 7},
		{Shards: 4, MaxBytes: -1},
		{Shards: 4, MaxBytes: 4*MaxKeyBytes - 1},
		{Shards: 128, MaxBytes: 8 << 20},
	} {
		err := c.Validate()
		if !errors.Is(err, ErrInvalidStoreConfig) {
			t.Errorf("%+v: Validate = %v", c, err)
			continue
		}
		if s, err := NewStore(c); s != nil || !errors.Is(err, ErrInvalidStoreConfig) {
			t.Errorf("%+v: NewStore = %v, %v", c, s, err)
		}
	}
	for _, c := range []StoreConfig{{Shards: 1}, {Shards: 1 << 16}, {Shards: 8, MaxEntries: 8}, {Shards: 2, MaxEntries: 0},
		{Shards: 4, MaxBytes: 4 * MaxKeyBytes}, {Shards: 128, MaxBytes: 16 << 20}, {Shards: 1, MaxBytes: 1 << 62}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestStoreCheckUsesNow(t *testing.T) {
	s := newTestStore(t)
	req := validRequest(FixedWindow)
	req.Hits = 10
	d, err := s.Check(req)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Check = %+v, %v", d, err)
	}
	// An hour on, the window is over whatever the wall clock said.
	if d := mustCheck(t, s, req, time.Now().Add(time.Hour)); !d.Allowed {
		t.Fatalf("an hour later: %+v", d)
	}
}

// TestStoreKeys checks that Name and Key together identify a counter.
func TestStoreKeys(t *testing.T) {
	s := newTestStore(t)
	req := Request{Hits: 1, Limit: 1, Period: time.Second, Algorithm: FixedWindow}
	for _, nk := range [][2]string{{"a", "bc"}, {"ab", "c"}, {"abc", "d"}, {"a", "bcd"}} {
		req.Name, req.Key = nk[0], nk[1]
		if d := mustCheck(t, s, req, t0); !d.Allowed {
			t.Errorf("%q/%q shares a counter", nk[0], nk[1])
		}
	}
	// A key too long for the stack buffer.
	req.Name, req.Key = "n", string(make([]byte, MaxKeyLen))
	mustCheck(t, s, req, t0)
	if d := mustCheck(t, s, req, t0); d.Allowed {
		t.Error("a long key lost its state")
	}
}

// TestStoreFreshNotKept checks that a decision leaving fresh state (a peek on
// a new key) stores nothing.
func TestStoreFreshNotKept(t *testing.T) {
	s := newTestStore(t)
	for _, a := range Algorithms {
		req := validRequest(a)
		req.Hits = 0
		mustCheck(t, s, req, t0)
	}
	if s.Len() != 0 || logCount(s) != 0 {
		t.Fatalf("peeks left %d entries, %d logs", s.Len(), logCount(s))
	}
}

// TestSweep checks that Sweep drops exactly the keys whose state is fresh,
// counts them, and leaves decisions unchanged.
func TestSweep(t *testing.T) {
	s := newTestStore(t)
	const sec = time.Second
	for _, a := range Algorithms {
		req := validRequest(a) // 10 per second
		req.Key = a.String() + "/short"
		req.Hits = 10
		mustCheck(t, s, req, t0)
		req.Key, req.Period = a.String()+"/long", time.Hour
		mustCheck(t, s, req, t0)
	}
	if s.Len() != 12 {
		t.Fatalf("Len %d", s.Len())
	}
	// The sliding window counter holds its window for two periods, the
	// others for one; nothing is fresh a nanosecond early.
	if n := s.Sweep(t0.Add(sec - 1)); n != 0 {
		t.Fatalf("Sweep before any expiry dropped %d", n)
	}
	if n := s.Sweep(t0.Add(sec)); n != 5 {
		t.Fatalf("Sweep at 1s dropped %d, want 5", n)
	}
	for _, a := range Algorithms {
		if held(s, "api", a.String()+"/short") != (a == SlidingWindowCounter) || !held(s, "api", a.String()+"/long") {
			t.Fatalf("%v: the wrong keys were dropped", a)
		}
	}
	if n := s.Sweep(t0.Add(2 * sec)); n != 1 {
		t.Fatalf("Sweep at 2s dropped %d, want the sliding window counter", n)
	}
	if got := s.Stats(); got.Entries != 6 || got.Expired != 6 || got.Evictions != 0 || s.Len() != 6 {
		t.Fatalf("Stats %+v, Len %d", got, s.Len())
	}
	if logCount(s) != 1 {
		t.Fatalf("%d logs after sweeping the short sliding log", logCount(s))
	}
	if n := s.Sweep(t0.Add(3 * time.Hour)); n != 6 || s.Len() != 0 || logCount(s) != 0 {
		t.Fatalf("final Sweep dropped %d, Len %d, logs %d", n, s.Len(), logCount(s))
	}
}

// TestSweepDecisionsUnchanged runs one random multi-key trace on two stores,
// sweeping one of them often: every decision must be identical, and each
// key a sweep dropped must have looked fresh to a peek on the other store.
func TestSweepDecisionsUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	swept, kept := newTestStore(t), newTestStore(t)
	var keys []Request
	for i := range 60 {
		r := randomRequest(t, rng, Algorithms[i%len(Algorithms)])
		r.Key = fmt.Sprintf("key-%d", i)
		r.Period = []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond}[i%3]
		if r.Algorithm == GCRA && r.Limit > int64(r.Period) {
			r.Limit = int64(r.Period)
		}
		if r.Validate() != nil {
			r.Limit, r.Burst = 10, 0
		}
		keys = append(keys, r)
	}
	steps := 20000
	if testing.Short() || raceEnabled {
		steps = 4000
	}
	now := t0
	dropped := 0
	for i := range steps {
		now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
		req := keys[rng.IntN(len(keys))]
		req.Hits = randomHits(rng, req.Capacity())
		if rng.IntN(20) == 0 {
			req.Behavior = DrainOverLimit
		}
		a, err1 := swept.CheckAt(req, now)
		b, err2 := kept.CheckAt(req, now)
		if err1 != nil || err2 != nil || a != b {
			t.Fatalf("step %d, %v %s: swept store %+v %v, unswept %+v %v", i, req.Algorithm, req.Key, a, err1, b, err2)
		}
		if i%97 == 0 {
			var before []bool
			for _, k := range keys {
				before = append(before, held(swept, k.Name, k.Key))
			}
			dropped += swept.Sweep(now)
			for j, k := range keys {
				if !before[j] || held(swept, k.Name, k.Key) {
					continue
				}
				peek := k
				peek.Hits = 0
				sn := copyState(kept, &peek)
				got := sn.decideAt(peek, now.UnixNano())
				fresh := stateCopy{}.decideAt(peek, now.UnixNano())
				if got != fresh {
					t.Fatalf("step %d: swept %v %s, but its state was not fresh: %+v, fresh %+v", i, k.Algorithm, k.Key, got, fresh)
				}
			}
		}
	}
	if dropped == 0 || swept.Stats().Expired != int64(dropped) {
		t.Fatalf("dropped %d, Stats %+v", dropped, swept.Stats())
	}
	if swept.Len() != counted(swept) || kept.Len() != counted(kept) {
		t.Fatalf("Len %d/%d, maps hold %d/%d", swept.Len(), kept.Len(), counted(swept), counted(kept))
	}
}

func TestMaxEntriesLRU(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 1, MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "api", Hits: 1, Limit: 10, Period: time.Second, Algorithm: TokenBucket}
	hit := func(key string, at time.Time) {
		t.Helper()
		r := req
		r.Key = key
		mustCheck(t, s, r, at)
	}
	hit("a", t0)
	hit("b", t0)
	hit("c", t0)
	hit("a", t0) // touching a keeps it: b is now the least recently used
	hit("d", t0)
	if held(s, "api", "b") || !held(s, "api", "a") || !held(s, "api", "c") || !held(s, "api", "d") {
		t.Fatal("evicted the wrong key: want b gone, a, c and d held")
	}
	if st := s.Stats(); st.Entries != 3 || st.Evictions != 1 || st.Expired != 0 {
		t.Fatalf("Stats %+v", st)
	}
	// An evicted key starts fresh: b admits its whole burst again.
	r := req
	r.Key, r.Hits = "b", 10
	if d := mustCheck(t, s, r, t0); !d.Allowed { // evicts c
		t.Fatalf("b after eviction: %+v", d)
	}
	if st := s.Stats(); st.Entries != 3 || st.Evictions != 2 || held(s, "api", "c") {
		t.Fatalf("Stats %+v", st)
	}
	// Evicting a key whose state is already fresh is not an eviction.
	hit("e", t0.Add(time.Hour))
	if st := s.Stats(); st.Entries != 3 || st.Evictions != 2 || st.Expired != 1 || held(s, "api", "a") {
		t.Fatalf("Stats %+v", st)
	}
	// Peeks at new keys take no room.
	r.Key, r.Hits = "f", 0
	mustCheck(t, s, r, t0.Add(time.Hour))
	if st := s.Stats(); st.Entries != 3 || held(s, "api", "f") {
		t.Fatalf("a peek took an entry: %+v", st)
	}
}

// TestMaxEntriesBound fills a sharded store with many more keys than it may
// hold: the total never passes MaxEntries.
func TestMaxEntriesBound(t *testing.T) {
	for _, c := range []StoreConfig{{Shards: 4, MaxEntries: 10}, {Shards: 16, MaxEntries: 100}, {Shards: 8, MaxEntries: 8}} {
		s, err := NewStore(c)
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Name: "api", Hits: 1, Limit: 10, Period: time.Second, Algorithm: SlidingWindowLog}
		for i := range 20 * c.MaxEntries {
			req.Key = fmt.Sprint(i)
			mustCheck(t, s, req, t0)
			if s.Len() > c.MaxEntries {
				t.Fatalf("%+v: %d entries", c, s.Len())
			}
		}
		st := s.Stats()
		if st.Entries != int64(counted(s)) || st.Evictions != int64(20*c.MaxEntries)-st.Entries || logCount(s) != int(st.Entries) {
			t.Fatalf("%+v: Stats %+v, maps %d, logs %d", c, st, counted(s), logCount(s))
		}
	}
}

// TestSlidingLogMemoryReleased checks that a key's log goes when the key is
// dropped (Sweep, eviction) or moves to another algorithm.
func TestSlidingLogMemoryReleased(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 2, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	logReq := Request{Name: "api", Key: "k", Hits: 1, Limit: 100, Period: time.Second, Algorithm: SlidingWindowLog}
	for i := range 50 {
		mustCheck(t, s, logReq, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if logCount(s) != 1 {
		t.Fatalf("%d logs", logCount(s))
	}
	// Another algorithm: the log goes.
	other := logReq
	other.Algorithm = GCRA
	mustCheck(t, s, other, t0.Add(time.Second))
	if logCount(s) != 0 || !held(s, "api", "k") {
		t.Fatalf("after moving to GCRA: %d logs, held %v", logCount(s), held(s, "api", "k"))
	}
	// Back to the log, which takes what GCRA counts (49 hits of the
	// log and its own 1) as hits at now: then Sweep drops key and log.
	if d := mustCheck(t, s, logReq, t0.Add(time.Second)); d.Remaining != 49 {
		t.Fatalf("back to the log: %+v", d)
	}
	if logCount(s) != 1 {
		t.Fatalf("%d logs", logCount(s))
	}
	if n := s.Sweep(t0.Add(2 * time.Second)); n != 1 || logCount(s) != 0 {
		t.Fatalf("Sweep dropped %d, %d logs left", n, logCount(s))
	}
	// Eviction: one entry per shard; fill both shards with log keys.
	for i := range 10 {
		r := logReq
		r.Key = fmt.Sprint(i)
		mustCheck(t, s, r, t0.Add(3*time.Second))
	}
	if s.Len() != 2 || logCount(s) != 2 {
		t.Fatalf("after evictions: Len %d, %d logs", s.Len(), logCount(s))
	}
}

// TestConcurrentOneKey has 64 goroutines hit one key at one instant: exactly
// Limit hits are admitted, whatever the algorithm.
func TestConcurrentOneKey(t *testing.T) {
	const goroutines, tries, limit = 64, 40, 1000
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newTestStore(t)
			req := Request{Name: "api", Key: "hot", Hits: 1, Limit: limit, Period: time.Second, Algorithm: a}
			var admitted atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					<-start
					for range tries {
						d, err := s.CheckAt(req, t0)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if n := admitted.Load(); n != limit {
				t.Fatalf("admitted %d of %d, want %d", n, goroutines*tries, limit)
			}
		})
	}
}

// TestConcurrentMixed runs checks on many keys, sweeps and stats reads at
// once, for the race detector, then checks the counters against the maps.
func TestConcurrentMixed(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 8, MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	var workers, sweeper sync.WaitGroup
	done := make(chan struct{})
	for g := range 4 {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 3000 {
				req := validRequest(Algorithms[rng.IntN(len(Algorithms))])
				req.Key = fmt.Sprint(rng.IntN(200))
				now := t0.Add(time.Duration(i) * time.Millisecond)
				if _, err := s.CheckAt(req, now); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	sweeper.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			s.Sweep(t0.Add(time.Duration(i) * time.Millisecond))
			if s.Stats().Entries > 64 {
				t.Error("more entries than MaxEntries")
				return
			}
		}
	})
	workers.Wait()
	close(done)
	sweeper.Wait()
	if st := s.Stats(); st.Entries != int64(counted(s)) || st.Entries > 64 {
		t.Fatalf("Stats %+v, maps hold %d", st, counted(s))
	}
}
