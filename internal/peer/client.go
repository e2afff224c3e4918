package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Errors of this package; test with errors.Is. ErrClosed and ErrUnavailable
// also match transport.ErrUnavailable: either way the owner was not reached.
var (
	// ErrClosed is returned for checks made after Close, and for checks
	// that were waiting or in flight when Close was called (those in
	// flight match ErrInFlight too).
	ErrClosed error = &sentinel{"peer: client closed", transport.ErrUnavailable}
	// ErrUnavailable wraps the error of a batch that failed as a whole: the
	// peer is down, does not answer it before its oldest check has waited
	// Config.Timeout, or its stream broke while the batch was in flight.
	// Every check of the batches concerned, and only those, fail with it;
	// so does a check still waiting to be sent when its own Timeout ends.
	ErrUnavailable error = &sentinel{"peer: peer unavailable", transport.ErrUnavailable}
	// ErrInvalidConfig is returned by Config.Validate and the constructors.
	ErrInvalidConfig = errors.New("peer: invalid config")
	// ErrInFlight is also matched by the error of a check whose batch was
	// sent, or may have been, when it failed (its stream broke, it was not
	// answered in time, or Close ended it): the peer may have decided it.
	// A check whose error does not match it was never sent, so sending it
	// elsewhere cannot count it twice.
	ErrInFlight = errors.New("peer: check in flight")
)

// sentinel is an error with its own text that also matches another error.
type sentinel struct {
	msg  string
	also error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.also }

// inFlightErr is the error of a check that was in flight when its batch
// failed: err, which it reads as, and also ErrInFlight.
type inFlightErr struct{ err error }

func (e *inFlightErr) Error() string   { return e.err.Error() }
func (e *inFlightErr) Unwrap() []error { return []error{e.err, ErrInFlight} }

// Client sends checks to one remote node, the owner of their keys, in
// batches on one long-lived stream. A check goes out at once while fewer
// than Config.MaxInFlight batches are in flight; otherwise it waits with
// the others, and the next batch to be answered lets up to Config.MaxBatch
// of them go. No fixed wait is ever added. A Client is safe for concurrent
// use.
type Client struct {
	name, addr string
	cfg        Config
	clock      Clock            // Config.Clock, or the system's
	now        func() time.Time // clock.Now
	conn       *grpc.ClientConn
	rpc        pb.PeerClient

	ctx    context.Context // parent of every stream; canceled by Close
	cancel context.CancelFunc
	wake   chan struct{} // cap 1: the sender has work
	done   chan struct{} // closed by Close: loops return
	fire   chan struct{} // cap 1: the watchdog's timer fired
	wg     sync.WaitGroup

	mu        sync.Mutex // guards the fields below and the streams' shared fields
	pending   []*item    // checks waiting for a batch, in the order queued
	closed    bool
	idle      chan struct{} // after stopTaking, closed once nothing is in flight
	sendToken sendToken     // see stream.go
	cur       *stream       // where new batches go; nil until opened, and once it fails or drains
	streams   []*stream     // streams that have not failed, cur among them
	draining  []*stream     // streams whose sending side the sender must close
	inFlight  int           // batches sent and not yet answered or failed, on every stream
	seq       uint64        // id of the last batch taken
	timerAt   time.Time     // when the watchdog's timer fires; zero when stopped or fired
	stopTimer func() bool   // stops the watchdog's timer; nil when none was started
	free      []*batch      // batches to reuse

	enc *encoder // the send token's

	tracer trace.Tracer // Config.TracerProvider's; nil when it is nil: no spans

	closeOnce sync.Once
	closeErr  error

	stats counters
}

// item is one check: the request and, once decided, its result. The
// goroutine that delivers it writes res and then sends on done, once.
// Items are pooled; one whose caller gave up is left to the collector.
type item struct {
	req         limiter.Request
	traceparent string // of the call's forwarding span; "" when not traced
	res         transport.Result
	deadline    time.Time     // Config.Timeout after it was queued: it fails then if not answered
	done        chan struct{} // cap 1
	canceled    atomic.Bool   // the caller stopped waiting
}

