package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testrogue"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// memberAlive reports whether n's gossip lists name alive.
func memberAlive(n *cluster.Node, name string) bool {
	for _, m := range n.Members() {
		if m.Name == name && m.Status == "alive" {
			return true
		}
	}
	return false
}

// waitRefused waits until every node lists name among its refused members,
// alive in its gossip.
func waitRefused(t *testing.T, name string, nodes ...*cluster.Node) {
	t.Helper()
	err := testcluster.WaitFor(10*time.Second, func() error {
		for _, n := range nodes {
			if !memberAlive(n, name) {
				return fmt.Errorf("%s does not see %s alive", n.Name(), name)
			}
			if !slices.ContainsFunc(n.RefusedMembers(), func(r cluster.RefusedMember) bool { return r.Name == name }) {
				return fmt.Errorf("%s does not list %s as refused: %+v", n.Name(), name, n.RefusedMembers())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitSettled waits until every node is ready, routes over want members
// and has every other member's hand-over confirmation.
func waitSettled(t *testing.T, want int, nodes ...*cluster.Node) {
	t.Helper()
	waitRing(t, want, nodes...)
	err := testcluster.WaitFor(10*time.Second, func() error {
		for _, n := range nodes {
			if !n.Ready() {
				return fmt.Errorf("%s is not ready", n.Name())
			}
			if u := n.Unconfirmed(); len(u) > 0 {
				return fmt.Errorf("%s waits for the hand-over of %v", n.Name(), u)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRogueMemberOwnsNoKey joins a stock serf agent, which holds the gossip
// key but not the peer credential, to a node, its grpc tag naming a server
// that answers every check as the attacker likes. It never enters the
// ring: every key is decided by the node, counts are exact, and no check,
// state or lease reaches the agent's server. The node reports it, in
// RefusedMembers and in sluice_members_refused, and so does a second node
// that joins later: each node challenges every member it sees.
func TestRogueMemberOwnsNoKey(t *testing.T) {
	const id = "spiffe://sluice.test/peer"
	ca := testpki.NewCA(t, "sluice test CA")
	key := gossipKey(9, 32)
	for _, tc := range []struct {
		name  string
		allow bool
		set   func(c *cluster.Config)
		rogue func(t *testing.T, allow bool) *testrogue.Peer
	}{
		{"cluster secret, rogue allows", true,
			func(c *cluster.Config) { c.ClusterSecret = []byte("a secret the members share") },
			func(t *testing.T, allow bool) *testrogue.Peer { return testrogue.StartPeer(t, allow, nil) }},
		{"cluster secret, rogue denies", false,
			func(c *cluster.Config) { c.ClusterSecret = []byte("a secret the members share") },
			func(t *testing.T, allow bool) *testrogue.Peer { return testrogue.StartPeer(t, allow, nil) }},
		{"mutual TLS, rogue serves an API client's certificate", true,
			func(c *cluster.Config) {
				c.TLS = ca.Config(ca.IssueWith(t, c.NodeName, id))
				c.PeerIdentities = []string{id}
			},
			func(t *testing.T, allow bool) *testrogue.Peer {
				return testrogue.StartPeer(t, allow, ca.Config(ca.Issue(t, "api-client")))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			regs := map[string]*prometheus.Registry{}
			cfg := func(name string) cluster.Config {
				c := cluster.TestConfig(name)
				c.GossipKeys = [][]byte{key}
				c.Replicas = 2
				regs[name] = prometheus.NewRegistry()
				c.Registerer = regs[name]
				tc.set(&c)
				return c
			}
			a := startNode(t, cfg("a"))
			rogue := tc.rogue(t, tc.allow)
			if _, err := testrogue.JoinSerf(t, "rogue", rogue.Addr, key, a.GossipAddr()); err != nil {
				t.Fatalf("the rogue's join: %v", err)
			}
			waitRefused(t, "rogue", a)
			wantRefused := func(n *cluster.Node) {
				t.Helper()
				if got := metricValue(t, regs[n.Name()], "sluice_members_refused", nil); got != 1 {
					t.Errorf("%s: sluice_members_refused %v, want 1", n.Name(), got)
				}
			}
			wantRefused(a)

			// 40 keys, limit 2, 3 checks each: exactly 80 allowed, all
			// by a. With the rogue in the ring, about half the keys would
			// be its own, and a would replicate its keys to it.
			allowed := 0
			for k := range 40 {
				for i := range 3 {
					d, err := a.Check(context.Background(), request(limiter.GCRA, fmt.Sprintf("rogue-%d", k), 2))
					if err != nil {
						t.Fatal(err)
					}
					if d.WithoutOwner || d.Owner != "a" {
						t.Fatalf("key %d check %d: %+v, want decided by a", k, i, d)
					}
					if d.Allowed {
						allowed++
					}
				}
			}
			if allowed != 80 {
				t.Errorf("%d of 120 checks allowed, want 80", allowed)
			}

			// A real member joins: it proves itself to a, refuses the
			// rogue too, and becomes the replica of a's keys.
			cb := cfg("b")
			cb.Seeds = []string{a.GossipAddr()}
			b := startNode(t, cb)
			waitRing(t, 2, a, b)
			waitRefused(t, "rogue", a, b)
			wantRefused(b)
			if err := testcluster.WaitFor(5*time.Second, func() error {
				if got := b.Store().Len(); got == 0 {
					return errors.New("b holds no replica")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, n := range []*cluster.Node{a, b} {
				for _, m := range n.RingMembers() {
					if m.Name == "rogue" {
						t.Errorf("%s's ring holds the rogue", n.Name())
					}
				}
			}
			if c, s, l := rogue.Checks.Load(), rogue.States.Load(), rogue.Leases.Load(); c+s+l != 0 {
				t.Errorf("the rogue received %d checks, %d states, %d leases; want none", c, s, l)
			}
		})
	}
}

// startPair starts nodes a and b, each with set applied to its
// TestConfig, b joined to a, and waits until both route over both.
func startPair(t *testing.T, set func(*cluster.Config)) (a, b *cluster.Node) {
	t.Helper()
	c1 := cluster.TestConfig("a")
	set(&c1)
	a = startNode(t, c1)
	c2 := cluster.TestConfig("b")
	set(&c2)
	c2.Seeds = []string{a.GossipAddr()}
	b = startNode(t, c2)
	waitRing(t, 2, a, b)
	return a, b
}

// TestSecretDerivesGossipKey: with a cluster secret and no gossip keys,
// gossip is encrypted with a key derived from the secret, so that a stock
// serf agent without it cannot join at all, while members can.
func TestSecretDerivesGossipKey(t *testing.T) {
	secret := []byte("a secret the members share")
	a, b := startPair(t, func(c *cluster.Config) { c.ClusterSecret = secret })

	rogue := testrogue.StartPeer(t, true, nil)
	for name, key := range map[string][]byte{"no key": nil, "the secret as key": secret[:16]} {
		if _, err := testrogue.JoinSerf(t, "rogue", rogue.Addr, key, a.GossipAddr()); err == nil {
			t.Errorf("a stock agent with %s joined", name)
		}
	}
	if len(a.Members()) != 2 || len(b.Members()) != 2 {
		t.Fatalf("members: a sees %d, b sees %d, want 2", len(a.Members()), len(b.Members()))
	}
}

// TestPeerIdentitiesNeedGossipEncryption: identities alone leave gossip
// open to anyone who reaches it, so New refuses them with ErrPlainGossip;
// with gossip keys or a cluster secret beside them, the config is valid.
func TestPeerIdentitiesNeedGossipEncryption(t *testing.T) {
	ca := testpki.NewCA(t, "sluice test CA")
	cfg := cluster.TestConfig("a")
	cfg.TLS = ca.Config(ca.IssueWith(t, "a", "spiffe://sluice.test/peer"))
	cfg.PeerIdentities = []string{"spiffe://sluice.test/peer"}
	n, err := cluster.New(cfg)
	if err == nil {
		n.Close()
		t.Fatal("New accepted peer identities without gossip encryption")
	}
	if !errors.Is(err, cluster.ErrPlainGossip) || !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrPlainGossip in ErrInvalidConfig", err)
	}
	for name, set := range map[string]func(*cluster.Config){
		"gossip keys":    func(c *cluster.Config) { c.GossipKeys = [][]byte{gossipKey(1, 16)} },
		"cluster secret": func(c *cluster.Config) { c.ClusterSecret = []byte("a secret the members share") },
	} {
		c := cfg
		set(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("identities with %s: %v", name, err)
		}
	}
}

// TestOpenDefaultWarnsAndAdmits: without TLS identities or a secret,
// members are used at once, a stock agent included, and the node says at
// start that peer calls are open.
func TestOpenDefaultWarnsAndAdmits(t *testing.T) {
	log := &logLines{}
	c1 := cluster.TestConfig("a")
	c1.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a := startNode(t, c1)
	if !log.find("peer calls are open") {
		t.Fatal("no warning at start of an open node")
	}
	rogue := testrogue.StartPeer(t, true, nil)
	if _, err := testrogue.JoinSerf(t, "rogue", rogue.Addr, nil, a.GossipAddr()); err != nil {
		t.Fatal(err)
	}
	waitRing(t, 2, a)
	if r := a.RefusedMembers(); len(r) != 0 {
		t.Fatalf("open node refuses %+v", r)
	}
}

// TestBrieflyUnreachableMemberProvesLater: a member whose proofs fail when
// it joins is refused, and enters the ring once it answers.
func TestBrieflyUnreachableMemberProvesLater(t *testing.T) {
	secret := []byte("a secret the members share")
	log := &logLines{}
	c1 := cluster.TestConfig("a")
	c1.ClusterSecret = secret
	c1.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a := startNode(t, c1)
	var down atomic.Bool
	down.Store(true)
	c2 := cluster.TestConfig("b")
	c2.ClusterSecret = secret
	c2.UnaryInterceptors = []grpc.UnaryServerInterceptor{
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if down.Load() && strings.HasSuffix(info.FullMethod, "/Prove") {
				return nil, status.Error(codes.Unavailable, "b is starting")
			}
			return h(ctx, req)
		}}
	c2.Seeds = []string{a.GossipAddr()}
	b := startNode(t, c2)
	waitRefused(t, "b", a)
	if got := len(a.RingMembers()); got != 1 {
		t.Fatalf("a routes to %d members while b fails its proof, want 1", got)
	}
	waitRing(t, 2, b) // b proved a: the proofs run both ways, each on its own

	// Retries do not log again: one warning for the change of state.
	if err := testcluster.WaitFor(5*time.Second, func() error {
		if r := a.RefusedMembers(); len(r) != 1 || r[0].Attempts < 3 {
			return fmt.Errorf("refused: %+v, want b after 3 attempts", r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := log.count("member refused"); got != 1 {
		t.Errorf("%d warnings of b's refusal after 3 attempts, want 1", got)
	}

	down.Store(false)
	waitSettled(t, 2, a, b)
	if r := a.RefusedMembers(); len(r) != 0 {
		t.Fatalf("a still refuses %+v", r)
	}
	if !log.find("member proved") {
		t.Errorf("no log of b's proof")
	}
	kb := keyOwnedBy(t, a, "b")
	d, err := a.Check(context.Background(), request(limiter.GCRA, kb, 10))
	if err != nil || d.Owner != "b" || d.WithoutOwner || !d.Allowed {
		t.Fatalf("check of b's key from a: %+v, %v, want allowed by b", d, err)
	}
}

// TestNameTakeoverRefused: a stock serf agent that claims a live node's
// name, joining through that node and through another, takes neither its
// name nor its ring entry: the live node keeps running, ready, at its own
// addresses in every ring.
func TestNameTakeoverRefused(t *testing.T) {
	key := gossipKey(5, 32)
	log := &logLines{}
	a, b := startPair(t, func(c *cluster.Config) {
		c.GossipKeys = [][]byte{key}
		if c.NodeName == "a" {
			c.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})

	rogue := testrogue.StartPeer(t, true, nil)
	if _, err := testrogue.JoinSerf(t, "a", rogue.Addr, key, a.GossipAddr(), b.GossipAddr()); err != nil {
		t.Logf("the claimant's join: %v", err)
	}
	// a hears of the claim and does not yield.
	if err := testcluster.WaitFor(5*time.Second, func() error {
		if !log.find("Node name conflicts") {
			return errors.New("a has not seen the claim on its name")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !log.find("Resolution enabled: false") {
		t.Fatal("a may yield its name: serf's name conflict resolution is on")
	}
	for _, n := range []*cluster.Node{a, b} {
		var got cluster.Member
		for _, m := range n.Members() {
			if m.Name == "a" {
				got = m
			}
		}
		if got.GossipAddr != a.GossipAddr() || got.GRPCAddr != a.GRPCAddr() || got.Status != "alive" {
			t.Errorf("%s sees a as %+v, want alive at %s and %s", n.Name(), got, a.GossipAddr(), a.GRPCAddr())
		}
	}
	waitSettled(t, 2, a, b)
	k := keyOwnedBy(t, b, "a")
	for i := range 3 {
		d, err := b.Check(context.Background(), request(limiter.GCRA, k, 2))
		if err != nil || d.Owner != "a" || d.WithoutOwner || d.Allowed != (i < 2) {
			t.Fatalf("check %d of a's key from b: %+v, %v, want decided by a, allowed %v", i, d, err, i < 2)
		}
	}
	if rogue.Checks.Load() != 0 {
		t.Fatalf("the claimant received %d checks", rogue.Checks.Load())
	}
}

// TestRogueTagNamingAMember: a stock serf agent whose grpc tag names a
// real member's server proves nothing (the member answers only to its own
// name), and once it points its tag at a server of its own, it is
// challenged again there, and refused again.
func TestRogueTagNamingAMember(t *testing.T) {
	key := gossipKey(11, 32)
	a, b := startPair(t, func(c *cluster.Config) {
		c.GossipKeys = [][]byte{key}
		c.ClusterSecret = []byte("a secret the members share")
	})
	agent, err := testrogue.JoinSerf(t, "rogue", b.GRPCAddr(), key, a.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	reasonOn := func(n *cluster.Node) (addr, reason string) {
		for _, r := range n.RefusedMembers() {
			if r.Name == "rogue" {
				return r.GRPCAddr, r.Reason
			}
		}
		return "", ""
	}
	waitRefused(t, "rogue", a, b)
	for _, n := range []*cluster.Node{a, b} {
		if addr, reason := reasonOn(n); addr != b.GRPCAddr() || !strings.Contains(reason, `this node is "b"`) {
			t.Errorf("%s refuses the rogue at %s for %q, want at b's address because b is not the rogue", n.Name(), addr, reason)
		}
	}

	own := testrogue.StartPeer(t, true, nil)
	if err := agent.SetTags(testrogue.Tags(own.Addr)); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.WaitFor(10*time.Second, func() error {
		for _, n := range []*cluster.Node{a, b} {
			if addr, reason := reasonOn(n); addr != own.Addr || !strings.Contains(reason, "cluster secret") {
				return fmt.Errorf("%s refuses the rogue at %s for %q, want at its own server for the cluster secret", n.Name(), addr, reason)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitRing(t, 2, a, b)
	if got := own.Checks.Load() + own.States.Load() + own.Leases.Load(); got != 0 {
		t.Fatalf("the rogue's server received %d checks, states and leases", got)
	}
}
