package limiter

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recount checks that every shard's bytes are what MaxBytes counts for
// the keys and logs it holds, recomputed from its maps, and within its
// budget, and returns their sum, which Bytes must match.
func recount(t testing.TB, s *Store) int64 {
	t.Helper()
	var total int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		var n int64
		for k := range sh.m {
			n += sh.entryBytes(len(k)) // with its rate under KeepStrictest
		}
		n += int64(len(sh.resets)) * ResetMarkOverhead
		for k, lg := range sh.logs {
			if e := sh.m[k]; e == nil || e.algo() != SlidingWindowLog {
				t.Errorf("shard %d holds a log for %q, which is no sliding window log", i, k)
			}
			n += logBytes(lg)
		}
		got := sh.bytes
		sh.mu.Unlock()
		if got != n {
			t.Fatalf("shard %d counts %d bytes, its maps hold %d", i, got, n)
		}
		if s.perBytes > 0 && n > s.perBytes {
			t.Fatalf("shard %d holds %d bytes, more than its %d", i, n, s.perBytes)
		}
		total += n
	}
	if b := s.Bytes(); b != total {
		t.Fatalf("Bytes %d, the shards hold %d", b, total)
	}
	return total
}

func TestAllocSize(t *testing.T) {
	// The size classes of the Go allocator up to MaxKeyBytes' key.
	classes := []int{16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
		288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280}
	for n := 1; n <= 1+MaxNameLen+MaxKeyLen; n++ {
		i := 0
		for classes[i] < n {
			i++
		}
		if got := allocSize(n); got < int64(classes[i]) || got > int64(n)*5/4+16 {
			t.Fatalf("allocSize(%d) = %d, the allocator gives %d", n, got, classes[i])
		}
	}
	if got := allocSize(1 + MaxNameLen + MaxKeyLen); got != 1280 {
		t.Fatalf("the longest store key counts %d bytes, MaxKeyBytes assumes 1280", got)
	}
}

