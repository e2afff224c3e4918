package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// peerPortConfig is testConfig with the Peer service on a port of its own.
func peerPortConfig(name string) Config {
	c := testConfig(name)
	c.PeerAddr = "127.0.0.1:0"
	return c
}

// floodConns is a public-port flood: connections that complete the HTTP/2
// handshake (the client preface and an empty SETTINGS frame) and then say
// nothing, which a server holds until its idle timeout, minutes away.
type floodConns struct {
	conns   []net.Conn
	refused atomic.Int64 // connections the server closed
	readers sync.WaitGroup
	ours    atomic.Bool // set once the test closes them
}

// http2Hello is the HTTP/2 client preface and an empty SETTINGS frame.
const http2Hello = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// flood opens n connections to addr from 16 goroutines, each sending
// http2Hello, and closes them when the test ends.
func flood(t *testing.T, addr string, n int) *floodConns {
	t.Helper()
	f := &floodConns{}
	var mu sync.Mutex // guards f.conns and errs
	var errs []error
	var dialers sync.WaitGroup
	var next atomic.Int64
	for range 16 {
		dialers.Go(func() {
			for next.Add(1) <= int64(n) {
				c, err := net.DialTimeout("tcp", addr, 30*time.Second)
				if err == nil {
					_, err = io.WriteString(c, http2Hello)
				}
				mu.Lock()
				switch {
				case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
					f.refused.Add(1) // refused before the dial or the write returned
				case err != nil:
					errs = append(errs, err)
				}
				if c != nil {
					f.conns = append(f.conns, c)
				}
				mu.Unlock()
				if c != nil && err == nil {
					f.readers.Go(func() {
						io.Copy(io.Discard, c)
						if !f.ours.Load() {
							f.refused.Add(1)
						}
					})
				}
			}
		})
	}
	dialers.Wait()
	t.Cleanup(func() {
		f.ours.Store(true)
		for _, c := range f.conns {
			c.Close()
		}
		f.readers.Wait()
	})
	if len(errs) > 0 {
		t.Fatalf("flood of %s: %d of %d connections failed, first: %v", addr, len(errs), n, errs[0])
	}
	return f
}

// ownedBy returns a key of name that d's ring gives to owner.
func ownedBy(t *testing.T, d *Daemon, name, owner string) string {
	t.Helper()
	for i := range 10_000 {
		key := fmt.Sprintf("key-%d", i)
		if m, ok := d.Node().Owner(name, key); ok && m.Name == owner {
			return key
		}
	}
	t.Fatalf("no key of %s owned by %s", name, owner)
	return ""
}

// checkHTTP posts a check of key, limit 5 an hour, to d's HTTP API and
// returns whether it was allowed and who decided it.
func checkHTTP(t *testing.T, base, key string) (bool, string) {
	t.Helper()
	resp := do(t, "POST", base+"/v1/check", `{"name":"flood","key":"`+key+`","limit":5,"period":"1h","algorithm":"fixed_window"}`)
	var dec struct {
		Allowed      bool   `json:"allowed"`
		Owner        string `json:"owner"`
		WithoutOwner bool   `json:"without_owner"`
	}
	if resp.status != http.StatusOK || json.Unmarshal(resp.body, &dec) != nil || dec.WithoutOwner {
		t.Fatalf("POST %s/v1/check: %d %s, want a decision of the owner", base, resp.status, resp.body)
	}
	return dec.Allowed, dec.Owner
}

