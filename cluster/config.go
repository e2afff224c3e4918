package cluster

import (
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Profile chooses serf's timings.
type Profile uint8

const (
	// ProfileLAN is memberlist's LAN defaults: a failed node is noticed in
	// about five seconds and retried every 30 seconds for a day, so the
	// sides of a healed partition merge within about a minute.
	ProfileLAN Profile = iota
	// ProfileFast is for nodes on one host, tests above all: joins converge
	// in tens of milliseconds, a failed node is noticed in about a second
	// and retried twice a second for a minute, so the sides of a partition
	// that heals within that minute merge within about a second.
	ProfileFast
)

// Config configures a Node. Build it from DefaultConfig or TestConfig.
type Config struct {
	// NodeName must be unique in the cluster.
	NodeName string
	// GossipAddr is serf's bind address, host:port (port 0 picks one).
	GossipAddr string
	// GRPCAddr is where the node serves its peers, and is what it
	// advertises to them; API clients too with ServePublicAPI (a program
	// that keeps them apart serves Node.RegisterPublicAPI elsewhere).
	GRPCAddr string
	// AdvertiseHost is the host other nodes reach this one at. Empty means
	// the bind host, or the address serf advertises when bound to all
	// interfaces.
	AdvertiseHost string
	// Seeds are gossip addresses, host:port, of existing members to join.
	// A host name stands for every address (A and AAAA) it resolves to at
	// each attempt, such as a Kubernetes headless Service's pods; this
	// node's own address is left out. A node whose seeds do not answer,
	// or resolve to no address but its own, starts not ready and retries,
	// resolving them again, every RetryJoinInterval.
	Seeds []string
	// Resolver resolves the host names of Seeds; nil is
	// net.DefaultResolver.
	Resolver          Resolver
	RetryJoinInterval time.Duration
	Profile           Profile
	// BootstrapExpect is how many members a node must see at once, itself
	// included, before it is ready as a cluster that did not exist yet:
	// set it to the number of nodes that start together (a StatefulSet's
	// replicas), 1 for a node meant to run alone. A node that sees a
	// member of a cluster that is ready joins that cluster and is ready
	// whatever this number. 0, the default, never starts a cluster: the
	// node is ready only once it has joined one. Until it is ready, a node
	// decides no key as owner and every check it is asked gets the
	// unreachable policy (Unreachable, or the request's own); with
	// PolicyLocal, that is a decision on this node's own store, so deny is
	// the policy that admits nothing until the cluster has formed
	// (bootstrap.go). At most MaxBootstrapExpect.
	BootstrapExpect int
	// Unreachable is the policy for requests that do not set their own.
	Unreachable sluice.Policy
	// DenyRetryAfter is the RetryAfter of a request denied by PolicyDeny.
	DenyRetryAfter time.Duration
	// BreakerThreshold consecutive failed calls to a peer open its circuit
	// breaker: its keys go to the unreachable policy at once, without a
	// call, for BreakerCooldown; then one call probes the peer again.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// SweepInterval is how often keys whose state returned to fresh are
	// dropped from the store.
	SweepInterval time.Duration

	// Replicas is how many nodes hold each key's state: its owner and
	// Replicas-1 others next in line on the ring, which the owner sends
	// the keys it changed every ReplicateInterval. 1 keeps no copies; at
	// most MaxReplicas. With more than 1, Store.TrackChanges is turned on.
	Replicas          int
	ReplicateInterval time.Duration
	// LeaveTimeout bounds the hand-off of a graceful Leave, both passes,
	// and, for a node alone in its ring while members are cut off, its
	// wait for one of them to come back first.
	LeaveTimeout time.Duration
	// DataDir, when set, is the directory where the node keeps the key
	// states it holds, owned and replicated, so that they outlive its
	// process (persist.go): every PersistInterval it writes the keys
	// that changed, on Close (and so at the end of Leave) every live key,
	// and New restores them and gives each to its owner, with the hits
	// stand-in owners admitted of the key that are not settled yet
	// (standin.go), which are charged to the owner. It also keeps the
	// members the node has seen (members.json), which it joins again on
	// start and every RetryJoinInterval while they are not members, beside
	// Seeds. A lock file keeps a second process out of it. Empty: states
	// live only in memory and only Seeds are joined again.
	DataDir string
	// PersistInterval is how often the keys that changed are written to
	// DataDir: what a hard kill of every node may forget is at most this
	// much traffic.
	PersistInterval time.Duration
	// DamagedData says what New does with a damaged, truncated or foreign
	// state file in DataDir: refuse to start (the default) or set the file
	// aside and start without its states.
	DamagedData DamagedDataPolicy
	// HandoverTimeout bounds how long a node that gained keys when the
	// membership changed waits for every other member's hand-over
	// confirmation before it decides them (handover.go), and how long a
	// check waits for a key's owner to be settled before the unreachable
	// policy decides it.
	HandoverTimeout time.Duration

	Store limiter.StoreConfig
	Ring  ring.Config
	// Peer configures the clients to other nodes; Peer.Timeout is the
	// deadline of a forwarded check.
	Peer PeerConfig
	// Lease configures token leases for hot keys (off by default); see
	// LeaseConfig.
	Lease LeaseConfig

	// GossipKeys, when not empty, encrypt and authenticate gossip with
	// AES-GCM: every key is 16, 24 or 32 bytes; the first encrypts, all
	// decrypt. Every member must also hold every other member's primary
	// key; a node without a matching key cannot join. Empty with
	// ClusterSecret set: gossip is encrypted with a key derived from the
	// secret. Empty with PeerIdentities and no ClusterSecret:
	// New fails with ErrPlainGossip, since anyone who reaches the gossip
	// port could join.
	GossipKeys [][]byte
	// TLS, when set, secures gRPC between nodes (and from daemon clients)
	// with mutual TLS. The config is cloned, never modified, and must hold:
	//   - Certificates: this node's certificate and key, served to callers
	//     and presented to peers as the client certificate;
	//   - RootCAs: the CAs that verify peers' server certificates;
	//   - ClientCAs: the CAs that verify callers; when set, callers must
	//     present a certificate they sign (RequireAndVerifyClientCert).
	// Peers are dialled at their advertised gRPC address, so certificates
	// need IP SANs (or DNS SANs) for the advertised addresses.
	TLS *tls.Config
	// PeerIdentities, with TLS, are the URI or DNS subject alternative
	// names that mark a caller's certificate as a cluster member's: only
	// such callers may use the Peer service (forwarded checks, hand-off,
	// replication, leases), while certificates without one may still call
	// the public API. Issue nodes certificates carrying a peer identity
	// (say spiffe://example.org/sluice/peer) that clients' do not carry.
	// Empty: every certificate the ClientCAs sign is a peer.
	PeerIdentities []string
	// ClusterSecret, when set (at least 16 bytes), must be proven on every
	// Peer call: an HMAC of the call under a key
	// derived from it, checked against the receiver's clock within
	// MaxPeerAuthSkew. Empty with GossipKeys set: the secret is
	// derived from the gossip keys (every key is accepted, the first is
	// sent), so that an encrypted cluster authenticates its peers with no
	// setting of its own. Without TLS the proof travels in clear; see the
	// README's Security section.
	//
	// With ClusterSecret, PeerIdentities or GossipKeys set, membership is
	// earned: a member that gossip brings in owns no key, and is sent no
	// check, hand-off, replica or lease, until it has answered a challenge
	// with the credential the Peer service demands of callers (proof.go;
	// Node.RefusedMembers lists those that failed).
	ClusterSecret []byte
	// ProofTimeout bounds one challenge of a member, and how long a node
	// that joins waits for the members it found to answer theirs before
	// it reports ready.
	ProofTimeout time.Duration
	// ProofRetry is the wait before a member that failed its challenge is
	// challenged again; it doubles at every failure in a row, up to
	// ProofRetryMax.
	ProofRetry    time.Duration
	ProofRetryMax time.Duration
	// ServePublicAPI serves the public gRPC API (the Sluice service, for
	// sluice's client package and other languages) on GRPCAddr beside the
	// Peer service. Off, the node answers only its peers: an embedded node
	// checks through its own methods and needs no API on the network.
	ServePublicAPI bool
	// PublicPermit, when set, is asked about every request of the public
	// API before it is routed, on GRPCAddr or on the
	// server of Node.RegisterPublicAPI; the daemon restricts destructive
	// behaviors with it.
	PublicPermit Permit
	// PublicInspectPermit, when set, is asked before every Inspect of the
	// public API: inspecting reveals a key's
	// usage.
	PublicInspectPermit InspectPermit

	// GossipTransport, when set, wraps the transport serf gossips over:
	// the node binds memberlist's NetTransport on GossipAddr and hands it
	// to GossipTransport, whose result carries every gossip packet and
	// stream. The wrapper may drop packets and refuse or close streams
	// (testcluster cuts partitions this way). Its Shutdown must forward to
	// the transport it wraps, stop what the wrapper started, and be safe to
	// call more than once: memberlist calls it, and so does Close. nil
	// gossips on the NetTransport itself.
	GossipTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// ServerOptions are added after the node's own options of its gRPC
	// server, for stream interceptors above all (testcluster delays a
	// slow node's messages this way). The server serves every unary
	// method as a stream whose handler receives one message (so that its
	// message budget reserves the message before it is read): stream
	// interceptors see each unary call as a stream that neither side
	// streams (grpc.StreamServerInfo's IsClientStream and IsServerStream
	// false), and unary interceptors belong in UnaryInterceptors, as
	// grpc.UnaryInterceptor options here see none of the node's methods.
	// Credentials come from TLS: do not set them here. Dial options of
	// the clients to peers are in Peer.DialOptions.
	ServerOptions []grpc.ServerOption
	// UnaryInterceptors run around each unary method of the node's
	// server, the first outermost, after its stream interceptors, each
	// with the call's request and its grpc.UnaryServerInfo.
	UnaryInterceptors []grpc.UnaryServerInterceptor
	// ServerLimits bounds what clients may hold open on the node's gRPC
	// server: connections, calls, and the bytes of the messages on their
	// way (its MessageBytes is the budget those messages share). Default
	// DefaultServerLimits().
	ServerLimits ServerLimits
	// RegisterServices, when set, is called once by New with the node's
	// gRPC server and the node, before the server serves, to serve more
	// services on GRPCAddr beside the node's own under the same TLS and
	// limits (the daemon adds Envoy's rate limit service, which checks
	// through the node). It must only register services: the node is not
	// running yet, and calls that reach it before New returns are decided
	// as checks made before the node is ready. An error fails New.
	RegisterServices func(s grpc.ServiceRegistrar, n *Node) error

	// Events, when set, receives a MemberEvent for every membership change
	// the node applies. Sends never block: when the channel is full the
	// event is dropped and counted in Stats.DroppedEvents.
	Events chan<- MemberEvent
	// Registerer, when set, receives the node's Prometheus metrics
	// (sluice_checks_total and friends; see metrics.go). Use a registry per
	// node when several nodes share a process.
	Registerer prometheus.Registerer
	// TracerProvider, when set, traces checks with OpenTelemetry: a span
	// per Check and CheckMany call, a client span per call forwarded to an
	// owner, and the owner's span of its decision, all in the caller's
	// trace (trace.go; the W3C traceparent of each forwarded check travels
	// in its item of the peer batch). Unless Peer.TracerProvider is set,
	// the clients to peers use it too. nil: no spans, and nothing added to
	// the path of a check.
	TracerProvider trace.TracerProvider
	// TraceKeys adds the client key of each check to its spans (attribute
	// sluice.key). Off by default: keys are personal data in many
	// deployments (user ids, IP addresses).
	TraceKeys bool
	// Logger receives the node's logs, serf's and memberlist's included;
	// nil discards them, except the warning that peer calls are open to
	// any caller (no TLS identities, no ClusterSecret), which then goes to
	// slog.Default().
	Logger *slog.Logger
	// Clock is the time decisions are made at and every deadline, timer
	// and ticker of the node is measured on (hand-over timeouts, a check's
	// wait for its key's owner, the outbox's retries, the peer clients'
	// deadlines when Peer.Clock is nil, the periodic sweeps, copies, clock
	// probes and join retries, the lease loop, a Leave's time limit); nil
	// is SystemClock(). ClockFunc adapts a function. Only the grace of
	// gRPC's shutdown and the latencies of metrics and logs are on the
	// system's clock, as are gRPC's own keepalives.
	Clock Clock
	// MaxClockSkew is the largest offset between two nodes' clocks the
	// cluster tolerates: the node estimates each member's offset every
	// ClockProbeInterval (clockskew.go), exports it
	// (sluice_peer_clock_offset_seconds), lists it in Status and logs a
	// warning when a member's passes this bound. Leases hold whatever the
	// skew; what else holds within the bound is in the README's
	// Guarantees. In (0, MaxMaxClockSkew].
	MaxClockSkew time.Duration
	// ClockProbeInterval is how often the node samples each member's
	// clock, at least MinInterval.
	ClockProbeInterval time.Duration

	// loadTolerant, set by TestConfig, stretches ProfileFast's failure
	// detection for processes starved of CPU (see loadTolerantGossip).
	loadTolerant bool
	// reconnectTimeout, when set, replaces ProfileFast's serf
	// ReconnectTimeout: how long a failed member is kept before it is
	// reaped. Tests shorten it to see what follows the reap.
	reconnectTimeout time.Duration

	// protocol is the range of protocol versions the node advertises;
	// zero is this build's (thisProtocol). Tests set it to stand in for
	// other builds.
	protocol protocolRange

	// beforeHandoffPass, when set, is called by the hand-off loop before
	// each pass reads the ring; tests use it to hold passes back.
	beforeHandoffPass func()
	// afterHandoffRead, when set, is called by a hand-off pass after it
	// read the states it hands off and before it attaches their parts;
	// tests use it to merge a state meanwhile.
	afterHandoffRead func()
	// afterChangesRead, when set, is called by the changes loop after it
	// read the changed states it copies to replicas and before it queues
	// them; tests use it to merge a state meanwhile.
	afterChangesRead func()
	// beforeStandinRecord, when set, is called by a stand-in decision
	// that admitted hits, after its store counts them and before its
	// record does; tests use it to hold the record back.
	beforeStandinRecord func()
}

// protocolRange returns the range the node advertises.
func (c *Config) protocolRange() protocolRange {
	if c.protocol == (protocolRange{}) {
		return thisProtocol
	}
	return c.protocol
}

// MaxMaxClockSkew bounds Config.MaxClockSkew.
const MaxMaxClockSkew = time.Hour

// DefaultConfig returns a config for a node on a LAN: gossip on port 7946
// and gRPC on 7947 of every interface, the node name from the host name.
func DefaultConfig() Config {
	return Config{
		GossipAddr:        ":7946",
		GRPCAddr:          ":7947",
		RetryJoinInterval: 5 * time.Second,
		Profile:           ProfileLAN,
		Unreachable:       sluice.PolicyLocal,
		DenyRetryAfter:    time.Second,
		BreakerThreshold:  3,
		BreakerCooldown:   time.Second,
		SweepInterval:     10 * time.Second,
		Replicas:          2,
		ReplicateInterval: 50 * time.Millisecond,
		LeaveTimeout:      5 * time.Second,
		PersistInterval:   time.Second,
		HandoverTimeout:   5 * time.Second,
		Store:             limiter.DefaultStoreConfig(),
		Ring:              ring.DefaultConfig(),
		Peer:              peer.DefaultConfig(),
		Lease:             DefaultLeaseConfig(),
		ServerLimits:      transport.DefaultServerLimits(),
		ProofTimeout:      2 * time.Second,
		ProofRetry:        200 * time.Millisecond,
		ProofRetryMax:     30 * time.Second,

		MaxClockSkew:       250 * time.Millisecond,
		ClockProbeInterval: 10 * time.Second,
	}
}

// TestConfig returns DefaultConfig changed for nodes in one process on
// loopback: free ports on 127.0.0.1, the fast gossip profile with a
// failure detection that tolerates a starved CPU (a member is suspected
// after a probe of 500ms and declared failed 2 to 6 seconds later, where
// the fast profile alone takes about a second: under -race beside other
// processes on two cores, the fast profile's 100ms probes went unanswered
// and live members were declared failed hundreds of times a minute),
// quick retries, a smaller store, and BootstrapExpect 1, so that a node
// given no seeds is ready alone at once. Its timeouts (Peer.Timeout, LeaveTimeout)
// are long rather than short: a test under -race on a loaded machine takes
// seconds for a forwarded call or a hand-off that usually takes
// milliseconds, and a deadline that passes turns into a decision without
// the owner, a state not handed off, a test that fails. Waits end as soon
// as the call does; tests of timeouts set their own.
func TestConfig(name string) Config {
	c := DefaultConfig()
	c.NodeName = name
	c.GossipAddr = "127.0.0.1:0"
	c.GRPCAddr = "127.0.0.1:0"
	c.Profile = ProfileFast
	c.loadTolerant = true
	c.RetryJoinInterval = 100 * time.Millisecond
	c.Store.MaxEntries = 100_000
	c.Peer.Timeout = 5 * time.Second
	c.ReplicateInterval = 20 * time.Millisecond
	c.LeaveTimeout = 10 * time.Second
	c.ProofRetry = 20 * time.Millisecond
	c.ProofRetryMax = time.Second
	c.BootstrapExpect = 1
	c.ClockProbeInterval = time.Second
	return c
}

// MaxReplicas bounds Config.Replicas.
const MaxReplicas = 5

// MaxBootstrapExpect bounds Config.BootstrapExpect.
const MaxBootstrapExpect = 1024

// MinInterval bounds the intervals of the node's periodic work from below
// (RetryJoinInterval, SweepInterval, ReplicateInterval): a loop that ticks
// every nanosecond would take a CPU while the node is idle.
const MinInterval = time.Millisecond

// Errors of Config.Validate.
var (
	// ErrInvalidConfig wraps every error of Config.Validate.
	ErrInvalidConfig = errors.New("cluster: invalid config")
	// ErrPlainGossip is a config that authenticates peers by their
	// certificates (PeerIdentities) but leaves gossip unencrypted, with
	// no secret to derive a gossip key from: anyone who reaches the
	// gossip port could join. Set GossipKeys or ClusterSecret. Validate
	// wraps it in ErrInvalidConfig.
	ErrPlainGossip = errors.New("cluster: peer identities without gossip encryption")
)

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	if c.NodeName == "" {
		return bad("NodeName is empty")
	}
	for field, addr := range map[string]string{"GossipAddr": c.GossipAddr, "GRPCAddr": c.GRPCAddr} {
		if _, _, err := splitHostPort(addr); err != nil {
			return bad("%s %q: %v", field, addr, err)
		}
	}
	switch {
	case c.Unreachable == sluice.PolicyDefault || !c.Unreachable.Valid():
		return bad("Unreachable policy %v must be local, allow or deny", c.Unreachable)
	case c.Profile > ProfileFast:
		return bad("Profile %d is unknown", c.Profile)
	case c.RetryJoinInterval < MinInterval:
		return bad("RetryJoinInterval %v is below %v", c.RetryJoinInterval, MinInterval)
	case c.DenyRetryAfter < 0:
		return bad("DenyRetryAfter %v is negative", c.DenyRetryAfter)
	case c.BreakerThreshold < 1:
		return bad("BreakerThreshold %d must be at least 1", c.BreakerThreshold)
	case c.BreakerCooldown <= 0:
		return bad("BreakerCooldown %v must be positive", c.BreakerCooldown)
	case c.SweepInterval < MinInterval:
		return bad("SweepInterval %v is below %v", c.SweepInterval, MinInterval)
	case c.Replicas < 1 || c.Replicas > MaxReplicas:
		return bad("Replicas %d is outside [1, %d]", c.Replicas, MaxReplicas)
	case c.ReplicateInterval < MinInterval:
		return bad("ReplicateInterval %v is below %v", c.ReplicateInterval, MinInterval)
	case c.LeaveTimeout <= 0:
		return bad("LeaveTimeout %v must be positive", c.LeaveTimeout)
	case c.DataDir != "" && c.PersistInterval < MinInterval:
		return bad("PersistInterval %v is below %v", c.PersistInterval, MinInterval)
	case c.DamagedData > SetDamagedAside:
		return bad("DamagedData %d is unknown", c.DamagedData)
	case len(c.DataDir) > 4096:
		return bad("DataDir is %d bytes, more than 4096", len(c.DataDir))
	case c.HandoverTimeout <= 0:
		return bad("HandoverTimeout %v must be positive", c.HandoverTimeout)
	case c.ProofTimeout <= 0:
		return bad("ProofTimeout %v must be positive", c.ProofTimeout)
	case c.ProofRetry < MinInterval:
		return bad("ProofRetry %v is below %v", c.ProofRetry, MinInterval)
	case c.ProofRetryMax < c.ProofRetry:
		return bad("ProofRetryMax %v is below ProofRetry %v", c.ProofRetryMax, c.ProofRetry)
	case c.BootstrapExpect < 0 || c.BootstrapExpect > MaxBootstrapExpect:
		return bad("BootstrapExpect %d is outside [0, %d]", c.BootstrapExpect, MaxBootstrapExpect)
	case c.protocol != (protocolRange{}) && !c.protocol.valid():
		return bad("protocol range %v is empty", c.protocol)
	case c.MaxClockSkew <= 0 || c.MaxClockSkew > MaxMaxClockSkew:
		return bad("MaxClockSkew %v is outside (0, %v]", c.MaxClockSkew, MaxMaxClockSkew)
	case c.ClockProbeInterval < MinInterval:
		return bad("ClockProbeInterval %v is below %v", c.ClockProbeInterval, MinInterval)
	}
	if c.DataDir != "" {
		if len(c.DataDir) > 4096 || strings.ContainsRune(c.DataDir, 0) {
			return bad("DataDir must be at most 4096 bytes, without NUL")
		}
	}
	for i, k := range c.GossipKeys {
		if l := len(k); l != 16 && l != 24 && l != 32 {
			return bad("GossipKeys[%d] is %d bytes, want 16, 24 or 32", i, l)
		}
	}
	for i, id := range c.PeerIdentities {
		if id == "" || len(id) > 1024 {
			return bad("PeerIdentities[%d] must be non-empty and at most 1024 bytes", i)
		}
	}
	if len(c.PeerIdentities) > 0 && (c.TLS == nil || c.TLS.ClientCAs == nil) {
		return bad("PeerIdentities need TLS with ClientCAs: identities are read from verified client certificates")
	}
	if len(c.ClusterSecret) > 0 && len(c.ClusterSecret) < transport.MinClusterSecretLen {
		return bad("ClusterSecret is %d bytes, want at least %d", len(c.ClusterSecret), transport.MinClusterSecretLen)
	}
	if err := c.ServerLimits.Validate(); err != nil {
		return fmt.Errorf("%w: ServerLimits: %w", ErrInvalidConfig, err)
	}
	if len(c.PeerIdentities) > 0 && len(c.GossipKeys) == 0 && len(c.ClusterSecret) == 0 {
		return fmt.Errorf("%w: %w: set GossipKeys or ClusterSecret", ErrInvalidConfig, ErrPlainGossip)
	}
	for i, o := range c.ServerOptions {
		if o == nil {
			return bad("ServerOptions[%d] is nil", i)
		}
	}
	for i, ic := range c.UnaryInterceptors {
		if ic == nil {
			return bad("UnaryInterceptors[%d] is nil", i)
		}
	}
	if err := c.Store.Validate(); err != nil {
		return fmt.Errorf("%w: Store: %w", ErrInvalidConfig, err)
	}
	if err := c.Ring.Validate(); err != nil {
		return fmt.Errorf("%w: Ring: %w", ErrInvalidConfig, err)
	}
	if err := c.Peer.Validate(); err != nil {
		return fmt.Errorf("%w: Peer: %w", ErrInvalidConfig, err)
	}
	if err := c.Lease.Validate(); err != nil {
		return err
	}
	return nil
}

