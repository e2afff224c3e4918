package transport

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Limits on messages.
const (
	// MaxBatchItems is the most items one batch may carry, on either
	// service. A larger batch fails as a whole with InvalidArgument.
	MaxBatchItems = 1000
	// MaxMessageSize is the largest message a server accepts, in bytes,
	// and a larger one is refused with ResourceExhausted before it is
	// read: the largest batch, of MaxBatchItems requests with name, key
	// and time zone at their longest, a traceparent, and every number at
	// its longest encoding (1,419,142 bytes; size.go). Padding (wire.go)
	// only brings small messages up to about 1 KiB. A Transfer is sent in
	// calls that fit (TransferSplit).
	MaxMessageSize = max(maxPeerRequest, maxBatchRequest, maxPeerResponse, maxBatchResponse,
		maxRulesRequest, maxRulesResponse)
	// WindowSize is the HTTP/2 flow-control window, per stream and per
	// connection, that ServerOptions sets and peer clients use. gRPC's
	// default (64 KiB, grown by probing) makes a stream of small messages
	// exchange a window update every few dozen messages; a fixed window of
	// 1 MiB does so every 256 KiB.
	WindowSize = 1 << 20
)

// Result is the outcome of one request in a batch: a Decision, or Err.
// Errors that wrap a limiter sentinel keep it across the wire.
type Result = sluice.Result

// Checker decides a batch of requests as the owner of their keys. It
// returns one Result per request, in order; a request's failure is its
// Result's Err, never the batch's. The requests have been validated.
// CheckMany must not keep reqs after it returns. Safe for concurrent use.
type Checker interface {
	CheckMany(ctx context.Context, reqs []limiter.Request) []Result
}

// CheckerInto is a Checker that can also write its results into a slice
// that its caller provides. The CheckStream handler of the Peer service
// uses it when the local Checker has it: the results of each batch then
// reuse the memory of the previous batch's.
type CheckerInto interface {
	Checker
	// CheckInto decides reqs as CheckMany does and writes their results
	// to out, which has len(reqs) elements, overwriting each. It must not
	// keep reqs or out after it returns.
	CheckInto(ctx context.Context, reqs []limiter.Request, out []Result)
}

// RoutedRequest is a request from an API client with the policy for when
// its key's owner cannot be reached.
type RoutedRequest struct {
	Request limiter.Request
	Policy  sluice.Policy
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
	sink     StateSink // Peer.Transfer; nil: Unimplemented
	leaser   Leaser    // Peer.Lease; nil: Unimplemented
	auth     *PeerAuth // who may call the Peer service; nil: anyone
	permit   Permit    // Sluice service: who may make which request; nil: anyone
	// inspector serves Inspect; nil: Unimplemented.
	inspector Inspector
	// inspectPermit: who may call the Sluice service's Inspect; nil: anyone.
	inspectPermit InspectPermit
	self          string // the name Prove answers as; "": Unimplemented
	// gossip is the gossip address Prove reports; nil or "": none.
	gossip func() string
	// now is the clock Prove reports to the caller; time.Now when nil.
	now func() time.Time
}

// Permit decides whether the caller of ctx may make req, a request of the
// public API that has been validated; a non-nil error refuses the whole
// call with PermissionDenied and the error's text. The daemon restricts
// destructive behaviors (Reset, DrainOverLimit, Refund) and the names of
// its server-side counters this way. It must be safe for concurrent use
// and should not block.
type Permit func(ctx context.Context, req *limiter.Request) error

