package dockertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// peersAlias stands in for a Kubernetes headless Service: every container
// carries it, and Docker's DNS answers it with all of their addresses.
const peersAlias = "sluice-peers"

// envoyDir is where the containers read Envoy's rate limit configuration.
const envoyDir = "/etc/sluice/envoy"

// envoyConfig is an envoyproxy/ratelimit configuration file: 60 requests
// an hour per user of the dockertest domain.
const envoyConfig = `domain: dockertest
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 60
`

// TestJoinThroughDNSName starts three containers whose only join address
// is one DNS name, as deploy/kubernetes configures its pods. The first,
// alone under the name, is not ready: the name answers with its own
// address only, which it does not join. The other two start; every node
// resolves the name again, finds the others, and all three converge to
// three members. A limit then holds exactly across them, through Envoy's
// rate limit service (go-control-plane's client) on the gRPC ports of all
// three containers, and through the HTTP ports.
func TestJoinThroughDNSName(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dockertest.yaml"), []byte(envoyConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// The containers run as an unprivileged user.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	alias := joinAlias(peersAlias)
	plan := func(c *cluster, i int) (runOpts, serveArgs []string) {
		runOpts, serveArgs = alias(c, i)
		runOpts = append(runOpts, "--volume", dir+":"+envoyDir+":ro", "--publish", "127.0.0.1::7947")
		return runOpts, serveArgs
	}
	c := newCluster(t, 3, plan, "--envoy-config-dir", envoyDir)
	first := c.nodes[0]
	c.start(first)
	c.waitFor(first.name+" to answer /readyz", func() error {
		_, err := c.readyz(first)
		return err
	})
	// The first join ran before the HTTP server served.
	if r, err := c.readyz(first); err != nil || r.Status == "ready" {
		t.Fatalf("%s alone under %s: /readyz %+v, %v; want not ready", first.name, peersAlias, r, err)
	}
	for _, nd := range c.nodes[1:] {
		c.start(nd)
	}
	c.waitMembers(c.nodes, 3)

	t.Run("rls", func(t *testing.T) { rlsExact(t, c, 60, 180, 6) })

	const limit, sent, workers = 60, 180, 6
	req := checkRequest{Name: "dockertest", Key: "dns-join", Limit: limit, Period: longPeriod, Algorithm: "sliding_window_log"}
	c.checkExact(req, sent, workers)
	for _, nd := range c.nodes {
		if d, err := c.check(nd, req); err != nil || d.Allowed {
			t.Errorf("%s after the limit: %+v, %v; want limited", nd.name, d, err)
		}
	}
}

// rlsExact sends sent ShouldRateLimit calls for one user, from workers
// callers spread over every node's published gRPC port, and wants exactly
// limit of them OK.
func rlsExact(t *testing.T, c *cluster, limit, sent, workers int) {
	var clients []rlsv3.RateLimitServiceClient
	for _, nd := range c.nodes {
		out, err := docker(dockerTimeout, "port", nd.name, "7947/tcp")
		if err != nil {
			t.Fatal(err)
		}
		base, err := loopbackURL(out)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	req := &rlsv3.RateLimitRequest{Domain: "dockertest", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "dns-join"}},
	}}}
	var ok, over, failed atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(sent) {
				ctx, cancel := context.WithTimeout(context.Background(), httpTimeout)
				resp, err := clients[w%len(clients)].ShouldRateLimit(ctx, req)
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
					t.Errorf("ShouldRateLimit: %v", err)
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				default:
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != int64(limit) || over.Load() != int64(sent-limit) || failed.Load() != 0 {
		t.Fatalf("RLS: %d OK, %d over limit, %d failed of %d; want exactly %d OK", ok.Load(), over.Load(), failed.Load(), sent, limit)
	}
}