// TestPublicFloodLeavesPeersDeciding floods the first daemon's grpc_addr
// with 5000 connections that complete the HTTP/2 handshake and open no
// call, beyond its cap, then starts a second daemon that joins it: the two
// open their peer connections, and checks sent to each daemon's public
// APIs for keys the other owns are forwarded over peer_addr and decided
// exactly by their owner. The flood does not hold the public port either:
// each connection beyond the cap takes the slot of the one idle longest,
// and a client of the public API is served at once.
func TestPublicFloodLeavesPeersDeciding(t *testing.T) {
	const conns = 5000
	a := start(t, peerPortConfig("flood-a"))
	capacity := a.publicLimits().MaxConnections
	if conns <= capacity {
		t.Fatalf("%d connections do not fill a cap of %d", conns, capacity)
	}
	if a.GRPCAddr() == a.PeerAddr() {
		t.Fatalf("grpc_addr and peer_addr are both %s", a.GRPCAddr())
	}
	began := time.Now()
	f := flood(t, a.GRPCAddr(), conns)
	t.Logf("%d connections opened in %v", conns, time.Since(began))
	testwait.For(t, fmt.Sprintf("the public port to refuse the %d connections beyond its cap of %d", conns-capacity, capacity), func() bool {
		return f.refused.Load() >= int64(conns-capacity)
	})
	publicServed(t, a.GRPCAddr())
	t.Logf("the public port served a client after %v", time.Since(began))

	cfg := peerPortConfig("flood-b")
	cfg.Join = []string{a.GossipAddr()}
	b := start(t, cfg)
	waitSettled(t, []*Daemon{a, b})

	for _, m := range b.Node().Members() {
		if m.Name == a.cfg.NodeName && m.GRPCAddr != a.PeerAddr() {
			t.Fatalf("a advertises %s to its peers, want its peer_addr %s", m.GRPCAddr, a.PeerAddr())
		}
	}

	// Keys of a, checked on b's public gRPC API; keys of b, checked on a's
	// HTTP API (a's public gRPC port is full).
	onB, err := client.New(b.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer onB.Close()
	keyOfA, keyOfB := ownedBy(t, b, "flood", a.cfg.NodeName), ownedBy(t, a, "flood", b.cfg.NodeName)
	forwardedBefore := a.Node().Stats().Forwarded
	for i := range 8 {
		wantAllowed := i < 5
		d, err := onB.Check(context.Background(), limiter.Request{Name: "flood", Key: keyOfA, Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.FixedWindow})
		if err != nil || d.Allowed != wantAllowed || d.Owner != a.cfg.NodeName || d.WithoutOwner {
			t.Fatalf("check %d of a's key on b's gRPC API: %+v, %v; want allowed %v, decided by %s", i+1, d, err, wantAllowed, a.cfg.NodeName)
		}
		allowed, owner := checkHTTP(t, "http://"+a.HTTPAddr(), keyOfB)
		if allowed != wantAllowed || owner != b.cfg.NodeName {
			t.Fatalf("check %d of b's key on a's HTTP API: allowed %v by %q; want %v by %s", i+1, allowed, owner, wantAllowed, b.cfg.NodeName)
		}
	}
	// A forward retried after a ring change counts twice: at least 8.
	if got := a.Node().Stats().Forwarded - forwardedBefore; got < 8 {
		t.Errorf("a forwarded %d checks to b, want at least 8", got)
	}
	// The flood's connections, idle, gave up their slots; the public
	// port still serves.
	publicServed(t, a.GRPCAddr())
	if got := f.refused.Load(); got < int64(conns-capacity) {
		t.Errorf("the public port closed %d of the flood's connections, want at least the %d beyond its cap", got, conns-capacity)
	}
}

// publicServed checks a key on the public gRPC API at addr with a new
// client, which must be answered within the deadline of testwait.
func publicServed(t *testing.T, addr string) {
	t.Helper()
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testwait.For(t, "a client's check on a public port that idle connections flood", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Check(ctx, limiter.Request{Name: "served", Key: "k", Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.FixedWindow})
		return err == nil
	})
}

// serviceCodes calls every gRPC service a daemon may serve at addr and
// returns each call's status code.
func serviceCodes(t *testing.T, addr string, creds credentials.TransportCredentials) map[string]codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &pb.RateLimitRequest{Name: "svc", Key: "k", Limit: 5, PeriodNanos: int64(time.Hour), Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW}
	out := map[string]codes.Code{}
	_, err = pb.NewSluiceClient(conn).Check(ctx, &pb.CheckRequest{Request: req})
	out["Sluice.Check"] = status.Code(err)
	_, err = pb.NewSluiceClient(conn).Health(ctx, &pb.HealthRequest{})
	out["Sluice.Health"] = status.Code(err)
	_, err = pb.NewRulesClient(conn).Check(ctx, &pb.RulesCheckRequest{User: "u"})
	out["Rules.Check"] = status.Code(err)
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlsRequest("api", []string{"user=u"}))
	out["RateLimitService"] = status.Code(err)
	_, err = pb.NewPeerClient(conn).CheckBatch(ctx, &pb.PeerCheckRequest{From: "probe"})
	out["Peer.CheckBatch"] = status.Code(err)
	return out
}

// checkCodes fails the test where got differs from want.
func checkCodes(t *testing.T, what string, got, want map[string]codes.Code) {
	t.Helper()
	for svc, w := range want {
		if got[svc] != w {
			t.Errorf("%s: %s answered %v, want %v", what, svc, got[svc], w)
		}
	}
}