// TestMaxBytesHeap fills stores with many more keys of 1,000 bytes (and of
// 16) than MaxBytes (16 MiB) holds, with and without sliding window logs:
// the bytes
// counted never pass MaxBytes, most of the budget is used, and the heap the
// store holds after a GC is at most MaxBytes plus 1/16 of it, so that the
// count is honest.
func TestMaxBytesHeap(t *testing.T) {
	const maxBytes = 16 << 20
	for _, tt := range []struct {
		name   string
		algo   Algorithm
		keyLen int // of the store key
		keys   int // with -short or -race: short, still more than fit
		short  int
		checks int // per key, at distinct instants
	}{
		{"gcra", GCRA, 1000, 1_500_000, 50_000, 1},
		{"log of 100 entries", SlidingWindowLog, 1000, 20_000, 7_000, 100},
		{"log of 3 entries", SlidingWindowLog, 1000, 200_000, 20_000, 3},
		{"gcra with keys of 16 bytes", GCRA, 16, 1_500_000, 300_000, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keys := tt.keys
			if testing.Short() || raceEnabled {
				keys = tt.short
			}
			req := Request{Name: "b", Hits: 1, Limit: 1000, Period: time.Hour, Algorithm: tt.algo}
			prefix := strings.Repeat("k", tt.keyLen-len(req.Name)-1-10)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s, err := NewStore(StoreConfig{Shards: 128, MaxBytes: maxBytes})
			if err != nil {
				t.Fatal(err)
			}
			buf := []byte(prefix)
			for i := range keys {
				buf = strconv.AppendInt(buf[:len(prefix)], int64(1_000_000_000+i), 10)
				req.Key = string(buf)
				for j := range tt.checks {
					// Instants that only grow: a reading behind a
					// shard's latest is read as the latest.
					at := t0.Add(time.Duration(i*tt.checks+j) * time.Microsecond)
					if _, err := s.CheckAt(req, at); err != nil {
						t.Fatal(err)
					}
				}
				if b := s.Bytes(); b > maxBytes {
					t.Fatalf("after %d keys: %d bytes counted, more than %d", i+1, b, maxBytes)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			counted := recount(t, s)
			st := s.Stats()
			t.Logf("%d keys, %d held, %d evicted: %d bytes counted, %d on the heap (%.3f of the count)",
				keys, st.Entries, st.Evictions, counted, heap, float64(heap)/float64(counted))
			if st.Evictions == 0 {
				t.Fatalf("nothing evicted: the test does not fill the budget")
			}
			if counted < maxBytes*7/8 {
				t.Errorf("%d bytes counted: the budget of %d is not used", counted, maxBytes)
			}
			if heap > maxBytes+maxBytes/16 {
				t.Errorf("the store holds %d heap bytes, more than MaxBytes %d and 1/16 of it", heap, maxBytes)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestMaxBytesLRU: a key that does not fit evicts the least recently used
// keys of its shard, as many as it takes; a log that grows evicts others,
// never itself; evictions, bytes and entries are counted; Sweep gives the
// bytes back.
func TestMaxBytesLRU(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 1, MaxBytes: MaxKeyBytes})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "api", Hits: 1, Limit: 10, Period: time.Hour, Algorithm: TokenBucket}
	// Keys of 1+3+1020 bytes count 1024+128: MaxKeyBytes holds 59 of them.
	key := func(i int) string { return fmt.Sprintf("%04d", i) + strings.Repeat("x", 1016) }
	hit := func(r Request, k string, at time.Time) Decision {
		t.Helper()
		r.Key = k
		return mustCheck(t, s, r, at)
	}
	per := entryBytes(1 + 3 + 1020)
	fit := int(MaxKeyBytes / per)
	for i := range fit {
		hit(req, key(i), t0)
	}
	hit(req, key(0), t0) // key 1 is now the least recently used
	if st := s.Stats(); st.Entries != int64(fit) || st.Evictions != 0 || st.Bytes != int64(fit)*per {
		t.Fatalf("after %d keys that fit: %+v", fit, st)
	}
	hit(req, key(fit), t0)
	if held(s, "api", key(1)) || !held(s, "api", key(0)) || !held(s, "api", key(2)) {
		t.Fatal("a key that did not fit evicted another than the least recently used")
	}
	if st := s.Stats(); st.Entries != int64(fit) || st.Evictions != 1 || st.Bytes > MaxKeyBytes {
		t.Fatalf("after one key too many: %+v", st)
	}
	recount(t, s)

	// A log growing to MaxLogEntries evicts the least recently used keys
	// as it grows, never itself: the shard has room left for the log and
	// one key, the most recent.
	logReq := Request{Name: "api", Key: "log", Hits: 1, Limit: 1_000_000, Period: time.Hour, Algorithm: SlidingWindowLog}
	for i := range MaxLogEntries {
		hit(logReq, "log", t0.Add(time.Duration(i)*time.Millisecond))
		recount(t, s)
	}
	fullLog := entryBytes(1+3+3) + LogOverhead + MaxLogEntries*LogEntryBytes
	st := s.Stats()
	if !held(s, "api", "log") || !held(s, "api", key(fit)) || st.Entries != 2 || st.Bytes != fullLog+per {
		t.Fatalf("after the log grew: %+v; want the log (%d bytes) and the last key (%d)", st, fullLog, per)
	}
	if st.Evictions != int64(fit) {
		t.Fatalf("after the log grew: %d evictions, want %d", st.Evictions, fit)
	}
	if n := s.Sweep(t0.Add(2 * time.Hour)); n != int(st.Entries) || s.Bytes() != 0 || s.Len() != 0 {
		t.Fatalf("Sweep dropped %d of %d; %d bytes, %d entries left", n, st.Entries, s.Bytes(), s.Len())
	}
}

// TestBytesCounted runs a random trace of checks, takes, refunds, resets,
// algorithm changes, merges and sweeps on stores with a byte budget, with
// and without MaxEntries: after every step the bytes counted are those of
// what the maps hold, and within the budget.
func TestBytesCounted(t *testing.T) {
	for _, cfg := range []StoreConfig{
		{Shards: 2, MaxBytes: 2 * MaxKeyBytes},
		{Shards: 4, MaxBytes: 4*MaxKeyBytes + 12345, MaxEntries: 40},
		{Shards: 1},
	} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(cfg.MaxBytes)))
			s, err := NewStore(cfg)
			if err != nil {
				t.Fatal(err)
			}
			peer := newTestStore(t)
			steps := 20_000
			if testing.Short() || raceEnabled {
				steps = 5_000
			}
			now := t0
			for i := range steps {
				now = now.Add(time.Duration(rng.Int64N(int64(time.Millisecond))))
				req := Request{Name: "n", Key: strings.Repeat("k", rng.IntN(3)*400+1) + strconv.Itoa(rng.IntN(100)),
					Hits: 1 + rng.Int64N(3), Limit: 1 + rng.Int64N(3000), Period: time.Duration(1+rng.IntN(500)) * time.Millisecond,
					Algorithm: Algorithms[rng.IntN(len(Algorithms))]}
				if rng.IntN(3) > 0 {
					req.Algorithm = SlidingWindowLog // the logs are what grows
				}
				if req.Validate() != nil {
					continue
				}
				switch x := rng.IntN(40); {
				case x == 0:
					req.Behavior = Refund
				case x == 1:
					req.Behavior = Reset
				case x == 2:
					req.Behavior = DrainOverLimit
				case x == 3:
					if _, _, err := s.TakeAt(req, 1+rng.Int64N(5), now); err != nil {
						t.Fatal(err)
					}
					recount(t, s)
					continue
				case x == 4:
					s.Sweep(now)
					recount(t, s)
					continue
				case x < 8:
					// A state of the same key from another store.
					if _, err := peer.CheckAt(req, now); err != nil {
						t.Fatal(err)
					}
					if sn, ok := peer.Snapshot(req.Name, req.Key, now); ok {
						if _, err := s.Merge([]Snapshot{sn}, now); err != nil {
							t.Fatal(err)
						}
					}
					recount(t, s)
					continue
				}
				if _, err := s.CheckAt(req, now); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				recount(t, s)
			}
			st := s.Stats()
			t.Logf("%+v", st)
			if st.Entries != int64(counted(s)) {
				t.Fatalf("Stats %+v, maps hold %d", st, counted(s))
			}
			if cfg.MaxBytes > 0 && st.Evictions == 0 {
				t.Fatalf("Stats %+v: the trace never filled the budget", st)
			}
		})
	}
}

// TestEvictedChangedKeyReleased: with TrackChanges, a key evicted before
// Changed reports it is not kept alive by the list of changes, and Changed
// skips it.
func TestEvictedChangedKeyReleased(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 1, MaxEntries: 1, TrackChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "n", Key: "first", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: GCRA}
	mustCheck(t, s, req, t0)
	req.Key = "second"
	mustCheck(t, s, req, t0) // evicts first
	sh := &s.shards[0]
	sh.mu.Lock()
	first := sh.changed[0]
	sh.mu.Unlock()
	if first.key != "" {
		t.Fatalf("the evicted entry still holds its key %q", first.key)
	}
	var got []string
	if n := s.Changed(t0, func(sn Snapshot) { got = append(got, sn.Key) }); n != 1 || got[0] != "second" {
		t.Fatalf("Changed reported %q", got)
	}
}