var itemPool = sync.Pool{New: func() any { return &item{done: make(chan struct{}, 1)} }}

func getItem(req *limiter.Request) *item {
	it := itemPool.Get().(*item)
	it.req = *req
	return it
}

func putItem(it *item) {
	it.req = limiter.Request{}
	it.traceparent = ""
	it.res = transport.Result{}
	itemPool.Put(it)
}

// NewClient returns a client of the node name listening at addr
// ("host:port"). It does not connect until the first check.
func NewClient(name, addr string, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: empty address for peer %q", ErrInvalidConfig, name)
	}
	cfg = cfg.clone()
	opts := append(dialOptions(), cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("peer: client of %q at %s: %w", name, addr, err)
	}
	c := &Client{
		name:  name,
		addr:  addr,
		cfg:   cfg,
		clock: cfg.Clock,
		conn:  conn,
		rpc:   pb.NewPeerClient(conn),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
		fire:  make(chan struct{}, 1),
		enc:   newEncoder(cfg.MaxBatch),
	}
	if c.clock == nil {
		c.clock = clocks.System{}
	}
	c.now = c.clock.Now
	if cfg.TracerProvider != nil {
		c.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.goFunc(c.sender)
	c.goFunc(c.watchdog)
	c.goFunc(c.watchConn)
	return c, nil
}

// dialOptions are the client's defaults, before Config.DialOptions:
// insecure transport; flow-control windows as large as the server's
// (transport.ServerOptions), so that small batches do not cost a window
// update every few messages; and the keepalive that servers built with
// transport.ServerOptions accept.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(transport.WindowSize),
		grpc.WithInitialConnWindowSize(transport.WindowSize),
		grpc.WithKeepaliveParams(transport.PeerKeepalive()),
	}
}

// goFunc runs f in a goroutine that Close waits for.
func (c *Client) goFunc(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// Name returns the remote node's name.
func (c *Client) Name() string { return c.name }

// Addr returns the remote node's address.
func (c *Client) Addr() string { return c.addr }

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := c.stats.snapshot()
	c.mu.Lock()
	s.Pending = len(c.pending)
	s.InFlight = c.inFlight
	c.mu.Unlock()
	return s
}

// Check asks the peer to decide req as its key's owner. It returns the
// owner's decision or: req's validation error (limiter.Request.Validate)
// without sending it; the owner's per-item error, which matches the same
// limiter sentinel; an error wrapping ErrUnavailable when its batch failed,
// which matches ErrInFlight too when the batch may have reached the peer;
// ErrClosed; or ctx.Err() when ctx ends first (the late result, if any, is
// discarded). The check waits at most Config.Timeout from when it is
// queued, whatever ctx allows: then it fails with an error wrapping
// ErrUnavailable whose gRPC status is DeadlineExceeded, sent or not.
func (c *Client) Check(ctx context.Context, req limiter.Request) (limiter.Decision, error) {
	if err := req.Validate(); err != nil {
		return limiter.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return limiter.Decision{}, err
	}
	it := getItem(&req)
	var span trace.Span
	if c.tracer != nil {
		ctx, span, it.traceparent = c.startForward(ctx, 1)
	}
	var r transport.Result
	if c.enqueue(it) {
		r = c.wait(ctx, it)
	} else {
		putItem(it)
		r.Err = ErrClosed
	}
	if span != nil {
		endForward(span, r)
	}
	return r.Decision.Decision, r.Err
}

// CheckMany checks every request as Check does and returns one result per
// request, in order. The requests go out together, in as many batches as
// MaxBatch requires.
func (c *Client) CheckMany(ctx context.Context, reqs []limiter.Request) []transport.Result {
	out := make([]transport.Result, len(reqs))
	if err := ctx.Err(); err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	items := make([]*item, len(reqs))
	valid := make([]*item, 0, len(reqs))
	var (
		span        trace.Span
		traceparent string
	)
	if c.tracer != nil {
		ctx, span, traceparent = c.startForward(ctx, len(reqs))
		defer func() { endForward(span, out...) }()
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			out[i].Err = err
			continue
		}
		items[i] = getItem(&reqs[i])
		items[i].traceparent = traceparent
		valid = append(valid, items[i])
	}
	if !c.enqueue(valid...) {
		for i, it := range items {
			if it != nil {
				putItem(it)
				out[i].Err = ErrClosed
			}
		}
		return out
	}
	for i, it := range items {
		if it != nil {
			out[i] = c.wait(ctx, it)
		}
	}
	return out
}

