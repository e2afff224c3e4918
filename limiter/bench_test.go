package limiter

import (
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// benchRequest is a valid request of 1,000 hits per millisecond. The
// benchmarks send one request per microsecond of fake time, so every check
// on an existing key is admitted in steady state (the sliding log holds
// about 1,000 entries). It fails the benchmark if the request is invalid, so
// that no benchmark silently measures the error path.
func benchRequest(tb testing.TB, a Algorithm) Request {
	tb.Helper()
	req := Request{Name: "bench", Key: "user:42", Hits: 1, Limit: 1000, Period: time.Millisecond, Algorithm: a}
	if err := req.Validate(); err != nil {
		tb.Fatal(err)
	}
	return req
}

// BenchmarkCheck is one goroutine checking one existing key.
func BenchmarkCheck(b *testing.B) {
	for _, a := range Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				b.Fatal(err)
			}
			req := benchRequest(b, a)
			ns := t0.UnixNano()
			if d, err := s.CheckAt(req, time.Unix(0, ns)); err != nil || !d.Allowed {
				b.Fatalf("first check: %+v, %v", d, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				ns += 1000
				s.CheckAt(req, time.Unix(0, ns))
			}
			if d, err := s.CheckAt(req, time.Unix(0, ns+1000)); err != nil || !d.Allowed {
				b.Fatalf("last check: %+v, %v", d, err)
			}
		})
	}
}

// BenchmarkCheckParallel is GOMAXPROCS goroutines, each checking its own
// existing key, on one store: it measures the sharded store under
// concurrency, not contention on one key (TestConcurrentOneKey covers that).
func BenchmarkCheckParallel(b *testing.B) {
	for _, a := range Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				b.Fatal(err)
			}
			base := benchRequest(b, a)
			var id atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := base
				req.Key = "user:" + strconv.FormatInt(id.Add(1), 10)
				ns := t0.UnixNano()
				for pb.Next() {
					ns += 1000
					s.CheckAt(req, time.Unix(0, ns))
				}
			})
		})
	}
}

// memKeys is the number of keys BenchmarkMemoryPerKey stores.
const memKeys = 1_000_000

// heapPerKey stores n live keys of algorithm a and returns the heap bytes
// per key, and the bytes of one store key (a length byte, the name and the
// key: 1 + 5 + 10 = 16, exactly one allocation size class).
func heapPerKey(tb testing.TB, a Algorithm, n int) (perKey float64, keyBytes int) {
	tb.Helper()
	req := Request{Name: "bench", Hits: 1, Limit: 1000, Period: time.Minute, Algorithm: a}
	keyBytes = len(appendStoreKey(nil, req.Name, "1000000000"))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := NewStore(StoreConfig{Shards: 128}) // no MaxEntries: keep them all
	if err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 0, 16)
	for i := range n {
		buf = strconv.AppendInt(buf[:0], int64(1_000_000_000+i), 10)
		req.Key = string(buf)
		if _, err := s.CheckAt(req, t0); err != nil {
			tb.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Len() != n {
		tb.Fatalf("store holds %d keys, want %d", s.Len(), n)
	}
	runtime.KeepAlive(s)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n), keyBytes
}

// BenchmarkMemoryPerKey reports the heap bytes a store spends per key with
// 1,000,000 live keys, beyond the key's own bytes (B/key-beyond-key), and
// in all (B/key). ns/op is the time to fill the store.
func BenchmarkMemoryPerKey(b *testing.B) {
	for _, a := range Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			var perKey float64
			var keyBytes int
			for range b.N {
				perKey, keyBytes = heapPerKey(b, a, memKeys)
			}
			b.ReportMetric(perKey, "B/key")
			b.ReportMetric(perKey-float64(keyBytes), "B/key-beyond-key")
		})
	}
}

// TestMemoryPerKey holds the store to its budget: at most 128 heap bytes per
// key beyond the key's own, with 1,000,000 keys. The token bucket, fixed
// window, sliding window counter and GCRA keep all their state in the entry
// (TestEntrySize), so they cost the same; it measures GCRA, and
// BenchmarkMemoryPerKey reports every algorithm. Filling the store takes
// over a second, so it is skipped in -short mode and under the race detector
// (which changes allocation sizes).
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("slow; run without -short and -race")
	}
	perKey, keyBytes := heapPerKey(t, GCRA, memKeys)
	beyond := perKey - float64(keyBytes)
	t.Logf("%.1f B/key, %.1f beyond the key's %d bytes", perKey, beyond, keyBytes)
	if beyond > 128 {
		t.Errorf("%.1f heap bytes per key beyond the key, budget 128", beyond)
	}
}

// TestEntrySize checks that an entry (key header, LRU links and the state of
// every algorithm but the sliding log) fills one 64-byte size class.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 64 {
		t.Fatalf("entry is %d bytes, more than 64", n)
	}
}
