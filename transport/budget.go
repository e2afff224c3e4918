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
// (streamReservation), from a budget shared by all connections
// (ServerLimits.MessageBytes); a call that finds no room is refused with
// ResourceExhausted before anything is read. A unary call gives its
// reservation back once its message is in (stats InPayload); a stream
// (the Peer service's CheckStream) keeps it until it ends, for the
// messages that follow. A call whose first message is not all in within
// ServerLimits.MessageTimeout is cancelled, its stream reset, and its
// bytes freed. While more than half the budget is in use, one connection
// may hold at most ServerLimits.ConnMessageBytes of it, so that a few
// connections cannot take it all from the others.

// MessageReservation is what one call reserves of the message budget:
// the largest message and its 5-byte gRPC prefix.
const MessageReservation = MaxMessageSize + 5

const streamReservation = MessageReservation

// MessageBudget holds the reservations of the calls of one gRPC server;
// NewMessageBudget makes one, and its ServerOptions install it on a
// server. Its methods are safe for concurrent use.
type MessageBudget struct {
	limits ServerLimits
	// afterFunc runs f after d, as time.AfterFunc does; tests replace it.
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	mu    sync.Mutex    // guards used and freed
	used  int64         // bytes reserved by every connection
	freed chan struct{} // closed at the next release; nil when no one waits

	refused  atomic.Int64
	timedOut atomic.Int64
	waiting  atomic.Int64
}

// MessageBudgetStats are a MessageBudget's counters.
type MessageBudgetStats struct {
	// Reserved is the bytes reserved now by calls whose messages are
	// not all in.
	Reserved int64
	// Waiting is the calls waiting for room, each on a connection over
	// its share whose own calls must give theirs back first.
	Waiting int64
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
	return MessageBudgetStats{Reserved: used, Waiting: b.waiting.Load(), Refused: b.refused.Load(), TimedOut: b.timedOut.Load()}
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

// reserve takes n bytes for conn. When there is no room it returns
// false, and a channel closed at the next release when conn itself holds
// more than its share (it may wait for its own calls), or nil when the
// others fill the budget (the call is refused).
func (b *MessageBudget) reserve(conn *budgetConn, n int64) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.limits.MessageBytes
	overShare := conn.used+n > b.limits.ConnMessageBytes
	switch {
	case b.used+n > total/2 && overShare:
		return false, b.freedLocked()
	case b.used+n > total:
		return false, nil
	}
	b.used += n
	conn.used += n
	return true, nil
}

// freedLocked returns the channel that the next release closes.
// MessageBudget.mu must be held.
func (b *MessageBudget) freedLocked() <-chan struct{} {
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	return b.freed
}

// release gives back the reservation of c, once.
func (c *budgetCall) release() {
	if !c.held.CompareAndSwap(true, false) {
		return
	}
	b := c.b
	b.mu.Lock()
	b.used -= streamReservation
	c.conn.used -= streamReservation
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// tap is the server's tap.ServerInHandle: it reserves for a new call, or
// refuses it. A connection over its share waits, up to MessageTimeout,
// for its own calls to give theirs back: gRPC reads none of its frames
// meanwhile, and the calls whose messages are in go on.
func (b *MessageBudget) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	conn, _ := ctx.Value(budgetConnKey{}).(*budgetConn)
	if conn == nil { // a server without b's stats handler: no budget
		return ctx, nil
	}
	var expired chan struct{}
	for {
		ok, freed := b.reserve(conn, streamReservation)
		if ok {
			break
		}
		if freed != nil && expired == nil {
			expired = make(chan struct{})
			defer b.afterFunc(b.limits.MessageTimeout, func() { close(expired) })()
		}
		if freed != nil {
			b.waiting.Add(1)
			select {
			case <-freed:
				b.waiting.Add(-1)
				continue
			case <-expired:
			case <-ctx.Done():
			}
			b.waiting.Add(-1)
		}
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
