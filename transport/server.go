package transport

import (
	"context"
	"fmt"
	"math"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Limits on messages.
const (
	// MaxBatchItems is the most items one batch may carry, on either
	// service. A larger batch fails as a whole with InvalidArgument.
	MaxBatchItems = 1000
	// MaxMessageSize is the largest message a server accepts, in bytes: a
	// full batch of the largest valid items takes about 1.3 MiB.
	MaxMessageSize = 2 << 20
)

// Result is the outcome of one request in a batch: a Decision, or Err.
type Result struct {
	Decision limiter.Decision
	// Owner is the name of the node that decided.
	Owner string
	// WithoutOwner is true when the owner could not be reached and the
	// request was decided under its UnreachablePolicy.
	WithoutOwner bool
	// Err is the request's own error; the Decision is then meaningless.
	// Errors that wrap a limiter sentinel keep it across the wire.
	Err error
}

// Checker decides a batch of requests as the owner of their keys. It
// returns one Result per request, in order; a request's failure is its
// Result's Err, never the batch's. The requests have been validated.
// CheckMany must not keep reqs after it returns. Safe for concurrent use.
type Checker interface {
	CheckMany(ctx context.Context, reqs []limiter.Request) []Result
}

// RoutedRequest is a request from an API client with the policy for when
// its key's owner cannot be reached.
type RoutedRequest struct {
	Request limiter.Request
	Policy  UnreachablePolicy
}

// Router decides requests from API clients: each by its key's owner,
// forwarded there when that is another node, or under its Policy when the
// owner cannot be reached. It returns one Result per request, in order,
// with the same contract as Checker. Safe for concurrent use.
type Router interface {
	Route(ctx context.Context, reqs []RoutedRequest) []Result
}

// HealthReport is a node's answer to a health check.
type HealthReport struct {
	// Status is "serving" when the node answers checks; anything else
	// ("starting", "leaving") means it does not.
	Status string
	// Members is how many cluster members the node knows, itself included.
	Members int
	// Node is the node's name.
	Node string
}

// Health reports a node's health. Safe for concurrent use; it should not
// block.
type Health interface {
	Health(ctx context.Context) HealthReport
}

// ServerOption configures RegisterPeer and RegisterPublic.
type ServerOption func(*serverConfig)

type serverConfig struct {
	codec    *Codec
	maxItems int
}

// WithCodec makes the server convert requests with c, sharing its zone
// cache with other users of c. By default each server has its own.
func WithCodec(c *Codec) ServerOption { return func(s *serverConfig) { s.codec = c } }

// WithMaxBatchItems lowers the most items a batch may carry; n in
// [1, MaxBatchItems], other values are ignored.
func WithMaxBatchItems(n int) ServerOption {
	return func(s *serverConfig) {
		if n >= 1 && n <= MaxBatchItems {
			s.maxItems = n
		}
	}
}

func newServerConfig(opts []ServerOption) serverConfig {
	cfg := serverConfig{maxItems: MaxBatchItems}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.codec == nil {
		cfg.codec = new(Codec)
	}
	return cfg
}

// ServerOptions returns the options a grpc.Server serving sluice should
// have: the largest message it receives bounded to MaxMessageSize.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageSize)}
}

// RegisterPeer registers the Peer service on s. Every item of a batch is
// converted with Codec.RequestFromProto; those that fail get their error in
// their own response, and the rest are decided by local as their owner.
// A batch of more than MaxBatchItems fails with InvalidArgument.
// local receives a context whose caller PeerFromContext names. It panics
// if local is nil.
func RegisterPeer(s *grpc.Server, local Checker, opts ...ServerOption) {
	if local == nil {
		panic("transport: RegisterPeer with a nil Checker")
	}
	pb.RegisterPeerServer(s, &peerServer{cfg: newServerConfig(opts), local: local})
}

// RegisterPublic registers the Sluice service on s: checks are decided by
// routed, Health answers from health (Unimplemented when health is nil).
// Validation and limits are as for RegisterPeer; an item's
// unreachable_policy is read with PolicyFromProto. It panics if routed is
// nil.
func RegisterPublic(s *grpc.Server, routed Router, health Health, opts ...ServerOption) {
	if routed == nil {
		panic("transport: RegisterPublic with a nil Router")
	}
	pb.RegisterSluiceServer(s, &publicServer{cfg: newServerConfig(opts), routed: routed, health: health})
}

type peerKey struct{}

// PeerFromContext returns the name the calling node gave in its
// PeerCheckRequest, within a Checker called by the Peer service.
func PeerFromContext(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(peerKey{}).(string)
	return s, ok
}

type peerServer struct {
	pb.UnimplementedPeerServer
	cfg   serverConfig
	local Checker
}

