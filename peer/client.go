package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Errors of this package; test with errors.Is. ErrClosed and ErrUnavailable
// also match transport.ErrUnavailable: either way the owner was not reached.
var (
	// ErrClosed is returned for checks made after Close, and for checks
	// that were waiting or in flight when Close was called.
	ErrClosed error = &sentinel{"peer: client closed", transport.ErrUnavailable}
	// ErrUnavailable wraps the error of a call that failed as a whole (the
	// peer is down, does not answer within Config.Timeout, refuses the
	// batch); every check of that call, and only those, fail with it.
	ErrUnavailable error = &sentinel{"peer: peer unavailable", transport.ErrUnavailable}
	// ErrInvalidConfig is returned by Config.Validate and the constructors.
	ErrInvalidConfig = errors.New("peer: invalid config")
)

// sentinel is an error with its own text that also matches another error.
type sentinel struct {
	msg  string
	also error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.also }

// Client sends checks to one remote node, the owner of their keys, in
// batches. A check goes out at once while fewer than Config.MaxInFlight
// calls are in flight; otherwise it waits with the others, and the next
// call to finish takes up to Config.MaxBatch of them. No fixed wait is ever
// added. A Client is safe for concurrent use.
type Client struct {
	name, addr string
	cfg        Config
	conn       *grpc.ClientConn
	rpc        pb.PeerClient

	ctx    context.Context // parent of every call; canceled by Close
	cancel context.CancelFunc
	wake   chan struct{} // a token per wake-up of an idle worker; cap MaxInFlight
	done   chan struct{} // closed by Close: workers return
	wg     sync.WaitGroup

	mu      sync.Mutex // guards pending and closed
	pending []*item    // checks waiting for a call, oldest first
	closed  bool

	closeOnce sync.Once
	closeErr  error

	stats counters
}

// item is one check: the request and, once decided, its result. The
// worker that sends it or Close writes res and then sends on done, once.
// Items are pooled; one whose caller gave up is left to the collector.
type item struct {
	req      limiter.Request
	res      transport.Result
	done     chan struct{} // cap 1
	canceled atomic.Bool   // the caller stopped waiting
}

var itemPool = sync.Pool{New: func() any { return &item{done: make(chan struct{}, 1)} }}

func getItem(req *limiter.Request) *item {
	it := itemPool.Get().(*item)
	it.req = *req
	return it
}

func putItem(it *item) {
	it.req = limiter.Request{}
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
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("peer: client of %q at %s: %w", name, addr, err)
	}
	c := &Client{
		name: name,
		addr: addr,
		cfg:  cfg,
		conn: conn,
		rpc:  pb.NewPeerClient(conn),
		wake: make(chan struct{}, cfg.MaxInFlight),
		done: make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for range cfg.MaxInFlight {
		c.goFunc(c.worker)
	}
	return c, nil
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
	c.mu.Unlock()
	return s
}

// Check asks the peer to decide req as its key's owner. It returns the
// owner's decision or: req's validation error (transport.ValidateRequest)
// without sending it; the owner's per-item error, which matches the same
// limiter sentinel; an error wrapping ErrUnavailable when the call failed;
// ErrClosed; or ctx.Err() when ctx ends first (the late result, if any, is
// discarded). ctx bounds only the wait: every call has Config.Timeout.
func (c *Client) Check(ctx context.Context, req limiter.Request) (limiter.Decision, error) {
	if err := transport.ValidateRequest(&req); err != nil {
		return limiter.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return limiter.Decision{}, err
	}
	it := getItem(&req)
	if !c.enqueue(it) {
		putItem(it)
		return limiter.Decision{}, ErrClosed
	}
	r := c.wait(ctx, it)
	return r.Decision, r.Err
}

