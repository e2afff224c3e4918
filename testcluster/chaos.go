package testcluster

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
)

// errCut is what a node gets for dialling a node it is partitioned from.
var errCut = errors.New("testcluster: partitioned from this node")

// network is a cluster's in-process network. It knows which node each
// gossip and gRPC address belongs to, cuts traffic between nodes that a
// partition puts in different groups, and delays the gRPC messages that a
// slow node receives. Every node consults it through the hooks wire
// installs: its gossip transport, its gRPC dialer and its gRPC server's
// interceptors. Nothing in it runs on its own. Safe for concurrent use.
type network struct {
	mu     sync.Mutex                // guards the fields below
	owners map[string]int            // address -> node index
	groups map[int]int               // node index -> group; nil when whole
	slow   map[int]time.Duration     // node index -> delay of each message
	muted  map[int]bool              // node indices whose gossip reaches no one
	conns  map[*trackedConn]struct{} // open conns dialled through the hooks
}

func newNetwork() *network {
	return &network{
		owners: make(map[string]int),
		slow:   make(map[int]time.Duration),
		muted:  make(map[int]bool),
		conns:  make(map[*trackedConn]struct{}),
	}
}

// wire installs node i's hooks in cfg, around any the test configured:
// its gossip transport wraps the test's, its dialer replaces any dialer in
// Peer.DialOptions, and its interceptors run after the test's.
func (nw *network) wire(i int, cfg *cluster.Config) {
	inner := cfg.GossipTransport
	cfg.GossipTransport = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		if inner != nil {
			t = inner(t)
		}
		return &gossipTransport{NodeAwareTransport: t, nw: nw, from: i}
	}
	cfg.Peer.DialOptions = append(slices.Clone(cfg.Peer.DialOptions), grpc.WithContextDialer(nw.dialer(i)))
	cfg.ServerOptions = append(slices.Clone(cfg.ServerOptions), grpc.ChainStreamInterceptor(nw.streamDelay(i)))
	cfg.UnaryInterceptors = append(slices.Clone(cfg.UnaryInterceptors), nw.unaryDelay(i))
}

// addrKey is the form addresses are kept in: "127.0.0.1:80" whatever the
// spelling, or addr itself when it is not an IP and port.
func addrKey(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	return addr
}

// register records that node i is reachable at addrs.
func (nw *network) register(i int, addrs ...string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, a := range addrs {
		nw.owners[addrKey(a)] = i
	}
}

// forget drops node i's addresses, which the system may give to another.
func (nw *network) forget(i int) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for a, j := range nw.owners {
		if j == i {
			delete(nw.owners, a)
		}
	}
}

// nodeAtLocked returns the node reachable at addr, or -1 when none is
// known. nw.mu must be held.
func (nw *network) nodeAtLocked(addr string) int {
	if i, ok := nw.owners[addrKey(addr)]; ok {
		return i
	}
	return -1
}

// cutLocked reports whether traffic between nodes a and b is cut. An
// unknown node (-1) is never cut off. nw.mu must be held.
func (nw *network) cutLocked(a, b int) bool {
	if nw.groups == nil || a == b || a < 0 || b < 0 {
		return false
	}
	ga, oka := nw.groups[a]
	gb, okb := nw.groups[b]
	return !oka || !okb || ga != gb
}

// cut reports whether traffic between nodes a and b is cut.
func (nw *network) cut(a, b int) bool {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.cutLocked(a, b)
}

// cutTo reports whether node from is cut off from the node at addr.
func (nw *network) cutTo(from int, addr string) bool {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.cutLocked(from, nw.nodeAtLocked(addr))
}

// gossipCutTo reports whether the gossip node from sends to the node at
// addr is lost: cut, or from is muted.
func (nw *network) gossipCutTo(from int, addr string) bool {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.muted[from] || nw.cutLocked(from, nw.nodeAtLocked(addr))
}

// partition puts node i in group groups[i] (nodes not in the map are cut
// off from all others; nil heals) and closes every tracked conn that now
// crosses a cut.
func (nw *network) partition(groups map[int]int) {
	nw.mu.Lock()
	nw.groups = groups
	var crossing []*trackedConn
	for c := range nw.conns {
		// The address is looked up now: a conn dialled while its node
		// was starting, before it was registered, is cut as well.
		if nw.cutLocked(c.from, nw.nodeAtLocked(c.addr)) {
			crossing = append(crossing, c)
		}
	}
	nw.mu.Unlock()
	for _, c := range crossing {
		c.Close()
	}
}

// setSlow makes node i receive every gRPC message d late (0: at once).
func (nw *network) setSlow(i int, d time.Duration) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if d == 0 {
		delete(nw.slow, i)
		return
	}
	nw.slow[i] = d
}

// delay waits for node i's slowness, or until ctx ends.
func (nw *network) delay(ctx context.Context, i int) error {
	nw.mu.Lock()
	d := nw.slow[i]
	nw.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// unaryDelay delays every unary call node i serves.
func (nw *network) unaryDelay(i int) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := nw.delay(ctx, i); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// streamDelay delays every message node i receives on a stream. The
// node's server serves its unary methods as streams that neither side
// streams (cluster.Config.ServerOptions): unaryDelay delays those.
func (nw *network) streamDelay(i int) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !info.IsClientStream && !info.IsServerStream {
			return handler(srv, ss)
		}
		return handler(srv, &slowStream{ServerStream: ss, nw: nw, node: i})
	}
}

