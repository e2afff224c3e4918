package cluster

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/ring"
)

// grpcTag is the serf tag holding a node's gRPC address.
const grpcTag = "grpc"

// Member is one node of the cluster as this node sees it.
type Member struct {
	Name       string
	GossipAddr string
	GRPCAddr   string
	// Status is serf's: alive, leaving, left or failed.
	Status string
}

// MemberEventKind says what happened to a member.
type MemberEventKind uint8

const (
	MemberJoined MemberEventKind = iota + 1
	MemberLeft
	MemberFailed
	MemberUpdated
	MemberReaped
)

func (k MemberEventKind) String() string {
	switch k {
	case MemberJoined:
		return "joined"
	case MemberLeft:
		return "left"
	case MemberFailed:
		return "failed"
	case MemberUpdated:
		return "updated"
	case MemberReaped:
		return "reaped"
	}
	return "unknown"
}

// MemberEvent is a membership change, sent on Config.Events after the ring
// has been rebuilt with it.
type MemberEvent struct {
	Kind    MemberEventKind
	Members []Member
}

// serfLogWriter passes serf's and memberlist's log lines to a slog logger
// at the level their "[ERR]", "[WARN]", "[INFO]" or "[DEBUG]" tag names:
// a name conflict or a failed join is an error or a warning, not a debug
// line.
type serfLogWriter struct{ logger *slog.Logger }

func (w serfLogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	for _, t := range []struct {
		tag   string
		level slog.Level
	}{{"[ERR]", slog.LevelError}, {"[WARN]", slog.LevelWarn}, {"[INFO]", slog.LevelInfo}, {"[DEBUG]", slog.LevelDebug}} {
		if i := strings.Index(line, t.tag); i >= 0 {
			level, line = t.level, strings.TrimSpace(line[i+len(t.tag):])
			break
		}
	}
	w.logger.Log(context.Background(), level, line)
	return len(p), nil
}

// serfConfig builds a fresh serf config (serf rewrites the one it is given).
func serfConfig(c *Config, events chan serf.Event, grpcAddr string, logger *slog.Logger) (*serf.Config, error) {
	host, port, err := splitHostPort(c.GossipAddr)
	if err != nil {
		return nil, err
	}
	sc := serf.DefaultConfig()
	sc.NodeName = c.NodeName
	sc.EventCh = events
	sc.Tags = nodeTags(c, grpcAddr, false)
	// serf's resolution of a name conflict shuts down the member that
	// loses a vote any gossip member may answer: a live member keeps its
	// name (memberlist refuses the claim of another address), and the
	// claimant owns nothing unless it proves itself (proof.go).
	sc.EnableNameConflictResolution = false
	// serf and memberlist log through the node's logger at the level each
	// line names; only one of LogOutput and Logger may be set on
	// memberlist.
	std := log.New(serfLogWriter{logger}, "", 0)
	sc.Logger = std
	sc.LogOutput = nil
	if c.Profile == ProfileFast {
		sc.MemberlistConfig = memberlist.DefaultLocalConfig()
		ml := sc.MemberlistConfig
		ml.ProbeInterval = 200 * time.Millisecond
		ml.ProbeTimeout = 100 * time.Millisecond
		ml.GossipInterval = 20 * time.Millisecond
		ml.SuspicionMult = 2
		ml.RetransmitMult = 4
		ml.PushPullInterval = 500 * time.Millisecond
		ml.TCPTimeout = 500 * time.Millisecond
		ml.DeadNodeReclaimTime = time.Millisecond
		sc.ReapInterval = 500 * time.Millisecond
		sc.TombstoneTimeout = 2 * time.Second
		// A failed member is retried every ReconnectInterval until
		// ReconnectTimeout reaps it: this is what merges the two sides
		// of a healed partition (nobody else rejoins them), so it must
		// outlast a partition, not only a failure detection.
		sc.ReconnectInterval = 500 * time.Millisecond
		sc.ReconnectTimeout = time.Minute
		if c.reconnectTimeout > 0 {
			sc.ReconnectTimeout = c.reconnectTimeout
		}
		sc.LeavePropagateDelay = 100 * time.Millisecond
		// How long SetTags and Leave wait for their broadcast to go
		// round: Close waits for a SetTags in flight.
		sc.BroadcastTimeout = time.Second
		if c.loadTolerant {
			loadTolerantGossip(ml)
		}
	}
	ml := sc.MemberlistConfig
	ml.Name = c.NodeName
	ml.BindAddr = host
	if host == "" {
		ml.BindAddr = "0.0.0.0"
	}
	ml.BindPort = port
	ml.AdvertisePort = 0
	if c.AdvertiseHost != "" {
		ml.AdvertiseAddr = c.AdvertiseHost
	}
	ml.Logger = std
	ml.LogOutput = nil
	keys, err := c.gossipKeys()
	if err != nil {
		return nil, err
	}
	if len(keys) > 0 {
		kr, err := memberlist.NewKeyring(keys, keys[0])
		if err != nil {
			return nil, fmt.Errorf("cluster: gossip keyring: %w", err)
		}
		ml.Keyring = kr
		ml.GossipVerifyIncoming = true
		ml.GossipVerifyOutgoing = true
	}
	return sc, nil
}

