package daemon

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testwait"
)

// serveXDS serves cache with go-control-plane's xDS server on loopback
// until the returned stop is called or the test ends.
func serveXDS(t *testing.T, cache cachev3.SnapshotCache, addr string, opts ...grpc.ServerOption) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(ctx, cache, nil))
	go srv.Serve(lis)
	stop := func() { srv.Stop(); cancel() }
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// snapshotOf sets version of domain "api", a limit of n a minute per
// user, as node sluice-xds's snapshot.
func snapshotOf(t *testing.T, cache cachev3.SnapshotCache, version string, n uint32) {
	t.Helper()
	conf := &rlconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key: "user", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n},
	}}}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {conf}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "sluice-xds", snap); err != nil {
		t.Fatal(err)
	}
}

// The daemon takes Envoy's rate limit configuration from an xDS server,
// as Envoy Gateway serves it: not ready until the first configuration,
// then serving it to go-control-plane's RLS client, following updates,
// and keeping it while the server is away.
func TestEnvoyXDS(t *testing.T) {
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	addr, stop := serveXDS(t, cache, "127.0.0.1:0")
	cfg := testConfig("xds")
	cfg.EnvoyXDSAddr, cfg.EnvoyXDSNodeID = addr, "sluice-xds"
	d := start(t, cfg, WithClock(fakeclock.New(rulesStart).Now), WithEnvoyXDS(func(c *envoyrls.XDSConfig) {
		c.MinBackoff, c.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}))
	base := "http://" + d.HTTPAddr()
	if r := do(t, http.MethodGet, base+"/healthcheck", ""); r.status != http.StatusInternalServerError {
		t.Errorf("/healthcheck before any configuration: %d", r.status)
	}
	snapshotOf(t, cache, "1", 2)
	testwait.For(t, "the daemon to be ready", d.Ready)
	client := rlsClient(t, d.GRPCAddr())
	call := func() string {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), rlsRequest("api", []string{"user=u"}))
		if err != nil {
			t.Fatal(err)
		}
		return rlsSummary(resp)
	}
	if got := call(); got != "OK; OK r=1" {
		t.Errorf("first call: %s", got)
	}
	snapshotOf(t, cache, "2", 5)
	testwait.For(t, "version 2", func() bool { return d.envoyXDS.Stats().Version == "2" })
	if got := call(); got != "OK; OK r=3" {
		t.Errorf("after the update: %s", got)
	}
	stop()
	testwait.For(t, "the stream to end", func() bool { return d.envoyXDS.Stats().Disconnects > 0 })
	if got := call(); got != "OK; OK r=2" || !d.Ready() {
		t.Errorf("with the server away: %s, ready %v", got, d.Ready())
	}
	m := scrape(t, base)
	for series, want := range map[string]float64{
		"sluice_envoy_domains":                    1,
		"sluice_envoy_config_reloads_total":       2,
		"sluice_envoy_xds_disconnects_total":      1,
		"sluice_envoy_config_reload_errors_total": 0,
	} {
		if m[series] < want || (want == 0 && m[series] != 0) {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
}

// envoy_xds_addr excludes envoy_config_dir, and its TLS files go
// together.
func TestEnvoyXDSConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"with a directory", func(c *Config) { c.EnvoyXDSAddr, c.EnvoyConfigDir = "127.0.0.1:1", t.TempDir() }},
		{"no port", func(c *Config) { c.EnvoyXDSAddr = "127.0.0.1" }},
		{"a cert without its key", func(c *Config) {
			c.EnvoyXDSAddr, c.EnvoyXDSCAFile, c.EnvoyXDSCertFile = "127.0.0.1:1", "ca.pem", "c.pem"
		}},
		{"a cert without a CA", func(c *Config) {
			c.EnvoyXDSAddr, c.EnvoyXDSCertFile, c.EnvoyXDSKeyFile = "127.0.0.1:1", "c.pem", "k.pem"
		}},
		{"an empty node id", func(c *Config) { c.EnvoyXDSAddr, c.EnvoyXDSNodeID = "127.0.0.1:1", "" }},
	} {
		c := testConfig("xds-config")
		tc.mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: valid", tc.name)
		}
	}
	c := testConfig("xds-config")
	c.EnvoyXDSAddr, c.EnvoyXDSCAFile = "127.0.0.1:1", "/nonexistent/ca.pem"
	if _, err := New(c, WithLogOutput(&lockedBuffer{})); err == nil {
		t.Error("New with a missing envoy_xds_ca_file")
	}
}

// With envoy_xds_ca_file the connection to the xDS server is TLS, with
// envoy_xds_cert_file's client certificate: a server that requires one
// configures the daemon; a daemon without a certificate, or verifying
// with another CA, gets nothing and stays not ready.
func TestEnvoyXDSTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "xds CA")
	srvTLS := ca.Config(ca.Issue(t, "xds-server"))
	srvTLS.ClientAuth = tls.RequireAndVerifyClientCert
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	snapshotOf(t, cache, "1", 2)
	addr, _ := serveXDS(t, cache, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(srvTLS)))
	caFile := ca.WriteCA(t, dir, "ca.pem")
	certFile, keyFile := testpki.WriteCert(t, dir, "client", ca.Issue(t, "sluice"))
	otherCA := testpki.NewCA(t, "other CA").WriteCA(t, dir, "other.pem")
	backoff := WithEnvoyXDS(func(c *envoyrls.XDSConfig) { c.MinBackoff, c.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond })
	for _, tc := range []struct {
		name          string
		ca, cert, key string
		wantReady     bool
	}{
		{"with a client certificate", caFile, certFile, keyFile, true},
		{"without one", caFile, "", "", false},
		{"verifying with another CA", otherCA, certFile, keyFile, false},
	} {
		cfg := testConfig("xds-tls")
		cfg.EnvoyXDSAddr, cfg.EnvoyXDSNodeID = addr, "sluice-xds"
		cfg.EnvoyXDSCAFile, cfg.EnvoyXDSCertFile, cfg.EnvoyXDSKeyFile = tc.ca, tc.cert, tc.key
		d := start(t, cfg, backoff)
		if tc.wantReady {
			testwait.For(t, tc.name+": ready", d.Ready)
			continue
		}
		testwait.For(t, tc.name+": two failed streams", func() bool { return d.envoyXDS.Stats().Disconnects >= 2 })
		if d.Ready() || d.envoyXDS.Stats().Updates != 0 {
			t.Errorf("%s: ready %v, %+v", tc.name, d.Ready(), d.envoyXDS.Stats())
		}
	}
}
