package transport

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func wireMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	data, err := wireCodec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

func wireUnmarshal(b []byte, m proto.Message) error {
	return wireCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

func TestWireCodec(t *testing.T) {
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	small := &pb.PeerCheckRequest{From: "a", Seq: 7, Items: []*pb.RateLimitRequest{RequestToProto(r)}}
	bigKey := r
	bigKey.Key = strings.Repeat("k", limiter.MaxKeyLen)
	big := &pb.PeerCheckRequest{Seq: 8, Items: []*pb.RateLimitRequest{RequestToProto(bigKey)}}
	resp := &pb.PeerCheckResponse{Seq: 7, Owner: "b", Items: []*pb.RateLimitResponse{DecisionToProto(limiter.Decision{Allowed: true, Limit: 3})}}
	public := &pb.CheckRequest{Request: RequestToProto(r)}

	for _, tt := range []struct {
		name   string
		m      proto.Message
		padded bool
	}{
		{"small request", small, true},
		{"small response", resp, true},
		{"empty response", &pb.PeerCheckResponse{}, true},
		{"request over the threshold", big, false},
		{"public message", public, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := wireMarshal(t, tt.m)
			plain, err := proto.Marshal(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.padded {
				if string(b) != string(plain) {
					t.Fatal("unpadded message differs from the plain encoding")
				}
			} else if n := len(b) + frameHeader; n < padTo-2 || n > padTo {
				t.Fatalf("padded to %d bytes on the wire, want about %d", n, padTo)
			}
			// The codec decodes its own encoding and the plain one alike.
			for _, enc := range [][]byte{b, plain} {
				got := tt.m.ProtoReflect().New().Interface()
				if err := wireUnmarshal(enc, got); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(got, tt.m) {
					t.Fatalf("decoded %v, want %v", got, tt.m)
				}
			}
			// A plain decoder reads the padding as an ordinary field.
			if tt.padded {
				got := tt.m.ProtoReflect().New().Interface()
				if err := proto.Unmarshal(b, got); err != nil {
					t.Fatal(err)
				}
				var pad []byte
				switch g := got.(type) {
				case *pb.PeerCheckRequest:
					pad, g.Padding = g.Padding, nil
				case *pb.PeerCheckResponse:
					pad, g.Padding = g.Padding, nil
				}
				if len(pad) < 900 || strings.Trim(string(pad), "\x00") != "" || !proto.Equal(got, tt.m) {
					t.Fatalf("plain decoding: %d bytes of padding, message %v", len(pad), got)
				}
			}
		})
	}

	if _, err := (wireCodec{}).Marshal("not a message"); err == nil {
		t.Error("Marshal of a string")
	}
	if err := (wireCodec{}).Unmarshal(nil, new(int)); err == nil {
		t.Error("Unmarshal into an int")
	}
	// A padding field whose length runs past the end is not skipped, and
	// fails to decode.
	if err := wireUnmarshal([]byte{paddingTag, 0x05, 0, 0}, new(pb.PeerCheckRequest)); err == nil {
		t.Error("truncated padding decoded")
	}
}

// FuzzWireUnmarshal decodes arbitrary bytes with the codec: it must never
// panic, and must agree with the plain protobuf decoder on everything but
// the padding.
func FuzzWireUnmarshal(f *testing.F) {
	r := limiter.Request{Name: "n", Key: "k", Hits: 2, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	f.Add(wireMarshal(f, &pb.PeerCheckRequest{From: "a", Seq: 1, Items: []*pb.RateLimitRequest{RequestToProto(r)}}))
	f.Add(wireMarshal(f, &pb.PeerCheckResponse{Seq: 1, Owner: "b", Items: []*pb.RateLimitResponse{{Allowed: true}}}))
	// Every field of both messages, for the hand-written decoder.
	hits := int64(-3)
	f.Add(wireMarshal(f, &pb.PeerCheckRequest{From: "é", Seq: 1 << 40, Items: []*pb.RateLimitRequest{{
		Name: "n", Key: "k", Hits: &hits, Limit: 1, PeriodNanos: 2, Burst: 3, Algorithm: 4, Calendar: 5,
		TimeZone: "UTC", Reset_: true, DrainOverLimit: true, UnreachablePolicy: 2, Refund: true,
	}, {}}}))
	f.Add(wireMarshal(f, &pb.PeerCheckResponse{Seq: 9, Owner: "b", Items: []*pb.RateLimitResponse{{
		Allowed: true, Limit: 1, Remaining: -2, ResetAtUnixNano: 3, RetryAfterNanos: 4, DelayNanos: 5,
		Owner: "c", WithoutOwner: true, ErrorCode: 6, ErrorMessage: "m",
	}, {}}}))
	f.Add([]byte{paddingTag, 0x01, 0x00, 0x18, 0x05})
	f.Add([]byte{paddingTag, 0xff})
	f.Add([]byte{paddingTag})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{new(pb.PeerCheckRequest), new(pb.PeerCheckResponse)} {
			got := m.ProtoReflect().New().Interface()
			errWire := wireUnmarshal(data, got)
			want := m.ProtoReflect().New().Interface()
			errPlain := proto.Unmarshal(data, want)
			if _, refused := errWire.(*countError); refused {
				// Only a message over its limits (guard.go) is refused.
				if errPlain != nil || !countsOver(want.ProtoReflect(), countLimits(want.ProtoReflect().Descriptor().FullName())) {
					t.Fatalf("%T: refused with %v, plain error %v", m, errWire, errPlain)
				}
				continue
			}
			if (errWire == nil) != (errPlain == nil) {
				t.Fatalf("%T: codec error %v, plain error %v", m, errWire, errPlain)
			}
			if errWire != nil {
				continue
			}
			for _, x := range []proto.Message{got, want} {
				switch x := x.(type) {
				case *pb.PeerCheckRequest:
					x.Padding = nil
				case *pb.PeerCheckResponse:
					x.Padding = nil
				}
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%T: codec decoded %v, plain %v", m, got, want)
			}
		}
	})
}

