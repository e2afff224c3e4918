package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/internal/testwait"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// fakeTimers holds the functions of MessageBudget.afterFunc until fire
// runs them, on a clock of its own (MessageBudget.now) that stands still
// until then.
type fakeTimers struct {
	mu      sync.Mutex // guards pending, next and clock
	pending map[int]fakeTimer
	next    int
	clock   time.Time
}

type fakeTimer struct {
	due time.Time
	fn  func()
}

func (f *fakeTimers) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clock
}

func (f *fakeTimers) after(d time.Duration, fn func()) func() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending == nil {
		f.pending = make(map[int]fakeTimer)
	}
	id := f.next
	f.next++
	f.pending[id] = fakeTimer{due: f.clock.Add(d), fn: fn}
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.pending[id]
		delete(f.pending, id)
		return ok
	}
}

// fire moves the clock to the time of the last pending function and
// runs every pending one, as if their time had come; it returns how many
// ran.
func (f *fakeTimers) fire() int {
	f.mu.Lock()
	fns := f.pending
	f.pending = nil
	for _, t := range fns {
		if t.due.After(f.clock) {
			f.clock = t.due
		}
	}
	f.mu.Unlock()
	for _, t := range fns {
		t.fn()
	}
	return len(fns)
}

// advance moves the clock d on, running nothing.
func (f *fakeTimers) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock = f.clock.Add(d)
}

