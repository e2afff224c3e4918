package transport

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// mapInspector answers from a map of states by key, with err when set.
type mapInspector struct {
	states map[string]limiter.Snapshot
	err    error
}

func (m mapInspector) Inspect(_ context.Context, name, key string) (sluice.Inspection, error) {
	if m.err != nil {
		return sluice.Inspection{}, m.err
	}
	s, ok := m.states[key]
	return sluice.Inspection{State: s, Found: ok, Owner: "n1", Replicas: []string{"n2", "n3"}, At: time.Unix(1_700_000_000, 5)}, nil
}

// Inspect carries a state of every algorithm, its owner and replicas on
// both services, and a fresh key as none; the permit and the inspector's
// errors become status codes.
func TestInspect(t *testing.T) {
	states := map[string]limiter.Snapshot{}
	for _, s := range liveSnapshots(t) {
		states[s.Key] = s
	}
	insp := mapInspector{states: states}
	refuse := errors.New("not an admin")
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPeer(s, &echoChecker{}, WithInspector(insp))
		RegisterPublic(s, LocalRouter(&echoChecker{}), nil, WithInspector(insp), WithInspectPermit(func(ctx context.Context) error {
			if _, ok := PeerFromContext(ctx); ok {
				return nil
			}
			return refuse
		}))
	})
	peerAPI, public := pb.NewPeerClient(conn), pb.NewSluiceClient(conn)
	ctx := context.Background()
	for key, want := range states {
		m, err := peerAPI.Inspect(ctx, &pb.InspectRequest{From: "n9", Name: "api", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		got, err := InspectionFromProto(m, "api", key)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Found || !reflect.DeepEqual(got.State, want) || got.Owner != "n1" ||
			!reflect.DeepEqual(got.Replicas, []string{"n2", "n3"}) || got.At.UnixNano() != 1_700_000_000_000_000_005 {
			t.Errorf("%s: got %+v, want %+v", key, got, want)
		}
		if _, err := InspectionFromProto(m, "api", "another"); !errors.Is(err, ErrMalformedResponse) {
			t.Errorf("the state of %s read as another key's: %v", key, err)
		}
	}
	m, err := peerAPI.Inspect(ctx, &pb.InspectRequest{Name: "api", Key: "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := InspectionFromProto(m, "api", "fresh"); err != nil || got.Found || len(m.States) != 0 {
		t.Errorf("a fresh key: %+v, %v", got, err)
	}

	for _, tt := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"public, refused", func() error {
			_, err := public.Inspect(ctx, &pb.InspectRequest{Name: "api", Key: "k"})
			return err
		}, codes.PermissionDenied, "not an admin"},
		{"empty name", func() error {
			_, err := peerAPI.Inspect(ctx, &pb.InspectRequest{Key: "k"})
			return err
		}, codes.InvalidArgument, "Name is empty"},
		{"long key", func() error {
			_, err := peerAPI.Inspect(ctx, &pb.InspectRequest{Name: "api", Key: strings.Repeat("k", limiter.MaxKeyLen+1)})
			return err
		}, codes.InvalidArgument, "Key is"},
	} {
		err := tt.call()
		if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: %v, want %v naming %q", tt.name, err, tt.code, tt.msg)
		}
	}

	for _, tt := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("%w: moved", ErrNotOwner), codes.Aborted},
		{fmt.Errorf("%w: gone", ErrUnavailable), codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("boom"), codes.Internal},
	} {
		conn := startServer(t, func(s *grpc.Server) {
			RegisterPeer(s, &echoChecker{}, WithInspector(mapInspector{err: tt.err}))
		})
		_, err := pb.NewPeerClient(conn).Inspect(ctx, &pb.InspectRequest{Name: "api", Key: "k"})
		if status.Code(err) != tt.code {
			t.Errorf("inspector error %v: %v, want %v", tt.err, err, tt.code)
		}
	}

	// Without an inspector, Inspect is not served.
	conn = startServer(t, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}) })
	if _, err := pb.NewPeerClient(conn).Inspect(ctx, &pb.InspectRequest{Name: "api", Key: "k"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("no inspector: %v", err)
	}
}

// An answer that breaks the protocol is refused.
func TestInspectionFromProtoRejects(t *testing.T) {
	good := SnapshotToProto(&liveSnapshots(t)[0])
	for _, tt := range []struct {
		name string
		m    *pb.InspectResponse
	}{
		{"nil", nil},
		{"two states", &pb.InspectResponse{States: []*pb.KeyState{good, good}}},
		{"five replicas", &pb.InspectResponse{Replicas: []string{"a", "b", "c", "d", "e"}}},
		{"invalid state", &pb.InspectResponse{States: []*pb.KeyState{{Name: good.Name, Key: good.Key}}}},
	} {
		if _, err := InspectionFromProto(tt.m, good.Name, good.Key); !errors.Is(err, ErrMalformedResponse) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

// A reset carries names and keys only: an invalid key is rejected, the
// rest reach the sink.
func TestTransferReset(t *testing.T) {
	sink := &recordSink{}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}, WithStateSink(sink)) })
	out, err := pb.NewPeerClient(conn).Transfer(context.Background(), &pb.TransferRequest{
		From: "n1", Reason: ReasonToProto(Reset),
		States: []*pb.KeyState{{Name: "api", Key: "a"}, {Name: "api"}, {Name: "api", Key: "b", Words: []int64{1}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []limiter.Snapshot{{Name: "api", Key: "a"}, {Name: "api", Key: "b"}}
	if out.Rejected != 1 || sink.reason != Reset || !reflect.DeepEqual(sink.states, want) {
		t.Errorf("rejected %d, sink got %v %+v; want 1 rejected and %+v", out.Rejected, sink.reason, sink.states, want)
	}
}

// A sink that refuses the states it is sent (a leaving node that has
// passed on its last ones) makes the transfer fail with Unavailable, its
// reason in the message, so that the sender keeps them.
func TestTransferRefused(t *testing.T) {
	sink := &recordSink{refuse: errors.New("node n2 is leaving")}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}, WithStateSink(sink)) })
	_, err := pb.NewPeerClient(conn).Transfer(context.Background(), &pb.TransferRequest{
		From: "n1", Reason: ReasonToProto(Handoff),
		States: []*pb.KeyState{{Name: "api", Key: "a", Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW}},
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node n2 is leaving") {
		t.Errorf("got %v, want Unavailable naming the sink's reason", err)
	}
}

// recordSink keeps the last states it takes, or refuses them with refuse.
type recordSink struct {
	reason TransferReason
	states []limiter.Snapshot
	refuse error
}

func (r *recordSink) TakeStates(_ context.Context, _ string, reason TransferReason, states []limiter.Snapshot) (int, int, error) {
	if r.refuse != nil {
		return 0, 0, r.refuse
	}
	r.reason, r.states = reason, states
	return len(states), 0, nil
}
