package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Errors of the cluster package.
var (
	// ErrClosed is returned by a Node that has been closed.
	ErrClosed = errors.New("cluster: node closed")
	// ErrJoin wraps a failure to join any of the given seeds.
	ErrJoin = errors.New("cluster: join failed")
	// ErrHandoff wraps key states a graceful Leave could not hand off.
	ErrHandoff = errors.New("cluster: hand-off incomplete")
	// ErrNilContext is returned for a call made with a nil context.
	ErrNilContext = sluice.ErrNilContext
)

// Stats counts what a node has done.
type Stats struct {
	Local        int64 // checks decided here as owner
	Forwarded    int64 // checks sent to their owner
	WithoutOwner int64 // checks decided under the unreachable policy
	// WaitedOut counts the checks and lease requests that waited
	// Config.HandoverTimeout for a node to decide their key, then went to
	// the unreachable policy (they are in WithoutOwner too).
	WaitedOut int64
	// HandoverExpired counts the memberships whose moved keys this node
	// began to decide when Config.HandoverTimeout passed, without the
	// hand-over confirmation of every member.
	HandoverExpired int64
	DroppedEvents   int64 // member events not delivered on Config.Events
	Transfers       TransferStats
	Store           limiter.StoreStats
	Leases          LeaseStats
	Persist         PersistStats // zero without Config.DataDir
	Settle          SettleStats
}

// Node is one member of a sluice cluster. It is safe for concurrent use.
type Node struct {
	cfg      Config
	logger   *slog.Logger
	clock    Clock            // Config.Clock, or SystemClock()
	now      func() time.Time // clock.Now
	resolver Resolver         // resolves the host names of seeds

	store   *limiter.Store
	persist *persister // nil without Config.DataDir (persist.go)
	ring    *ring.Ring
	peers   *peer.Pool

	metrics  *metrics   // nil without Config.Registerer
	tracing  *tracing   // nil without Config.TracerProvider
	router   *router    // where checks go; owns the breakers
	handover *handover  // which keys this node decides as owner
	grants   grantTable // leases this node granted as owner (grants.go)
	// heldScratch is where changesLoop computes the copies of leased keys
	// for the replicas (replicate.go's heldSnapshot); nil until needed.
	heldScratch *limiter.Store
	leases      *leaseTable // see lease.go
	clocks      *clockTable // the members' clock offsets (clockskew.go)
	proofs      *proofs     // which members have proved themselves (proof.go)
	versions    *versions   // members refused for their protocol version (protocol.go)

	lis    net.Listener
	grpc   *grpc.Server
	budget *transport.MessageBudget // of grpc
	serf   *serf.Serf
	gossip memberlist.Transport // nil unless Config.GossipTransport is set
	// self is what this node advertises, fixed once serf has started:
	// serf forgets its own member TombstoneTimeout after Leave, while
	// Leave may still be draining calls, so it is not read from serf.
	self advertised

	serfEvents chan serf.Event
	// learnedWake tells eventLoop that the members cut off hold one
	// learned from a report: it rebuilds once the earliest's hold ends.
	learnedWake chan struct{}
	shutdown    chan struct{} // closed by Close: every loop selects on it
	wg          sync.WaitGroup
	closeOnce   sync.Once
	closed      atomic.Bool
	// leaveOnce runs the one leave of the node; every Leave waits for it
	// and returns its result, leaveErr.
	leaveOnce sync.Once
	leaveErr  error
	// serfMu keeps Close's serf.Shutdown out of a serf.Leave in
	// progress: memberlist panics when it is shut down in the middle of
	// a leave (a Leave whose node is closed meanwhile). serfDown, under
	// it, says Close has shut serf down.
	serfMu     sync.Mutex
	serfDown   bool
	rebuildMu  sync.Mutex // serialises ring and peer rebuilds
	transfers  transfers  // hand-off and replication (handoff.go)
	departures departures // members that left, before serf says so
	// statuses is serf's members' statuses at the last rebuild, which the
	// event loop looks at again while one is leaving.
	statuses *memberStatuses
	// proofCtx ends the members' proofs in flight when the node closes.
	proofCtx    context.Context
	proofCancel context.CancelFunc
	// gossipAdvert is self's gossip address once serf has started, for
	// the Prove answers the gRPC server gives from before then.
	gossipAdvert atomic.Value // string
	// proveDial and proveKeys challenge a member (challenge): the ring's
	// members, and the remembered members before they are joined.
	proveDial []grpc.DialOption
	proveKeys [][]byte

	// joinedOnce is set once a join of the seeds has succeeded.
	joinedOnce atomic.Bool
	readyMu    sync.Mutex    // serialises tryReady
	readyWake  chan struct{} // wakes readyLoop
	rememberMu sync.Mutex    // guards remembered and the members file
	remembered []rememberedMember

	local, forwarded, withoutOwner, waitedOut, droppedEvents atomic.Int64
	debts                                                    *debts    // hits admitted without the owner, to settle (settle.go)
	standins                                                 *standins // hits admitted as a stand-in owner (standin.go)
}

