package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testwait"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// fakeTimers holds the functions of MessageBudget.afterFunc until fire
// runs them.
type fakeTimers struct {
	mu      sync.Mutex // guards pending and next
	pending map[int]func()
	next    int
}

func (f *fakeTimers) after(_ time.Duration, fn func()) func() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending == nil {
		f.pending = make(map[int]func())
	}
	id := f.next
	f.next++
	f.pending[id] = fn
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.pending[id]
		delete(f.pending, id)
		return ok
	}
}

// fire runs every pending function, as if their time had come, and
// returns how many ran.
func (f *fakeTimers) fire() int {
	f.mu.Lock()
	fns := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
	return len(fns)
}

// budgetServer serves the Peer service with limits l and a message budget
// on fake timers.
func budgetServer(t *testing.T, l ServerLimits) (addr string, b *MessageBudget, timers *fakeTimers) {
	t.Helper()
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	timers = new(fakeTimers)
	b.afterFunc = timers.after
	addr = serveBudget(t, b, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}) })
	return addr, b, timers
}

// stallCalls opens a connection to addr with n CheckBatch calls, each
// sending the first part bytes of a message of MaxMessageSize bytes and
// nothing more, and returns it.
func stallCalls(t *testing.T, addr string, n, part int) net.Conn {
	t.Helper()
	b := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	body := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(MaxMessageSize)), make([]byte, part)...)
	for i := range n {
		id := uint32(2*i + 1)
		b = appendFrame(b, frameHeaders, flagEndHeaders, id, grpcHeaders("/sluice.v1.Peer/CheckBatch"))
		for rest := body; len(rest) > 0; {
			chunk := rest[:min(len(rest), 16384)] // the default SETTINGS_MAX_FRAME_SIZE
			rest = rest[len(chunk):]
			b = appendFrame(b, frameData, 0, id, chunk)
		}
	}
	return dialRaw(t, addr, b)
}

// awaitEnded reads c until each of the first n streams it opened has been
// reset or ended by the server.
func awaitEnded(t *testing.T, c net.Conn, n int) {
	t.Helper()
	ended := make(map[uint32]bool)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for len(ended) < n {
		f, err := readFrame(c)
		if err != nil {
			t.Fatalf("%d of %d streams ended: %v", len(ended), n, err)
		}
		if f.typ == frameRSTStream || (f.typ == frameHeaders && f.flags&flagEndStream != 0) {
			ended[f.stream] = true
		}
	}
}

// Calls that send most of a large message and stall hold no more than the
// budget: each connection takes up to half of it, then its share beyond
// half, its further calls refused with ResourceExhausted; once the budget
// is full every call is refused, a normal client's included. A normal
// client's calls succeed while there is room. After MessageTimeout every
// stalled call is reset and the budget is empty again.
func TestMessageBudgetBoundsUnfinishedMessages(t *testing.T) {
	const r = MessageReservation
	l := DefaultServerLimits()
	l.MessageBytes, l.ConnMessageBytes = 8*r, 2*r
	addr, b, timers := budgetServer(t, l)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	checkWorks(t, conn)

	var attackers []net.Conn
	for i, step := range []struct {
		calls int
		want  MessageBudgetStats // after this connection
	}{
		{calls: 5, want: MessageBudgetStats{Reserved: 4 * r, Refused: 1}}, // up to half
		{calls: 3, want: MessageBudgetStats{Reserved: 6 * r, Refused: 2}}, // its share beyond half
		{calls: 3, want: MessageBudgetStats{Reserved: 8 * r, Refused: 3}}, // the rest
		{calls: 2, want: MessageBudgetStats{Reserved: 8 * r, Refused: 6}}, // and the normal client's call
	} {
		attackers = append(attackers, stallCalls(t, addr, step.calls, 200_000))
		testwait.For(t, fmt.Sprintf("step %d: the calls to be reserved for or refused as %+v", i, step.want), func() bool {
			return b.Stats() == step.want
		})
		if s := b.Stats(); s.Reserved > l.MessageBytes {
			t.Fatalf("step %d: %d bytes reserved, more than the budget %d", i, s.Reserved, l.MessageBytes)
		}
		if step.want.Reserved < l.MessageBytes {
			checkWorks(t, conn)
			continue
		}
		if i == 2 {
			_, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{})
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "budget") {
				t.Fatalf("step %d: a call with the budget full: %v, want ResourceExhausted naming the budget", i, err)
			}
		}
	}
	for i, c := range attackers {
		awaitEnded(t, c, []int{1, 1, 1, 2}[i]) // the refused calls
	}

	// Their time is up: every stalled call is reset.
	if n := timers.fire(); n != 8 {
		t.Fatalf("%d timers pending, want one per stalled call (8)", n)
	}
	for i, c := range attackers[:3] {
		awaitEnded(t, c, []int{4, 2, 2}[i])
	}
	testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
	if s := b.Stats(); s.TimedOut != 8 {
		t.Errorf("%d calls timed out, want 8", s.TimedOut)
	}
	checkWorks(t, conn)
}

