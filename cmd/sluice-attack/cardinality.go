package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// cardinalityConfig is the daemon's Envoy configuration: a limit per
// client, named in metrics after each client (detailed_metric).
const cardinalityConfig = `domain: api
descriptors:
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// maxEnvoyKeys is the daemon's default envoy_metric_keys.
const maxEnvoyKeys = 1000

// metricCardinality: Envoy rate limit service calls of 64 descriptors,
// each with a value never sent before, half of them named in metrics by
// detailed_metric and half carrying their own limit; then a scrape of
// /metrics. sluice_envoy_hits_total must keep at most envoy_metric_keys
// keys and _other.
func metricCardinality(ctx context.Context, c *config) (*row, error) {
	dir := filepath.Join(c.tmp, "envoy")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(cardinalityConfig), 0o600); err != nil {
		return nil, err
	}
	return onDaemon(ctx, c, "metric-cardinality", []string{"--envoy-config-dir", dir}, overGRPC, func(t *target, r *row) error {
		client := rlsv3.NewRateLimitServiceClient(t.conn)
		var next atomic.Int64
		var outcomes tally
		const perCall = 64
		calls := c.rounds(ctx, c.count(40_000), c.hostile(), func(int, int) {
			req := &rlsv3.RateLimitRequest{Domain: "api"}
			for range perCall {
				v := next.Add(1)
				d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "client", Value: fmt.Sprintf("c%d", v)}}}
				if v%2 == 0 {
					d.Entries[0].Key = "caller"
					d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
				}
				req.Descriptors = append(req.Descriptors, d)
			}
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			_, err := client.ShouldRateLimit(cctx, req)
			outcomes.addErr(codeOf(err), err)
		})
		size, keys, err := envoyKeys(ctx, t.d.httpAddr)
		if err != nil {
			return err
		}
		r.did = fmt.Sprintf("%d attackers call Envoy's rate limit service with %d descriptors per call, each value new, half named by detailed_metric and half carrying their own limit, for %v; then one scrape of /metrics",
			c.attackers, perCall, c.duration)
		r.result = fmt.Sprintf("%s calls (%s values): %s; sluice_envoy_hits_total has %s keys, /metrics %s KB",
			thousands(calls), thousands(next.Load()), outcomes.String(), thousands(int64(keys)), thousands(size/1000))
		if keys > maxEnvoyKeys+1 {
			r.miss("%d metric keys, more than envoy_metric_keys (%d) and _other", keys, maxEnvoyKeys)
		}
		return nil
	})
}

// envoyKeys scrapes /metrics at addr and returns its size and the number
// of distinct keys of sluice_envoy_hits_total.
func envoyKeys(ctx context.Context, addr string) (int64, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<30))
	if err != nil {
		return 0, 0, err
	}
	keys := make(map[string]bool)
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "sluice_envoy_hits_total{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `key="`)
		key, _, _ := strings.Cut(rest, `"`)
		keys[key] = true
	}
	return int64(len(body)), len(keys), nil
}