// New validates cfg, starts the gRPC server and serf, and joins cfg.Seeds.
// A node whose seeds do not answer starts alone and keeps retrying. If New
// fails half-way it stops what it started.
func New(cfg Config) (n *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Seeds = append([]string(nil), cfg.Seeds...)
	n = &Node{
		cfg:         cfg,
		logger:      cfg.Logger,
		clock:       cfg.Clock,
		serfEvents:  make(chan serf.Event, 1024),
		learnedWake: make(chan struct{}, 1),
		shutdown:    make(chan struct{}),
		readyWake:   make(chan struct{}, 1),
		transfers:   newTransfers(),
		versions:    newVersions(cfg.protocolRange()),
		debts:       newDebts(),
		statuses:    newMemberStatuses(),
	}
	if n.logger == nil {
		n.logger = slog.New(slog.DiscardHandler)
	}
	if n.clock == nil {
		n.clock = SystemClock()
	}
	n.now = n.clock.Now
	if _, ok := n.clock.(clocks.System); ok {
		n.now = time.Now // every check reads it: no call through the interface
	}
	n.standins = newStandins(cfg.NodeName, n.now())
	if n.resolver = cfg.Resolver; n.resolver == nil {
		n.resolver = net.DefaultResolver
	}
	n.proofCtx, n.proofCancel = context.WithCancel(context.Background())
	node := n // n is nil once a failing return has run; Close needs the node
	defer func() {
		if err != nil {
			node.Close()
			n = nil
		}
	}()
	if cfg.DataDir != "" {
		if err = os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDataDir, err)
		}
		if n.remembered, err = readMembersFile(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	scfg := cfg.Store
	// For the replicator and the persister.
	scfg.TrackChanges = scfg.TrackChanges || cfg.Replicas > 1 || cfg.DataDir != ""
	if n.store, err = limiter.NewStore(scfg); err != nil {
		return nil, err
	}
	if cfg.DataDir != "" {
		if err = n.restore(); err != nil {
			return nil, err
		}
	}
	if n.ring, err = ring.New(cfg.Ring); err != nil {
		return nil, err
	}
	n.handover = newHandover(cfg.NodeName, n.ring, cfg.HandoverTimeout, n.logger)
	n.grants.away = func(name string) bool { return !n.inRing(name) }
	n.grants.replicating = cfg.Replicas > 1
	n.router = &router{self: cfg.NodeName, hand: n.handover, now: n.now, departing: n.departing,
		threshold: int32(cfg.BreakerThreshold), cooldown: cfg.BreakerCooldown}
	if n.budget, err = transport.NewMessageBudget(cfg.ServerLimits); err != nil {
		return nil, err
	}
	auth, err := peerAuth(&cfg, n.now)
	if err != nil {
		return nil, err
	}
	n.proofs = newProofs(auth.Open(), cfg.NodeName, cfg.ProofRetry, cfg.ProofRetryMax)
	n.budget.AuthorizePeers(auth)
	if n.metrics, err = newMetrics(cfg.Registerer, n); err != nil {
		return nil, fmt.Errorf("cluster: register metrics: %w", err)
	}
	pcfg := cfg.Peer
	pcfg.Self = cfg.NodeName
	if pcfg.Clock == nil {
		pcfg.Clock = n.clock
	}
	if pcfg.SendClock == nil {
		pcfg.SendClock = n.now // the clock the states' times are on
	}
	if cfg.TLS != nil {
		client := cfg.TLS.Clone()
		if len(cfg.PeerIdentities) > 0 {
			// Every connection to a member checks that it answers with
			// a peer's certificate, not only the first proof.
			client.VerifyConnection = transport.VerifyPeerIdentity(cfg.PeerIdentities, client.VerifyConnection)
		}
		pcfg.DialOptions = append(append([]grpc.DialOption(nil), cfg.Peer.DialOptions...),
			grpc.WithTransportCredentials(credentials.NewTLS(client)))
	}
	if len(auth.Keys) > 0 {
		pcfg.DialOptions = append(append([]grpc.DialOption(nil), pcfg.DialOptions...),
			grpc.WithPerRPCCredentials(transport.PeerCredentials(auth.Keys[0], n.now)))
	}
	if n.metrics != nil && pcfg.Observer == nil {
		pcfg.Observer = n.metrics.peerCall
	}
	n.tracing = newTracing(&cfg)
	if pcfg.TracerProvider == nil {
		pcfg.TracerProvider = cfg.TracerProvider
	}
	if n.peers, err = peer.NewPool(pcfg); err != nil {
		return nil, err
	}
	n.proveDial = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, pcfg.DialOptions...)
	n.router.peers = n.peers
	x := &n.transfers
	counts := outboxCounts{handedOff: &x.handedOff, replicated: &x.replicated, failures: &x.failures, givenUp: &x.givenUp}
	orphan := func(states []limiter.Snapshot) { x.holdOrphans(states, true) }
	x.outbox = newOutbox(x.ctx, outboxNode{n}, counts, n.clock, max(2*cfg.HandoverTimeout, cfg.LeaveTimeout), orphan)
	if err = n.startLeases(); err != nil {
		return nil, err
	}
	n.clocks = newClockTable(cfg.MaxClockSkew, n.logger)
	if reg := cfg.Registerer; reg != nil {
		if err = reg.Register(newClockCollector(n.clocks)); err != nil {
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	// The budget's own listener: at the cap, a connection with no call
	// open gives its slot to a new one.
	if n.lis, err = n.budget.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("cluster: listen on GRPCAddr: %w", err)
	}
	sopts := n.budget.ServerOptions()
	n.budget.ChainUnaryInterceptor(cfg.UnaryInterceptors...)
	if cfg.TLS != nil {
		server := cfg.TLS.Clone()
		if server.ClientCAs != nil {
			server.ClientAuth = tls.RequireAndVerifyClientCert
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(server)))
	}
	sopts = append(sopts, cfg.ServerOptions...)
	n.grpc = grpc.NewServer(sopts...)
	transport.RegisterPeer(n.grpc, ownerChecker{n}, transport.WithStateSink(stateSink{n}), transport.WithLeaser(n),
		transport.WithInspector(ownerInspector{n}), transport.WithPeerAuth(auth), transport.WithProver(cfg.NodeName), transport.WithClock(n.now),
		transport.WithProverGossip(n.advertisedGossip))
	if cfg.ServePublicAPI {
		n.RegisterPublicAPI(n.grpc)
	}
	if cfg.RegisterServices != nil {
		if err = cfg.RegisterServices(transport.Registrar(n.grpc), n); err != nil {
			return nil, fmt.Errorf("cluster: register services: %w", err)
		}
	}
	if auth.Open() {
		warn := n.logger
		if cfg.Logger == nil { // an embedded node is not silently open
			warn = slog.Default()
		}
		warn.Warn("cluster: peer calls are open to every caller that reaches GRPCAddr: set TLS with PeerIdentities, or ClusterSecret (or GossipKeys), to admit only cluster members",
			"grpc", cfg.GRPCAddr)
	}
	// Not n: a failing return sets the result n to nil while this runs.
	srv, lis, logger := n.grpc, n.lis, n.logger
	n.goFunc(func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logger.Error("cluster: gRPC server stopped", "err", err)
		}
	})

	grpcAddr, known := advertisedGRPC(&cfg, n.lis)
	sc, err := serfConfig(&cfg, n.serfEvents, grpcAddr, n.logger)
	if err != nil {
		return nil, err
	}
	// A member learned cut off is held as long as serf holds one it saw
	// fail.
	n.standins.learnedHold = sc.ReconnectTimeout
	if cfg.GossipTransport != nil {
		if n.gossip, err = wrapGossipTransport(sc.MemberlistConfig, cfg.GossipTransport); err != nil {
			return nil, err
		}
	}
	if n.serf, err = serf.Create(sc); err != nil {
		return nil, fmt.Errorf("cluster: start serf: %w", err)
	}
	self := n.serf.LocalMember()
	if !known { // bound to all interfaces: advertise serf's address
		grpcAddr = net.JoinHostPort(self.Addr.String(), grpcAddr[1:])
		if err = n.serf.SetTags(nodeTags(&cfg, grpcAddr, false)); err != nil {
			return nil, fmt.Errorf("cluster: set tags: %w", err)
		}
	}
	ip, _ := netip.AddrFromSlice(self.Addr)
	n.self = advertised{gossip: netip.AddrPortFrom(ip.Unmap(), self.Port), grpc: grpcAddr}
	n.gossipAdvert.Store(n.self.gossip.String())
	n.rebuild(0)
	n.proveKeys = auth.Keys
	n.goFunc(n.proveLoop)
	n.goFunc(n.eventLoop)
	n.goFunc(n.sweepLoop)
	n.goFunc(n.settleLoop)
	n.goFunc(n.clockLoop)
	n.goFunc(n.watchSerf)
	n.startTransfers()
	if len(cfg.Seeds) > 0 {
		if _, jerr := n.join(cfg.Seeds); jerr != nil {
			n.logger.Warn("cluster: join failed; not ready, retrying: until it joins, the node decides no key as owner and checks get the unreachable policy",
				"seeds", cfg.Seeds, "retry", cfg.RetryJoinInterval, "err", jerr)
		}
	}
	if !n.tryReady() {
		n.logger.Warn("cluster: not ready: until it is, the node decides no key as owner and checks get the unreachable policy",
			"reason", n.NotReadyReason())
	}
	n.goFunc(n.readyLoop)
	n.goFunc(n.rejoinLoop)
	n.logger.Info("cluster: node started", "name", cfg.NodeName, "gossip", n.GossipAddr(), "grpc", grpcAddr)
	return n, nil
}