// wrapGossipTransport binds memberlist's NetTransport where ml says, as
// memberlist would, sets ml to gossip over wrap's wrapper of it, and
// returns the wrapper; a failure shuts the NetTransport down.
func wrapGossipTransport(ml *memberlist.Config, wrap func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport) (memberlist.Transport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{ml.BindAddr}, BindPort: ml.BindPort, Logger: ml.Logger}
	// A free TCP port may be taken for UDP: memberlist retries too.
	tries := 1
	if ml.BindPort == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: gossip transport: %w", err)
	}
	t := wrap(nt)
	if t == nil {
		nt.Shutdown()
		return nil, fmt.Errorf("%w: GossipTransport returned nil", ErrInvalidConfig)
	}
	// memberlist learns the port it bound only when it binds itself.
	ml.BindPort = nt.GetAutoBindPort()
	ml.AdvertisePort = ml.BindPort
	ml.Transport = t
	return t, nil
}

// advertisedGRPC returns the gRPC address to put in the serf tag: the
// listener's port on AdvertiseHost, or on the listener's host when that is a
// specific address. ok is false when the host must come from serf.
func advertisedGRPC(c *Config, lis net.Listener) (addr string, ok bool) {
	tcp := lis.Addr().(*net.TCPAddr)
	port := strconv.Itoa(tcp.Port)
	if c.AdvertiseHost != "" {
		return net.JoinHostPort(c.AdvertiseHost, port), true
	}
	if !tcp.IP.IsUnspecified() {
		return net.JoinHostPort(tcp.IP.String(), port), true
	}
	return ":" + port, false
}

// ringMembers turns serf's members into the ring's, keeping alive members
// whose gRPC tag is a valid address. Tags come from other nodes: a member
// with a bad one is left out and reported, never trusted.
func ringMembers(ms []serf.Member, logger *slog.Logger) []ring.Member {
	out := make([]ring.Member, 0, len(ms))
	for _, m := range ms {
		if m.Status != serf.StatusAlive {
			continue
		}
		addr, err := checkGRPCTag(m.Tags[grpcTag])
		if err != nil {
			logger.Warn("cluster: ignoring member with a bad gRPC tag", "member", m.Name, "err", err)
			continue
		}
		out = append(out, ring.Member{Name: m.Name, Addr: addr})
	}
	return out
}

func checkGRPCTag(v string) (string, error) {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", fmt.Errorf("grpc tag %q: %w", v, err)
	}
	if host == "" {
		return "", fmt.Errorf("grpc tag %q has no host", v)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("grpc tag %q has a bad port", v)
	}
	return v, nil
}

func toMember(m serf.Member) Member {
	return Member{
		Name:       m.Name,
		GossipAddr: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))),
		GRPCAddr:   m.Tags[grpcTag],
		Status:     m.Status.String(),
	}
}

func eventKind(t serf.EventType) (MemberEventKind, bool) {
	switch t {
	case serf.EventMemberJoin:
		return MemberJoined, true
	case serf.EventMemberLeave:
		return MemberLeft, true
	case serf.EventMemberFailed:
		return MemberFailed, true
	case serf.EventMemberUpdate:
		return MemberUpdated, true
	case serf.EventMemberReap:
		return MemberReaped, true
	}
	return 0, false
}

// loadTolerantGossip stretches the fast profile's failure detection for
// nodes whose process may be starved of CPU for a second or more, as tests
// under -race on a loaded machine are: a probe waits 300ms for its ack
// (memberlist's awareness stretches it further while acks go missing),
// once every 500ms, and a suspected member has 2s to refute it, 6s when
// no other member confirms the suspicion. A killed member is seen failed
// in about 3s, a partition in at most about 7s.
func loadTolerantGossip(ml *memberlist.Config) {
	ml.ProbeInterval = 500 * time.Millisecond
	ml.ProbeTimeout = 300 * time.Millisecond
	ml.SuspicionMult = 4
	ml.SuspicionMaxTimeoutMult = 3
}

// leavingLook is how often, on the system's timer, the event loop looks
// again at serf's members while serf lists one leaving (memberStatuses).
const leavingLook = 200 * time.Millisecond

// memberStatuses is serf's members' statuses as the last ring rebuild read
// them. serf changes a member's status without an event in one case that
// matters to the ring: a member that joins while serf holds a recent leave
// intent of its name (a member of that name left and serf forgot it, and
// the intent reached this node again, by a push/pull with a member that
// had not forgotten it yet, or rebroadcast) is listed leaving, and the
// join intent that comes next sets it alive with no event. A member that
// comes back under the name of one that left would stay out of the ring
// until some other member's event. So while serf lists a member leaving,
// the event loop looks again every leavingLook and rebuilds the ring when
// a status changed since the last rebuild (changed). Safe for concurrent
// use.
type memberStatuses struct {
	mu   sync.Mutex // guards seen
	seen map[string]serf.MemberStatus
	// leaving is set while seen holds a member leaving.
	leaving atomic.Bool
	// wake tells the event loop that leaving was set.
	wake chan struct{}
}

func newMemberStatuses() *memberStatuses {
	return &memberStatuses{wake: make(chan struct{}, 1)}
}

// record keeps the statuses of ms, the members a rebuild read.
func (s *memberStatuses) record(ms []serf.Member) {
	seen := make(map[string]serf.MemberStatus, len(ms))
	leaving := false
	for _, m := range ms {
		seen[m.Name] = m.Status
		leaving = leaving || m.Status == serf.StatusLeaving
	}
	s.mu.Lock()
	s.seen = seen
	s.mu.Unlock()
	if leaving && !s.leaving.Swap(true) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	} else if !leaving {
		s.leaving.Store(false)
	}
}

// changed reports whether the statuses of ms differ from those recorded.
func (s *memberStatuses) changed(ms []serf.Member) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ms) != len(s.seen) {
		return true
	}
	for _, m := range ms {
		if st, ok := s.seen[m.Name]; !ok || st != m.Status {
			return true
		}
	}
	return false
}
