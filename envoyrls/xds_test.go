package envoyrls

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

// xdsServer is go-control-plane's xDS server over its snapshot cache, on
// loopback, recording the error details of the requests it receives
// (NACKs).
type xdsServer struct {
	cache cachev3.SnapshotCache
	addr  string
	srv   *grpc.Server
	stop  context.CancelFunc

	mu    sync.Mutex
	nacks []string // guarded by mu
}

// startXDSServer serves cache on addr ("127.0.0.1:0" for a new port)
// until stopped or the test ends.
func startXDSServer(t testing.TB, cache cachev3.SnapshotCache, addr string) *xdsServer {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x := &xdsServer{cache: cache, addr: lis.Addr().String(), srv: grpc.NewServer(), stop: cancel}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		if r.ErrorDetail != nil {
			x.mu.Lock()
			x.nacks = append(x.nacks, r.ErrorDetail.Message)
			x.mu.Unlock()
		}
		return nil
	}}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(x.srv, serverv3.NewServer(ctx, cache, cb))
	go x.srv.Serve(lis)
	t.Cleanup(x.close)
	return x
}

// close stops the server at once, as a server that goes away.
func (x *xdsServer) close() {
	x.srv.Stop()
	x.stop()
}

func (x *xdsServer) nackList() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.nacks...)
}

// rlConfig is a RateLimitConfig of domain with a limit of n per minute
// on key.
func rlConfig(name, domain, key string, n uint32) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key:       key,
		RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n},
	}}}
}

// setSnapshot makes version of configs the snapshot of node "sluice".
func setSnapshot(t testing.TB, cache cachev3.SnapshotCache, version string, configs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "sluice", snap); err != nil {
		t.Fatal(err)
	}
}

// The watcher takes its configuration from go-control-plane's own xDS
// server: the first snapshot, updates, removals; an invalid resource is
// NACKed with its error and the last good rules stay; when the server
// goes away the rules stay, and the watcher connects again with backoff
// and takes the next snapshot.
func TestXDSWatcher(t *testing.T) {
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, "v1", rlConfig("a", "a", "user", 2))
	srv := startXDSServer(t, cache, "127.0.0.1:0")

	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	// The waits run on the test's terms: recorded, and over at once.
	var waitMu sync.Mutex
	var waits []time.Duration
	cfg.After = func(d time.Duration) <-chan time.Time {
		waitMu.Lock()
		waits = append(waits, d)
		waitMu.Unlock()
		c := make(chan time.Time, 1)
		c <- testStart
		return c
	}
	var rejected []error
	var mu sync.Mutex
	cfg.OnReject = func(err error) { mu.Lock(); rejected = append(rejected, err); mu.Unlock() }
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Current().Len() != 0 {
		t.Error("rules before the first response")
	}
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no configuration after 10s")
	}

	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New(testStart)
	sc := DefaultConfig()
	sc.Limiter, sc.Rules, sc.Now = sluice.NewLocal(store, clk.Now), w, clk.Now
	svc, err := New(sc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, clk: clk, svc: svc}
	waitVersion := func(v string) {
		t.Helper()
		testwait.For(t, "version "+v, func() bool { return w.Stats().Version == v })
	}
	e.run("a", []step{{descs: descs(desc("user=x")), want: "OK; OK 1/2/minute t=40s"}})

	// An update and a new domain.
	setSnapshot(t, cache, "v2", rlConfig("a", "a", "user", 5), rlConfig("b", "b", "ip", 1))
	waitVersion("v2")
	e.run("a", []step{{descs: descs(desc("user=x")), want: "OK; OK 3/5/minute t=40s"}})
	e.run("b", []step{{descs: descs(desc("ip=1")), want: "OK; OK 0/1/minute t=40s"}})

	// A removal: a resource left out of the state of the world is gone.
	setSnapshot(t, cache, "v3", rlConfig("b", "b", "ip", 1))
	waitVersion("v3")
	e.run("a", []step{{descs: descs(desc("user=x")), want: "OK; OK"}})

	// Invalid resources are NACKed with their error; v3 stays.
	bad := rlConfig("bad", "c", "user", 1)
	bad.Descriptors[0].RateLimit.Unit = rlconfv3.RateLimitUnit_UNKNOWN
	setSnapshot(t, cache, "v4", rlConfig("b", "b", "ip", 1), bad)
	testwait.For(t, "a NACK", func() bool { return len(srv.nackList()) > 0 })
	if n := srv.nackList()[0]; !strings.Contains(n, "xds:bad") || !strings.Contains(n, "rate_limit has no unit") {
		t.Errorf("NACK detail: %s", n)
	}
	setSnapshot(t, cache, "v4b", rlConfig("b", "b", "ip", 1), rlConfig("b2", "b", "user", 1))
	// (The snapshot cache sends a version NACKed again: the watcher
	// NACKs the repeats after a growing wait, and counts them once.)
	testwait.For(t, "the NACK of a domain twice", func() bool {
		l := srv.nackList()
		return strings.Contains(l[len(l)-1], `domain "b" is configured in xds:b already`)
	})
	mu.Lock()
	if len(rejected) != 2 || !errors.Is(rejected[0], ErrInvalidConfig) {
		t.Errorf("rejections: %v", rejected)
	}
	mu.Unlock()
	if s := w.Stats(); s.Version != "v3" || s.Rejects != 2 {
		t.Errorf("after the NACKs: %+v", s)
	}
	e.run("b", []step{{descs: descs(desc("ip=1")), want: "OVER_LIMIT; OVER 0/1/minute t=40s"}})

	// The server goes away: the rules stay. One comes back on the same
	// address with the next snapshot: the watcher takes it.
	srv.close()
	testwait.For(t, "the stream to end", func() bool { return w.Stats().Disconnects > 0 })
	e.run("b", []step{{descs: descs(desc("ip=1")), want: "OVER_LIMIT; OVER 0/1/minute t=40s"}})
	cache2 := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache2, "v5", rlConfig("a", "a", "user", 7))
	startXDSServer(t, cache2, srv.addr)
	waitVersion("v5")
	e.run("a", []step{{descs: descs(desc("user=y")), want: "OK; OK 6/7/minute t=40s"}})
	if s := w.Stats(); s.Connects < 2 || s.Updates != 4 {
		t.Errorf("stats: %+v, want 2 connects or more and 4 updates", s)
	}
	waitMu.Lock()
	defer waitMu.Unlock()
	for i, d := range waits {
		if d < 5*time.Millisecond || d > 50*time.Millisecond {
			t.Errorf("wait %d: %v, outside [MinBackoff/2, MaxBackoff]", i, d)
		}
	}
}

