package transport

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func TestServerLimitsValidate(t *testing.T) {
	if err := DefaultServerLimits().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tt := range []struct {
		field string
		mut   func(*ServerLimits)
	}{
		{"MaxConnections", func(l *ServerLimits) { l.MaxConnections = 0 }},
		{"HandshakeTimeout", func(l *ServerLimits) { l.HandshakeTimeout = 0 }},
		{"MaxConnectionIdle", func(l *ServerLimits) { l.MaxConnectionIdle = -time.Second }},
		{"KeepaliveTime", func(l *ServerLimits) { l.KeepaliveTime = 999 * time.Millisecond }},
		{"KeepaliveTimeout", func(l *ServerLimits) { l.KeepaliveTimeout = 0 }},
		{"MinPingInterval", func(l *ServerLimits) { l.MinPingInterval = 0 }},
		{"MinPingInterval", func(l *ServerLimits) { l.MinPingInterval = PeerKeepalive().Time + 1 }},
		{"MaxConcurrentStreams", func(l *ServerLimits) { l.MaxConcurrentStreams = 0 }},
		{"ConnMessageBytes", func(l *ServerLimits) { l.ConnMessageBytes = MaxMessageSize }},
		{"MessageBytes", func(l *ServerLimits) { l.MessageBytes = l.ConnMessageBytes - 1 }},
		{"MessageTimeout", func(l *ServerLimits) { l.MessageTimeout = 0 }},
	} {
		l := DefaultServerLimits()
		tt.mut(&l)
		err := l.Validate()
		if !errors.Is(err, ErrInvalidServerLimits) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: %v, want ErrInvalidServerLimits naming it", tt.field, err)
		}
		if _, err := l.ServerOptions(); !errors.Is(err, ErrInvalidServerLimits) {
			t.Errorf("%s: ServerOptions: %v", tt.field, err)
		}
		if _, err := NewMessageBudget(l); !errors.Is(err, ErrInvalidServerLimits) {
			t.Errorf("%s: NewMessageBudget: %v", tt.field, err)
		}
		if _, err := l.Listen("tcp", "127.0.0.1:0"); !errors.Is(err, ErrInvalidServerLimits) {
			t.Errorf("%s: Listen: %v", tt.field, err)
		}
	}
	// Peers' pings pass the defaults, with room for jitter.
	if k := PeerKeepalive(); k.PermitWithoutStream || k.Time < 2*DefaultServerLimits().MinPingInterval {
		t.Errorf("PeerKeepalive %+v against MinPingInterval %v", k, DefaultServerLimits().MinPingInterval)
	}
}

// What raw HTTP/2 clients send and read.
const (
	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8

	flagAck        = 0x1 // SETTINGS, PING
	flagEndStream  = 0x1 // DATA, HEADERS
	flagEndHeaders = 0x4

	settingMaxConcurrentStreams = 0x3
)

type h2Frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

func appendFrame(b []byte, typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}

func readFrame(r io.Reader) (h2Frame, error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return h2Frame{}, err
	}
	f := h2Frame{typ: h[3], flags: h[4], stream: binary.BigEndian.Uint32(h[5:]) & 0x7fffffff}
	f.payload = make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
	_, err := io.ReadFull(r, f.payload)
	return f, err
}

// dialRaw opens a TCP connection to addr, closed at the end of the test,
// and writes send on it.
func dialRaw(t *testing.T, addr string, send []byte) net.Conn {
	t.Helper()
	c, err := tryRaw(t, addr, send)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tryRaw is dialRaw returning its error: a server that closes connections
// at once may reset one before it is fully open.
func tryRaw(t *testing.T, addr string, send []byte) (net.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Write(send)
	return c, err
}

// served reports whether the server serves a new connection to addr: it
// sends its SETTINGS first, or it closes the connection without a frame.
func served(t *testing.T, addr string, send []byte) bool {
	t.Helper()
	c, err := tryRaw(t, addr, send)
	if err != nil {
		return false
	}
	_, ok := firstSettings(t, c)
	return ok
}

// waitClosed reads c until the server closes it, and fails the test if
// that takes more than 30 seconds.
func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, err := readFrame(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection from %s still open", c.LocalAddr())
		}
		if err != nil {
			return
		}
	}
}

// firstSettings returns the SETTINGS frame the server sends first on c,
// or false when the server closes c without a frame.
func firstSettings(t *testing.T, c net.Conn) (h2Frame, bool) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := readFrame(c)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("connection from %s: no frame, and not closed", c.LocalAddr())
	case err != nil:
		return h2Frame{}, false
	case f.typ != frameSettings:
		t.Fatalf("first frame of type %d, want SETTINGS", f.typ)
	}
	c.SetReadDeadline(time.Time{})
	return f, true
}

