package limiter

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// logOf returns the fields of the log s holds for req's key (a zero log if
// none), copied under the shard's lock.
func logOf(s *Store, req *Request) windowLog {
	k := appendStoreKey(nil, req.Name, req.Key)
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if lg := sh.logs[string(k)]; lg != nil {
		return *lg
	}
	return windowLog{}
}

// checkLogShape fails unless l's live entries are at most MaxLogEntries, in
// strictly increasing time and count, each in its own multiple of the
// quantum (a power of two), in an array whose length is a power of two.
func checkLogShape(t testing.TB, l windowLog) {
	t.Helper()
	live := l.entries[l.head:]
	if len(live) > MaxLogEntries {
		t.Fatalf("the log holds %d entries, more than %d", len(live), MaxLogEntries)
	}
	if c := cap(l.entries); c != 0 && c&(c-1) != 0 {
		t.Fatalf("the log's array holds %d entries, not a power of two", c)
	}
	if q := l.quantum; q < 0 || q&(q-1) != 0 {
		t.Fatalf("quantum %d is not 0 or a power of two", q)
	}
	prev := logEntry{cum: l.base}
	for i, e := range live {
		if e.cum <= prev.cum || i > 0 && (e.at <= prev.at || l.quantum > 0 && floorDiv(e.at, l.quantum) == floorDiv(prev.at, l.quantum)) {
			t.Fatalf("entry %d %+v after %+v (base %d, quantum %d)", i, e, prev, l.base, l.quantum)
		}
		prev = e
	}
}

// TestLogBound hammers one key of Limit 1e9 per hour with 100,000 checks at
// distinct instants 7µs apart: the log never holds more than MaxLogEntries
// entries, keeps every hit, and hits count less than Period/1023 late.
func TestLogBound(t *testing.T) {
	s := newTestStore(t)
	req := Request{Name: "n", Key: "hot", Hits: 1, Limit: 1e9, Period: time.Hour, Algorithm: SlidingWindowLog}
	const checks = 100_000
	at := t0
	for i := range checks {
		if d := mustCheck(t, s, req, at); !d.Allowed || d.Remaining != req.Limit-int64(i)-1 {
			t.Fatalf("check %d: %+v", i, d)
		}
		if i%1000 == 999 {
			checkLogShape(t, logOf(s, &req))
		}
		at = at.Add(7 * time.Microsecond)
	}
	l := logOf(s, &req)
	checkLogShape(t, l)
	if l.total() != checks || l.quantum == 0 || l.quantum >= int64(req.Period)/1023 {
		t.Fatalf("the log holds %d hits with quantum %d; want %d, and a quantum below Period/1023", l.total(), l.quantum, checks)
	}
	sn := snapOf(t, s, req, at)
	var hits int64
	for _, e := range sn.Log {
		hits += e.Hits
	}
	if len(sn.Log) > MaxSnapshotLog || hits != checks {
		t.Fatalf("snapshot of %d entries holding %d hits", len(sn.Log), hits)
	}
	// The bytes counted for the key stay within one key's most.
	if b := s.Bytes(); b > MaxKeyBytes {
		t.Fatalf("%d bytes counted for one key, more than MaxKeyBytes %d", b, MaxKeyBytes)
	}
	// Once every hit has expired the log is exact again.
	d := mustCheck(t, s, req, at.Add(2*time.Hour))
	if l := logOf(s, &req); !d.Allowed || l.quantum != 0 || l.total() != 1 {
		t.Fatalf("an hour after the last hit: %+v, log %d hits, quantum %d", d, l.total(), l.quantum)
	}
}

// exactLog is every hit a store admitted, at its instant, as cumulative
// counts: the sliding window log without merging.
type exactLog struct{ at, cum []int64 }

func (m *exactLog) add(at, hits int64) {
	c := hits
	if n := len(m.cum); n > 0 {
		c += m.cum[n-1]
	}
	m.at, m.cum = append(m.at, at), append(m.cum, c)
}

