package transport

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// The message budget. gRPC buffers the DATA frames of a message until the
// whole message is in, and it grows a stream's flow-control window to fit
// the message its handler reads: a client that sends most of a large
// message on each of many streams and stops makes the server hold those
// bytes for as long as the streams stay open. So every call reserves what
// it may hold, from a budget shared by all connections
// (ServerLimits.MessageBytes), in two steps:
//
//   - as it opens (tap.ServerInHandle, in the goroutine that reads the
//     connection's frames), StreamWindow: what its stream may receive
//     before its handler reads, the server's stream window. A call that
//     finds no room for that is refused with ResourceExhausted before
//     anything is read; nothing waits there, as a connection whose reads
//     stopped could neither finish the messages that would free room nor
//     be seen to close.
//   - as its handler begins (the budget's stream interceptor, in the
//     call's own goroutine, before gRPC reads its message and grows its
//     window), the rest of MessageReservation. A call that finds no
//     room waits in its own goroutine, holding only its stream window,
//     until another call gives room back or its deadline ends, so that a
//     burst of calls on one connection is served in turn instead of
//     refused.
//
// A unary call gives its reservation back once its message is in; a
// stream (the Peer service's CheckStream) keeps it until it ends, for the
// messages that follow. A call whose first message is not all in within
// ServerLimits.MessageTimeout is cancelled, its stream reset, and its
// bytes freed. While more than half the budget is in use,
// one connection may hold at most ServerLimits.ConnMessageBytes of it, so
// that a few connections cannot take it all from the others.
//
// The server serves unary methods as streams (servedAsStreams, Registrar):
// grpc-go reads a unary call's message before any hook of the call's own
// goroutine but a stats handler's, and a stats handler makes it build an
// event for every step of every call (headers and metadata copied, the
// times taken), which cost about a tenth of the public unary path. A
// stream's handler reads its message itself, after the interceptor. A
// unary method registered on the server otherwise has its message read
// before the budget sees the call (its window alone reserved); the
// budget's unary interceptor then gives the call's window back once the
// handler runs, and ends it.
//
// Each connection's share is found by the connection's *peer.Peer, which
// grpc-go puts once in the context of every call of a connection: the
// budget keeps the connections whose calls hold bytes, and forgets one
// once they hold none.
//
// The rest of a message is reserved before gRPC reads even its 5-byte
// prefix (no hook of grpc-go's comes between the read of the prefix and
// the read that grows the window), so a call of 100 bytes reserves as
// much as one of 1.4 MB, for the moment between its handler's start and
// its message in. A busy
// connection's rests past its share therefore leave room in the first
// half for the windows of the calls it may yet open (roomForRest): its
// later calls then never find the budget past half on its own account,
// and are not refused at the door; its rests wait instead, holding their
// windows. This only ever reserves less than the rules above allow.

// StreamWindow is the flow-control window of a stream that a server with
// ServerLimits' options gives its callers: what a call may receive before
// its handler reads (gRPC's least window).
const StreamWindow = 64 << 10

// MessageReservation is what one call reserves of the message budget:
// the largest message and its 5-byte gRPC prefix.
const MessageReservation = MaxMessageSize + 5

// MessageBudget holds the reservations of the calls of one gRPC server;
// NewMessageBudget makes one, and its ServerOptions install it on a
// server. Its methods are safe for concurrent use.
type MessageBudget struct {
	limits ServerLimits
	// afterFunc runs f after d, as time.AfterFunc does, and now is the
	// time; tests replace them.
	afterFunc func(d time.Duration, f func()) (stop func() bool)
	now       func() time.Time

	mu   sync.Mutex // guards used, freed, and each connection's and call's bytes
	used int64      // bytes reserved by every connection
	// freed is closed at the next release, for the calls waiting for
	// room; nil when none waits.
	freed chan struct{}
	// awaited are the calls whose first message is not all in, oldest
	// first: all wait MessageTimeout, so the oldest times out first.
	// One timer (sweep), armed while the list is not empty, times them
	// out, rather than one timer per call.
	awaited  callList
	sweeping bool // a sweep is scheduled

	refused   atomic.Int64
	timedOut  atomic.Int64
	waiting   atomic.Int64
	reclaimed atomic.Int64

	// byPeer are the connections whose calls hold bytes, by the peer
	// grpc-go gives every call of a connection; guarded by mu.
	byPeer map[*peer.Peer]*budgetConn
	// unary runs around the unary methods served as streams (see
	// ChainUnaryInterceptor); nil for none. Set before serving.
	unary grpc.UnaryServerInterceptor

	connSlots // of the listener of Listen

	// peers, when set, is checked for Peer calls as they open
	// (AuthorizePeers).
	peers *PeerAuth
}

