package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Errors of this package; test with errors.Is. Per-request errors wrap the
// limiter's sentinels instead (see the package comment).
var (
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("client: closed")
	// ErrNilContext is returned for a call made with a nil context.
	ErrNilContext = transport.ErrNilContext
	// ErrInvalidOption is returned by New for an invalid option.
	ErrInvalidOption = errors.New("client: invalid option")
	// ErrInvalidArgument is a request the daemon could not be sent: an
	// unknown unreachable policy.
	ErrInvalidArgument = transport.ErrInvalidArgument
	// ErrMalformedResponse is an answer that breaks the protocol, such as
	// a batch answer with the wrong number of items.
	ErrMalformedResponse = transport.ErrMalformedResponse
	// ErrUnavailable is a key's owner that the daemon could not reach: Reset
	// returns it when nothing was reset.
	ErrUnavailable = transport.ErrUnavailable
	// ErrNotGRPC is an address that answered, but not as a gRPC server:
	// an HTTP/1 server, such as a sluice daemon's HTTP API (http_addr),
	// where its gRPC port (grpc_addr) was meant. The error says which.
	ErrNotGRPC = errors.New("client: the address does not speak gRPC")
)

// DefaultTimeout is the deadline of a call whose context has none, unless
// WithTimeout changes it.
const DefaultTimeout = 2 * time.Second

// MaxBatchItems, 1000, is the most requests one gRPC call carries; CheckMany
// splits longer lists.
const MaxBatchItems = transport.MaxBatchItems

// Health is a node's answer to a health check.
type Health struct {
	// Status is "serving" when the node answers checks.
	Status string
	// Members is how many cluster members the node routes to, itself
	// included.
	Members int
	// Node is the node's name.
	Node string
}

// Serving reports whether the node answers checks.
func (h Health) Serving() bool { return h.Status == "serving" }

// Option configures New.
type Option func(*options)

type options struct {
	timeout time.Duration
	policy  sluice.Policy
	tls     *tls.Config
	dial    []grpc.DialOption
}

// WithTimeout sets the deadline of calls whose context has none; default
// DefaultTimeout. It must be positive.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithPolicy sets the policy of every check that sets none with
// sluice.OnUnreachable; default sluice.PolicyDefault, the daemon's own.
func WithPolicy(p sluice.Policy) Option { return func(o *options) { o.policy = p } }

// WithTLS dials with TLS configured by cfg instead of an insecure
// connection.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithDialOptions adds gRPC dial options after the client's own, which they
// override (transport credentials included).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// Client calls one sluice daemon. It is safe for concurrent use.
type Client struct {
	addr    string // as given to New
	conn    *grpc.ClientConn
	rpc     pb.SluiceClient
	timeout time.Duration
	policy  sluice.Policy
	closed  atomic.Bool
}

var _ sluice.Limiter = (*Client)(nil)

// New returns a client of the daemon at addr (host:port of its gRPC
// address, or any gRPC target). It does not connect: the first call does.
func New(addr string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout}
	for _, f := range opts {
		f(&o)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("%w: timeout %v must be positive", ErrInvalidOption, o.timeout)
	}
	if err := checkPolicy(o.policy); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	for i, d := range o.dial {
		if d == nil {
			return nil, fmt.Errorf("%w: dial option %d is nil", ErrInvalidOption, i)
		}
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(transport.MaxMessageSize)),
	}, o.dial...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{addr: addr, conn: conn, rpc: pb.NewSluiceClient(conn), timeout: o.timeout, policy: o.policy}, nil
}

func checkPolicy(p sluice.Policy) error {
	if !p.Valid() {
		return fmt.Errorf("%w: %w: %v", ErrInvalidArgument, sluice.ErrInvalidPolicy, p)
	}
	return nil
}

// Close closes the connection. Calls made after it return ErrClosed. Safe
// to call more than once.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}

// Check asks the daemon to decide req. A request that cannot be valid
// returns its error without a call; see the package comment for the rest.
func (c *Client) Check(ctx context.Context, req limiter.Request, opts ...sluice.CheckOption) (sluice.Decision, error) {
	policy, err := c.callPolicy(opts)
	if err != nil {
		return sluice.Decision{}, err
	}
	if err := req.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	if c.closed.Load() {
		return sluice.Decision{}, ErrClosed
	}
	if ctx == nil {
		return sluice.Decision{}, ErrNilContext
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	m := transport.RequestToProto(req)
	m.UnreachablePolicy = transport.PolicyToProto(policy)
	resp, err := c.rpc.Check(ctx, &pb.CheckRequest{Request: m})
	if err != nil {
		return sluice.Decision{}, c.callError(ctx, "check", err)
	}
	r := transport.ResultFromProto(resp.GetResponse())
	if r.Err != nil {
		return sluice.Decision{}, r.Err
	}
	return r.Decision, nil
}

// CheckMany asks the daemon to decide every request, in order, and returns
// one Result each. Requests that cannot be valid get their error without
// being sent. More than MaxBatchItems requests are sent in several calls,
// one after the other. When a call fails as a whole, the requests of that
// call and of the calls not yet made carry its error as their Err; the
// requests of earlier calls were decided.
func (c *Client) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	out := make([]sluice.Result, len(reqs))
	policy, err := c.callPolicy(opts)
	switch {
	case err != nil:
	case c.closed.Load():
		err = ErrClosed
	case ctx == nil:
		err = ErrNilContext
	}
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	wire := transport.PolicyToProto(policy)
	var (
		batch = make([]*pb.RateLimitRequest, 0, min(len(reqs), MaxBatchItems))
		idx   = make([]int, 0, cap(batch)) // batch[j] is reqs[idx[j]]
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		resp, err := c.rpc.CheckBatch(ctx, &pb.BatchCheckRequest{Requests: batch})
		if err == nil && len(resp.GetResponses()) != len(batch) {
			err = fmt.Errorf("%w: %d answers to %d requests", ErrMalformedResponse, len(resp.GetResponses()), len(batch))
		}
		if err != nil {
			return c.callError(ctx, "check batch", err)
		}
		for j, m := range resp.GetResponses() {
			out[idx[j]] = transport.ResultFromProto(m)
		}
		batch, idx = batch[:0], idx[:0]
		return nil
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			out[i].Err = err
			continue
		}
		m := transport.RequestToProto(reqs[i])
		m.UnreachablePolicy = wire
		batch = append(batch, m)
		idx = append(idx, i)
		if len(batch) < MaxBatchItems {
			continue
		}
		if err := flush(); err != nil {
			failFrom(out, reqs, idx[0], err)
			return out
		}
	}
	if err := flush(); err != nil {
		failFrom(out, reqs, idx[0], err)
		return out
	}
	return out
}

