package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// MaxInspectReplicas is the most replicas an InspectResponse names: the
// most copies a cluster keeps besides the owner's.
const MaxInspectReplicas = 4

// Inspector reads one key's state for Inspect, on either service; name and
// key have been checked with limiter.ValidateKey. On the Peer service it
// answers for the keys this node decides as owner and returns an error
// wrapping ErrNotOwner for the others (the caller asks again once its ring
// has moved on); on the Sluice service it finds the key's owner. Reading
// changes nothing. Safe for concurrent use.
type Inspector interface {
	Inspect(ctx context.Context, name, key string) (sluice.Inspection, error)
}

// InspectPermit decides whether the caller of ctx may inspect keys on the
// Sluice service; a non-nil error refuses the call with PermissionDenied
// and the error's text. Inspecting reveals a key's usage, which a daemon
// may keep to its admins. It must be safe for concurrent use and should
// not block.
type InspectPermit func(ctx context.Context) error

// WithInspector serves Inspect with i, on the service registered with this
// option (Unimplemented without one).
func WithInspector(i Inspector) ServerOption {
	return func(s *serverConfig) { s.inspector = i }
}

// WithInspectPermit makes RegisterPublic ask p before every Inspect.
func WithInspectPermit(p InspectPermit) ServerOption {
	return func(s *serverConfig) { s.inspectPermit = p }
}

// Inspect answers for a key this node decides as its owner.
func (p *peerServer) Inspect(ctx context.Context, in *pb.InspectRequest) (*pb.InspectResponse, error) {
	if err := p.authorize(ctx); err != nil {
		return nil, err
	}
	return inspect(ctx, &p.cfg, in)
}

// Inspect finds the key's owner and answers with its state.
func (p *publicServer) Inspect(ctx context.Context, in *pb.InspectRequest) (*pb.InspectResponse, error) {
	if p.cfg.inspectPermit != nil {
		if err := p.cfg.inspectPermit(ctx); err != nil {
			return nil, status.Errorf(codes.PermissionDenied, "transport: inspect: %v", err)
		}
	}
	return inspect(ctx, &p.cfg, in)
}

// inspect validates in, asks cfg's Inspector and encodes its answer. A
// key the node does not decide is Aborted, an unreachable owner
// Unavailable.
func inspect(ctx context.Context, cfg *serverConfig, in *pb.InspectRequest) (*pb.InspectResponse, error) {
	if cfg.inspector == nil {
		return nil, status.Error(codes.Unimplemented, "transport: Inspect is not served")
	}
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil InspectRequest")
	}
	if err := limiter.ValidateKey(in.Name, in.Key); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "transport: inspect: %v", err)
	}
	ins, err := cfg.inspector.Inspect(ctx, in.Name, in.Key)
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, ErrNotOwner):
			code = codes.Aborted
		case errors.Is(err, ErrUnavailable):
			code = codes.Unavailable
		case errors.Is(err, context.DeadlineExceeded):
			code = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codes.Canceled
		}
		return nil, status.Errorf(code, "transport: inspect: %v", err)
	}
	return InspectionToProto(&ins), nil
}

// InspectionToProto returns the wire form of ins. Replicas beyond
// MaxInspectReplicas are left out.
func InspectionToProto(ins *sluice.Inspection) *pb.InspectResponse {
	out := &pb.InspectResponse{
		Owner:        cleanText(ins.Owner, limiter.MaxNameLen),
		WithoutOwner: ins.WithoutOwner,
		AtUnixNano:   unixNano(ins.At),
	}
	if ins.Found {
		out.States = []*pb.KeyState{SnapshotToProto(&ins.State)}
	}
	for _, r := range ins.Replicas[:min(len(ins.Replicas), MaxInspectReplicas)] {
		out.Replicas = append(out.Replicas, cleanText(r, limiter.MaxNameLen))
	}
	return out
}

// InspectionFromProto converts and checks m, the answer about (name,
// key): at most one state, of that key and valid (SnapshotFromProto).
// Errors wrap ErrMalformedResponse or the state's error.
func InspectionFromProto(m *pb.InspectResponse, name, key string) (sluice.Inspection, error) {
	if m == nil {
		return sluice.Inspection{}, fmt.Errorf("%w: nil InspectResponse", ErrMalformedResponse)
	}
	if len(m.States) > 1 || len(m.Replicas) > MaxInspectReplicas {
		return sluice.Inspection{}, fmt.Errorf("%w: InspectResponse with %d states and %d replicas", ErrMalformedResponse, len(m.States), len(m.Replicas))
	}
	ins := sluice.Inspection{
		Owner:        cleanText(m.Owner, limiter.MaxNameLen),
		WithoutOwner: m.WithoutOwner,
	}
	if m.AtUnixNano != 0 {
		ins.At = time.Unix(0, m.AtUnixNano)
	}
	for _, r := range m.Replicas {
		ins.Replicas = append(ins.Replicas, cleanText(r, limiter.MaxNameLen))
	}
	if len(m.States) == 1 {
		s, err := SnapshotFromProto(m.States[0])
		if err != nil {
			return sluice.Inspection{}, fmt.Errorf("%w: InspectResponse state: %w", ErrMalformedResponse, err)
		}
		if s.Name != name || s.Key != key {
			return sluice.Inspection{}, fmt.Errorf("%w: InspectResponse about %s/%s, not %s/%s", ErrMalformedResponse, s.Name, s.Key, name, key)
		}
		ins.State, ins.Found = s, true
	}
	return ins, nil
}