// With peer_addr, grpc_addr serves the public API and not the Peer
// service, and peer_addr the Peer service and nothing of the public API;
// without it, grpc_addr serves both and the daemon warns, naming
// peer_addr.
func TestPortPerPrincipal(t *testing.T) {
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, checkRules)
	both := func(c *Config) {
		c.RulesFile = rulesFile
		c.EnvoyConfigDir = envoyDir(t)
		writeEnvoyFile(t, c.EnvoyConfigDir, "api.yaml", envoyAPI)
	}
	public := map[string]codes.Code{"Sluice.Check": codes.OK, "Sluice.Health": codes.OK, "Rules.Check": codes.OK, "RateLimitService": codes.OK}
	unimplemented := func(svcs map[string]codes.Code) map[string]codes.Code {
		out := map[string]codes.Code{}
		for svc := range svcs {
			out[svc] = codes.Unimplemented
		}
		return out
	}
	peer := map[string]codes.Code{"Peer.CheckBatch": codes.OK}
	merged := func(ms ...map[string]codes.Code) map[string]codes.Code {
		out := map[string]codes.Code{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}

	t.Run("with peer_addr", func(t *testing.T) {
		cfg := peerPortConfig("apart")
		both(&cfg)
		var log lockedBuffer
		d := start(t, cfg, WithLogOutput(&log))
		if d.GRPCAddr() == d.PeerAddr() {
			t.Fatalf("grpc_addr and peer_addr are both %s", d.GRPCAddr())
		}
		creds := insecure.NewCredentials()
		checkCodes(t, "grpc_addr", serviceCodes(t, d.GRPCAddr(), creds), merged(public, unimplemented(peer)))
		checkCodes(t, "peer_addr", serviceCodes(t, d.PeerAddr(), creds), merged(unimplemented(public), peer))
		if strings.Contains(log.String(), "set peer_addr") {
			t.Errorf("warned about peer_addr with peer_addr set:\n%s", log.String())
		}
		// A graceful shutdown closes both ports.
		if err := d.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, addr := range []string{d.GRPCAddr(), d.PeerAddr()} {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				t.Errorf("%s accepts connections after Shutdown", addr)
			}
		}
	})

	t.Run("without peer_addr", func(t *testing.T) {
		cfg := testConfig("shared")
		both(&cfg)
		var log lockedBuffer
		d := start(t, cfg, WithLogOutput(&log))
		if d.GRPCAddr() != d.PeerAddr() {
			t.Fatalf("grpc_addr %s and peer_addr %s differ without peer_addr", d.GRPCAddr(), d.PeerAddr())
		}
		checkCodes(t, "grpc_addr", serviceCodes(t, d.GRPCAddr(), insecure.NewCredentials()), merged(public, peer))
		var warned bool
		for line := range strings.Lines(log.String()) {
			var rec struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "WARN" && strings.Contains(rec.Msg, "set peer_addr") {
				warned = true
			}
		}
		if !warned {
			t.Errorf("no warning that names peer_addr in the log:\n%s", log.String())
		}
	})
}

// Under mutual TLS with peer identities and peer_addr, both ports speak
// TLS only: a forwarded check crosses peer_addr with the nodes'
// certificates, an API client's certificate is served the public API on
// grpc_addr and refused the Peer service on peer_addr, where members'
// forwarded checks are served.
func TestPeerPortUnderTLS(t *testing.T) {
	ca, ds := peerTLSDaemons(t, "ptls", func(c *Config) { c.PeerAddr = "127.0.0.1:0" })
	a, b := ds[0], ds[1]
	as := func(cert tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}})
	}
	apiClient, member := as(ca.Issue(t, "caller")), as(ca.IssueWith(t, "member", peerID))

	c, err := client.New(a.GRPCAddr(), client.WithTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, "caller")}}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keyOfB := ownedBy(t, a, "tls", b.cfg.NodeName)
	for i := range 4 {
		d, err := c.Check(context.Background(), limiter.Request{Name: "tls", Key: keyOfB, Hits: 1, Limit: 3, Period: time.Hour, Algorithm: limiter.TokenBucket})
		if err != nil || d.Allowed != (i < 3) || d.Owner != b.cfg.NodeName || d.WithoutOwner {
			t.Fatalf("check %d on a of b's key: %+v, %v; want allowed %v, decided by %s", i+1, d, err, i < 3, b.cfg.NodeName)
		}
	}

	for _, tc := range []struct {
		what  string
		addr  string
		creds credentials.TransportCredentials
		want  map[string]codes.Code
	}{
		{"API client on grpc_addr", a.GRPCAddr(), apiClient, map[string]codes.Code{"Sluice.Check": codes.OK, "Peer.CheckBatch": codes.Unimplemented}},
		{"API client on peer_addr", a.PeerAddr(), apiClient, map[string]codes.Code{"Sluice.Check": codes.Unimplemented, "Peer.CheckBatch": codes.PermissionDenied}},
		// A member's certificate without the proof under the key the
		// gossip keys derive: the Peer service asks for both (the
		// forwarded checks above carry both).
		{"member certificate alone on peer_addr", a.PeerAddr(), member, map[string]codes.Code{"Sluice.Check": codes.Unimplemented, "Peer.CheckBatch": codes.Unauthenticated}},
		{"plain text on grpc_addr", a.GRPCAddr(), insecure.NewCredentials(), map[string]codes.Code{"Sluice.Check": codes.Unavailable}},
		{"plain text on peer_addr", a.PeerAddr(), insecure.NewCredentials(), map[string]codes.Code{"Peer.CheckBatch": codes.Unavailable}},
		{"no certificate on grpc_addr", a.GRPCAddr(), credentials.NewTLS(&tls.Config{RootCAs: ca.Pool}), map[string]codes.Code{"Sluice.Check": codes.Unavailable}},
	} {
		checkCodes(t, tc.what, serviceCodes(t, tc.addr, tc.creds), tc.want)
	}
}