// splitHostPort parses host:port with a numeric port.
func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return "", 0, err
	}
	return host, p, nil
}

// gossipKey derives the key that encrypts gossip, when GossipKeys is
// empty, from a cluster secret, with a label of its own: it is not the key
// that proves membership (transport.PeerKey). It fails for a secret
// shorter than transport.MinClusterSecretLen.
func gossipKey(secret []byte) ([]byte, error) {
	if len(secret) < transport.MinClusterSecretLen {
		return nil, fmt.Errorf("%w: ClusterSecret is %d bytes, want at least %d", ErrInvalidConfig, len(secret), transport.MinClusterSecretLen)
	}
	return hkdf.Key(sha256.New, secret, nil, "sluice gossip encryption v1", 32)
}

// gossipKeys returns the keys gossip is encrypted with: GossipKeys, or one
// derived from ClusterSecret, or none.
func (c *Config) gossipKeys() ([][]byte, error) {
	if len(c.GossipKeys) > 0 || len(c.ClusterSecret) == 0 {
		return c.GossipKeys, nil
	}
	k, err := gossipKey(c.ClusterSecret)
	if err != nil {
		return nil, err
	}
	return [][]byte{k}, nil
}

// peerAuth returns who may call the node's Peer service: the callers
// whose certificates carry one of cfg.PeerIdentities, and that prove
// cfg.ClusterSecret, or the secret derived from cfg.GossipKeys.
func peerAuth(cfg *Config, now func() time.Time) (*transport.PeerAuth, error) {
	a := &transport.PeerAuth{Identities: append([]string(nil), cfg.PeerIdentities...), Now: now}
	secrets := cfg.GossipKeys
	if len(cfg.ClusterSecret) > 0 {
		secrets = [][]byte{cfg.ClusterSecret}
	}
	for _, s := range secrets {
		k, err := transport.PeerKey(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		a.Keys = append(a.Keys, k)
	}
	return a, nil
}
