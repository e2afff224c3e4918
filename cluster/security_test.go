package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

func startNode(t *testing.T, cfg cluster.Config) *cluster.Node {
	t.Helper()
	n, err := cluster.New(cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.NodeName, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
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
