package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limiter"
)

// benchKeys is the number of distinct keys of BenchmarkAPIs.
const benchKeys = 10_000

// BenchmarkAPIs measures one daemon through each of its APIs on loopback:
// the JSON HTTP API (POST /v1/check), the native gRPC API (sluice's client
// package) and Envoy's rate limit service (go-control-plane's client), each
// check a fixed window of a minute never reached, for a random key of
// 10,000, from 64 callers. It reports checks/s and the p50 and p99
// latencies besides ns/op:
//
//	go test -run '^$' -bench BenchmarkAPIs -benchtime 3s ./cmd/sluice/internal/daemon
func BenchmarkAPIs(b *testing.B) {
	dir := b.TempDir()
	text := "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n"
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := testConfig("bench")
	cfg.EnvoyConfigDir = dir
	d := start(b, cfg)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	req := limiter.Request{Name: "bench", Hits: 1, Limit: 4_000_000_000, Period: time.Minute, Algorithm: limiter.FixedWindow}

	b.Run("http", func(b *testing.B) {
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
		defer hc.CloseIdleConnections()
		url := "http://" + d.HTTPAddr() + "/v1/check"
		benchParallel(b, func(key string) error {
			body := fmt.Sprintf(`{"name":"bench","key":%q,"limit":4000000000,"period":"1m","algorithm":"fixed_window"}`, key)
			resp, err := hc.Post(url, "application/json", bytes.NewReader([]byte(body)))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}, keys)
	})
	b.Run("grpc", func(b *testing.B) {
		c, err := client.New(d.GRPCAddr())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		benchParallel(b, func(key string) error {
			r := req
			r.Key = key
			dec, err := c.Check(context.Background(), r)
			if err == nil && !dec.Allowed {
				err = fmt.Errorf("denied")
			}
			return err
		}, keys)
	})
	b.Run("envoy", func(b *testing.B) {
		rls := rlsClient(b, d.GRPCAddr())
		benchParallel(b, func(key string) error {
			resp, err := rls.ShouldRateLimit(context.Background(), rlsRequest("bench", []string{"user=" + key}))
			if err == nil && resp.OverallCode.String() != "OK" {
				err = fmt.Errorf("%s", resp.OverallCode)
			}
			return err
		}, keys)
	})
}

// benchParallel calls check b.N times from 64 goroutines, each time for a
// random key, and reports checks/s and the p50 and p99 latencies.
func benchParallel(b *testing.B, check func(key string) error, keys []string) {
	var mu sync.Mutex
	var lats []time.Duration
	var seed atomic.Uint64
	var failed atomic.Value
	b.SetParallelism(32) // 64 goroutines at GOMAXPROCS 2
	b.ResetTimer()
	began := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 7))
		var own []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := check(keys[rng.IntN(len(keys))]); err != nil {
				failed.Store(err)
			}
			own = append(own, time.Since(t0))
		}
		mu.Lock()
		lats = append(lats, own...)
		mu.Unlock()
	})
	elapsed := time.Since(began)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lats)
	q := func(p float64) float64 {
		return float64(lats[min(len(lats)-1, int(p*float64(len(lats))))].Microseconds())
	}
	b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "checks/s")
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