// AuthorizePeers makes b check the caller of every Peer call against a as
// the call opens, before it reserves anything or a byte of its message is
// read, and refuse the calls a refuses with a's status (Unauthenticated or
// PermissionDenied): a caller that is no member never holds room a
// member's message needs. Call it before the server serves.
func (b *MessageBudget) AuthorizePeers(a *PeerAuth) {
	if !a.Open() {
		b.peers = a
	}
}

// MessageBudgetStats are a MessageBudget's counters.
type MessageBudgetStats struct {
	// Reserved is the bytes reserved now by calls whose messages are
	// not all in.
	Reserved int64
	// Waiting is the calls whose handlers wait for room for their
	// message, each holding its stream window.
	Waiting int64
	// Refused counts calls refused as they opened: with
	// ResourceExhausted for want of room for their stream window, or,
	// Peer calls under AuthorizePeers, for want of the peer credential.
	Refused int64
	// TimedOut counts calls cancelled because their first message was
	// not all in within ServerLimits.MessageTimeout.
	TimedOut int64
	// Reclaimed counts connections of Listen's listener closed with no
	// call open, at the cap, to give their slots to new ones.
	Reclaimed int64
}

// NewMessageBudget returns an empty budget of l's MessageBytes. It fails
// when l is invalid.
func NewMessageBudget(l ServerLimits) (*MessageBudget, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return newMessageBudget(l), nil
}

func newMessageBudget(l ServerLimits) *MessageBudget {
	return &MessageBudget{limits: l, afterFunc: func(d time.Duration, f func()) func() bool {
		return time.AfterFunc(d, f).Stop
	}, now: time.Now, byPeer: make(map[*peer.Peer]*budgetConn), connSlots: connSlots{conns: make(map[string]*slotConn)}}
}

// ChainUnaryInterceptor makes ics run, the first outermost, around every
// unary method that the server of b's ServerOptions serves as a stream
// (the methods of RegisterPeer, RegisterPublic, RegisterRules and
// Registrar): gRPC's own unary interceptors (grpc.UnaryInterceptor,
// grpc.ChainUnaryInterceptor) see only the unary methods registered
// otherwise. Call it before the server serves.
func (b *MessageBudget) ChainUnaryInterceptor(ics ...grpc.UnaryServerInterceptor) {
	for _, ic := range ics {
		if ic == nil {
			continue
		}
		if outer := b.unary; outer != nil {
			b.unary = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				return outer(ctx, req, info, func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, h) })
			}
		} else {
			b.unary = ic
		}
	}
}

// ServerOptions returns the options a grpc.Server serving sluice should
// have (see ServerLimits.ServerOptions), with b as its message budget.
// Give them to one server only.
func (b *MessageBudget) ServerOptions() []grpc.ServerOption {
	return b.limits.serverOptions(b)
}

// Stats returns b's counters.
func (b *MessageBudget) Stats() MessageBudgetStats {
	b.mu.Lock()
	used := b.used
	b.mu.Unlock()
	return MessageBudgetStats{Reserved: used, Waiting: b.waiting.Load(), Refused: b.refused.Load(), TimedOut: b.timedOut.Load(),
		Reclaimed: b.reclaimed.Load()}
}

// budgetConn is the share of one connection.
type budgetConn struct {
	// Guarded by MessageBudget.mu: the bytes its calls reserve, of
	// which their stream windows, and the rests of the messages of its
	// unary calls.
	used, windows, unaryRests int64
	slot                      *slotConn // its slot of Listen's cap; nil for another listener's
	// peer is its key in MessageBudget.byPeer; nil for a connection of
	// TagConn, which the budget does not keep.
	peer *peer.Peer
}