// count is the number of hits admitted in (t-p, now].
func (m *exactLog) count(t, p int64) int64 {
	if len(m.cum) == 0 {
		return 0
	}
	i := sort.Search(len(m.at), func(i int) bool { return m.at[i] > t-p }) // first live
	before := int64(0)
	if i > 0 {
		before = m.cum[i-1]
	}
	return m.cum[len(m.cum)-1] - before
}

// removeNewest takes up to h hits off the newest.
func (m *exactLog) removeNewest(h int64) {
	for h > 0 && len(m.cum) > 0 {
		n := len(m.cum)
		own := m.cum[n-1]
		if n > 1 {
			own -= m.cum[n-2]
		}
		take := min(h, own)
		m.cum[n-1] -= take
		h -= take
		if take == own {
			m.at, m.cum = m.at[:n-1], m.cum[:n-1]
		}
	}
}

// retry is how long after now a request of probe hits waits until the
// hits in the window fall to limit-probe, at Period p: 0 if they are.
func (m *exactLog) retry(now, p, probe, limit int64) int64 {
	need := m.count(now, p) + probe - limit
	if need <= 0 {
		return 0
	}
	i := sort.Search(len(m.at), func(i int) bool { return m.at[i] > now-p })
	base := int64(0)
	if i > 0 {
		base = m.cum[i-1]
	}
	j := sort.Search(len(m.cum), func(j int) bool { return m.cum[j]-base >= need })
	return m.at[j] + p - now
}

// TestLogCompactedConservative runs random traces that fill the log many
// times over (Limits of 5,000 to 1,000,000 per second, many hits per
// millisecond, peeks, DrainOverLimit and Refund) and checks each decision
// against the exact log of the hits the store admitted: the store counts
// every admitted hit in its window, and none longer than the largest
// quantum past it; so it admits only what the exact log would, its
// Remaining is at most the exact one, and its RetryAfter is at least the
// exact one and at most a quantum more.
func TestLogCompactedConservative(t *testing.T) {
	traces, steps := 12, 30_000
	if testing.Short() || raceEnabled {
		traces, steps = 4, 12_000
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for trace := range traces {
		req := Request{Name: "n", Key: "k", Limit: 5000 + rng.Int64N(1_000_000), Period: time.Second, Algorithm: SlidingWindowLog}
		p, limit := int64(req.Period), req.Limit
		// About four times as many instants per period as MaxLogEntries.
		meanGap := p / (4 * MaxLogEntries)
		s := newTestStore(t)
		var exact exactLog
		now := randomStart(rng)
		var qMax int64
		coarsened := 0
		for i := range steps {
			if rng.IntN(5) > 0 {
				now += rng.Int64N(2 * meanGap)
			}
			r := req
			r.Hits = 1 + rng.Int64N(max(limit/(2*MaxLogEntries), 1))
			switch x := rng.IntN(100); {
			case x < 5:
				r.Hits = 0
			case x < 8:
				r.Behavior = DrainOverLimit
			case x < 10:
				r.Behavior = Refund
			}
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("trace %d (limit %d) step %d at %d, hits %d, behavior %d: "+format,
					append([]any{trace, limit, i, now, r.Hits, r.Behavior}, args...)...)
			}
			before := exact.count(now, p)
			stored := int64(0)
			if r.Behavior == DrainOverLimit {
				peek := r
				peek.Hits, peek.Behavior = 0, 0
				stored = limit - mustCheck(t, s, peek, nsTime(now)).Remaining
			}
			d := mustCheck(t, s, r, nsTime(now))
			switch {
			case r.Behavior == Refund:
				exact.removeNewest(r.Hits)
			case d.Allowed && r.Hits > 0:
				if before+r.Hits > limit {
					fail("admitted with %d hits in the exact window", before)
				}
				exact.add(now, r.Hits)
			case !d.Allowed && r.Behavior == DrainOverLimit && r.Hits > 0 && stored < limit:
				exact.add(now, limit-stored)
			}
			l := logOf(s, &req)
			checkLogShape(t, l)
			if l.quantum > qMax {
				qMax = l.quantum
				coarsened++
			}
			counted := limit - d.Remaining // the store's count, at most limit
			lo, hi := exact.count(now, p), exact.count(now, p+qMax)
			if counted < min(lo, limit) || counted > hi {
				fail("the store counts %d hits, the exact log %d in its window and %d in one a quantum (%d) longer", counted, lo, hi, qMax)
			}
			if !d.Allowed && r.Behavior != Refund {
				want := exact.retry(now, p, max(r.Hits, 1), limit)
				if got := int64(d.RetryAfter); got < want || got > want+qMax {
					fail("RetryAfter %d, the exact log's %d, quantum %d", got, want, qMax)
				}
			}
		}
		if coarsened == 0 {
			t.Fatalf("trace %d never coarsened its log", trace)
		}
	}
}