// joined records that the node has joined its seeds, and makes it ready
// when bootstrap.go allows: its ring is rebuilt from the members the join
// brought in before it decides any key as owner.
func (n *Node) joined() {
	if n.closed.Load() || n.serf.State() != serf.SerfAlive {
		return
	}
	n.joinedOnce.Store(true)
	n.rebuild(0)
	n.logger.Info("cluster: joined", "members", n.ring.Len())
	n.tryReady()
}

// watchSerf makes the node not ready, and says why, when serf stops while
// the node runs: serf shuts itself down when another node holds this
// node's name and wins the conflict.
func (n *Node) watchSerf() {
	select {
	case <-n.shutdown:
	case <-n.serf.ShutdownCh():
		if n.closed.Load() {
			return
		}
		n.handover.setReady(false, n.now())
		n.logger.Error("cluster: serf stopped while the node runs (another node has its name?): the node decides no key as owner any more and reports not ready; restart it with a unique name",
			"name", n.cfg.NodeName)
	}
}

// Ready reports whether the node decides the keys it owns: it has joined
// the cluster of its seeds, when it has any, and sees a cluster that has
// formed (Config.BootstrapExpect; bootstrap.go), serf runs, and it is
// neither closed nor leaving. Until then every check it is asked about
// a key it would own gets the unreachable policy, with WithoutOwner set.
func (n *Node) Ready() bool { return !n.closed.Load() && n.handover.ready.Load() }