// budgetCall is the reservation of one call, and the call's context
// (tap's, which cancels it): it answers budgetCallKey itself, so that
// every call takes one context fewer.
type budgetCall struct {
	context.Context
	b      *MessageBudget
	conn   *budgetConn
	cancel context.CancelCauseFunc
	stream atomic.Bool // a client stream: keeps its reservation until it ends
	first  atomic.Bool // its first message is in
	// late tells that the call timed out and gave back what it held: it
	// reserves nothing more. Guarded by MessageBudget.mu.
	late bool
	// recv is the call's stream as its handler sees it, which tells the
	// budget when a message is in.
	recv budgetStream
	// open tells whether the call counts as open on its connection's
	// slot (conn.slot, when set): from its first message in until it
	// ends. A call whose message has not arrived keeps no slot, so that
	// calls opened and left without a message (renewed before
	// MessageTimeout) cannot hold the cap.
	open atomic.Bool
	// Bytes reserved, and the rest of its message among them; guarded
	// by MessageBudget.mu.
	held, rest int64
	// In MessageBudget.awaited until its first message is in; guarded
	// by MessageBudget.mu.
	prev, next *budgetCall
	listed     bool
	deadline   time.Time // of its first message
	method     string
}

// callList is a list of calls, linked through their prev and next.
type callList struct{ head, tail *budgetCall }

func (l *callList) push(c *budgetCall) {
	c.prev, c.next, c.listed = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *callList) remove(c *budgetCall) {
	if !c.listed {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
}

// Value answers budgetCallKey with c, and the rest from c's parent.
func (c *budgetCall) Value(key any) any {
	if _, ok := key.(budgetCallKey); ok {
		return c
	}
	return c.Context.Value(key)
}

type budgetConnKey struct{}
type budgetCallKey struct{}

// reserve takes n bytes for c, its stream window or (rest) the rest of
// its message, or reports that there is no room: the budget is full, or
// more than half of it would be in use and c's connection holds its share.
// A rest finds no room either, past its connection's share, when it would
// leave too little of the first half for the windows of the connection's
// calls still to come (see roomForRest). Without room, freed is closed at
// the next release.
func (b *MessageBudget) reserve(c *budgetCall, n int64, rest bool) (ok bool, freed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reserveLocked(c, n, rest)
}

// reserveLocked is reserve with b.mu held. A call that timed out finds
// neither room nor a channel to wait on.
func (b *MessageBudget) reserveLocked(c *budgetCall, n int64, rest bool) (ok bool, freed <-chan struct{}) {
	if c.late {
		return false, nil
	}
	total, half := b.limits.MessageBytes, b.limits.MessageBytes/2
	fits := b.used+n <= total && (c.conn.used+n <= b.limits.ConnMessageBytes || b.used+n <= half && (!rest || b.roomForRest(c, n)))
	if !fits {
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		return false, b.freed
	}
	b.used += n
	c.conn.used += n
	c.held += n
	if !rest {
		c.conn.windows += n
		return true, nil
	}
	c.rest += n
	if !c.stream.Load() {
		c.conn.unaryRests += n
	}
	return true, nil
}

// roomForRest tells whether the rest n of the message of c, whose
// connection is past its share, leaves room in the first half of the
// budget for the stream windows of every call its connection may yet
// open (ServerLimits.MaxConcurrentStreams in all). Without this, the rests
// of a connection's calls, each held only from its handler's start until
// its message is in, fill the first half on their own whenever a busy
// client has enough of them between the two at once (Envoy's one
// connection with 256 callers: 3 to 4 calls in 1000), and the next calls
// the connection opens, past half and past its share, are refused at the
// door: what a call's rest may hold is unknown until gRPC has read its
// message (a message of 100 bytes reserves as much as one of 1.4 MB), but
// its window is held from the start, so rests wait for room and windows
// cannot. A connection whose unary calls hold no rest is let have
// one regardless, as before: it then waits for nothing but the budget, and
// the rests it holds are given back as their messages come in, so it never
// waits for ever on room that only its own windows hold.
//
// A budget whose first half cannot hold the windows of a connection with
// every stream open and a message besides (less than about 35 MiB with
// the default 256 streams) keeps no such room: its busy connection goes
// past its share on its windows alone, and rests fill the first half.
func (b *MessageBudget) roomForRest(c *budgetCall, n int64) bool {
	all := int64(b.limits.MaxConcurrentStreams) * StreamWindow
	half := b.limits.MessageBytes / 2
	if c.conn.unaryRests == 0 || all+MessageReservation-StreamWindow > half {
		return true
	}
	return b.used+n+max(all-c.conn.windows, 0) <= half
}

// release gives back what c holds.
func (c *budgetCall) release() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.releaseLocked()
}