// failFrom sets err on every result from index from on that has no error
// of its own.
func failFrom(out []sluice.Result, reqs []limiter.Request, from int, err error) {
	for i := from; i < len(out); i++ {
		if out[i].Err == nil && reqs[i].Validate() == nil {
			out[i] = sluice.Result{Err: err}
		}
	}
}

// Health asks the daemon for its state.
func (c *Client) Health(ctx context.Context) (Health, error) {
	if c.closed.Load() {
		return Health{}, ErrClosed
	}
	if ctx == nil {
		return Health{}, ErrNilContext
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	resp, err := c.rpc.Health(ctx, &pb.HealthRequest{})
	if err != nil {
		return Health{}, c.callError(ctx, "health", err)
	}
	return Health{Status: resp.GetStatus(), Members: int(resp.GetMembers()), Node: resp.GetNode()}, nil
}

// Inspect asks the daemon for the state of (name, key) as the key's owner
// holds it, with the owner and the nodes that hold copies. Reading it
// changes nothing. A daemon may keep it to some callers: its refusal
// carries gRPC's PermissionDenied.
func (c *Client) Inspect(ctx context.Context, name, key string) (sluice.Inspection, error) {
	if err := limiter.ValidateKey(name, key); err != nil {
		return sluice.Inspection{}, err
	}
	if c.closed.Load() {
		return sluice.Inspection{}, ErrClosed
	}
	if ctx == nil {
		return sluice.Inspection{}, ErrNilContext
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	resp, err := c.rpc.Inspect(ctx, &pb.InspectRequest{Name: name, Key: key})
	if err != nil {
		return sluice.Inspection{}, c.callError(ctx, "inspect", err)
	}
	return transport.InspectionFromProto(resp, name, key)
}

// Reset asks the daemon to reset (name, key) to fresh on its owner, with
// limiter.ResetRequest, and returns the owner's name. A reset is a
// destructive behavior, which a daemon may refuse (PermissionDenied). When
// the owner cannot be reached nothing is reset and the error wraps
// ErrUnavailable.
func (c *Client) Reset(ctx context.Context, name, key string) (string, error) {
	d, err := c.Check(ctx, limiter.ResetRequest(name, key), sluice.OnUnreachable(sluice.PolicyDeny))
	if err != nil {
		return "", err
	}
	if d.WithoutOwner {
		return "", fmt.Errorf("client: reset: %w: nothing was reset", ErrUnavailable)
	}
	return d.Owner, nil
}

func (c *Client) callPolicy(opts []sluice.CheckOption) (sluice.Policy, error) {
	p := sluice.Options(opts).Unreachable
	if p == sluice.PolicyDefault {
		p = c.policy
	}
	if err := checkPolicy(p); err != nil {
		return 0, fmt.Errorf("client: %w", err)
	}
	return p, nil
}

// withTimeout returns ctx with the client's timeout when it has no
// deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// callError wraps the error of a failed call with ErrClosed, if the
// client was closed meanwhile, or the context's error, if it ended. A
// DeadlineExceeded status wraps context.DeadlineExceeded even when the
// server noticed the deadline a moment before the client did.
func (c *Client) callError(ctx context.Context, op string, err error) error {
	cerr := ctx.Err()
	if cerr == nil && status.Code(err) == codes.DeadlineExceeded {
		cerr = context.DeadlineExceeded
	}
	switch {
	case c.closed.Load():
		return fmt.Errorf("client: %s: %w: %w", op, ErrClosed, err)
	case answeredHTTP1(err):
		return fmt.Errorf("client: %s: %w: %s answered as an HTTP/1 server: this looks like a sluice daemon's HTTP port (http_addr); its gRPC API is on grpc_addr (default port 7947): %w",
			op, ErrNotGRPC, c.addr, err)
	case cerr != nil:
		return fmt.Errorf("client: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("client: %s: %w", op, err)
}

// answeredHTTP1 reports whether err is gRPC's failure to read an HTTP/2
// server preface from a server that answered in HTTP/1: "HTTP/1.1 400"
// read as a frame header is a frame far too large.
func answeredHTTP1(err error) bool {
	if status.Code(err) != codes.Unavailable {
		return false
	}
	msg := status.Convert(err).Message()
	return strings.Contains(msg, "server preface") &&
		(strings.Contains(msg, "looked like an HTTP/1.1 header") || strings.Contains(msg, "frame too large"))
}