// A stream keeps its reservation while it is open, and once its first
// message is in, no deadline cuts it however long it waits for the next.
// A stream whose first message does not come is reset.
func TestMessageBudgetKeepsStreams(t *testing.T) {
	const r = MessageReservation
	addr, b, timers := budgetServer(t, DefaultServerLimits())
	p := newRawPeer(t, addr)
	p.send(1)
	if seq := p.answer(); seq != 1 {
		t.Fatalf("answer to batch %d, want 1", seq)
	}
	if n := timers.fire(); n != 0 {
		t.Fatalf("%d timers pending after the first message", n)
	}
	if got := b.Stats().Reserved; got != r {
		t.Fatalf("%d bytes reserved for an open stream, want %d", got, r)
	}
	p.send(2)
	if seq := p.answer(); seq != 2 {
		t.Fatalf("answer to batch %d, want 2", seq)
	}

	q := newRawPeer(t, addr)
	testwait.For(t, "the silent stream to be reserved for", func() bool { return b.Stats().Reserved == 2*r })
	if n := timers.fire(); n != 1 {
		t.Fatalf("%d timers pending, want the silent stream's", n)
	}
	q.await(func() bool { return q.ended != "" }, nil)
	testwait.For(t, "the silent stream's reservation to be freed", func() bool { return b.Stats().Reserved == r })
	if s := b.Stats(); s.TimedOut != 1 || s.Refused != 0 {
		t.Errorf("stats %+v, want 1 timed out and none refused", s)
	}
	p.send(3)
	if seq := p.answer(); seq != 3 {
		t.Fatalf("answer to batch %d, want 3", seq)
	}
}

// Many small calls at once on one connection, as a busy client makes,
// are all served while their reservations fit in half the budget (90
// calls with the defaults): each gives its reservation back as soon as
// its message is in. A burst of more may see some refused with
// ResourceExhausted when the server falls behind reading them; every
// call is answered either way.
func TestMessageBudgetServesConcurrentCalls(t *testing.T) {
	l := DefaultServerLimits()
	addr, b, _ := budgetServer(t, l)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	client := pb.NewPeerClient(conn)
	burst := func(calls int) (failed map[codes.Code]int) {
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for range calls {
			wg.Go(func() {
				_, err := client.CheckBatch(ctxT(t), &pb.PeerCheckRequest{})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		failed = make(map[codes.Code]int)
		for err := range errs {
			if err != nil {
				failed[status.Code(err)]++
			}
		}
		return failed
	}
	within := int(l.MessageBytes / 2 / MessageReservation)
	for round := range 5 {
		if failed := burst(within); len(failed) > 0 {
			t.Fatalf("round %d: of %d calls at once, failed: %v (stats %+v)", round, within, failed, b.Stats())
		}
	}
	failed := burst(1000)
	t.Logf("1000 calls at once: refused %d (stats %+v)", failed[codes.ResourceExhausted], b.Stats())
	if len(failed) > 1 || len(failed) == 1 && failed[codes.ResourceExhausted] == 0 {
		t.Fatalf("of 1000 calls at once, failed: %v, want ResourceExhausted or none", failed)
	}
	testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
}