// Unconfirmed returns the members whose hand-over confirmation of this
// node's current membership it still waits for: while any are listed, keys
// that moved to this node are decided by their previous owner or wait
// (see Config.HandoverTimeout). It is empty once the membership settled.
func (n *Node) Unconfirmed() []string { return n.handover.unconfirmed() }

// WaitReady waits until the node is ready or ctx ends, and returns ctx's
// error in the second case, or ErrClosed when the node closes first.
func (n *Node) WaitReady(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	for {
		wake := n.handover.wake()
		if n.Ready() {
			return nil
		}
		if n.closed.Load() {
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.shutdown:
			return ErrClosed
		case <-wake:
		}
	}
}

// goFunc runs f in a goroutine that Close waits for.
func (n *Node) goFunc(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.NodeName }

// GossipAddr returns the address other nodes join this one at.
func (n *Node) GossipAddr() string { return n.self.gossip.String() }

// advertisedGossip returns GossipAddr once serf has started, "" before.
func (n *Node) advertisedGossip() string {
	s, _ := n.gossipAdvert.Load().(string)
	return s
}

// GRPCAddr returns the address the node serves gRPC on, as advertised.
func (n *Node) GRPCAddr() string { return n.self.grpc }

// advertised is the addresses a node gives the other members.
type advertised struct {
	gossip netip.AddrPort // serf's address and port
	grpc   string         // the gRPC tag
}

