package transport

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ServerLimits bounds what clients may hold open on a gRPC server serving
// sluice: connections, their handshakes, their idle time, their pings and
// the calls open on each. Without them, a connection that sends the HTTP/2
// preface and nothing more stays open for ever (three goroutines and some
// 70 KB each). Start from DefaultServerLimits; the zero value is invalid.
type ServerLimits struct {
	// MaxConnections is the most connections open at once. A connection
	// accepted beyond it is closed at once, with a TCP reset, before
	// anything is read from it; gRPC clients retry with backoff. Counted
	// by the listener that Listen returns. The listener of
	// MessageBudget.Listen closes instead the connection idle longest
	// with no call open (a call counts from its first message in), if
	// there is one, and serves the new one.
	// Default 4096 (about 300 MB of idle connections).
	MaxConnections int
	// HandshakeTimeout bounds the time from accepting a connection to
	// having read the client's HTTP/2 preface and first SETTINGS frame
	// (after the TLS handshake, when there is one); a connection that
	// takes longer is closed. Default 10s.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes a connection on which no call has been
	// open for this long: GOAWAY, then close within 5 seconds. Clients
	// reconnect on their next call. A peer's connection, with its stream
	// open, is never idle. Default 5m.
	MaxConnectionIdle time.Duration
	// KeepaliveTime and KeepaliveTimeout: after KeepaliveTime without
	// receiving anything on a connection, the server pings its client,
	// and closes the connection when nothing arrives within
	// KeepaliveTimeout. KeepaliveTime is at least 1s (gRPC's minimum).
	// Defaults 1m and 20s.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// MinPingInterval is the shortest interval at which clients may ping
	// (keepalive.EnforcementPolicy.MinTime), with or without calls open; a
	// client that pings more often three times running is disconnected
	// with GOAWAY "too_many_pings". At most PeerKeepalive().Time, so that
	// peers' pings pass; gRPC clients ping every 10s at the most often.
	// Default 5s.
	MinPingInterval time.Duration
	// MaxConcurrentStreams is the most calls open at once on one
	// connection; a gRPC client waits for one to end before it opens
	// another. A peer holds one stream, and a few unary calls, per
	// connection. Default 256.
	MaxConcurrentStreams uint32
	// MessageBytes bounds the bytes of inbound messages that every
	// connection together may make the server hold before the messages
	// are all in: each call opened reserves its stream window
	// (StreamWindow), and the rest of the largest message
	// (MessageReservation) as its handler begins, until its message is in
	// (a stream: until it ends). A call that finds no room for its window
	// is refused with ResourceExhausted; one that finds no room for the
	// rest waits for it (see MessageBudget). The rests of a connection
	// past its share leave the first half room for the windows of all the
	// calls it may open (MaxConcurrentStreams), so that one busy
	// connection is not refused on its own account when the first half
	// holds that much and a message. At least ConnMessageBytes.
	// Default 256 MiB (about 190 calls whose messages are on their way).
	MessageBytes int64
	// ConnMessageBytes is the most of MessageBytes one connection may
	// hold while more than half of it is in use: its calls beyond it wait
	// (or, for want of room for their window, are refused), so that many
	// connections are needed to fill the budget, and the last half of it
	// goes to many. At least MessageReservation (one call). Default 4 MiB.
	ConnMessageBytes int64
	// MessageTimeout is how long a call's first message may take to
	// arrive whole once the call is open: a call still waiting for the
	// rest is cancelled and its stream reset, freeing what it held.
	// The messages that follow on a stream have no deadline; the
	// stream's reservation bounds them. Default 10s.
	MessageTimeout time.Duration
}

// DefaultServerLimits returns the default limits.
func DefaultServerLimits() ServerLimits {
	return ServerLimits{
		MaxConnections:       4096,
		HandshakeTimeout:     10 * time.Second,
		MaxConnectionIdle:    5 * time.Minute,
		KeepaliveTime:        time.Minute,
		KeepaliveTimeout:     20 * time.Second,
		MinPingInterval:      5 * time.Second,
		MaxConcurrentStreams: 256,
		MessageBytes:         256 << 20,
		ConnMessageBytes:     4 << 20,
		MessageTimeout:       10 * time.Second,
	}
}

