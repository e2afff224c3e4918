package peer

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// rawCodec moves *[]byte as they are, under the proto codec's name, so
// that a fake peer can put any bytes on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// script is how a fake peer answers on one stream: it is called with each
// batch received and returns the messages to send, and an error to end
// the stream with (after sending them; errEndOK ends it with status OK),
// or nil to keep it.
type script func(in *pb.PeerCheckRequest) (out [][]byte, end error)

// startFake serves a fake Peer service whose streams each follow a new
// script from newScript. It returns the address.
func startFake(t *testing.T, newScript func() script) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	handler := func(_ any, ss grpc.ServerStream) error {
		sc := newScript()
		for {
			var data []byte
			if err := ss.RecvMsg(&data); err != nil {
				return nil
			}
			in := new(pb.PeerCheckRequest)
			if err := proto.Unmarshal(data, in); err != nil {
				t.Errorf("fake peer: %v", err)
				return err
			}
			out, end := sc(in)
			for _, m := range out {
				if err := ss.SendMsg(&m); err != nil {
					return err
				}
			}
			if end == errEndOK {
				return nil
			}
			if end != nil {
				return end
			}
		}
	}
	s := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(handler))
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-served
	})
	return lis.Addr().String()
}

// answer returns the fake peer's answer to in: every item allowed, with
// the owner given once for the batch; seq and the number of items are
// changed by the deltas.
func answer(t *testing.T, in *pb.PeerCheckRequest, seqDelta uint64, itemsDelta int) []byte {
	t.Helper()
	out := &pb.PeerCheckResponse{Seq: in.Seq + seqDelta, Owner: "fake"}
	for range len(in.Items) + itemsDelta {
		out.Items = append(out.Items, &pb.RateLimitResponse{Allowed: true, Limit: 3, Remaining: 2})
	}
	b, err := proto.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// honest answers every batch correctly.
func honest(t *testing.T) script {
	return func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{answer(t, in, 0, 0)}, nil }
}

func TestUntrustedAnswers(t *testing.T) {
	for _, tt := range []struct {
		name string
		// first answers the first batch of the first stream; the other
		// batches and streams are answered honestly.
		first       func(in *pb.PeerCheckRequest) ([][]byte, error)
		want        []error // the first check's error matches each
		wantInText  string
		newStream   bool   // the stream is replaced
		failedCalls uint64 // the batch failed as a whole
	}{
		{
			name:        "one answer too many",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{answer(t, in, 0, 1)}, nil },
			want:        []error{transport.ErrMalformedResponse},
			wantInText:  "2 answers for 1 checks",
			failedCalls: 1,
		},
		{
			name:        "no answer for the check",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{answer(t, in, 0, -1)}, nil },
			want:        []error{transport.ErrMalformedResponse},
			wantInText:  "0 answers for 1 checks",
			failedCalls: 1,
		},
		{
			name:        "unknown batch id",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{answer(t, in, 7, 0)}, nil },
			want:        []error{ErrUnavailable, transport.ErrMalformedResponse},
			wantInText:  "not in flight",
			newStream:   true,
			failedCalls: 1,
		},
		{
			name:        "garbage",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{{0x0a, 0xff}}, nil },
			want:        []error{ErrUnavailable},
			newStream:   true,
			failedCalls: 1,
		},
		{
			name:  "out of range decision",
			first: func(in *pb.PeerCheckRequest) ([][]byte, error) { return [][]byte{mustMarshal(t, badDecision(in))}, nil },
			want:  []error{transport.ErrMalformedResponse},
		},
		{
			name:        "stream ends without an answer",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return nil, status.Error(codes.Aborted, "going away") },
			want:        []error{ErrUnavailable, transport.ErrUnavailable},
			wantInText:  "going away",
			newStream:   true,
			failedCalls: 1,
		},
		{
			name:        "stream ends cleanly without an answer",
			first:       func(in *pb.PeerCheckRequest) ([][]byte, error) { return nil, errEndOK },
			want:        []error{ErrUnavailable},
			wantInText:  "ended the stream",
			newStream:   true,
			failedCalls: 1,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			streams := 0
			addr := startFake(t, func() script {
				mu.Lock()
				defer mu.Unlock()
				streams++
				if streams > 1 {
					return honest(t)
				}
				n := 0
				return func(in *pb.PeerCheckRequest) ([][]byte, error) {
					n++
					if n == 1 {
						return tt.first(in)
					}
					return [][]byte{answer(t, in, 0, 0)}, nil
				}
			})
			c := newTestClient(t, addr, testConfig())
			_, err := c.Check(context.Background(), req("x"))
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Fatalf("first check: %v, want an error matching %v", err, w)
				}
			}
			if !strings.Contains(err.Error(), tt.wantInText) {
				t.Fatalf("first check: %q does not say %q", err, tt.wantInText)
			}
			// The client recovers: the next check is answered, on a new
			// stream when the first one broke.
			d, err := c.Check(context.Background(), req("x"))
			if err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("second check: %+v, %v", d, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{false: 1, true: 2}[tt.newStream]; streams != want {
				t.Fatalf("%d streams, want %d", streams, want)
			}
			if s := c.Stats(); s.Calls != 2 || s.FailedCalls != tt.failedCalls {
				t.Fatalf("stats %+v, want 2 calls, %d failed", s, tt.failedCalls)
			}
		})
	}
}