// peer_addr must not take the port of grpc_addr, http_addr or gossip_addr;
// port 0, a free port each, and distinct ports are fine.
func TestPeerAddrValidation(t *testing.T) {
	for _, tc := range []struct {
		peer, grpc, http string
		wantErr          string // "" for valid
	}{
		{peer: "127.0.0.1:7948", grpc: "127.0.0.1:7947", http: "127.0.0.1:8080"},
		{peer: "127.0.0.1:0", grpc: "127.0.0.1:0", http: "127.0.0.1:0"},
		{peer: "10.0.0.1:7947", grpc: "10.0.0.2:7947", http: ":8080"},
		{peer: "127.0.0.1:7947", grpc: "127.0.0.1:7947", http: ":8080", wantErr: "grpc_addr"},
		{peer: ":7947", grpc: "10.0.0.1:7947", http: ":8080", wantErr: "grpc_addr"},
		{peer: "10.0.0.1:7947", grpc: "0.0.0.0:7947", http: ":8080", wantErr: "grpc_addr"},
		{peer: "[::1]:8080", grpc: ":7947", http: "[::]:8080", wantErr: "http_addr"},
		{peer: ":7946", grpc: ":7947", http: ":8080", wantErr: "gossip_addr"},
		{peer: "7948", grpc: ":7947", http: ":8080", wantErr: "not host:port"},
		{peer: "127.0.0.1:70000", grpc: ":7947", http: ":8080", wantErr: "port"},
	} {
		c := DefaultConfig()
		c.NodeName = "v"
		c.PeerAddr, c.GRPCAddr, c.HTTPAddr = tc.peer, tc.grpc, tc.http
		err := c.Validate()
		var ce *ConfigError
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("peer %q, grpc %q, http %q: %v, want valid", tc.peer, tc.grpc, tc.http, err)
		case tc.wantErr != "" && (!errors.As(err, &ce) || ce.Field != "peer_addr" || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("peer %q, grpc %q, http %q: %v, want an error of peer_addr naming %s", tc.peer, tc.grpc, tc.http, err, tc.wantErr)
		}
	}
	// Every source sets it, and a clash is refused whichever source made it.
	path := writeFile(t, "peer_addr: 127.0.0.1:7948\n")
	for _, src := range []struct {
		args []string
		env  map[string]string
	}{
		{args: []string{"--config", path}},
		{env: map[string]string{"SLUICE_PEER_ADDR": "127.0.0.1:7948"}},
		{args: []string{"--peer-addr", "127.0.0.1:7948"}},
	} {
		c, err := Load(append([]string{"--node-name", "n"}, src.args...), envMap(src.env), io.Discard)
		if err != nil || c.PeerAddr != "127.0.0.1:7948" {
			t.Errorf("Load %v %v: peer_addr %q, %v; want 127.0.0.1:7948", src.args, src.env, c.PeerAddr, err)
		}
		_, err = Load(append([]string{"--node-name", "n", "--grpc-addr", "127.0.0.1:7948"}, src.args...), envMap(src.env), io.Discard)
		if ce, ok := errors.AsType[*ConfigError](err); !ok || ce.Field != "peer_addr" || !strings.Contains(err.Error(), "grpc_addr") {
			t.Errorf("Load %v %v with grpc_addr on peer_addr's port: %v, want an error of peer_addr naming grpc_addr", src.args, src.env, err)
		}
	}
}

// With peer_addr, a taken grpc_addr fails New before the node starts, and
// a taken peer_addr fails it naming peer_addr; neither leaves anything
// running (TestMain checks for goroutines).
func TestPeerPortTaken(t *testing.T) {
	taken := start(t, peerPortConfig("taken"))
	for _, tc := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.GRPCAddr = taken.GRPCAddr() }, "listen on grpc_addr"},
		{func(c *Config) { c.PeerAddr = taken.PeerAddr() }, "peer_addr " + taken.PeerAddr()},
		{func(c *Config) { c.PeerAddr = taken.GRPCAddr() }, "peer_addr " + taken.GRPCAddr()},
	} {
		cfg := peerPortConfig("second")
		tc.set(&cfg)
		if d, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), tc.want) {
			if d != nil {
				d.Close()
			}
			t.Errorf("New on a taken port: %v, want an error with %q", err, tc.want)
		}
	}
}