// Join joins the cluster through any of the given gossip addresses, host
// names resolved to all their addresses and this node's own left out, and
// returns how many it reached.
func (n *Node) Join(seeds ...string) (int, error) {
	if n.closed.Load() {
		return 0, ErrClosed
	}
	return n.join(seeds)
}

// Members returns every member serf knows, alive or not.
func (n *Node) Members() []Member {
	ms := n.serf.Members()
	out := make([]Member, len(ms))
	for i, m := range ms {
		out[i] = toMember(m)
	}
	return out
}

// RingMembers returns the members the ring routes to, sorted by name.
func (n *Node) RingMembers() []ring.Member { return n.ring.Members() }

// inRing reports whether the member named is in this node's ring now.
func (n *Node) inRing(name string) bool {
	_, ok := slices.BinarySearchFunc(n.ring.Members(), name, func(m ring.Member, name string) int {
		return strings.Compare(m.Name, name)
	})
	return ok
}

// Owner returns the member that owns (name, key) in this node's ring.
func (n *Node) Owner(name, key string) (ring.Member, bool) { return n.ring.Owner(name, key) }

// Store returns the node's own store, for inspection.
func (n *Node) Store() *limiter.Store { return n.store }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		Local:           n.local.Load(),
		Forwarded:       n.forwarded.Load(),
		WithoutOwner:    n.withoutOwner.Load(),
		WaitedOut:       n.waitedOut.Load(),
		HandoverExpired: n.handover.expired.Load(),
		DroppedEvents:   n.droppedEvents.Load(),
		Transfers:       n.transfers.stats(),
		Store:           n.store.Stats(),
		Leases:          n.leaseStats(),
		Persist:         n.persist.stats(),
		Settle:          n.settleStats(),
	}
}