// enqueue appends its to the pending checks, each with its deadline,
// Config.Timeout from now, and has them sent: at once, by this goroutine,
// when they are few and nothing is in flight on the open stream;
// otherwise by whoever sends next, waking the sender goroutine if no one
// else will. The watchdog fails them if their deadline comes first. It
// reports false, enqueueing nothing, when the client is closed.
func (c *Client) enqueue(its ...*item) bool {
	if len(its) == 0 {
		return true
	}
	// Read before locking, to keep the lock short: the order of pending is
	// then only nearly that of the deadlines, and nothing relies on it.
	now := c.now()
	deadline := now.Add(c.cfg.Timeout)
	for _, it := range its {
		it.deadline = deadline
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	wasEmpty := len(c.pending) == 0
	c.pending = append(c.pending, its...)
	c.armLocked(deadline)
	var b *batch
	s := c.cur
	if wasEmpty && len(its) <= maxInlineChecks && c.inFlight == 0 && c.usableLocked(s) {
		b = c.beginSendLocked(now)
	}
	// Otherwise the holder of the send token, or the end of a batch in
	// flight, looks at the pending checks again.
	wake := b == nil && wasEmpty && c.canSendLocked()
	c.mu.Unlock()
	if b != nil {
		c.sendInline(s, b)
	} else if wake {
		c.wakeSender()
	}
	return true
}

// wakeSender leaves a token for the sender, unless one is waiting already.
func (c *Client) wakeSender() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// wait returns it.res, or ctx.Err() when ctx ends first. it goes back
// to the pool only when its result was received: after that no one else
// touches it.
func (c *Client) wait(ctx context.Context, it *item) transport.Result {
	select {
	case <-it.done:
		r := it.res
		putItem(it)
		return r
	case <-ctx.Done():
		it.canceled.Store(true)
		return transport.Result{Err: ctx.Err()}
	}
}

// stopTaking makes c take no more checks: those made from now on, and
// those waiting to be sent, fail with ErrClosed, unsent. The batches in
// flight go on until they are answered, or fail as their stream breaks
// or their deadline passes. It returns a channel closed once none is in
// flight; Close ends them at once.
func (c *Client) stopTaking() <-chan struct{} {
	c.mu.Lock()
	c.closed = true
	pending := c.pending
	c.pending = nil
	if c.idle == nil {
		c.idle = make(chan struct{})
		if c.inFlight == 0 {
			close(c.idle)
		}
	}
	idle := c.idle
	c.mu.Unlock()
	for _, it := range pending {
		it.res = transport.Result{Err: ErrClosed}
		it.done <- struct{}{}
	}
	return idle
}

// landedLocked counts n batches in flight as answered or failed. c.mu
// must be held.
func (c *Client) landedLocked(n int) {
	c.inFlight -= n
	if c.inFlight == 0 && c.idle != nil {
		select {
		case <-c.idle:
		default:
			close(c.idle)
		}
	}
}

// Close fails every waiting check with ErrClosed, ends the stream (the
// checks in flight fail with ErrClosed too), waits for the client's
// goroutines and closes the connection. Checks made afterwards fail with
// ErrClosed. Safe to call more than once and concurrently; later calls wait
// for the first and return nil.
func (c *Client) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		c.mu.Lock()
		c.closed = true
		pending := c.pending
		c.pending = nil
		c.mu.Unlock()
		for _, it := range pending {
			it.res = transport.Result{Err: ErrClosed}
			it.done <- struct{}{}
		}
		c.cancel()
		close(c.done)
		c.wg.Wait()
		c.mu.Lock()
		if c.stopTimer != nil {
			c.stopTimer()
		}
		c.mu.Unlock()
		c.closeErr = c.conn.Close()
	})
	if !first {
		return nil
	}
	return c.closeErr
}
