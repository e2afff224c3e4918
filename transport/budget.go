package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// The message budget. gRPC buffers the DATA frames of a message until the
// whole message is in, and it grows a stream's flow-control window to fit
// the message being read: a client that sends most of a large message on
// each of many streams and stops makes the server hold those bytes for as
// long as the streams stay open. So every call reserves, as it opens
// (tap.ServerInHandle), the most bytes its first message may take
// (MessageReservation), from a budget shared by all connections
// (ServerLimits.MessageBytes); a call that finds no room is refused with
// ResourceExhausted before anything is read. A unary call gives its
// reservation back once its message is in (stats InPayload); a stream
// (the Peer service's CheckStream) keeps it until it ends, for the
// messages that follow. A call whose first message is not all in within
// ServerLimits.MessageTimeout is cancelled, its stream reset, and its
// bytes freed. While more than half the budget is in use, one connection
// may hold at most ServerLimits.ConnMessageBytes of it, its further calls
// refused, so that a few connections cannot take it all from the others.
// Nothing waits for room: gRPC reads a connection's frames in the
// goroutine that runs the tap, and a connection whose reads stopped could
// neither finish the messages that would free room nor be seen to close.

// MessageReservation is what one call reserves of the message budget:
// the largest message and its 5-byte gRPC prefix.
const MessageReservation = MaxMessageSize + 5

// MessageBudget holds the reservations of the calls of one gRPC server;
// NewMessageBudget makes one, and its ServerOptions install it on a
// server. Its methods are safe for concurrent use.
type MessageBudget struct {
	limits ServerLimits
	// afterFunc runs f after d, as time.AfterFunc does; tests replace it.
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	mu   sync.Mutex // guards used
	used int64      // bytes reserved by every connection

	refused  atomic.Int64
	timedOut atomic.Int64
}

// MessageBudgetStats are a MessageBudget's counters.
type MessageBudgetStats struct {
	// Reserved is the bytes reserved now by calls whose messages are
	// not all in.
	Reserved int64
	// Refused counts calls refused with ResourceExhausted for want of
	// room.
	Refused int64
	// TimedOut counts calls cancelled because their first message was
	// not all in within ServerLimits.MessageTimeout.
	TimedOut int64
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
	}}
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
	return MessageBudgetStats{Reserved: used, Refused: b.refused.Load(), TimedOut: b.timedOut.Load()}
}

// budgetConn is the share of one connection.
type budgetConn struct {
	used int64 // guarded by MessageBudget.mu
}

// budgetCall is the reservation of one call.
type budgetCall struct {
	b      *MessageBudget
	conn   *budgetConn
	cancel context.CancelCauseFunc
	stream atomic.Bool // a client stream: keeps its reservation until it ends
	first  atomic.Bool // its first message is in
	held   atomic.Bool // its reservation is held
	stop   func() bool // stops the timer of its first message
}

type budgetConnKey struct{}
type budgetCallKey struct{}

// reserve takes n bytes for conn, or reports that there is no room: the
// budget is full, or more than half of it is in use and conn holds its
// share.
func (b *MessageBudget) reserve(conn *budgetConn, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.limits.MessageBytes
	switch {
	case b.used+n > total:
		return false
	case b.used+n > total/2 && conn.used+n > b.limits.ConnMessageBytes:
		return false
	}
	b.used += n
	conn.used += n
	return true
}

// release gives back the reservation of c, once.
func (c *budgetCall) release() {
	if !c.held.CompareAndSwap(true, false) {
		return
	}
	b := c.b
	b.mu.Lock()
	b.used -= MessageReservation
	c.conn.used -= MessageReservation
	b.mu.Unlock()
}

// tap is the server's tap.ServerInHandle: it reserves for a new call, or
// refuses it. It never waits: gRPC reads the connection's frames in the
// goroutine that runs it.
func (b *MessageBudget) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	conn, _ := ctx.Value(budgetConnKey{}).(*budgetConn)
	if conn == nil { // a server without b's stats handler: no budget
		return ctx, nil
	}
	if !b.reserve(conn, MessageReservation) {
		b.refused.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted,
			"transport: %s refused: the server's inbound message budget (%d bytes, at most %d per connection while more than half is in use) has no room for another message",
			info.FullMethodName, b.limits.MessageBytes, b.limits.ConnMessageBytes)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c := &budgetCall{b: b, conn: conn, cancel: cancel}
	c.held.Store(true)
	c.stop = b.afterFunc(b.limits.MessageTimeout, func() {
		if c.first.Load() {
			return
		}
		b.timedOut.Add(1)
		cancel(fmt.Errorf("%w: the first message of %s was not all in within %v", ErrMessageTimeout, info.FullMethodName, b.limits.MessageTimeout))
		c.release()
	})
	return context.WithValue(ctx, budgetCallKey{}, c), nil
}

// TagConn gives each connection its share.
func (b *MessageBudget) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, budgetConnKey{}, &budgetConn{})
}

// HandleConn does nothing: a connection's calls end before it does.
func (b *MessageBudget) HandleConn(context.Context, stats.ConnStats) {}

// TagRPC keeps ctx.
func (b *MessageBudget) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC follows the messages of a call that tap reserved for.
func (b *MessageBudget) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, _ := ctx.Value(budgetCallKey{}).(*budgetCall)
	if c == nil {
		return
	}
	switch s := s.(type) {
	case *stats.Begin:
		c.stream.Store(s.IsClientStream)
	case *stats.InPayload:
		if c.first.CompareAndSwap(false, true) {
			c.stop()
		}
		if !c.stream.Load() {
			c.release()
		}
	case *stats.End:
		c.stop()
		c.release()
		c.cancel(nil)
	}
}

var _ stats.Handler = (*MessageBudget)(nil)