// A management server that restarts counts its versions afresh, as
// Envoy Gateway's rate limit xDS server does (1, 2, ... in each
// process): a restarted server whose snapshot has the version the watcher
// last took, with other resources or none, is still taken.
func TestXDSWatcherServerRestartsItsVersions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		configs []*rlconfv3.RateLimitConfig
	}{
		{"the policy changed", []*rlconfv3.RateLimitConfig{rlConfig("b", "b", "ip", 1)}},
		{"the policy deleted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
			setSnapshot(t, cache, "1", rlConfig("a", "a", "user", 2))
			srv := startXDSServer(t, cache, "127.0.0.1:0")
			cfg := DefaultXDSConfig()
			cfg.Addr, cfg.NodeID = srv.addr, "sluice"
			cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, time.Millisecond
			w, err := WatchXDS(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			testwait.For(t, "the first snapshot", func() bool { _, ok := w.Current().Domain("a"); return ok })

			srv.close()
			testwait.For(t, "the stream to end", func() bool { return w.Stats().Disconnects > 0 })
			restarted := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
			setSnapshot(t, restarted, "1", tc.configs...)
			startXDSServer(t, restarted, srv.addr)
			testwait.For(t, "the restarted server's snapshot", func() bool {
				_, ok := w.Current().Domain("a")
				return !ok && w.Current().Len() == len(tc.configs)
			})
		})
	}
}

// RulesFromXDS refuses what it cannot bound or read.
func TestRulesFromXDS(t *testing.T) {
	deep := &rlconfv3.RateLimitDescriptor{Key: "k"}
	for range MaxXDSDepth {
		deep = &rlconfv3.RateLimitDescriptor{Key: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{deep}}
	}
	anyOf := func(c *rlconfv3.RateLimitConfig) *anypb.Any {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	other, _ := anypb.New(&discoveryv3.DiscoveryRequest{})
	badMetadata := &rlconfv3.RateLimitDescriptor{Key: "k"}
	badMetadata.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 8, protowire.BytesType), []byte{0xff}))
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"too deep", []*anypb.Any{anyOf(&rlconfv3.RateLimitConfig{Name: "d", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{deep}})}, "xds:d: descriptors nest deeper than 100 levels"},
		{"another type", []*anypb.Any{other}, "resource 0"},
		{"no domain", []*anypb.Any{anyOf(&rlconfv3.RateLimitConfig{Name: "n"})}, "xds:n: the domain is empty"},
		{"a bad unit", []*anypb.Any{anyOf(&rlconfv3.RateLimitConfig{Name: "u", Domain: "u", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: 9, RequestsPerUnit: 1}}}})}, "unknown rate limit unit 9"},
		{"bad metadata", []*anypb.Any{anyOf(&rlconfv3.RateLimitConfig{Name: "m", Domain: "m", Descriptors: []*rlconfv3.RateLimitDescriptor{badMetadata}})},
			`xds:m: descriptor "k": metadata:`},
	} {
		_, err := RulesFromXDS(tc.res, LoadConfig{})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	r, err := RulesFromXDS([]*anypb.Any{anyOf(rlConfig("a", "d", "x", 1)), anyOf(rlConfig("b", "d", "y", 1))}, LoadConfig{MergeDomains: true})
	if err != nil || r.Len() != 1 {
		t.Errorf("merged: %v %v", r, err)
	}
}