// install makes f b's timers and clock.
func (f *fakeTimers) install(b *MessageBudget) {
	b.afterFunc, b.now = f.after, f.now
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
	timers.install(b)
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

// Calls that send the start of a large message and stall hold no more
// than the budget: each holds its stream window from when it opens, and
// the rest of a whole message once its handler begins, while there is
// room; the others wait for room holding only their stream window, or
// are refused when even that does not fit. A
// normal client's connection, within its share, is served meanwhile.
// After MessageTimeout every stalled call is reset and
// the budget is empty again. A call that finds no room even for its
// stream window is refused.
func TestMessageBudgetBoundsUnfinishedMessages(t *testing.T) {
	const r, w = MessageReservation, StreamWindow
	l := DefaultServerLimits()
	l.MessageBytes, l.ConnMessageBytes = 8*r, 2*r
	addr, b, timers := budgetServer(t, l)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	checkWorks(t, conn)

	// 3 connections of 5 calls, each sending 60,000 bytes of a message
	// that announces MaxMessageSize, within its stream window. Past half
	// the budget each connection holds at most its share, so 3 of them
	// leave room for another (4 could fill it).
	const calls = 15
	var attackers []net.Conn
	for range 3 {
		attackers = append(attackers, stallCalls(t, addr, 5, 60_000))
	}
	// What each call holds: its window, and the rest of a message when
	// its handler found room; a call refused holds nothing.
	full := func(s MessageBudgetStats) int64 { return (s.Reserved - (calls-s.Refused)*w) / (r - w) }
	testwait.For(t, "every stalled call to hold a message, wait for room or be refused", func() bool {
		s := b.Stats()
		held := s.Reserved - (calls-s.Refused)*w
		return held >= 0 && held%(r-w) == 0 && full(s)+s.Waiting+s.Refused == calls
	})
	s := b.Stats()
	if s.Reserved > l.MessageBytes || s.Waiting == 0 {
		t.Fatalf("stats %+v: want at most %d bytes reserved, and some calls waiting", s, l.MessageBytes)
	}
	t.Logf("%d calls hold a message, %d wait, %d refused: %d bytes reserved", full(s), s.Waiting, s.Refused, s.Reserved)

	// A normal client's connection holds none of it: within its share,
	// its calls are served at once.
	checkWorks(t, conn)
	for _, c := range attackers {
		c.Close()
	}
	testwait.For(t, "the budget to empty", func() bool { s := b.Stats(); return s.Reserved == 0 && s.Waiting == 0 })

	// Stalled calls whose time is up are reset, and give back what they
	// held.
	c := stallCalls(t, addr, 3, 60_000)
	testwait.For(t, "3 stalled calls to hold their messages", func() bool { return b.Stats().Reserved == 3*r })
	if n := timers.fire(); n != 1 {
		t.Fatalf("%d timers pending, want one for all the stalled calls", n)
	}
	awaitEnded(t, c, 3)
	testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
	if s := b.Stats(); s.TimedOut != 3 {
		t.Errorf("%d calls timed out, want 3", s.TimedOut)
	}

	// With room for fewer stream windows than calls, the rest are
	// refused, and what is reserved stays within the budget.
	small := l
	small.MessageBytes, small.ConnMessageBytes = r, r
	addr2, b2, _ := budgetServer(t, small)
	c2 := stallCalls(t, addr2, 40, 1000)
	testwait.For(t, "calls beyond the room for their windows to be refused", func() bool { return b2.Stats().Refused > 0 })
	if s := b2.Stats(); s.Reserved > small.MessageBytes {
		t.Fatalf("%d bytes reserved, more than the budget %d", s.Reserved, small.MessageBytes)
	}
	c2.Close()
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
	timers.fire() // the stream's first message is in: no deadline left
	if s := b.Stats(); s.TimedOut != 0 {
		t.Fatalf("%d calls timed out after their first message", s.TimedOut)
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
		t.Fatalf("%d timers pending, want one for the silent stream", n)
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
// are all served, none refused: each gives its reservation back as soon as
// its message is in, and the reservations of those whose handlers have
// begun leave room in the first half of the budget for the windows of the
// calls the connection opens next (see roomForRest), however many of the
// 1000 the client has open at once.
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
	if failed := burst(1000); len(failed) > 0 {
		t.Fatalf("of 1000 calls at once, failed: %v (stats %+v)", failed, b.Stats())
	}
	if s := b.Stats(); s.Refused != 0 {
		t.Fatalf("stats %+v, want none refused", s)
	}
	testwait.For(t, "the budget to empty", func() bool { return b.Stats().Reserved == 0 })
}

// One timer serves every call awaiting its first message: each is timed
// out at its own deadline, the later ones at a later sweep, and a call
// whose message came in is never timed out.
func TestMessageBudgetTimesOutEachCallAtItsDeadline(t *testing.T) {
	l := DefaultServerLimits()
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	timers := new(fakeTimers)
	timers.install(b)
	conn := b.TagConn(context.Background(), nil)
	open := func() *budgetCall {
		ctx, err := b.tap(conn, &tap.Info{FullMethodName: "/test.S/M"})
		if err != nil {
			t.Fatal(err)
		}
		return ctx.(*budgetCall)
	}
	first := open()
	timers.advance(l.MessageTimeout / 2)
	second, served := open(), open()
	b.HandleRPC(served, &stats.InPayload{}) // its message is in
	if s := b.Stats(); s.Reserved != 2*StreamWindow {
		t.Fatalf("%d bytes reserved, want two stream windows", s.Reserved)
	}

	if n := timers.fire(); n != 1 {
		t.Fatalf("%d timers pending, want one", n)
	}
	if !errors.Is(context.Cause(first), ErrMessageTimeout) || second.Err() != nil || served.Err() != nil {
		t.Fatalf("after the first deadline: causes %v, %v, %v; want only the first call timed out",
			context.Cause(first), context.Cause(second), context.Cause(served))
	}
	if s := b.Stats(); s.TimedOut != 1 || s.Reserved != StreamWindow {
		t.Fatalf("stats %+v, want 1 timed out and one stream window reserved", s)
	}

	if n := timers.fire(); n != 1 {
		t.Fatalf("%d timers pending, want one for the second call", n)
	}
	if !errors.Is(context.Cause(second), ErrMessageTimeout) || served.Err() != nil {
		t.Fatalf("after the second deadline: causes %v, %v; want the second call timed out", context.Cause(second), context.Cause(served))
	}
	if s := b.Stats(); s.TimedOut != 2 || s.Reserved != 0 {
		t.Fatalf("stats %+v, want 2 timed out and nothing reserved", s)
	}
	if n := timers.fire(); n != 0 {
		t.Fatalf("%d timers pending with no call awaited", n)
	}
	b.HandleRPC(served, &stats.End{})
}