// checkWorks makes a call on conn, which must succeed.
func checkWorks(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	if _, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{}); err != nil {
		t.Fatalf("a normal client's call: %v", err)
	}
}

// Connections that send nothing, only the HTTP/2 preface, or the preface
// and SETTINGS and nothing more, are closed: by the handshake timeout, or,
// once established, by the idle limit or keepalive. A normal client keeps
// working meanwhile.
func TestSilentConnectionsAreClosed(t *testing.T) {
	fast := DefaultServerLimits()
	fast.HandshakeTimeout = 200 * time.Millisecond
	idle, keepalive := fast, fast
	idle.MaxConnectionIdle = 200 * time.Millisecond // then GOAWAY, and a close within 5s
	keepalive.KeepaliveTime, keepalive.KeepaliveTimeout = time.Second, 200*time.Millisecond
	settings := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	for name, l := range map[string]ServerLimits{"idle limit": idle, "keepalive": keepalive} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := serve(t, l, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}) })
			conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			checkWorks(t, conn)
			var raw []net.Conn
			for range 10 {
				raw = append(raw,
					dialRaw(t, addr, nil),
					dialRaw(t, addr, []byte(clientPreface)),
					dialRaw(t, addr, settings))
			}
			for _, c := range raw {
				waitClosed(t, c)
				checkWorks(t, conn)
			}
		})
	}
}

// Connections beyond MaxConnections are closed at once, without a frame;
// those within it, and a normal client's, are served, and a slot freed is
// taken again.
func TestConnectionsBeyondTheCapAreClosed(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxConnections = 4
	l.MaxConcurrentStreams = 7
	addr := serve(t, l, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}) })
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	checkWorks(t, conn) // one connection
	settings := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	var held []net.Conn
	for range l.MaxConnections - 1 {
		c := dialRaw(t, addr, settings)
		f, ok := firstSettings(t, c)
		if !ok {
			t.Fatalf("connection %d of %d not served", len(held)+2, l.MaxConnections)
		}
		if got := settingValue(f, settingMaxConcurrentStreams); got != l.MaxConcurrentStreams {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", got, l.MaxConcurrentStreams)
		}
		held = append(held, c)
	}
	for range 3 {
		if served(t, addr, settings) {
			t.Fatal("a connection beyond the cap was served")
		}
		checkWorks(t, conn)
	}
	held[0].Close()
	testwait.ForTimeout(t, 30*time.Second, "the slot of a closed connection to be given back", func() bool {
		return served(t, addr, settings)
	})
	checkWorks(t, conn)
}

// settingValue returns the value of setting id in a SETTINGS frame, or 0.
func settingValue(f h2Frame, id uint16) uint32 {
	for p := f.payload; len(p) >= 6; p = p[6:] {
		if binary.BigEndian.Uint16(p) == id {
			return binary.BigEndian.Uint32(p[2:])
		}
	}
	return 0
}

// grpcHeaders returns the HPACK block of a gRPC call of method path.
func grpcHeaders(path string) []byte {
	var headers []byte
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", path},
		{":authority", "sluice"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		// A literal field without indexing, with a new name; no Huffman.
		headers = append(headers, 0x00, byte(len(h[0])))
		headers = append(headers, h[0]...)
		headers = append(headers, byte(len(h[1])))
		headers = append(headers, h[1]...)
	}
	return headers
}

// rawPeer is a hand-made HTTP/2 client with one CheckStream open (stream
// 1), so that a test controls its pings.
type rawPeer struct {
	t      *testing.T
	conn   net.Conn
	frames chan h2Frame // closed when the connection ends
	done   chan struct{}

	serverPings, pingAcks int
	goAway                []byte // the debug data of a GOAWAY received
	ended                 string // why stream 1 or the connection ended
	data                  []byte // what stream 1 has received and not yet read
}

func newRawPeer(t *testing.T, addr string) *rawPeer {
	p := &rawPeer{t: t, frames: make(chan h2Frame), done: make(chan struct{})}
	open := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	open = appendFrame(open, frameHeaders, flagEndHeaders, 1, grpcHeaders("/sluice.v1.Peer/CheckStream"))
	p.conn = dialRaw(t, addr, open)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(p.frames)
		for {
			f, err := readFrame(p.conn)
			if err != nil {
				return
			}
			select {
			case p.frames <- f:
			case <-p.done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(p.done)
		p.conn.Close()
		wg.Wait()
	})
	return p
}

func (p *rawPeer) write(typ, flags byte, stream uint32, payload []byte) {
	p.t.Helper()
	if _, err := p.conn.Write(appendFrame(nil, typ, flags, stream, payload)); err != nil {
		p.t.Fatalf("write: %v", err)
	}
}