// Leave leaves the cluster gracefully, telling the other members, then
// closes the node. Before it goes, it hands every key it holds to the key's
// owner on the ring without this node, in two passes within
// Config.LeaveTimeout (see leaveHandoff for what may still be lost). A
// node alone in its ring while members it routed to are cut off first
// waits, within the same bound, for one of them to come back: it is no
// last member, and its states are theirs; if none comes back the error
// wraps ErrHandoff and names them.
//
// The node leaves once: a Leave called while another is under way (a
// signal handler beside a deferred Leave, say) waits for it and returns
// its result, as does one called after it. A Leave of a node closed
// without leaving returns ErrClosed.
func (n *Node) Leave() error {
	n.leaveOnce.Do(func() {
		if n.closed.Load() {
			n.leaveErr = ErrClosed
			return
		}
		err := n.leaveHandoff()
		if cerr := n.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			n.leaveErr = fmt.Errorf("cluster: leave: %w", err)
		}
	})
	return n.leaveErr
}

// Close stops the node at once: inbound gRPC first, then serf, then the
// node's loops and peer clients, and waits for all of them; with
// Config.DataDir it then writes every live key state there, and a check
// under way as it began is answered ErrClosed, not with a decision that
// write may not hold. Other members see it fail. Safe to call more than
// once.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		n.closed.Store(true)
		if n.grpc != nil {
			stopGRPC(n.grpc, 2*time.Second)
		} else if n.lis != nil {
			n.lis.Close()
		}
		if n.serf != nil {
			n.serfMu.Lock()
			n.serfDown = true
			err = n.serf.Shutdown()
			n.serfMu.Unlock()
		}
		if n.gossip != nil { // memberlist shut it down, unless never created
			n.gossip.Shutdown()
		}
		close(n.shutdown)
		n.transfers.cancel() // ends transfers in flight
		n.proofCancel()      // and proofs
		n.wg.Wait()
		if n.transfers.outbox != nil {
			n.transfers.outbox.close()
		}
		if n.peers != nil {
			n.peers.Close()
		}
		if n.persist != nil { // the loops have stopped: it is Close's now
			if perr := n.persist.close(n.store, n.now()); perr != nil {
				err = errors.Join(err, perr)
			}
		}
	})
	return err
}

// stopGRPC drains in-flight calls for up to grace, then stops hard. The
// grace is on the system's clock, not the node's: it bounds how long
// stopping takes, which must end even when a test's clock stands still
// while peers hold streams open; it decides nothing.
func stopGRPC(s *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}