func (c *budgetCall) releaseLocked() {
	b := c.b
	if c.held == 0 {
		return
	}
	b.used -= c.held
	c.conn.used -= c.held
	c.conn.windows -= c.held - c.rest
	if !c.stream.Load() {
		c.conn.unaryRests -= c.rest
	}
	c.held, c.rest = 0, 0
	if c.conn.used == 0 && c.conn.peer != nil {
		delete(b.byPeer, c.conn.peer)
	}
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
}

// tap is the server's tap.ServerInHandle: it reserves a new call's stream
// window, or refuses the call. It never waits: gRPC reads the connection's
// frames in the goroutine that runs it.
func (b *MessageBudget) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	p, _ := peer.FromContext(ctx)
	var conn *budgetConn
	if p == nil {
		if conn, _ = ctx.Value(budgetConnKey{}).(*budgetConn); conn == nil {
			return ctx, nil // not a call of a gRPC server
		}
	}
	if b.peers != nil && strings.HasPrefix(info.FullMethodName, "/"+pb.Peer_ServiceDesc.ServiceName+"/") {
		// Before anything is reserved or read: the caller's certificate
		// and proof are in ctx and its metadata already.
		if err := b.peers.authorize(ctx, info.FullMethodName); err != nil {
			b.refused.Add(1)
			return nil, err
		}
	}
	c := &budgetCall{b: b, conn: conn, method: info.FullMethodName}
	c.Context, c.cancel = context.WithCancelCause(ctx)
	if !b.open(c, p) {
		c.cancel(nil)
		b.refused.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted,
			"transport: %s refused: the server's inbound message budget (%d bytes, at most %d per connection while more than half is in use) has no room for another call",
			info.FullMethodName, b.limits.MessageBytes, b.limits.ConnMessageBytes)
	}
	return c, nil
}

// open reserves the stream window of c, a call of the connection of p
// (or of c.conn, when p is nil), and puts c in the calls awaited; it
// reports whether the window fit.
func (b *MessageBudget) open(c *budgetCall, p *peer.Peer) bool {
	b.mu.Lock()
	if p != nil {
		if c.conn = b.byPeer[p]; c.conn == nil {
			c.conn = &budgetConn{peer: p, slot: b.slotOf(p.LocalAddr, p.Addr)}
			b.byPeer[p] = c.conn
		}
	}
	if ok, _ := b.reserveLocked(c, StreamWindow, false); !ok {
		if c.conn.used == 0 && c.conn.peer != nil {
			delete(b.byPeer, c.conn.peer)
		}
		b.mu.Unlock()
		return false
	}
	arm := b.awaitLocked(c)
	b.mu.Unlock()
	if arm {
		b.afterFunc(b.limits.MessageTimeout, b.sweep)
	}
	return true
}

// awaitLocked puts c in the calls awaited, with b.mu held, and reports
// whether a sweep is to be scheduled (none is).
func (b *MessageBudget) awaitLocked(c *budgetCall) (arm bool) {
	c.deadline = b.now().Add(b.limits.MessageTimeout)
	b.awaited.push(c)
	arm = !b.sweeping
	b.sweeping = true
	return arm
}

// sweep times out the awaited calls whose deadline has come: each is
// cancelled, and gives back what it held. It schedules the next sweep
// for the oldest call left, if any.
func (b *MessageBudget) sweep() {
	b.mu.Lock()
	now := b.now()
	var late []*budgetCall
	for c := b.awaited.head; c != nil && !c.deadline.After(now); c = b.awaited.head {
		b.awaited.remove(c)
		late = append(late, c)
	}
	var next time.Duration
	if h := b.awaited.head; h != nil {
		next = h.deadline.Sub(now)
	} else {
		b.sweeping = false
	}
	b.mu.Unlock()
	if next > 0 {
		b.afterFunc(next, b.sweep)
	}
	for _, c := range late {
		if c.first.Load() {
			continue
		}
		b.timedOut.Add(1)
		c.cancel(fmt.Errorf("%w: the first message of %s was not all in within %v", ErrMessageTimeout, c.method, b.limits.MessageTimeout))
		b.mu.Lock()
		c.late = true
		c.releaseLocked()
		b.mu.Unlock()
	}
}

