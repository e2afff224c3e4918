package transport

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/testwait"
)

// stallMethod opens a connection to addr with n calls of method, each
// sending the first part bytes of a message of MaxMessageSize bytes and
// nothing more, and returns it.
func stallMethod(t *testing.T, addr, method string, n, part int) net.Conn {
	t.Helper()
	b := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	body := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(MaxMessageSize)), make([]byte, part)...)
	for i := range n {
		id := uint32(2*i + 1)
		b = appendFrame(b, frameHeaders, flagEndHeaders, id, grpcHeaders(method))
		b = appendFrame(b, frameData, 0, id, body)
	}
	return dialRaw(t, addr, b)
}

// budgetEmpty reports whether b holds nothing and keeps no connection.
func budgetEmpty(b *MessageBudget) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used == 0 && len(b.byPeer) == 0 && b.awaited.head == nil
}

// A service registered through Registrar, one this package does not
// know (gRPC's health service), is served to an unchanged unary client,
// and its unary calls are held to the budget as the Peer service's are:
// calls that send part of a message and stall each hold their window and
// a whole message, and are reset at MessageTimeout. The same service
// registered on the server directly is still served, its calls ended
// when their handlers return (not left to time out). Once the calls end
// the budget keeps nothing, no connection among it.
func TestRegistrarServesUnaryMethodsWithinTheBudget(t *testing.T) {
	const r = MessageReservation
	for _, tc := range []struct {
		name     string
		register func(s *grpc.Server)
		budgeted bool
	}{
		{"through Registrar", func(s *grpc.Server) { healthpb.RegisterHealthServer(Registrar(s), health.NewServer()) }, true},
		{"directly", func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewMessageBudget(DefaultServerLimits())
			if err != nil {
				t.Fatal(err)
			}
			timers := new(fakeTimers)
			timers.install(b)
			addr := serveBudget(t, b, tc.register)
			conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			client := healthpb.NewHealthClient(conn)
			for range 20 {
				resp, err := client.Check(ctxT(t), &healthpb.HealthCheckRequest{})
				if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("Check: %v, %v", resp, err)
				}
			}
			testwait.For(t, "the budget to keep nothing once the calls end", func() bool { return budgetEmpty(b) })
			if s := b.Stats(); s.TimedOut != 0 || s.Refused != 0 {
				t.Fatalf("stats %+v after calls that ended, want none timed out or refused", s)
			}
			if !tc.budgeted {
				return
			}

			c := stallMethod(t, addr, "/grpc.health.v1.Health/Check", 3, 1000)
			testwait.For(t, "3 stalled calls to hold their messages", func() bool { return b.Stats().Reserved == 3*r })
			if n := timers.fire(); n != 1 {
				t.Fatalf("%d timers pending, want one for the stalled calls", n)
			}
			awaitEnded(t, c, 3)
			testwait.For(t, "the budget to empty", func() bool { return budgetEmpty(b) })
			if s := b.Stats(); s.TimedOut != 3 {
				t.Errorf("%d calls timed out, want 3", s.TimedOut)
			}
		})
	}
}

// wrappedStream is a stream as a stream interceptor that wraps it passes
// it on.
type wrappedStream struct{ grpc.ServerStream }

// A budget's unary interceptors run around each unary method it serves
// as a stream, the first outermost, with the method's request and name,
// whether or not a stream interceptor after the budget's wraps the
// stream; gRPC's own unary interceptors see none of them.
func TestMessageBudgetUnaryInterceptors(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		var extra []grpc.ServerOption
		if wrap {
			extra = append(extra, grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				return h(srv, &wrappedStream{ss})
			}))
		}
		testUnaryInterceptors(t, extra...)
	}
}

func testUnaryInterceptors(t *testing.T, extra ...grpc.ServerOption) {
	t.Helper()
	b, err := NewMessageBudget(DefaultServerLimits())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	record := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			mu.Lock()
			seen = append(seen, name+" "+info.FullMethod)
			mu.Unlock()
			if _, ok := req.(*healthpb.HealthCheckRequest); !ok {
				t.Errorf("%s got %T", name, req)
			}
			return h(ctx, req)
		}
	}
	b.ChainUnaryInterceptor(record("outer"), nil, record("inner"))
	addr := serveBudget(t, b, func(s *grpc.Server) { healthpb.RegisterHealthServer(Registrar(s), health.NewServer()) },
		append(extra, grpc.ChainUnaryInterceptor(record("grpc")))...)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if _, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"outer /grpc.health.v1.Health/Check", "inner /grpc.health.v1.Health/Check"}; !slices.Equal(seen, want) {
		t.Fatalf("interceptors ran %q, want %q", seen, want)
	}
}