// handle answers f as a client does, and records what it says.
func (p *rawPeer) handle(f h2Frame) {
	switch {
	case f.typ == frameSettings && f.flags&flagAck == 0:
		p.write(frameSettings, flagAck, 0, nil)
	case f.typ == framePing && f.flags&flagAck == 0:
		p.serverPings++
		p.write(framePing, flagAck, 0, f.payload)
	case f.typ == framePing:
		p.pingAcks++
	case f.typ == frameData && f.stream == 1:
		p.data = append(p.data, f.payload...)
		if n := uint32(len(f.payload)); n > 0 {
			p.write(frameWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, n))
			p.write(frameWindowUpdate, 0, 1, binary.BigEndian.AppendUint32(nil, n))
		}
		if f.flags&flagEndStream != 0 {
			p.ended = "the server ended the stream"
		}
	case f.typ == frameHeaders && f.stream == 1 && f.flags&flagEndStream != 0:
		p.ended = "the server ended the stream"
	case f.typ == frameRSTStream:
		p.ended = "the server reset the stream"
	case f.typ == frameGoAway:
		p.goAway = append([]byte{}, f.payload[min(8, len(f.payload)):]...)
		p.ended = "GOAWAY " + string(p.goAway)
	}
}

// await handles frames until cond holds, or until wake fires when it is
// not nil. It fails the test when the stream or the connection ends first
// (unless cond holds then), or after 30 seconds.
func (p *rawPeer) await(cond func() bool, wake <-chan time.Time) {
	p.t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for !cond() {
		if p.ended != "" {
			p.t.Fatalf("%s", p.ended)
		}
		select {
		case f, ok := <-p.frames:
			if !ok {
				p.ended = "the server closed the connection"
				continue
			}
			p.handle(f)
		case <-wake:
			return
		case <-deadline.C:
			p.t.Fatal("no progress in 30s")
		}
	}
}

// send sends batch seq on the stream.
func (p *rawPeer) send(seq uint64) {
	p.t.Helper()
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	b, err := proto.Marshal(&pb.PeerCheckRequest{From: "raw", Seq: seq, Items: []*pb.RateLimitRequest{RequestToProto(r)}})
	if err != nil {
		p.t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	p.write(frameData, 0, 1, append(msg, b...))
}

// answer returns the seq of the next answer on the stream.
func (p *rawPeer) answer() uint64 {
	p.t.Helper()
	complete := func() bool { return len(p.data) >= 5 && len(p.data) >= 5+int(binary.BigEndian.Uint32(p.data[1:])) }
	p.await(complete, nil)
	n := 5 + int(binary.BigEndian.Uint32(p.data[1:]))
	var m pb.PeerCheckResponse
	if err := proto.Unmarshal(p.data[5:n], &m); err != nil {
		p.t.Fatal(err)
	}
	p.data = p.data[n:]
	if len(m.Items) != 1 || m.Items[0].ErrorCode != pb.ErrorCode_ERROR_CODE_NONE {
		p.t.Fatalf("answer %v", &m)
	}
	return m.Seq
}

// A peer stream outlives the idle limit and the server's keepalive pings,
// and pings as often as MinPingInterval allows do not cut it; pings more
// often do.
func TestPeerStreamKeepsItsConnection(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxConnectionIdle = 100 * time.Millisecond
	l.KeepaliveTime, l.KeepaliveTimeout = time.Second, 10*time.Second
	l.MinPingInterval = 50 * time.Millisecond
	addr := serve(t, l, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{owner: "b"}) })

	p := newRawPeer(t, addr)
	p.send(1)
	if seq := p.answer(); seq != 1 {
		t.Fatalf("answer to batch %d, want 1", seq)
	}
	// Quiet: the server pings (after KeepaliveTime without a frame), the
	// client answers; many idle limits go by.
	p.await(func() bool { return p.serverPings >= 2 }, nil)
	// The client pings, each ping at least twice MinPingInterval after
	// the previous one's answer.
	for i := range 5 {
		p.write(framePing, 0, 0, make([]byte, 8))
		p.await(func() bool { return p.pingAcks > i }, nil)
		pace := time.NewTimer(2 * l.MinPingInterval)
		p.await(func() bool { return false }, pace.C)
	}
	p.send(2)
	if seq := p.answer(); seq != 2 {
		t.Fatalf("answer to batch %d, want 2", seq)
	}

	// Pings back to back, with nothing else sent, break the policy.
	q := newRawPeer(t, addr)
	q.send(1)
	q.answer()
	for range 5 {
		q.write(framePing, 0, 0, make([]byte, 8))
	}
	q.await(func() bool { return q.goAway != nil }, nil)
	if string(q.goAway) != "too_many_pings" {
		t.Fatalf("GOAWAY %q, want too_many_pings", q.goAway)
	}
}