// Validate returns nil, or an error wrapping ErrInvalidServerLimits that
// names the field.
func (l ServerLimits) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidServerLimits, fmt.Sprintf(format, a...))
	}
	switch {
	case l.MaxConnections < 1:
		return bad("MaxConnections %d is less than 1", l.MaxConnections)
	case l.HandshakeTimeout <= 0:
		return bad("HandshakeTimeout %v is not positive", l.HandshakeTimeout)
	case l.MaxConnectionIdle <= 0:
		return bad("MaxConnectionIdle %v is not positive", l.MaxConnectionIdle)
	case l.KeepaliveTime < time.Second:
		return bad("KeepaliveTime %v is less than 1s", l.KeepaliveTime)
	case l.KeepaliveTimeout <= 0:
		return bad("KeepaliveTimeout %v is not positive", l.KeepaliveTimeout)
	case l.MinPingInterval <= 0 || l.MinPingInterval > PeerKeepalive().Time:
		return bad("MinPingInterval %v is outside (0, %v], the peers' keepalive", l.MinPingInterval, PeerKeepalive().Time)
	case l.MaxConcurrentStreams < 1:
		return bad("MaxConcurrentStreams is 0")
	case l.ConnMessageBytes < MessageReservation:
		return bad("ConnMessageBytes %d is less than one message (%d bytes)", l.ConnMessageBytes, MessageReservation)
	case l.MessageBytes < l.ConnMessageBytes:
		return bad("MessageBytes %d is less than ConnMessageBytes %d", l.MessageBytes, l.ConnMessageBytes)
	case l.MessageTimeout <= 0:
		return bad("MessageTimeout %v is not positive", l.MessageTimeout)
	}
	return nil
}

// ServerOptions returns the options a grpc.Server serving sluice should
// have, with the default limits: see ServerLimits.ServerOptions.
func ServerOptions() []grpc.ServerOption {
	return newMessageBudget(DefaultServerLimits()).ServerOptions()
}

// ServerOptions returns the options a grpc.Server serving sluice should
// have: the largest message it receives bounded to MaxMessageSize; the
// protobuf codec with the padding of the Peer messages (see CallOptions)
// and the count guard (see RegisterPeer), for every service of the
// server; flow-control windows of WindowSize; and l's limits but
// MaxConnections, which the listener of Listen enforces, with a message
// budget of its own (see NewMessageBudget to read its counters). It fails
// when l is invalid.
func (l ServerLimits) ServerOptions() ([]grpc.ServerOption, error) {
	b, err := NewMessageBudget(l)
	if err != nil {
		return nil, err
	}
	return b.ServerOptions(), nil
}

func (l ServerLimits) serverOptions(b *MessageBudget) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(b.tap),
		// The budget's hooks in each call's goroutine. No stats handler:
		// with one, gRPC builds an event for every step of every call.
		grpc.ChainStreamInterceptor(b.interceptStream),
		grpc.ChainUnaryInterceptor(b.interceptUnary),
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.ForceServerCodecV2(wireCodec{}),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(WindowSize),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		// A call on a goroutine of its own grows that goroutine's stack
		// from its first 8 KB, each time: copying stacks took about a
		// sixth of the public unary path's CPU. Workers keep theirs.
		grpc.NumStreamWorkers(streamWorkers),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.MaxConnectionIdle,
			Time:              l.KeepaliveTime,
			Timeout:           l.KeepaliveTimeout,
		}),
		// Pings without calls open are allowed, as often as with: they
		// cost no more, and the connection is closed once idle anyway.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             l.MinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}

// Listen listens on the local network address, as net.Listen does, and
// holds at most l.MaxConnections of the connections it accepts open at
// once: one more is closed as soon as it is accepted. It fails when l is
// invalid.
//
// Closing at once rather than leaving the connection in the kernel's
// accept queue until a slot frees (as x/net's netutil.LimitListener does)
// tells the client at once, keeps the queue empty, and needs no further
// dependency. The connections it returns are wrapped, so that gRPC does
// not set TCP_USER_TIMEOUT on them; keepalive closes a dead connection
// instead.
func (l ServerLimits) Listen(network, address string) (net.Listener, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	lis, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &limitListener{Listener: lis, max: int64(l.MaxConnections)}, nil
}

// limitListener closes the connections it accepts beyond max open.
type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64 // connections accepted and not closed
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &limitConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset: nothing lingers in TIME_WAIT
		}
		c.Close()
	}
}

// limitConn gives back its slot when it is first closed.
type limitConn struct {
	net.Conn
	l      *limitListener
	closed atomic.Bool
}

func (c *limitConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// PeerKeepalive returns the keepalive of peer clients (the peer package
// dials with it): while a call is open, a ping after 30s without receiving
// anything, and the connection closed when no answer comes within 10s, so
// that a stream to a peer gone silent fails before the next batch waits
// on it. No pings without a call open: the server closes an idle
// connection anyway (MaxConnectionIdle). ServerLimits.Validate requires a
// MinPingInterval that lets these pings pass.
func PeerKeepalive() keepalive.ClientParameters {
	return keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
}

// streamWorkers is how many goroutines of a server run its calls, each
// call after call; a call that finds them all busy gets a goroutine of
// its own. 64 covers the calls a node has in flight under load (a
// forwarded check holds its worker for a round trip to the owner) for
// about 2 MB of stacks.
const streamWorkers = 64