// settle takes c out of the calls awaited, its first message in or the
// call ended, and gives back what it holds when release is set.
func (c *budgetCall) settle(release bool) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.awaited.remove(c)
	if release {
		c.releaseLocked()
	}
}

// begin reserves the rest of c's message before its handler reads it,
// waiting in the call's own goroutine for room until ctx, the call's, ends
// (at its MessageTimeout at the latest). Without room gRPC's read of the
// message fails on the ended context.
func (c *budgetCall) begin(ctx context.Context) {
	b := c.b
	for {
		ok, freed := b.reserve(c, MessageReservation-StreamWindow, true)
		if ok || freed == nil {
			return
		}
		b.waiting.Add(1)
		select {
		case <-freed:
			b.waiting.Add(-1)
		case <-ctx.Done():
			b.waiting.Add(-1)
			return
		}
	}
}

// messageIn follows a message of c in: the first ends its deadline and
// opens the call on its connection's slot; a unary call's gives back what
// the call holds.
func (c *budgetCall) messageIn() {
	if c.conn.slot != nil && c.open.CompareAndSwap(false, true) {
		c.b.callBegan(c.conn.slot)
	}
	unary := !c.stream.Load()
	if c.first.CompareAndSwap(false, true) {
		c.settle(unary)
	} else if unary {
		c.release()
	}
}

// end ends c: it gives back what c holds, and its slot.
func (c *budgetCall) end() {
	if c.conn.slot != nil && c.open.Load() {
		c.b.callEnded(c.conn.slot)
	}
	if c.stream.Load() || !c.first.Load() {
		// A unary call whose message is in holds nothing, and is
		// awaited no more.
		c.settle(true)
	}
	c.cancel(nil)
}

// callOf returns the budget's call of ctx, a call of b's server, or nil.
func (b *MessageBudget) callOf(ctx context.Context) *budgetCall {
	if c, _ := ctx.Value(budgetCallKey{}).(*budgetCall); c != nil && c.b == b {
		return c
	}
	return nil
}

// interceptStream is the server's first stream interceptor: every call
// of a stream method, a unary method served as a stream among them,
// reserves the rest of its message before its handler reads it (begin),
// and ends when its handler returns.
func (b *MessageBudget) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx := ss.Context()
	c := b.callOf(ctx)
	if c == nil {
		return h(srv, ss)
	}
	defer c.end()
	c.stream.Store(info.IsClientStream)
	c.begin(ctx)
	c.recv = budgetStream{ServerStream: ss, c: c}
	return h(srv, &c.recv)
}

// interceptUnary is the server's first unary interceptor, for the unary
// methods it does not serve as streams: gRPC has read the message, which
// is in, and the call ends when its handler returns.
func (b *MessageBudget) interceptUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c := b.callOf(ctx)
	if c == nil {
		return h(ctx, req)
	}
	defer c.end()
	c.messageIn()
	return h(ctx, req)
}

// budgetStream is a call's stream: each message received is in.
type budgetStream struct {
	grpc.ServerStream
	c *budgetCall
}

func (s *budgetStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	s.c.messageIn()
	return nil
}

// The budget is also a stats.Handler, whose events call the hooks above,
// for a server that cannot take its interceptors; its ServerOptions do
// not install it.

// TagConn gives each connection its share, and finds its slot.
func (b *MessageBudget) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	c := &budgetConn{}
	if info != nil {
		c.slot = b.slotOf(info.LocalAddr, info.RemoteAddr)
	}
	return context.WithValue(ctx, budgetConnKey{}, c)
}

// HandleConn does nothing: a connection's calls end before it does.
func (b *MessageBudget) HandleConn(context.Context, stats.ConnStats) {}

// TagRPC does nothing: tap gave the call its context.
func (b *MessageBudget) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC follows the messages of a call that tap reserved for: Begin
// begins it, InPayload tells a message in, End ends it.
func (b *MessageBudget) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.Begin, *stats.InPayload, *stats.End:
	default:
		return // headers, trailers, the messages out
	}
	c := b.callOf(ctx)
	if c == nil {
		return
	}
	switch s := s.(type) {
	case *stats.Begin:
		c.stream.Store(s.IsClientStream)
		c.begin(ctx)
	case *stats.InPayload:
		c.messageIn()
	case *stats.End:
		c.end()
	}
}

var _ stats.Handler = (*MessageBudget)(nil)