// TestLogCoarsenOrder: entries merged into a coarser quantum keep their
// total, their latest instant and their order, also before 1970 and across
// a quantum's multiple.
func TestLogCoarsenOrder(t *testing.T) {
	for _, start := range []int64{-1e18, -3, 0, 1_700_000_000e9} {
		l := &windowLog{}
		at := start
		var total int64
		for i := range 3 * MaxLogEntries {
			h := int64(i%7 + 1)
			l.add(at, h)
			total += h
			at += int64(1 + i%3)
		}
		checkLogShape(t, *l)
		if l.total() != total || l.entries[len(l.entries)-1].at != at-int64(1+(3*MaxLogEntries-1)%3) {
			t.Fatalf("start %d: %d hits, newest at %d; want %d", start, l.total(), l.entries[len(l.entries)-1].at, total)
		}
		if q := l.quantum; q == 0 || bits.OnesCount64(uint64(q)) != 1 {
			t.Fatalf("start %d: quantum %d", start, q)
		}
	}
}

// benchFullLog returns a store holding one sliding window log key that was
// admitted hits at instants distinct instants 1µs apart, Limit hits in all,
// and the instant after the last.
func benchFullLog(b *testing.B, instants int) (*Store, Request, time.Time) {
	s, err := NewStore(DefaultStoreConfig())
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Name: "bench", Key: "log", Hits: 1000, Limit: int64(instants) * 1000, Period: time.Hour, Algorithm: SlidingWindowLog}
	at := t0
	for range instants {
		if d, err := s.CheckAt(req, at); err != nil || !d.Allowed {
			b.Fatalf("filling: %+v, %v", d, err)
		}
		at = at.Add(time.Microsecond)
	}
	return s, req, at
}

// BenchmarkCheckDeniedFullLog is a denied check of one hit on a key whose
// sliding window log holds Limit hits: admitted at 4,096 instants
// (MaxLogEntries), or at 1,000,000 instants, with the request's Limit as
// the log holds (at_limit), where RetryAfter waits for the oldest hit, or
// cut to 1,000 (cut), where it waits for all but the newest 999.
func BenchmarkCheckDeniedFullLog(b *testing.B) {
	for _, instants := range []int{MaxLogEntries, 1_000_000} {
		for _, cut := range []bool{false, true} {
			name := fmt.Sprintf("instants=%d/at_limit", instants)
			if cut {
				name = fmt.Sprintf("instants=%d/cut", instants)
			}
			b.Run(name, func(b *testing.B) {
				s, req, now := benchFullLog(b, instants)
				req.Hits = 1
				if cut {
					req.Limit = 1000
				}
				b.ReportAllocs()
				for b.Loop() {
					if d, _ := s.CheckAt(req, now); d.Allowed {
						b.Fatal("admitted")
					}
				}
			})
		}
	}
}