// errEndOK makes the fake peer end the stream with status OK.
var errEndOK = errors.New("end OK")

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// badDecision answers in with a negative remaining count.
func badDecision(in *pb.PeerCheckRequest) *pb.PeerCheckResponse {
	out := &pb.PeerCheckResponse{Seq: in.Seq}
	for range in.Items {
		out.Items = append(out.Items, &pb.RateLimitResponse{Allowed: true, Limit: 3, Remaining: -1, Owner: "fake"})
	}
	return out
}

func TestAnswersAreMatchedByID(t *testing.T) {
	// The fake peer keeps the first batch and answers it after the
	// second, so that the answers arrive in the other order.
	addr := startFake(t, func() script {
		var first *pb.PeerCheckRequest
		return func(in *pb.PeerCheckRequest) ([][]byte, error) {
			if first == nil {
				first = in
				return nil, nil
			}
			out := &pb.PeerCheckResponse{Seq: in.Seq, Owner: "fake"}
			for _, m := range in.Items {
				out.Items = append(out.Items, &pb.RateLimitResponse{Allowed: true, Limit: m.Limit, Remaining: 1})
			}
			return [][]byte{mustMarshal(t, out), answer(t, first, 0, 0)}, nil
		}
	})
	cfg := testConfig()
	cfg.MaxInFlight = 2
	c := newTestClient(t, addr, cfg)
	first := goCheck(context.Background(), c, req("a"))
	testwait.For(t, "the first batch", func() bool { return c.Stats().Calls == 1 })
	r := req("b")
	r.Limit = 5
	second := goCheck(context.Background(), c, r)
	if out := receive(t, "the second check", second); out.err != nil || out.d.Limit != 5 || out.d.Remaining != 1 {
		t.Fatalf("second check: %+v", out)
	}
	if out := receive(t, "the first check", first); out.err != nil || out.d.Limit != 3 || out.d.Remaining != 2 {
		t.Fatalf("first check: %+v", out)
	}
	// The owner said once per batch applies to each of its items.
	res := c.CheckMany(context.Background(), []limiter.Request{req("c"), req("d")})
	for i, r := range res {
		if r.Err != nil || r.Owner != "fake" {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
}

func TestGracefulStopEndsTheStream(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	c := newTestClient(t, srv.addr, testConfig())
	if _, err := c.Check(context.Background(), req("x")); err != nil {
		t.Fatal(err)
	}
	// A batch is in flight when the server starts stopping: it is still
	// answered, and then the client ends its stream, so that the server
	// does not wait for it.
	held := holdOneCall(t, c, o)
	stopped := make(chan struct{})
	go func() {
		srv.grpc.GracefulStop()
		close(stopped)
	}()
	o.release()
	if out := receive(t, "the held check", held); out.err != nil || !out.d.Allowed {
		t.Fatalf("held check: %+v", out)
	}
	receive(t, "GracefulStop to return", stopped)
	if _, err := c.Check(context.Background(), req("x")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("check after the server stopped: %v, want ErrUnavailable", err)
	}
	if s := c.Stats(); s.Calls != 3 || s.FailedCalls != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestObserverSeesEveryBatch(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	type call struct {
		peer  string
		items int
		took  time.Duration
		err   error
	}
	calls := make(chan call, 10)
	cfg := testConfig()
	cfg.Observer = func(peer string, items int, took time.Duration, err error) {
		calls <- call{peer, items, took, err}
	}
	c := newTestClient(t, srv.addr, cfg)
	bad := req("reject") // a per-item error does not fail the batch
	if res := c.CheckMany(context.Background(), []limiter.Request{req("a"), bad, req("b")}); !errors.Is(res[1].Err, limiter.ErrInvalidBurst) {
		t.Fatalf("CheckMany: %+v", res)
	}
	got := receive(t, "the observer", calls)
	if got.peer != "node-b" || got.items != 3 || got.took <= 0 || got.err != nil {
		t.Fatalf("observed %+v", got)
	}
	srv.stop()
	if _, err := c.Check(context.Background(), req("x")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("check of a stopped server: %v", err)
	}
	if got := receive(t, "the observer", calls); got.items != 1 || !errors.Is(got.err, ErrUnavailable) {
		t.Fatalf("observed %+v", got)
	}
	select {
	case got := <-calls:
		t.Fatalf("one call too many: %+v", got)
	default:
	}
}

func TestCloseDuringOpen(t *testing.T) {
	// A peer that accepts connections but never speaks HTTP/2: opening a
	// stream hangs until the batch's deadline or Close.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			cn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, cn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-accepted
		mu.Lock()
		defer mu.Unlock()
		for _, cn := range conns {
			cn.Close()
		}
	})
	clk := fakeclock.New(clockStart)
	cfg := testConfig()
	cfg.Timeout, cfg.Clock = time.Second, ClockFunc(clk.Now)
	c, err := NewClient("node-b", lis.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The deadline covers opening the stream.
	first := goCheck(context.Background(), c, req("x"))
	testwait.For(t, "the batch to be sent", func() bool { return c.Stats().InFlight == 1 })
	expireAt(c, clk, cfg.Timeout)
	receiveTimedOut(t, "the check of a silent peer", first)
	// The caller's context ends its wait at once; its batch stays in
	// flight until its deadline.
	ctx, cancel := context.WithCancel(context.Background())
	waiting := goCheck(ctx, c, req("x"))
	testwait.For(t, "the batch to be sent", func() bool { return c.Stats().Calls == 2 && c.Stats().InFlight == 1 })
	cancel()
	if out := receive(t, "the canceled check", waiting); !errors.Is(out.err, context.Canceled) {
		t.Fatalf("canceled check: %v", out.err)
	}
	expireAt(c, clk, 2*cfg.Timeout)
	// Close fails what is in flight and stops every goroutine (TestMain
	// checks for leaks).
	inFlight := goCheck(context.Background(), c, req("y"))
	testwait.For(t, "the batch to be sent", func() bool { return c.Stats().Calls == 3 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if out := receive(t, "the check in flight", inFlight); !errors.Is(out.err, ErrClosed) {
		t.Fatalf("check in flight at Close: %v, want ErrClosed", out.err)
	}
}
