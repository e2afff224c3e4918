package cluster

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkRestore measures what New spends restoring a data directory of
// a million keys (one snapshot, written as Close writes it): reading and
// checking the file, decoding every state and merging it into an empty
// store. It reports the CPU time that takes and the bytes on disk per
// key.
func BenchmarkRestore(b *testing.B) {
	const keys = 1_000_000
	scfg := limiter.StoreConfig{Shards: 128, MaxEntries: 2 * keys, MaxBytes: 1 << 30}
	src, err := limiter.NewStore(scfg)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	algos := []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket, limiter.GCRA, limiter.SlidingWindowCounter}
	for i := range keys {
		req := limiter.Request{Name: "api", Key: fmt.Sprintf("user-%d", i), Hits: 1, Limit: 10_000, Period: 24 * time.Hour, Algorithm: algos[i%len(algos)]}
		if _, err := src.CheckAt(req, now); err != nil {
			b.Fatal(err)
		}
	}
	cfg := TestConfig("bench")
	cfg.DataDir = b.TempDir()
	logger := slog.New(slog.DiscardHandler)
	p, _, err := openPersister(&cfg, logger, now)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.close(src, now); err != nil {
		b.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(cfg.DataDir, "*.state"))
	var size int64
	for _, f := range files {
		info, _ := os.Stat(f)
		size += info.Size()
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	began := cpu()
	for b.Loop() {
		dst, err := limiter.NewStore(scfg)
		if err != nil {
			b.Fatal(err)
		}
		p, restored, err := openPersister(&cfg, logger, now)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := dst.Merge(restored, now); err != nil {
			b.Fatal(err)
		}
		p.release()
		if len(restored) != keys || dst.Len() != keys {
			b.Fatalf("restored %d states, %d in the store, want %d", len(restored), dst.Len(), keys)
		}
	}
	// The process's CPU time (every goroutine, GC included): on a shared
	// machine the wall time is the other processes' too.
	b.ReportMetric((cpu()-began).Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(size)/keys, "disk-B/key")
	b.ReportMetric(keys, "keys")
}
