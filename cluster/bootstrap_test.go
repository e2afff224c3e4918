package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

// dailyRequests are n keys with a daily limit, one hit each.
func dailyRequests(prefix string, n int, limit int64) []limiter.Request {
	reqs := make([]limiter.Request, n)
	for i := range reqs {
		reqs[i] = limiter.Request{Name: prefix, Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow}
	}
	return reqs
}

// admitted checks req through nd n times under PolicyDeny and counts the
// hits admitted.
func admitted(t *testing.T, nd *cluster.Node, req limiter.Request, n int) int {
	t.Helper()
	got := 0
	for range n {
		d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			t.Fatalf("%s: check %s: %v", nd.Name(), req.Key, err)
		}
		if d.Allowed {
			got++
		}
	}
	return got
}

// converged waits until every node of nodes routes over all of them, is
// ready and waits for no hand-over, with a deadline that allows for a
// loaded machine.
func converged(t *testing.T, nodes ...*cluster.Node) {
	t.Helper()
	err := testwait.Until(30*time.Second, func() error {
		for _, n := range nodes {
			switch {
			case len(n.RingMembers()) != len(nodes):
				return fmt.Errorf("%s routes to %v, want %d members", n.Name(), n.RingMembers(), len(nodes))
			case !n.Ready():
				return fmt.Errorf("%s is not ready: %s", n.Name(), n.NotReadyReason())
			case len(n.Unconfirmed()) > 0:
				return fmt.Errorf("%s waits for the hand-over of %v", n.Name(), n.Unconfirmed())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// routes waits until every node of nodes routes to want members.
func routes(t *testing.T, want int, nodes ...*cluster.Node) {
	t.Helper()
	err := testwait.Until(30*time.Second, func() error {
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

func waitReady(t *testing.T, nodes ...*cluster.Node) {
	t.Helper()
	for _, n := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := n.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s is not ready: %v (%s)", n.Name(), err, n.NotReadyReason())
		}
	}
}

// TestBootstrapExpect: nodes that start a cluster together are not ready,
// and decide nothing as owner, until BootstrapExpect of them see each
// other; meanwhile the unreachable policy decides their checks. A node
// with BootstrapExpect 0 that joins later is ready once it has joined a
// member of the ready cluster.
func TestBootstrapExpect(t *testing.T) {
	cfg := func(name string, expect int, seeds ...*cluster.Node) cluster.Config {
		c := cluster.TestConfig(name)
		c.BootstrapExpect = expect
		for _, s := range seeds {
			c.Seeds = append(c.Seeds, s.GossipAddr())
		}
		return c
	}
	a := startNode(t, cfg("a", 3))
	b := startNode(t, cfg("b", 3, a))
	routes(t, 2, a, b)
	req := dailyRequests("boot", 1, 5)[0]
	for _, n := range []*cluster.Node{a, b} {
		if n.Ready() {
			t.Fatalf("%s is ready with 2 of 3 members", n.Name())
		}
		if why := n.NotReadyReason(); !strings.Contains(why, "3 members") || !strings.Contains(why, "2 seen") {
			t.Errorf("%s not ready for %q, want the count of members", n.Name(), why)
		}
		d, err := n.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil || d.Allowed || !d.WithoutOwner {
			t.Fatalf("%s before the cluster formed, under deny: %+v, %v; want denied without the owner", n.Name(), d, err)
		}
		d, err = n.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyAllow))
		if err != nil || !d.Allowed || !d.WithoutOwner {
			t.Fatalf("%s before the cluster formed, under allow: %+v, %v; want allowed without the owner", n.Name(), d, err)
		}
	}
	c := startNode(t, cfg("c", 3, a))
	waitReady(t, a, b, c)
	converged(t, a, b, c)
	// A node that never starts a cluster joins the formed one: it sees
	// ready members, though fewer than its own BootstrapExpect would be.
	d := startNode(t, cfg("d", 0, c))
	waitReady(t, d)
	nodes := []*cluster.Node{a, b, c, d}
	converged(t, nodes...)
	err := testwait.Until(30*time.Second, func() error {
		for _, n := range []*cluster.Node{a, b} {
			if st := n.Stats().Settle; st.Settled != st.Recorded {
				return fmt.Errorf("%s settled %d of %d hits admitted without the owner", n.Name(), st.Settled, st.Recorded)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for i := range 20 {
		got += admitted(t, nodes[i%len(nodes)], req, 1)
	}
	// The two hits allow admitted before the cluster formed are settled
	// with the key's owner (settle.go): the limit counts them.
	if want := int(req.Limit) - 2; got != want {
		t.Fatalf("%d admitted across the formed cluster, want the limit %d less the 2 admitted under allow", got, req.Limit)
	}
}

// TestBootstrapExpectZeroAlone: a node with BootstrapExpect 0 and no seeds
// never makes itself a cluster; a ready node that joins it makes it ready.
func TestBootstrapExpectZeroAlone(t *testing.T) {
	c := cluster.TestConfig("zero")
	c.BootstrapExpect = 0
	z := startNode(t, c)
	lone := startNode(t, cluster.TestConfig("lone")) // BootstrapExpect 1: ready alone
	if z.Ready() || !strings.Contains(z.NotReadyReason(), "BootstrapExpect 0") {
		t.Fatalf("zero: ready %v, reason %q; want not ready, waiting to join", z.Ready(), z.NotReadyReason())
	}
	if !lone.Ready() {
		t.Fatal("a node with BootstrapExpect 1 is not ready alone")
	}
	if _, err := lone.Join(z.GossipAddr()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, z)
	converged(t, z, lone)
}

// TestRestartedSeedlessNodeDoesNotSplit is the quick start's restart: the
// first node, started with no seeds, leaves and starts again at its
// address. It must not form a cluster of its own: it is not ready until
// the others have found it again (they retry their seeds that are not
// members), and keys consumed before the restart stay consumed, through
// it too. A node that is ready alone at once admits every key again.
func TestRestartedSeedlessNodeDoesNotSplit(t *testing.T) {
	const expect = 3
	start := func(name, gossip string, seeds ...string) *cluster.Node {
		c := cluster.TestConfig(name)
		c.BootstrapExpect = expect
		c.Seeds = seeds
		if gossip != "" {
			c.GossipAddr = gossip
		}
		return startNode(t, c)
	}
	first := start("first", "")
	addr := first.GossipAddr()
	b := start("b", "", addr)
	c := start("c", "", addr)
	waitReady(t, first, b, c)
	converged(t, first, b, c)
	reqs := dailyRequests("restart", 40, 1)
	consume(t, b, reqs)
	if err := first.Leave(); err != nil {
		t.Fatal(err)
	}
	routes(t, 2, b, c)

	again := start("first", addr)
	// The others' retries may find it before New returns: ready means
	// rejoined, a ready member in its ring.
	if again.Ready() && len(again.RingMembers()) < 2 {
		t.Fatalf("the restarted seedless node is ready in a ring of %v", again.RingMembers())
	}
	for _, r := range reqs[:5] {
		if got := admitted(t, again, r, 1); got != 0 {
			t.Fatalf("the restarted node admitted %s, used up before the restart, under deny", r.Key)
		}
	}
	waitReady(t, again)
	converged(t, again, b, c)
	owned := 0
	for _, r := range reqs {
		if m, _ := again.Owner(r.Name, r.Key); m.Name == "first" {
			owned++
		}
		for _, n := range []*cluster.Node{again, b, c} {
			if got := admitted(t, n, r, 1); got != 0 {
				t.Fatalf("%s admitted %s, whose limit of 1 was used before the restart", n.Name(), r.Key)
			}
		}
	}
	if owned == 0 {
		t.Fatal("the restarted node owns none of the keys: the test proves nothing")
	}
}

// gate is a gossip transport that a test opens and shuts: shut, it drops
// every packet and refuses every stream it would send, so that two nodes
// whose gates are both shut cannot hear each other.
type gate struct {
	memberlist.NodeAwareTransport
	shut *atomic.Bool
}

var errGateShut = errors.New("gate shut")

func (g gate) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if g.shut.Load() {
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteToAddress(b, a)
}

func (g gate) WriteTo(b []byte, addr string) (time.Time, error) {
	return g.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (g gate) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if g.shut.Load() {
		return nil, errGateShut
	}
	return g.NodeAwareTransport.DialAddressTimeout(a, timeout)
}

func (g gate) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// TestSplitHalvesMerge: two nodes each allowed to run alone
// (BootstrapExpect 1) that formed apart, after one left and came back
// while they could not reach each other, find each other once they can:
// each retries the member it remembers in its DataDir. Their rings merge
// and so do their states, the more consumed winning.
func TestSplitHalvesMerge(t *testing.T) {
	var shutA, shutB atomic.Bool
	dirA, dirB := t.TempDir(), t.TempDir()
	cfg := func(name, dir string, shut *atomic.Bool) cluster.Config {
		c := cluster.TestConfig(name)
		c.DataDir = dir
		c.GossipTransport = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport { return gate{t, shut} }
		return c
	}
	a := startNode(t, cfg("a", dirA, &shutA))
	cb := cfg("b", dirB, &shutB)
	cb.Seeds = []string{a.GossipAddr()}
	b := startNode(t, cb)
	converged(t, a, b)
	for _, d := range []struct{ dir, other string }{{dirA, "b"}, {dirB, "a"}} {
		testwait.For(t, "the members file of "+d.dir+" to name "+d.other, func() bool {
			text, _ := os.ReadFile(filepath.Join(d.dir, "members.json"))
			return strings.Contains(string(text), `"`+d.other+`"`)
		})
	}
	req := dailyRequests("split", 1, 10)[0]
	if got := admitted(t, a, req, 3); got != 3 {
		t.Fatalf("%d of 3 admitted before the split", got)
	}
	bAddr := b.GossipAddr()
	if err := b.Leave(); err != nil {
		t.Fatal(err)
	}
	routes(t, 1, a)
	shutA.Store(true)
	shutB.Store(true)
	cb = cfg("b", dirB, &shutB) // no seeds: only the member it remembers
	cb.GossipAddr = bAddr
	b = startNode(t, cb)
	waitReady(t, b)
	// Two clusters of one: each admits on its own.
	if got := admitted(t, b, req, 2); got != 2 {
		t.Fatalf("the split-off node admitted %d of 2", got)
	}
	if got := admitted(t, a, req, 4); got != 4 {
		t.Fatalf("the other half admitted %d of 4", got)
	}
	if len(a.RingMembers()) != 1 || len(b.RingMembers()) != 1 {
		t.Fatalf("rings %v and %v, want one member each while split", a.RingMembers(), b.RingMembers())
	}
	shutA.Store(false)
	shutB.Store(false)
	converged(t, a, b)
	// a consumed 7, b 2: the merged key has 3 left, wherever it is checked.
	peek := req
	peek.Hits = 0
	testwait.For(t, "the key's states to merge", func() bool {
		for _, n := range []*cluster.Node{a, b} {
			d, err := n.Check(context.Background(), peek, sluice.OnUnreachable(sluice.PolicyDeny))
			if err != nil || d.WithoutOwner || d.Remaining != 3 {
				return false
			}
		}
		return true
	})
	got := 0
	for i := range 8 {
		got += admitted(t, []*cluster.Node{a, b}[i%2], req, 1)
	}
	if got != 3 {
		t.Fatalf("%d admitted after the halves merged, want 3 (10 less the 7 the more consumed half used)", got)
	}
}

// gauge returns the value of the unlabelled gauge name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func ownerOf(n *cluster.Node, req limiter.Request) string {
	m, _ := n.Owner(req.Name, req.Key)
	return m.Name
}

// TestProtocolVersions: nodes of two builds, one speaking protocol 1 and
// one speaking 1 and 2, share a ring and a limit exactly, as in a rolling
// upgrade; a node speaking only 3 is refused by both (listed, counted,
// logged once), owns no key, and is not ready on its own.
func TestProtocolVersions(t *testing.T) {
	log := &logLines{}
	ca := cluster.TestConfig("old")
	ca.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	ca.Registerer = reg
	cluster.SetProtocol(&ca, 1, 1)
	a := startNode(t, ca)
	var nodes = []*cluster.Node{a}
	for _, name := range []string{"new-1", "new-2"} {
		c := cluster.TestConfig(name)
		cluster.SetProtocol(&c, 1, 2)
		c.Seeds = []string{a.GossipAddr()}
		nodes = append(nodes, startNode(t, c))
	}
	converged(t, nodes...)
	reqs := dailyRequests("versions", 30, 7)
	for _, r := range reqs {
		got := 0
		for i := range 12 {
			got += admitted(t, nodes[i%len(nodes)], r, 1)
		}
		if got != int(r.Limit) {
			t.Fatalf("%s: %d admitted across builds, want %d", r.Key, got, r.Limit)
		}
	}

	cf := cluster.TestConfig("far")
	cluster.SetProtocol(&cf, 3, 3)
	cf.BootstrapExpect = 0
	cf.Seeds = []string{a.GossipAddr()}
	far := startNode(t, cf)
	waitRefused(t, "far", nodes...)
	for _, n := range nodes {
		i := slices.IndexFunc(n.RefusedMembers(), func(r cluster.RefusedMember) bool { return r.Name == "far" })
		if r := n.RefusedMembers()[i]; !strings.Contains(r.Reason, "protocol versions 3-3") {
			t.Errorf("%s refuses far for %q, want its protocol range", n.Name(), r.Reason)
		}
		if len(n.RingMembers()) != 3 {
			t.Errorf("%s routes to %v with far refused", n.Name(), n.RingMembers())
		}
		for _, r := range reqs {
			if ownerOf(n, r) == "far" {
				t.Fatalf("%s routes %s to far", n.Name(), r.Key)
			}
		}
	}
	if far.Ready() || len(far.RingMembers()) != 1 {
		t.Fatalf("far: ready %v, ring %v; want not ready, alone in its ring", far.Ready(), far.RingMembers())
	}
	if got := gauge(t, reg, "sluice_members_refused"); got != 1 {
		t.Errorf("sluice_members_refused %v on old, want 1", got)
	}
	if got := log.count("speaks no protocol version this node speaks"); got != 1 {
		t.Fatalf("old logged the refusal of far %d times, want once", got)
	}
	for _, r := range reqs[:5] {
		if got := admitted(t, far, r, 1); got != 0 {
			t.Fatalf("far admitted %s under deny while refused", r.Key)
		}
	}
}

// TestDataDirRejoinsOnStart: a node that restarts with its DataDir and no
// seeds, on a new port, joins the members it remembers at once, without
// waiting for a tick of RetryJoinInterval.
func TestDataDirRejoinsOnStart(t *testing.T) {
	a := startNode(t, cluster.TestConfig("a"))
	dir := t.TempDir()
	cb := cluster.TestConfig("b")
	cb.DataDir = dir
	cb.Seeds = []string{a.GossipAddr()}
	b := startNode(t, cb)
	converged(t, a, b)
	testwait.For(t, "b to remember a", func() bool {
		text, _ := os.ReadFile(filepath.Join(dir, "members.json"))
		return strings.Contains(string(text), a.GossipAddr())
	})
	if err := b.Leave(); err != nil {
		t.Fatal(err)
	}
	routes(t, 1, a)
	cb = cluster.TestConfig("b")
	cb.DataDir = dir
	cb.RetryJoinInterval = time.Hour // only the pass at start
	cb.BootstrapExpect = 2           // ready only once it has rejoined
	b = startNode(t, cb)
	converged(t, a, b)
}

// A members file that is not one stops New with ErrMembersFile, naming
// the file; the node does not start on a guess.
func TestDataDirRefusesForeignMembersFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "members.json")
	for name, text := range map[string]string{
		"truncated": `{"format":"sluice-members","version":1,"members":[{"name":"a",`,
		"foreign":   `{"format":"sluice-state","version":1}`,
		"later":     `{"format":"sluice-members","version":9,"members":[]}`,
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		c := cluster.TestConfig("n")
		c.DataDir = dir
		n, err := cluster.New(c)
		if err == nil {
			n.Close()
			t.Fatalf("%s members file: New succeeded", name)
		}
		if !errors.Is(err, cluster.ErrMembersFile) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s members file: %v, want ErrMembersFile naming %s", name, err, path)
		}
	}
}

// A leaving node drains the calls in flight for up to LeaveTimeout after
// it has left serf, and serf forgets the node's own member TombstoneTimeout
// after the leave: meanwhile the node still names its addresses, and its
// rejoin loop, which ticks on, neither stops the process nor joins again.
func TestLeaveOutlivesItsOwnTombstone(t *testing.T) {
	a := startNode(t, cluster.TestConfig("stays"))
	cfg := cluster.TestConfig("drains")
	cfg.Seeds = []string{a.GossipAddr()}
	cfg.LeaveTimeout = 2 * testwait.Timeout // the watch below ends it first
	cfg.DataDir = t.TempDir()
	cfg.RegisterServices = func(s grpc.ServiceRegistrar, _ *cluster.Node) error {
		healthpb.RegisterHealthServer(s, health.NewServer())
		return nil
	}
	b := startNode(t, cfg)
	converged(t, a, b)
	testwait.For(t, "drains to remember stays, whom its rejoin loop looks for", func() bool {
		text, _ := os.ReadFile(filepath.Join(cfg.DataDir, "members.json"))
		return strings.Contains(string(text), `"stays"`)
	})
	gossip, grpcAddr := b.GossipAddr(), b.GRPCAddr()

	// A server stream the client keeps open: Leave's drain waits for it.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	left := make(chan error, 1)
	go func() { left <- b.Leave() }()
	testwait.For(t, "drains's serf to forget its own member", func() bool {
		for _, m := range b.Members() {
			if m.Name == "drains" {
				return false
			}
		}
		return true
	})
	if got := b.GossipAddr(); got != gossip {
		t.Errorf("GossipAddr after serf forgot the node: %q, want %q", got, gossip)
	}
	if got := b.GRPCAddr(); got != grpcAddr {
		t.Errorf("GRPCAddr after serf forgot the node: %q, want %q", got, grpcAddr)
	}
	cancel()
	if err := <-left; err != nil {
		t.Errorf("Leave: %v", err)
	}
}