// frameLog records the HTTP/2 frames a client writes to its connection,
// with the number of the write that completed each.
type frameLog struct {
	mu      sync.Mutex // guards all below
	pending []byte     // written, not yet a whole frame
	writes  int
	frames  []loggedFrame
}

type loggedFrame struct {
	write  int
	typ    byte
	length int
}

// loggingConn is a client's connection that logs what it writes.
type loggingConn struct {
	net.Conn
	log *frameLog
}

func (c loggingConn) Write(b []byte) (int, error) {
	c.log.add(b)
	return c.Conn.Write(b)
}

func (l *frameLog) add(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, b...)
	if l.writes == 0 {
		l.pending = bytes.TrimPrefix(l.pending, []byte(clientPreface))
	}
	for len(l.pending) >= 9 {
		n := int(l.pending[0])<<16 | int(l.pending[1])<<8 | int(l.pending[2])
		if len(l.pending) < 9+n {
			break
		}
		l.frames = append(l.frames, loggedFrame{write: l.writes, typ: l.pending[3], length: n})
		l.pending = l.pending[9+n:]
	}
	l.writes++
}

// dataFrames returns the lengths of the DATA frames logged from the
// frame numbered from on, and the most of them one write held.
func (l *frameLog) dataFrames(from int) (lengths []int, perWrite int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	inWrite := map[int]int{}
	for _, f := range l.frames[from:] {
		if f.typ == frameData && f.length > 0 {
			lengths = append(lengths, f.length)
			inWrite[f.write]++
			perWrite = max(perWrite, inWrite[f.write])
		}
	}
	return lengths, perWrite
}

func (l *frameLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.frames)
}

// sizePool is a mem.BufferPool that records the sizes asked of it.
type sizePool struct {
	mem.BufferPool
	mu    sync.Mutex // guards sizes
	sizes map[int]int
}

func (p *sizePool) Get(n int) *[]byte {
	p.mu.Lock()
	p.sizes[n]++
	p.mu.Unlock()
	return p.BufferPool.Get(n)
}

func (p *sizePool) got(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sizes[n]
}

// The padding (wire.go) is there for two behaviours of grpc-go's HTTP/2
// transport, which this test runs, on a Peer stream, to fail when either
// changes: its connection writer (loopyWriter.run in
// internal/transport/controlbuf.go) yields once before it writes less than
// minBatchSize (1000) bytes, so that a second message sent during the
// yield goes out in the same write, but not before it writes a padded
// message; and its reader (framer.readDataFrame in http_util.go) reads a
// padded message's DATA frame into a buffer of the pool, more than
// mem.IsBelowBufferPoolingThreshold.
//
// The yield is seen with one P: the sender yields between its two
// messages, so that the writer runs in between. Go's scheduler may run the
// sender first all the same (it takes from the global run queue first one
// time in 61), so a few trials may go either way.
func TestPaddingMatchesGrpc(t *testing.T) {
	pool := &sizePool{BufferPool: mem.DefaultBufferPool(), sizes: map[int]int{}}
	addr := serve(t, DefaultServerLimits(), func(s *grpc.Server) { RegisterPeer(s, &echoChecker{owner: "b"}) }, experimental.BufferPool(pool))
	var log frameLog
	conn := dial(t, addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(WindowSize), grpc.WithInitialConnWindowSize(WindowSize),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return loggingConn{Conn: c, log: &log}, nil
		}))
	client := pb.NewPeerClient(conn)
	r := RequestToProto(limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA})

	const trials = 100
	for _, tt := range []struct {
		name   string
		opts   []grpc.CallOption
		padded bool
	}{
		{"plain codec", nil, false},
		{"padded", CallOptions(), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := client.CheckStream(ctxT(t), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var seq uint64
			send := func() {
				seq++
				if err := stream.Send(&pb.PeerCheckRequest{From: "a", Seq: seq, Items: []*pb.RateLimitRequest{r}}); err != nil {
					t.Fatal(err)
				}
			}
			recv := func() {
				if _, err := stream.Recv(); err != nil {
					t.Fatal(err)
				}
			}
			send()
			recv()

			together := 0
			var lengths []int
			func() {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
				for range trials {
					from := log.len()
					send()
					runtime.Gosched()
					send()
					recv()
					recv()
					l, perWrite := log.dataFrames(from)
					lengths = append(lengths, l...)
					if perWrite > 1 {
						together++
					}
				}
			}()
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); err != io.EOF {
				t.Fatalf("stream ended with %v", err)
			}

			sizes := slices.Compact(slices.Sorted(slices.Values(lengths)))
			t.Logf("%d of %d pairs of messages written together; DATA frames of %v bytes", together, trials, sizes)
			switch {
			case !tt.padded && together < trials*3/4:
				t.Errorf("grpc-go wrote small messages one by one in %d of %d trials: its writer no longer waits for more before writing less than minBatchSize, and the padding (wire.go) may no longer pay", trials-together, trials)
			case tt.padded && together > trials/4:
				t.Errorf("grpc-go held %d of %d padded messages back for the next: padTo (wire.go) no longer reaches its writer's minBatchSize", together, trials)
			}
			for _, n := range sizes {
				if pooled := pool.got(n) > 0; pooled != tt.padded {
					t.Errorf("a DATA frame of %d bytes read into a pooled buffer: %v, want %v (padTo, wire.go, against mem.IsBelowBufferPoolingThreshold)", n, pooled, tt.padded)
				}
			}
		})
	}
}