func (p *peerServer) CheckBatch(ctx context.Context, in *pb.PeerCheckRequest) (*pb.PeerCheckResponse, error) {
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil PeerCheckRequest")
	}
	if err := checkCount(len(in.Items), p.cfg.maxItems); err != nil {
		return nil, err
	}
	out := newResponses(len(in.Items))
	reqs := make([]limiter.Request, 0, len(in.Items))
	idx := make([]int, 0, len(in.Items)) // reqs[j] is in.Items[idx[j]]
	for i, m := range in.Items {
		r, err := p.cfg.codec.RequestFromProto(m)
		if err != nil {
			EncodeResult(out[i], &Result{Err: err})
			continue
		}
		reqs = append(reqs, r)
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		res := p.local.CheckMany(context.WithValue(ctx, peerKey{}, in.From), reqs)
		encodeResults(out, idx, res)
	}
	return &pb.PeerCheckResponse{Items: out}, nil
}

type publicServer struct {
	pb.UnimplementedSluiceServer
	cfg    serverConfig
	routed Router
	health Health
}

func (p *publicServer) Check(ctx context.Context, in *pb.CheckRequest) (*pb.CheckResponse, error) {
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil CheckRequest")
	}
	out := p.route(ctx, []*pb.RateLimitRequest{in.Request})
	return &pb.CheckResponse{Response: out[0]}, nil
}

func (p *publicServer) CheckBatch(ctx context.Context, in *pb.BatchCheckRequest) (*pb.BatchCheckResponse, error) {
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil BatchCheckRequest")
	}
	if err := checkCount(len(in.Requests), p.cfg.maxItems); err != nil {
		return nil, err
	}
	return &pb.BatchCheckResponse{Responses: p.route(ctx, in.Requests)}, nil
}

// route converts items, routes the valid ones and returns one response
// per item.
func (p *publicServer) route(ctx context.Context, items []*pb.RateLimitRequest) []*pb.RateLimitResponse {
	out := newResponses(len(items))
	reqs := make([]RoutedRequest, 0, len(items))
	idx := make([]int, 0, len(items))
	for i, m := range items {
		r, err := p.cfg.codec.RequestFromProto(m)
		var pol UnreachablePolicy
		if err == nil {
			pol, err = PolicyFromProto(m.UnreachablePolicy)
		}
		if err != nil {
			EncodeResult(out[i], &Result{Err: err})
			continue
		}
		reqs = append(reqs, RoutedRequest{Request: r, Policy: pol})
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		encodeResults(out, idx, p.routed.Route(ctx, reqs))
	}
	return out
}

func (p *publicServer) Health(ctx context.Context, in *pb.HealthRequest) (*pb.HealthResponse, error) {
	if p.health == nil {
		return nil, status.Error(codes.Unimplemented, "transport: health is not served")
	}
	h := p.health.Health(ctx)
	return &pb.HealthResponse{
		Status:  cleanText(h.Status, math.MaxInt),
		Members: int32(min(max(h.Members, 0), math.MaxInt32)),
		Node:    cleanText(h.Node, math.MaxInt),
	}, nil
}

// checkCount fails a batch of n items when n is more than max.
func checkCount(n, max int) error {
	if n > max {
		return status.Errorf(codes.InvalidArgument, "transport: batch of %d items is more than the maximum %d", n, max)
	}
	return nil
}

// newResponses returns n responses allocated together.
func newResponses(n int) []*pb.RateLimitResponse {
	slab := make([]pb.RateLimitResponse, n)
	out := make([]*pb.RateLimitResponse, n)
	for i := range out {
		out[i] = &slab[i]
	}
	return out
}

// encodeResults writes res[j] to out[idx[j]]. A Checker that breaks its
// contract by returning too few results leaves the rest failed with
// ErrInternal rather than undecided.
func encodeResults(out []*pb.RateLimitResponse, idx []int, res []Result) {
	for j, i := range idx {
		if j < len(res) {
			EncodeResult(out[i], &res[j])
			continue
		}
		EncodeResult(out[i], &Result{Err: fmt.Errorf("%w: the checker returned %d results for %d requests", ErrInternal, len(res), len(idx))})
	}
}

// LocalRouter returns a Router that decides every request with c, ignoring
// its Policy: for a node that is its whole cluster, and for tests.
func LocalRouter(c Checker) Router { return localRouter{c} }

type localRouter struct{ c Checker }

func (l localRouter) Route(ctx context.Context, reqs []RoutedRequest) []Result {
	rs := make([]limiter.Request, len(reqs))
	for i := range reqs {
		rs[i] = reqs[i].Request
	}
	return l.c.CheckMany(ctx, rs)
}