// slowStream is a server stream whose received messages are delayed.
type slowStream struct {
	grpc.ServerStream
	nw   *network
	node int
}

func (s *slowStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.nw.delay(s.Context(), s.node)
}

// dialer is node i's gRPC dialer: it refuses nodes i is cut off from and
// tracks the conns it makes, so that a partition can close them.
func (nw *network) dialer(i int) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if nw.cutTo(i, addr) {
			return nil, errCut
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return nw.track(i, addr, conn)
	}
}

// track records conn, dialled by node from to addr, unless a partition
// came between the dial and now: then it closes conn and returns errCut.
func (nw *network) track(from int, addr string, conn net.Conn) (net.Conn, error) {
	nw.mu.Lock()
	to := nw.nodeAtLocked(addr)
	if nw.cutLocked(from, to) {
		nw.mu.Unlock()
		conn.Close()
		return nil, errCut
	}
	tc := &trackedConn{Conn: conn, nw: nw, from: from, addr: addr}
	nw.conns[tc] = struct{}{}
	nw.mu.Unlock()
	return tc, nil
}

// trackedConn is a conn between two nodes that a partition closes.
type trackedConn struct {
	net.Conn
	nw   *network
	from int
	addr string // the address dialled
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.nw.mu.Lock()
		delete(c.nw.conns, c)
		c.nw.mu.Unlock()
	})
	return c.Conn.Close()
}

// gossipTransport is node from's gossip transport: packets to a node it is
// cut off from are dropped, as a lost UDP packet would be, and streams to
// one are refused. It starts nothing: Shutdown is the wrapped one's.
type gossipTransport struct {
	memberlist.NodeAwareTransport
	nw   *network
	from int
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)

func (g *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return g.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (g *gossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if g.nw.gossipCutTo(g.from, a.Addr) {
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteToAddress(b, a)
}

func (g *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (g *gossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if g.nw.gossipCutTo(g.from, a.Addr) {
		return nil, errCut
	}
	conn, err := g.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return g.nw.track(g.from, a.Addr, conn)
}

// Partition cuts the cluster into groups of node indices: nodes in
// different groups exchange neither gossip nor gRPC, in either direction,
// and the conns between them are closed at once. A node in no group (one
// stopped, or added later, included) is cut off from every other. Each
// call replaces the previous partition; Heal ends it. Checks keep being
// answered on every side, by the owner when it is on the caller's side and
// by the unreachable policy otherwise, until each side's gossip sees the
// others fail and its ring routes over its own side only: WaitConverged
// waits for that.
func (c *Cluster) Partition(groups ...[]int) {
	c.t.Helper()
	n := c.size()
	in := make(map[int]int)
	for g, group := range groups {
		for _, i := range group {
			if i < 0 || i >= n {
				c.t.Fatalf("testcluster: Partition: no node %d (nodes are 0 to %d)", i, n-1)
			}
			if first, dup := in[i]; dup {
				c.t.Fatalf("testcluster: Partition: node %d is in groups %d and %d", i, first, g)
			}
			in[i] = g
		}
	}
	c.net.partition(in)
}

// MuteGossip makes the gossip node i sends lost (mute true), as lost UDP
// packets and refused streams, or delivered again (false); what it
// receives, and gRPC both ways, are untouched. A muted node's leave
// intent reaches no one: the others learn it left only from what it says
// over gRPC, or when their failure detection gives up on it. The setting
// outlives a restart of node i.
func (c *Cluster) MuteGossip(i int, mute bool) {
	c.t.Helper()
	c.checkIndex("MuteGossip", i)
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	if mute {
		c.net.muted[i] = true
	} else {
		delete(c.net.muted, i)
	}
}

// Heal ends a partition: traffic flows between every node again. Each
// side's gossip has declared the others failed, so every live node joins
// the others, as serf's reconnection would later; then Heal waits until
// the cluster converges.
func (c *Cluster) Heal() {
	c.t.Helper()
	c.net.partition(nil)
	live := c.Nodes()
	for _, nd := range live {
		var seeds []string
		for _, other := range live {
			if other != nd {
				seeds = append(seeds, other.GossipAddr())
			}
		}
		if len(seeds) == 0 {
			continue
		}
		// A join is a push/pull with each seed, which a loaded machine
		// may time out with every one of them: it is tried again.
		err := WaitFor(c.opts.wait, func() error {
			_, err := nd.Join(seeds...)
			return err
		})
		if err != nil {
			c.t.Fatalf("testcluster: Heal: %s rejoins: %v", nd.Name(), err)
		}
	}
	c.WaitConverged()
}

// Slow makes node i receive every gRPC message d late: each message of a
// stream, and each unary call, waits d (or until its call ends) before
// node i handles it. Gossip is not slowed. d of 0 makes node i fast again;
// the setting outlives a restart of node i.
func (c *Cluster) Slow(i int, d time.Duration) {
	c.t.Helper()
	c.checkIndex("Slow", i)
	if d < 0 {
		c.t.Fatalf("testcluster: Slow(%d, %v): negative delay", i, d)
	}
	c.net.setSlow(i, d)
}
