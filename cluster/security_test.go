package cluster_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func startNode(t *testing.T, cfg cluster.Config) *cluster.Node {
	t.Helper()
	n, err := cluster.New(cfg)
	if err != nil && strings.Contains(err.Error(), "address already in use") && (fixedPort(cfg.GossipAddr) || fixedPort(cfg.GRPCAddr)) {
		// A test that starts a node again at an address it had: another
		// process (a test run beside this one) took the port meanwhile,
		// and the situation the test sets up cannot be made.
		t.Skipf("New(%s) at an address used before: %v", cfg.NodeName, err)
	}
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.NodeName, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// fixedPort reports whether addr names a port other than 0.
func fixedPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port != "0" && port != ""
}

func waitRing(t *testing.T, want int, nodes ...*cluster.Node) {
	t.Helper()
	err := testcluster.WaitFor(5*time.Second, func() error {
		for _, n := range nodes {
			if got := len(n.RingMembers()); got != want {
				return fmt.Errorf("%s routes to %d members, want %d", n.Name(), got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// keyOwnedBy returns a key of request name "test" that owner owns in from's
// ring.
func keyOwnedBy(t *testing.T, from *cluster.Node, owner string) string {
	t.Helper()
	for i := range 10_000 {
		k := fmt.Sprintf("sec-%d", i)
		if m, ok := from.Owner("test", k); ok && m.Name == owner {
			return k
		}
	}
	t.Fatalf("no key owned by %s", owner)
	return ""
}

func gossipKey(b byte, n int) []byte {
	k := make([]byte, n)
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func TestGossipEncryptionSameKey(t *testing.T) {
	key := gossipKey(1, 32)
	c1 := cluster.TestConfig("a")
	c1.GossipKeys = [][]byte{key}
	a := startNode(t, c1)
	c2 := cluster.TestConfig("b")
	c2.GossipKeys = [][]byte{key}
	c2.Seeds = []string{a.GossipAddr()}
	b := startNode(t, c2)
	waitRing(t, 2, a, b)

	k := keyOwnedBy(t, b, "a")
	d, err := b.Check(context.Background(), request(limiter.Algorithms[0], k, 10))
	if err != nil {
		t.Fatal(err)
	}
	if d.Owner != "a" || d.WithoutOwner || !d.Allowed {
		t.Fatalf("forwarded check: %+v, want allowed by a", d)
	}
}

func TestGossipEncryptionWrongKeyCannotJoin(t *testing.T) {
	c1 := cluster.TestConfig("a")
	c1.GossipKeys = [][]byte{gossipKey(1, 32)}
	a := startNode(t, c1)
	c2 := cluster.TestConfig("b")
	c2.GossipKeys = [][]byte{gossipKey(50, 32)}
	b := startNode(t, c2)

	if _, err := b.Join(a.GossipAddr()); !errors.Is(err, cluster.ErrJoin) {
		t.Fatalf("Join with a different key: %v, want ErrJoin", err)
	}
	if len(a.Members()) != 1 || len(b.Members()) != 1 {
		t.Fatalf("members: a sees %d, b sees %d, want 1 each", len(a.Members()), len(b.Members()))
	}
}

func TestGossipKeyLengthRejected(t *testing.T) {
	cfg := cluster.TestConfig("a")
	cfg.GossipKeys = [][]byte{gossipKey(1, 32), gossipKey(1, 15)}
	n, err := cluster.New(cfg)
	if err == nil {
		n.Close()
		t.Fatal("New accepted a 15-byte gossip key")
	}
	if !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
}

func TestMutualTLSForwarding(t *testing.T) {
	ca := testpki.NewCA(t, "sluice test CA")
	c1 := cluster.TestConfig("a")
	c1.TLS = ca.Config(ca.Issue(t, "a"))
	a := startNode(t, c1)
	c2 := cluster.TestConfig("b")
	c2.TLS = ca.Config(ca.Issue(t, "b"))
	c2.Seeds = []string{a.GossipAddr()}
	b := startNode(t, c2)
	waitRing(t, 2, a, b)

	for _, pair := range [][2]*cluster.Node{{b, a}, {a, b}} {
		from, owner := pair[0], pair[1]
		k := keyOwnedBy(t, from, owner.Name())
		d, err := from.Check(context.Background(), request(limiter.Algorithms[0], k, 10))
		if err != nil {
			t.Fatal(err)
		}
		if d.Owner != owner.Name() || d.WithoutOwner {
			t.Fatalf("check from %s: %+v, want decided by %s", from.Name(), d, owner.Name())
		}
	}
}

func TestMutualTLSUntrustedClientRefused(t *testing.T) {
	ca := testpki.NewCA(t, "sluice test CA")
	other := testpki.NewCA(t, "other CA")
	c1 := cluster.TestConfig("a")
	c1.TLS = ca.Config(ca.Issue(t, "a"))
	a := startNode(t, c1)
	c2 := cluster.TestConfig("b")
	// b trusts a's CA but presents a certificate a does not trust.
	c2.TLS = ca.Config(other.Issue(t, "b"))
	c2.Seeds = []string{a.GossipAddr()}
	b := startNode(t, c2)
	waitRing(t, 2, a, b)

	k := keyOwnedBy(t, b, "a")
	d, err := b.Check(context.Background(), request(limiter.Algorithms[0], k, 10))
	if err != nil {
		t.Fatal(err)
	}
	if !d.WithoutOwner || d.Owner != "b" {
		t.Fatalf("check from untrusted b: %+v, want decided by b without owner", d)
	}
	if got := a.Stats().Local; got != 0 {
		t.Fatalf("a decided %d checks, want 0", got)
	}
}

// outsider calls addr's Peer service as a caller that is no cluster
// member, with opts, and reports the status of each attack: a hand-off of
// a state that would deny key until 2116, a lease of its hits, and a
// forwarded check of it.
func outsider(t *testing.T, addr, key string, opts ...grpc.DialOption) map[string]codes.Code {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	far := time.Date(2116, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	c := pb.NewPeerClient(conn)
	req := transport.RequestToProto(request(limiter.GCRA, key, 10))
	out := map[string]codes.Code{}
	_, err = c.Transfer(ctx, &pb.TransferRequest{From: "mallory", Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF,
		States: []*pb.KeyState{{Name: "test", Key: key, Algorithm: pb.Algorithm_ALGORITHM_GCRA, ExpireAtUnixNano: far, Words: []int64{far, int64(time.Second), 0}}}})
	out["Transfer"] = status.Code(err)
	_, err = c.Lease(ctx, &pb.LeaseRequest{From: "mallory", Request: req, Want: 5, TtlNanos: int64(time.Second)})
	out["Lease"] = status.Code(err)
	_, err = c.CheckBatch(ctx, &pb.PeerCheckRequest{From: "mallory", Items: []*pb.RateLimitRequest{req}})
	out["CheckBatch"] = status.Code(err)
	return out
}

// TestPeerCallsNeedClusterSecret runs two nodes that prove a cluster
// secret, or one derived from their gossip key, on every peer call: they
// forward to each other, and an outsider's Transfer, Lease and forwarded
// check are refused and change nothing.
func TestPeerCallsNeedClusterSecret(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*cluster.Config)
	}{
		{"ClusterSecret", func(c *cluster.Config) { c.ClusterSecret = []byte("a secret the members share") }},
		{"GossipKeys", func(c *cluster.Config) { c.GossipKeys = [][]byte{gossipKey(7, 32)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c1 := cluster.TestConfig("a")
			tc.set(&c1)
			a := startNode(t, c1)
			c2 := cluster.TestConfig("b")
			tc.set(&c2)
			c2.Seeds = []string{a.GossipAddr()}
			b := startNode(t, c2)
			waitRing(t, 2, a, b)
			k := keyOwnedBy(t, b, "a")

			for what, code := range outsider(t, a.GRPCAddr(), k) {
				if code != codes.Unauthenticated {
					t.Errorf("outsider's %s: %v, want Unauthenticated", what, code)
				}
			}
			// Ten hits of ten pass, from the member that forwards them:
			// neither the forged state nor a lease took any.
			for i := range 10 {
				d, err := b.Check(context.Background(), request(limiter.GCRA, k, 10))
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed || d.Owner != "a" || d.WithoutOwner {
					t.Fatalf("check %d forwarded by b: %+v, want allowed by a", i, d)
				}
			}
		})
	}
}

// TestPeerCallsNeedPeerIdentity runs two nodes under mutual TLS whose
// certificates carry the peer identity; an API client's certificate, from
// the same CA, may call the public API but no peer method.
func TestPeerCallsNeedPeerIdentity(t *testing.T) {
	const id = "spiffe://sluice.test/peer"
	ca := testpki.NewCA(t, "sluice test CA")
	cfg := func(name string) cluster.Config {
		c := cluster.TestConfig(name)
		c.TLS = ca.Config(ca.IssueWith(t, name, id))
		c.PeerIdentities = []string{id}
		c.GossipKeys = [][]byte{gossipKey(3, 32)} // identities need encrypted gossip
		c.ServePublicAPI = true
		return c
	}
	a := startNode(t, cfg("a"))
	c2 := cfg("b")
	c2.Seeds = []string{a.GossipAddr()}
	b := startNode(t, c2)
	waitRing(t, 2, a, b)
	k := keyOwnedBy(t, b, "a")

	client := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "api-client")}, RootCAs: ca.Pool}))
	for what, code := range outsider(t, a.GRPCAddr(), k, client) {
		if code != codes.PermissionDenied {
			t.Errorf("API client's %s: %v, want PermissionDenied", what, code)
		}
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), client)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewSluiceClient(conn).Check(context.Background(), &pb.CheckRequest{Request: transport.RequestToProto(request(limiter.GCRA, k, 10))})
	if err != nil {
		t.Fatalf("API client's public Check: %v", err)
	}
	if !resp.Response.Allowed || resp.Response.Remaining != 9 {
		t.Fatalf("API client's public Check: %+v, want allowed with 9 remaining", resp.Response)
	}
	d, err := b.Check(context.Background(), request(limiter.GCRA, k, 10))
	if err != nil || !d.Allowed || d.Owner != "a" || d.Remaining != 8 {
		t.Fatalf("check forwarded by b: %+v, %v, want allowed by a with 8 remaining", d, err)
	}
}

// TestPublicAPIOnlyWhenAsked: an embedded node serves its peers, not the
// public API, unless ServePublicAPI is set.
func TestPublicAPIOnlyWhenAsked(t *testing.T) {
	for _, serve := range []bool{false, true} {
		cfg := cluster.TestConfig("a")
		cfg.ServePublicAPI = serve
		n := startNode(t, cfg)
		conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		req := request(limiter.FixedWindow, "k", 10)
		req.Behavior = limiter.Reset
		_, err = pb.NewSluiceClient(conn).Check(context.Background(), &pb.CheckRequest{Request: transport.RequestToProto(req)})
		if want := map[bool]codes.Code{false: codes.Unimplemented, true: codes.OK}[serve]; status.Code(err) != want {
			t.Errorf("ServePublicAPI %v: Check with reset: %v, want %v", serve, err, want)
		}
	}
}

func TestPeerAuthConfigRefused(t *testing.T) {
	for name, set := range map[string]func(*cluster.Config){
		"short secret":           func(c *cluster.Config) { c.ClusterSecret = []byte("too short") },
		"identities without TLS": func(c *cluster.Config) { c.PeerIdentities = []string{"spiffe://x/peer"} },
		"an empty identity":      func(c *cluster.Config) { c.PeerIdentities = []string{""} },
	} {
		cfg := cluster.TestConfig("a")
		set(&cfg)
		if err := cfg.Validate(); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Errorf("%s: Validate: %v, want ErrInvalidConfig", name, err)
		}
	}
}