// WithPermit makes RegisterPublic ask p about every valid request before
// routing any of a call's.
func WithPermit(p Permit) ServerOption {
	return func(s *serverConfig) { s.permit = p }
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

// RegisterPeer registers the Peer service on s, with both of its methods:
// CheckBatch, a batch per call, and CheckStream, a stream of batches from
// one node answered one at a time in the order received, each with its
// seq (a Checker that blocks delays the stream's later batches). Every
// item of a batch is converted with Codec.RequestFromProto; those that fail
// get their error in their own response, and the rest are decided by local
// as their owner. A batch of more than MaxBatchItems fails the call, or
// ends the stream, with InvalidArgument; so does a Transfer of more than
// MaxTransferStates states, of a state with more than 3 words or
// limiter.MaxSnapshotLog log entries, or of more than
// MaxTransferLogEntries log entries in all. On a server built with
// ServerOptions, these counts are checked on the wire before the message
// is decoded. local receives a context whose
// caller PeerFromContext names; on a stream, that is the call's context.
// It panics if local is nil.
func RegisterPeer(s *grpc.Server, local Checker, opts ...ServerOption) {
	if local == nil {
		panic("transport: RegisterPeer with a nil Checker")
	}
	into, _ := local.(CheckerInto)
	s.RegisterService(servedAsStreams(guardService(&pb.Peer_ServiceDesc)), &peerServer{cfg: newServerConfig(opts), local: local, into: into})
}

// RegisterPublic registers the Sluice service on s: checks are decided by
// routed, Health answers from health (Unimplemented when health is nil).
// Validation and limits are as for RegisterPeer; an item's
// unreachable_policy is read with PolicyFromProto. It panics if routed is
// nil.
func RegisterPublic(s grpc.ServiceRegistrar, routed Router, health Health, opts ...ServerOption) {
	if routed == nil {
		panic("transport: RegisterPublic with a nil Router")
	}
	s.RegisterService(servedAsStreams(guardService(&pb.Sluice_ServiceDesc)), &publicServer{cfg: newServerConfig(opts), routed: routed, health: health})
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
	into  CheckerInto // local, when it is one; nil otherwise
}

func (p *peerServer) CheckBatch(ctx context.Context, in *pb.PeerCheckRequest) (*pb.PeerCheckResponse, error) {
	if err := p.authorize(ctx); err != nil {
		return nil, err
	}
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil PeerCheckRequest")
	}
	if err := checkCount(len(in.Items), p.cfg.maxItems); err != nil {
		return nil, err
	}
	out := &pb.PeerCheckResponse{Items: newResponses(len(in.Items))}
	p.decide(context.WithValue(ctx, peerKey{}, in.From), in.Items, out.Items, new(decideBuffers))
	return out, nil
}