// CheckMany checks every request as Check does and returns one result per
// request, in order. The requests go out together, in as many calls as
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
	for i := range reqs {
		if err := transport.ValidateRequest(&reqs[i]); err != nil {
			out[i].Err = err
			continue
		}
		items[i] = getItem(&reqs[i])
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

// enqueue appends its to the pending checks and wakes idle workers. It
// reports false, enqueueing nothing, when the client is closed.
func (c *Client) enqueue(its ...*item) bool {
	if len(its) == 0 {
		return true
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.pending = append(c.pending, its...)
	c.mu.Unlock()
	c.wakeWorkers((len(its) + c.cfg.MaxBatch - 1) / c.cfg.MaxBatch)
	return true
}

// wakeWorkers leaves up to n tokens for idle workers. When the channel is
// full, tokens are already waiting, and the worker that takes one will find
// the new checks.
func (c *Client) wakeWorkers(n int) {
	for range n {
		select {
		case c.wake <- struct{}{}:
		default:
			return
		}
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

// batch is a worker's reusable buffers.
type batch struct {
	items []*item
	msgs  []pb.RateLimitRequest
	ptrs  []*pb.RateLimitRequest
	req   pb.PeerCheckRequest
}

// worker sends batches until Close. Each worker has at most one call in
// flight, so MaxInFlight workers bound the calls.
func (c *Client) worker() {
	b := &batch{
		items: make([]*item, 0, c.cfg.MaxBatch),
		msgs:  make([]pb.RateLimitRequest, c.cfg.MaxBatch),
		ptrs:  make([]*pb.RateLimitRequest, c.cfg.MaxBatch),
	}
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		for c.take(b) {
			c.send(b)
		}
	}
}

// take moves up to MaxBatch pending checks into b, dropping those whose
// caller gave up. It reports whether b has any; false when closed.
func (c *Client) take(b *batch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	b.items = b.items[:0]
	n := 0
	for n < len(c.pending) && len(b.items) < c.cfg.MaxBatch {
		it := c.pending[n]
		n++
		if it.canceled.Load() {
			c.stats.canceled.Add(1)
			continue
		}
		b.items = append(b.items, it)
	}
	rest := copy(c.pending, c.pending[n:])
	clear(c.pending[rest:])
	c.pending = c.pending[:rest]
	if rest > 0 {
		c.wakeWorkers(1) // an idle worker may send the rest now
	}
	return len(b.items) > 0
}

// send makes one call for the checks in b and delivers their results.
func (c *Client) send(b *batch) {
	n := len(b.items)
	for i, it := range b.items {
		transport.EncodeRequest(&b.msgs[i], &it.req)
		b.ptrs[i] = &b.msgs[i]
	}
	b.req.From = c.cfg.Self
	b.req.Items = b.ptrs[:n]

	c.stats.recordCall(n)
	c.stats.inFlight.Add(1)
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
	resp, err := c.rpc.CheckBatch(ctx, &b.req)
	cancel()
	c.stats.inFlight.Add(-1)

	var fail error
	switch {
	case err != nil && c.ctx.Err() != nil:
		fail = ErrClosed
	case err != nil:
		fail = fmt.Errorf("%w: %s at %s: %w", ErrUnavailable, c.name, c.addr, err)
	case len(resp.GetItems()) != n:
		fail = fmt.Errorf("%w: %d responses for %d checks from %s at %s", transport.ErrMalformedResponse, len(resp.GetItems()), n, c.name, c.addr)
	}
	if fail != nil {
		c.stats.failed.Add(1)
	}
	for i, it := range b.items {
		if fail != nil {
			it.res = transport.Result{Err: fail}
		} else {
			it.res = transport.ResultFromProto(resp.Items[i])
		}
		it.done <- struct{}{}
		// Keep no references to the callers' requests.
		b.items[i] = nil
		b.msgs[i].Name, b.msgs[i].Key = "", ""
		b.ptrs[i] = nil
	}
	b.req.Items = nil
}

// Close fails every waiting check with ErrClosed, cancels the calls in
// flight (their checks fail with ErrClosed too), waits for the client's
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
		c.closeErr = c.conn.Close()
	})
	if !first {
		return nil
	}
	return c.closeErr
}