func (n *Node) eventLoop() {
	// While serf lists a member leaving, look again at intervals: it may
	// turn alive without an event (memberStatuses). The look runs on the
	// system's timer, not the node's Clock: serf's statuses change at
	// gossip's pace, on the system's time, and a test's clock that stands
	// still must not keep the ring from following them.
	// A member learned from a report is held until a time
	// (standins.learnFrom), which only a rebuild looks at: one follows
	// when the earliest hold ends, events or none. Its timer is also the
	// system's; a test clock that stands still finds the hold not over,
	// and the timer armed again for what is left of it.
	var look, expire *time.Timer
	defer func() {
		for _, t := range []*time.Timer{look, expire} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	for {
		var looked, expired <-chan time.Time
		if look != nil {
			looked = look.C
		}
		if expire != nil {
			expired = expire.C
		}
		select {
		case <-n.shutdown:
			return
		case <-n.statuses.wake:
		case <-looked:
			look = nil
			if n.statuses.changed(n.serf.Members()) {
				n.rebuild(0)
			}
		case <-n.learnedWake:
			if until, ok := n.standins.learnedExpiry(); ok {
				if expire != nil {
					expire.Stop()
				}
				expire = time.NewTimer(max(until.Sub(n.now()), learnedLook) + learnedLook)
			}
		case <-expired:
			expire = nil
			n.rebuild(0)
		case e := <-n.serfEvents:
			me, ok := e.(serf.MemberEvent)
			if !ok {
				continue
			}
			kind, ok := eventKind(me.Type)
			if !ok {
				continue
			}
			n.rebuild(kind, me.Members...)
		}
		if look == nil && n.statuses.leaving.Load() {
			look = time.NewTimer(leavingLook)
		}
	}
}

// rebuild recomputes the ring and the peer clients from serf's alive
// members that have proved themselves (proof.go), then reports the event
// that caused it (kind 0: none).
func (n *Node) rebuild(kind MemberEventKind, changed ...serf.Member) {
	n.rebuildMu.Lock()
	defer n.rebuildMu.Unlock()
	n.departures.forget(kind, changed)
	serfMembers := n.serf.Members()
	n.statuses.record(serfMembers)
	members := n.proofs.admit(n.departures.without(n.compatibleRingMembers()), n.now())
	prev := n.ring.Members()
	addrs := make(map[string]string, len(members))
	for _, m := range members {
		if m.Name != n.cfg.NodeName {
			addrs[m.Name] = m.Addr
		}
	}
	// Clients first, so that a new owner is reachable once routed to.
	n.peers.Update(addrs)
	n.transfers.holdOrphans(n.transfers.outbox.retain(addrs), false) // the pass this rebuild wakes sends them
	n.router.breakers.forget(addrs)
	// Stand-in decisions are told by the ring with the failed members:
	// with both the old and the new ones while the ring changes.
	ho := handoverUnder
	if slices.Equal(prev, members) && n.goneSettled(members) {
		ho = handoverSettled
	}
	// A key this node decided standing in for a member that is back in
	// the ring now was decided meanwhile by that member too, as its owner
	// on its side: where the new ring leaves it to this node (a ring that
	// is not the one the stand-in went by: a member joined or left while
	// members were cut off), it waits for that member's hand-over like a
	// key that moved here, rather than stay settled, so that no two nodes
	// decide it as its plain owner at once.
	unkeep := n.standins.view().stoodInForBack(prev, members)
	reported := n.standins.cutReport()
	var reaped []serf.Member
	if kind == MemberReaped {
		reaped = changed
	}
	n.standins.noteReaped(reaped, serfMembers, n.now())
	n.standins.update(serfMembers, prev, members, n.ring.Config(), n.now(), ho)
	if _, ok := n.standins.learnedExpiry(); ok {
		select {
		case n.learnedWake <- struct{}{}:
		default:
		}
	}
	if err := n.handover.adopt(members, n.now(), unkeep); err != nil {
		n.logger.Error("cluster: ring rebuild failed, keeping the previous ring", "err", err)
	} else {
		n.transfers.noteAdopted(n.ring.Members())
	}
	n.standins.publish(members, n.ring.Config())
	if !sameCutOff(reported, n.standins.cutReport()) {
		// What this node holds cut off changed (a member failed, was
		// reaped, came back): the members that hold its last report
		// get the new one with its confirmation again, so that none
		// keeps standing in for a member reaped here (learnFrom).
		fp := n.handover.fingerprint()
		for _, m := range members {
			if m.Name != n.cfg.NodeName {
				n.transfers.outbox.reconfirm(m.Name, fp, false)
			}
		}
	}
	n.transfers.wakeHandoff()
	if !n.handover.ready.Load() {
		n.wakeReady()
	}
	if kind == 0 || n.cfg.Events == nil {
		return
	}
	ev := MemberEvent{Kind: kind, Members: make([]Member, len(changed))}
	for i, m := range changed {
		ev.Members[i] = toMember(m)
	}
	select {
	case n.cfg.Events <- ev:
	default:
		n.droppedEvents.Add(1)
	}
}

func (n *Node) sweepLoop() {
	t := clocks.NewTicker(n.clock, n.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
			n.grants.sweep(n.handover, n.store, n.now().UnixNano())
			n.store.Sweep(n.now())
			n.standins.prune(n.store, n.now())
		}
	}
}