// CheckStream answers the batches of one stream in the order received,
// deciding one at a time. A batch over the size limit ends the stream with
// InvalidArgument; the sender closing its side ends it with OK once every
// batch received is answered.
func (p *peerServer) CheckStream(stream pb.Peer_CheckStreamServer) error {
	ctx := stream.Context()
	if err := p.authorize(ctx); err != nil {
		return err
	}
	from := ""
	fromCtx := context.WithValue(ctx, peerKey{}, from)
	var buf streamBuffers
	in := &buf.in.PeerCheckRequest
	for {
		// Each batch is decoded in the memory of the previous one.
		if err := stream.RecvMsg(&buf.in); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := checkCount(len(in.Items), p.cfg.maxItems); err != nil {
			return err
		}
		if in.From != "" && in.From != from {
			from = in.From
			fromCtx = context.WithValue(ctx, peerKey{}, from)
		}
		out := buf.response(len(in.Items))
		out.Seq = in.Seq
		p.decide(fromCtx, in.Items, out.Items, &buf.decideBuffers)
		hoistOwner(out)
		// SendMsg has encoded out when it returns, so that its buffers can
		// be reused for the next batch.
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// authorize checks the caller of the method of ctx against the server's
// PeerAuth.
func (p *peerServer) authorize(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	return p.cfg.auth.authorize(ctx, method)
}

// decide converts items, decides the valid ones with the local Checker and
// writes one response per item to out, which has len(items) messages.
// When an item carries a traceparent, the Checker finds them all with
// TraceParents.
func (p *peerServer) decide(ctx context.Context, items []*pb.RateLimitRequest, out []*pb.RateLimitResponse, buf *decideBuffers) {
	reqs := buf.reqs[:0]
	idx := buf.idx[:0] // reqs[j] is items[idx[j]]
	traced := false    // an item has a traceparent: then traces[j] is reqs[j]'s
	var traces []string
	for i, m := range items {
		r, err := p.cfg.codec.RequestFromProto(m)
		if err != nil {
			EncodeResult(out[i], &Result{Err: err})
			continue
		}
		if m.Traceparent != "" && !traced {
			traced = true
			traces = append(buf.traces.parents[:0], make([]string, len(reqs))...)
		}
		reqs = append(reqs, r)
		idx = append(idx, i)
		if traced {
			traces = append(traces, m.Traceparent)
		}
	}
	if traced {
		buf.traces.parents = traces
		ctx = context.WithValue(ctx, itemTracesKey{}, &buf.traces)
	}
	if len(reqs) > 0 && p.into != nil {
		res := buf.res[:0]
		res = append(res, make([]Result, len(reqs))...)
		p.into.CheckInto(ctx, reqs, res)
		encodeResults(out, idx, res)
		clear(res) // keep no references to this batch's owners and errors
		buf.res = res[:0]
	} else if len(reqs) > 0 {
		encodeResults(out, idx, p.local.CheckMany(ctx, reqs))
	}
	clear(reqs) // keep no references to this batch's strings
	buf.reqs, buf.idx = reqs[:0], idx[:0]
	if traced {
		clear(traces)
		buf.traces.parents = traces[:0]
	}
}

// decideBuffers are decide's scratch slices, reused by a stream from one
// batch to the next.
type decideBuffers struct {
	reqs []limiter.Request
	idx  []int
	res  []Result // for a CheckerInto
	// traces are the requests' traceparents, when one has one.
	traces itemTraces
}

// streamBuffers are the buffers of one CheckStream handler.
type streamBuffers struct {
	decideBuffers
	in   peerRequestBuffer
	slab []pb.RateLimitResponse
	ptrs []*pb.RateLimitResponse
	resp pb.PeerCheckResponse
}

// response returns the stream's response message with n item messages.
// Each item is overwritten by decide (EncodeResult sets every field).
func (b *streamBuffers) response(n int) *pb.PeerCheckResponse {
	if cap(b.slab) < n {
		b.slab = make([]pb.RateLimitResponse, n)
		b.ptrs = make([]*pb.RateLimitResponse, n)
		for i := range b.ptrs {
			b.ptrs[i] = &b.slab[i]
		}
	}
	b.resp.Items = b.ptrs[:n]
	b.resp.Owner = ""
	return &b.resp
}

// hoistOwner moves the owner of out's first item to out.Owner and clears it
// from every item that has the same, so that it travels once per batch.
func hoistOwner(out *pb.PeerCheckResponse) {
	if len(out.Items) == 0 {
		return
	}
	owner := out.Items[0].Owner
	out.Owner = owner
	for _, m := range out.Items {
		if m.Owner == owner {
			m.Owner = ""
		}
	}
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
	sp := new(checkSpace)
	sp.items[0], sp.outs[0] = in.Request, &sp.out
	out, err := p.routeInto(ctx, sp.items[:], sp.outs[:], sp.reqs[:0], sp.idx[:0])
	if err != nil {
		return nil, err
	}
	sp.resp.Response = out[0]
	return &sp.resp, nil
}

// checkSpace holds what Check of one request needs, allocated together:
// its response, and route's request and index slices.
type checkSpace struct {
	resp  pb.CheckResponse
	out   pb.RateLimitResponse
	outs  [1]*pb.RateLimitResponse
	items [1]*pb.RateLimitRequest
	reqs  [1]RoutedRequest
	idx   [1]int
}

func (p *publicServer) CheckBatch(ctx context.Context, in *pb.BatchCheckRequest) (*pb.BatchCheckResponse, error) {
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil BatchCheckRequest")
	}
	if err := checkCount(len(in.Requests), p.cfg.maxItems); err != nil {
		return nil, err
	}
	out, err := p.route(ctx, in.Requests)
	if err != nil {
		return nil, err
	}
	return &pb.BatchCheckResponse{Responses: out}, nil
}

// route converts items, routes the valid ones and returns one response
// per item, or the Permit's refusal of one of them.
func (p *publicServer) route(ctx context.Context, items []*pb.RateLimitRequest) ([]*pb.RateLimitResponse, error) {
	return p.routeInto(ctx, items, newResponses(len(items)), make([]RoutedRequest, 0, len(items)), make([]int, 0, len(items)))
}

// routeInto is route, writing the responses to out, one per item, and
// appending to reqs and idx, empty with room for every item.
func (p *publicServer) routeInto(ctx context.Context, items []*pb.RateLimitRequest, out []*pb.RateLimitResponse, reqs []RoutedRequest, idx []int) ([]*pb.RateLimitResponse, error) {
	for i, m := range items {
		r, err := p.cfg.codec.RequestFromProto(m)
		var pol sluice.Policy
		if err == nil && m.Charge {
			err = fmt.Errorf("%w: charge is the peer service's", limiter.ErrInvalidBehavior)
		}
		if err == nil {
			pol, err = PolicyFromProto(m.UnreachablePolicy)
		}
		if err != nil {
			EncodeResult(out[i], &Result{Err: err})
			continue
		}
		if p.cfg.permit != nil {
			if err := p.cfg.permit(ctx, &r); err != nil {
				return nil, status.Errorf(codes.PermissionDenied, "transport: request %d: %v", i, err)
			}
		}
		reqs = append(reqs, RoutedRequest{Request: r, Policy: pol})
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		encodeResults(out, idx, p.routed.Route(ctx, reqs))
	}
	return out, nil
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
