package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// daemonLimits are the limits the daemon gives a gRPC server by default
// (daemon.Config.GRPCMessageBudget): a budget of a quarter of its default
// memory_limit of 224 MiB, and a 64th of that, at least one call's, per
// connection.
func daemonLimits() ServerLimits {
	l := DefaultServerLimits()
	l.MessageBytes = 56 << 20
	l.ConnMessageBytes = max(l.MessageBytes/64, MessageReservation)
	return l
}

// busyClient is a hand-made HTTP/2 client whose unary calls, on one
// connection, send the 5-byte prefix of their message and stop until
// told to send the rest: so that the handlers of many calls have begun
// before their messages are in, as those of a busy client's calls do
// when the server falls behind.
type busyClient struct {
	t    *testing.T
	conn net.Conn
	msg  []byte // the message of every call

	mu      sync.Mutex // guards the writes to conn and the fields below
	data    map[uint32]bool
	outcome map[uint32]string // of each call ended: "" for OK, else why not
	done    chan struct{}
}

func newBusyClient(t *testing.T, addr string) *busyClient {
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	msg, err := proto.Marshal(&pb.PeerCheckRequest{From: "busy", Items: []*pb.RateLimitRequest{RequestToProto(r)}})
	if err != nil {
		t.Fatal(err)
	}
	open := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	// Room on the connection for every answer.
	open = appendFrame(open, frameWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, 1<<30))
	c := &busyClient{t: t, conn: dialRaw(t, addr, open), msg: msg,
		data: make(map[uint32]bool), outcome: make(map[uint32]string), done: make(chan struct{})}
	go c.read()
	t.Cleanup(func() {
		c.conn.Close()
		<-c.done
	})
	return c
}

func (c *busyClient) write(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Errorf("write: %v", err)
	}
}

// read reads what the server sends until the connection closes, answers
// its SETTINGS and PINGs, and records how each call ends.
func (c *busyClient) read() {
	defer close(c.done)
	var grpcStatus string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "grpc-status" {
			grpcStatus = f.Value
		}
	})
	for {
		f, err := readFrame(c.conn)
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f.typ {
		case frameSettings:
			if f.flags&flagAck == 0 {
				c.conn.Write(appendFrame(nil, frameSettings, flagAck, 0, nil))
			}
		case framePing:
			if f.flags&flagAck == 0 {
				c.conn.Write(appendFrame(nil, framePing, flagAck, 0, f.payload))
			}
		case frameData:
			c.data[f.stream] = true
		case frameHeaders:
			grpcStatus = ""
			if _, err := dec.Write(f.payload); err != nil {
				c.outcome[f.stream] = "headers: " + err.Error()
			} else if f.flags&flagEndStream != 0 {
				switch {
				case grpcStatus != strconv.Itoa(int(codes.OK)):
					c.outcome[f.stream] = "grpc-status " + grpcStatus
				case !c.data[f.stream]:
					c.outcome[f.stream] = "no answer"
				default:
					c.outcome[f.stream] = ""
				}
			}
		case frameRSTStream:
			if _, ok := c.outcome[f.stream]; !ok {
				c.outcome[f.stream] = "reset"
			}
		}
		c.mu.Unlock()
	}
}

func callID(i int) uint32 { return uint32(2*i + 1) }

// open opens calls from to to (excluded) of CheckBatch, each sending the
// prefix of its message.
func (c *busyClient) open(from, to int) {
	prefix := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(c.msg)))
	var b []byte
	for i := from; i < to; i++ {
		b = appendFrame(b, frameHeaders, flagEndHeaders, callID(i), grpcHeaders("/sluice.v1.Peer/CheckBatch"))
		b = appendFrame(b, frameData, 0, callID(i), prefix)
	}
	c.write(b)
}

// finish sends the rest of the message of calls 0 to n, and ends them.
func (c *busyClient) finish(n int) {
	var b []byte
	for i := range n {
		b = appendFrame(b, frameData, flagEndStream, callID(i), c.msg)
	}
	c.write(b)
}

// ended returns the outcomes of the calls ended.
func (c *busyClient) ended() map[uint32]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[uint32]string, len(c.outcome))
	for id, o := range c.outcome {
		m[id] = o
	}
	return m
}

// A busy client's one connection, with as many small unary calls open
// at once as it may have (256) or fewer, has every call answered and none
// refused, at the daemon's default budget, even with the handlers of many
// of them begun before their messages are in, each holding the rest of a
// whole message (1.4 MB: what gRPC may grow its window to), far past the
// connection's share (one such message). Half the calls open first, and
// wait for their messages; then the other half open, and the messages of
// all come.
func TestMessageBudgetServesABusyConnection(t *testing.T) {
	for _, n := range []int{64, 256} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const r, w = MessageReservation, StreamWindow
			addr, b, _ := budgetServer(t, daemonLimits())
			c := newBusyClient(t, addr)
			// Every call opened has begun: it holds a message, or waits
			// for room for one; or one was refused.
			begun := func(calls int64) func() bool {
				return func() bool {
					s := b.Stats()
					held := s.Reserved - calls*w
					return s.Refused > 0 || held >= 0 && held%(r-w) == 0 && held/(r-w)+s.Waiting == calls
				}
			}
			c.open(0, n/2)
			testwait.For(t, "the first calls to begin", begun(int64(n/2)))
			c.open(n/2, n)
			testwait.For(t, "every call to begin", begun(int64(n)))
			s := b.Stats()
			t.Logf("%d calls open: %d bytes reserved, %d waiting, %d refused", n, s.Reserved, s.Waiting, s.Refused)
			if s.Refused > 0 {
				t.Errorf("%d calls refused, want none (stats %+v)", s.Refused, s)
			}
			c.finish(n)
			testwait.For(t, "every call to end", func() bool { return len(c.ended()) == n })
			failed := make(map[string]int)
			for _, o := range c.ended() {
				if o != "" {
					failed[o]++
				}
			}
			if len(failed) > 0 {
				t.Errorf("of %d calls, failed: %v", n, failed)
			}
			testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
		})
	}
}

// A real client's bursts of small calls on one connection, 64 and 256 at
// once (the most a connection may have open), are all answered, none
// refused, at the daemon's default budget.
func TestMessageBudgetServesBurstsOnOneConnection(t *testing.T) {
	addr, b, _ := budgetServer(t, daemonLimits())
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	client := pb.NewPeerClient(conn)
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	req := &pb.PeerCheckRequest{From: "busy", Items: []*pb.RateLimitRequest{RequestToProto(r)}}
	for _, n := range []int{64, 256} {
		for round := range 10 {
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for range n {
				wg.Go(func() {
					_, err := client.CheckBatch(ctxT(t), req)
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			failed := make(map[codes.Code]int)
			for err := range errs {
				if err != nil {
					failed[status.Code(err)]++
				}
			}
			if len(failed) > 0 {
				t.Fatalf("%d at once, round %d: failed %v (stats %+v)", n, round, failed, b.Stats())
			}
		}
	}
	if s := b.Stats(); s.Refused != 0 {
		t.Errorf("stats %+v, want none refused", s)
	}
	testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
}

// At the daemon's default budget, where a busy connection's rests leave
// room for its windows, calls that send part of a message and stall
// still hold no more than before: at most half the budget, and past it
// each connection its share. A normal client is served meanwhile, and
// the budget empties once the stalled connections close.
func TestMessageBudgetBoundsStalledCallsAtTheDaemonDefault(t *testing.T) {
	const r, w = MessageReservation, StreamWindow
	l := daemonLimits()
	addr, b, _ := budgetServer(t, l)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	checkWorks(t, conn)
	const conns, each = 4, 64
	const calls = conns * each
	var attackers []net.Conn
	for range conns {
		attackers = append(attackers, stallCalls(t, addr, each, 60_000))
	}
	full := func(s MessageBudgetStats) int64 { return (s.Reserved - (calls-s.Refused)*w) / (r - w) }
	testwait.For(t, "every stalled call to hold a message, wait for room or be refused", func() bool {
		s := b.Stats()
		held := s.Reserved - (calls-s.Refused)*w
		return held >= 0 && held%(r-w) == 0 && full(s)+s.Waiting+s.Refused == calls
	})
	s := b.Stats()
	t.Logf("%d calls hold a message, %d wait, %d refused: %d bytes reserved", full(s), s.Waiting, s.Refused, s.Reserved)
	if most := l.MessageBytes/2 + conns*l.ConnMessageBytes; s.Reserved > most {
		t.Fatalf("%d bytes reserved, more than half the budget and %d shares (%d)", s.Reserved, conns, most)
	}
	checkWorks(t, conn)
	for _, c := range attackers {
		c.Close()
	}
	testwait.For(t, "the budget to empty", func() bool { s := b.Stats(); return s.Reserved == 0 && s.Waiting == 0 })
}
