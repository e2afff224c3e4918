package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The h2 load generator speaks gRPC to ShouldRateLimit on HTTP/2 frames
// itself (x/net's Framer and hpack), so that the load generator, which
// shares the machine with the servers it measures, spends little of it:
// request bodies and the request header block are encoded once, the frames
// of concurrent calls go out together in one write, and one reader per
// connection hands each answer to its caller. It keeps to what any gRPC
// client must: the server's SETTINGS (concurrent streams, initial window,
// frame size), flow control both ways, PINGs answered, and every answer
// checked (:status 200, a gRPC content type, grpc-status 0, and an overall
// code of OK or OVER_LIMIT).

// rlsMethod is the path of Envoy's ShouldRateLimit.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

const (
	// h2ConnWindow is the connection receive window the client gives
	// the server; it gives the received bytes back once a quarter of it
	// is used.
	h2ConnWindow = 1 << 20
	// h2StreamWindow is HTTP/2's initial stream window, which the client
	// keeps (it sends no SETTINGS_INITIAL_WINDOW_SIZE).
	h2StreamWindow = 65535
	// h2CallTimeout fails a call not answered in that time (the
	// request's grpc-timeout says as much to the server).
	h2CallTimeout = 5 * time.Second
)

// rlsBodies returns the gRPC messages (length-prefixed protobuf) of
// RateLimitRequest{domain, one descriptor {key: values[i]}, hits_addend 1}
// for each value.
func rlsBodies(domain, key string, values []string) ([][]byte, error) {
	bodies := make([][]byte, len(values))
	for i, v := range values {
		pb, err := proto.MarshalOptions{Deterministic: true}.Marshal(rlsRequestOf(domain, key, v))
		if err != nil {
			return nil, err
		}
		b := make([]byte, 5+len(pb))
		binary.BigEndian.PutUint32(b[1:5], uint32(len(pb)))
		copy(b[5:], pb)
		bodies[i] = b
	}
	return bodies, nil
}

// rlsRequestOf is the request both load generators send for value.
func rlsRequestOf(domain, key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		}},
		HitsAddend: 1,
	}
}

// overallCode reads overall_code (field 1) of a RateLimitResponse
// without unmarshalling the rest; an absent field is UNKNOWN.
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	code := rlsv3.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			code, b = rlsv3.RateLimitResponse_Code(int32(v)), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return code, nil
}

// h2Client calls ShouldRateLimit on conns HTTP/2 connections to one
// server. Safe for concurrent use.
type h2Client struct {
	conns []*h2Conn
}

// dialH2 opens conns connections to addr, each once the server's first
// SETTINGS are in.
func dialH2(addr string, conns int) (*h2Client, error) {
	c := &h2Client{}
	for range conns {
		cc, err := dialH2Conn(addr)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.conns = append(c.conns, cc)
	}
	return c, nil
}

// call sends body (one of rlsBodies) on connection i mod conns and
// returns the answer's overall code: OK or OVER_LIMIT, or an error (a gRPC
// status error when the server answered one).
func (c *h2Client) call(i int, body []byte) (rlsv3.RateLimitResponse_Code, error) {
	return c.conns[i%len(c.conns)].roundTrip(body)
}

// Close closes every connection and waits for their goroutines.
func (c *h2Client) Close() {
	for _, cc := range c.conns {
		cc.Close()
	}
}

// h2Stream is one call. Its fields after done are the caller's; before,
// they are guarded by the connection's mu.
type h2Stream struct {
	id         uint32
	sendWindow int64
	deadline   time.Time
	gotHeaders bool
	body       []byte
	unacked    int // bytes of DATA received and not given back in a WINDOW_UPDATE

	code rlsv3.RateLimitResponse_Code
	err  error
	done chan struct{} // receives once, when the call has its code or error
}

var h2Streams = sync.Pool{New: func() any { return &h2Stream{done: make(chan struct{}, 1)} }}

// h2Block is what the hpack decoder found in one header block; the
// reader's alone.
type h2Block struct {
	streamID   uint32
	endStream  bool
	status     string
	sawStatus  bool
	grpcType   bool
	grpcStatus string
	sawGRPC    bool
	grpcMsg    string
}

// h2Conn is one HTTP/2 connection of an h2Client.
type h2Conn struct {
	nc      net.Conn
	fr      *http2.Framer // writes under mu, reads by the reader
	dec     *hpack.Decoder
	block   h2Block // what dec emits into: the reader's
	first   []byte  // the request header block that fills the dynamic table, for the first request
	headers []byte  // the request header block of the others
	stop    chan struct{}
	wg      sync.WaitGroup

	mu         sync.Mutex // guards the fields below, the frames written and every open stream
	cond       sync.Cond  // signalled when a stream ends, a window grows or the connection fails
	pending    []byte     // frames written and not yet sent
	spare      []byte
	writing    bool // a goroutine is sending pending
	sentFirst  bool
	nextID     uint32
	streams    map[uint32]*h2Stream
	maxStreams uint32
	peerWindow int64 // the server's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   int   // the server's SETTINGS_MAX_FRAME_SIZE
	// headerTable is the server's SETTINGS_HEADER_TABLE_SIZE, the
	// most the request header blocks may keep in its dynamic table.
	headerTable uint32
	sendWindow  int64 // the connection's send window
	recvUsed    int   // connection receive window used and not given back
	lastID      uint32
	err         error // once set, every call fails with it
	closed      bool
}

// pendingWriter is the Framer's writer: frames accumulate in pending,
// under mu, until flushLocked sends them.
type pendingWriter struct{ c *h2Conn }

func (w pendingWriter) Write(p []byte) (int, error) {
	w.c.pending = append(w.c.pending, p...)
	return len(p), nil
}

var errH2Closed = status.Error(codes.Canceled, "h2: connection closed")

func dialH2Conn(addr string) (*h2Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &h2Conn{nc: nc, stop: make(chan struct{}), nextID: 1, streams: make(map[uint32]*h2Stream),
		maxStreams: ^uint32(0), peerWindow: h2StreamWindow, maxFrame: 16384, headerTable: 4096, sendWindow: 65535, lastID: ^uint32(0)}
	c.cond.L = &c.mu
	c.fr = http2.NewFramer(pendingWriter{c}, bufio.NewReaderSize(nc, 64<<10))
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384)
	c.dec = hpack.NewDecoder(4096, c.emit)
	c.dec.SetMaxStringLength(16 << 10)
	fail := func(err error) (*h2Conn, error) {
		nc.Close()
		return nil, fmt.Errorf("h2 %s: %w", addr, err)
	}

	c.pending = append(c.pending, http2.ClientPreface...)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	c.fr.WriteWindowUpdate(0, h2ConnWindow-65535)
	if _, err := nc.Write(c.pending); err != nil {
		return fail(err)
	}
	c.pending = c.pending[:0]
	// The server's SETTINGS come first; the calls start under them.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := c.fr.ReadFrame()
	if err != nil {
		return fail(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return fail(fmt.Errorf("first frame %v, want SETTINGS", f.Header()))
	}
	nc.SetReadDeadline(time.Time{})
	c.mu.Lock()
	err = c.settingsLocked(sf)
	c.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	if c.first, c.headers, err = requestHeaderBlocks(addr, c.headerTable); err != nil {
		return fail(err)
	}
	c.wg.Add(2)
	go c.read()
	go c.watch()
	return c, nil
}

// requestHeaderBlocks returns the HPACK blocks of the request headers:
// the first adds every field to the dynamic table (of the server's
// tableSize at most), and the rest, the same for every request after it,
// refers to them, as the encoders of Envoy and grpc-go do. A field too
// big for the table is sent as a literal each time.
func requestHeaderBlocks(authority string, tableSize uint32) (first, rest []byte, err error) {
	var buf []byte
	enc := hpack.NewEncoder(writerFunc(func(p []byte) (int, error) {
		buf = append(buf, p...)
		return len(p), nil
	}))
	enc.SetMaxDynamicTableSizeLimit(tableSize)
	encode := func() []byte {
		buf = nil
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"},
			{Name: ":scheme", Value: "http"},
			{Name: ":path", Value: rlsMethod},
			{Name: ":authority", Value: authority},
			{Name: "content-type", Value: "application/grpc"},
			{Name: "te", Value: "trailers"},
			{Name: "grpc-timeout", Value: strconv.FormatInt(h2CallTimeout.Milliseconds(), 10) + "m"},
			{Name: "user-agent", Value: "sluice-bench-h2"},
		} {
			enc.WriteField(f)
		}
		return buf
	}
	first, rest = encode(), encode()
	if !bytes.Equal(rest, encode()) {
		return nil, nil, errors.New("the request header block changes from request to request")
	}
	return first, rest, nil
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// roundTrip sends body on a new stream and waits for its answer.
func (c *h2Conn) roundTrip(body []byte) (rlsv3.RateLimitResponse_Code, error) {
	s := h2Streams.Get().(*h2Stream)
	defer h2Streams.Put(s)
	c.mu.Lock()
	for c.err == nil && uint32(len(c.streams)) >= c.maxStreams {
		c.cond.Wait()
	}
	if c.err == nil && c.nextID > c.lastID {
		c.err = status.Error(codes.Unavailable, "h2: the server sent GOAWAY")
	}
	if c.err == nil && c.nextID >= 1<<31 {
		c.err = status.Error(codes.Unavailable, "h2: stream ids used up")
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	s.id, s.sendWindow, s.deadline = c.nextID, c.peerWindow, time.Now().Add(h2CallTimeout)
	s.gotHeaders, s.body, s.unacked, s.code, s.err = false, s.body[:0], 0, 0, nil
	c.nextID += 2
	c.streams[s.id] = s
	block := c.headers
	if !c.sentFirst {
		block, c.sentFirst = c.first, true
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: block, EndHeaders: true})
	for rest := body; len(rest) > 0 && c.streams[s.id] == s; {
		n := min(int64(len(rest)), c.sendWindow, s.sendWindow, int64(c.maxFrame))
		if n <= 0 {
			c.flushLocked()
			c.cond.Wait()
			continue
		}
		c.fr.WriteData(s.id, int(n) == len(rest), rest[:n])
		c.sendWindow -= n
		s.sendWindow -= n
		rest = rest[n:]
	}
	if !c.writing {
		// Let the callers ready to run add their frames to this write.
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
	}
	c.flushLocked()
	c.mu.Unlock()
	<-s.done
	return s.code, s.err
}

// flushLocked sends the pending frames unless another goroutine is
// sending, in which case that one sends them after its own. It releases
// mu while it writes.
func (c *h2Conn) flushLocked() {
	for !c.writing && len(c.pending) > 0 && c.err == nil {
		c.writing = true
		buf := c.pending
		c.pending = c.spare[:0]
		c.mu.Unlock()
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		c.spare, c.writing = buf[:0], false
		if err != nil {
			c.failLocked(err)
		}
	}
}

// endLocked gives stream s its answer, unless it has one already.
func (c *h2Conn) endLocked(s *h2Stream, code rlsv3.RateLimitResponse_Code, err error) {
	if c.streams[s.id] != s {
		return
	}
	delete(c.streams, s.id)
	s.code, s.err = code, err
	s.done <- struct{}{}
	c.cond.Broadcast()
}

// failLocked fails the connection and every call open on it.
func (c *h2Conn) failLocked(err error) {
	if c.err == nil {
		if c.closed {
			err = errH2Closed
		} else if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Unavailable, "h2: "+err.Error())
		}
		c.err = err
	}
	for _, s := range c.streams {
		c.endLocked(s, 0, c.err)
	}
	c.cond.Broadcast()
}

// Close closes the connection and waits for its reader and watchdog.
func (c *h2Conn) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
		c.nc.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// watch fails the calls not answered by their deadline.
func (c *h2Conn) watch() {
	defer c.wg.Done()
	t := time.NewTicker(h2CallTimeout / 10)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.mu.Lock()
			for _, s := range c.streams {
				if now.After(s.deadline) {
					c.fr.WriteRSTStream(s.id, http2.ErrCodeCancel)
					c.endLocked(s, 0, status.Error(codes.DeadlineExceeded, "h2: no answer in "+h2CallTimeout.String()))
				}
			}
			c.flushLocked()
			c.mu.Unlock()
		}
	}
}

// read reads the server's frames until the connection fails.
func (c *h2Conn) read() {
	defer c.wg.Done()
	for {
		f, err := c.fr.ReadFrame()
		if err == nil {
			err = c.handle(f)
		}
		if err != nil {
			c.mu.Lock()
			c.failLocked(err)
			c.mu.Unlock()
			c.nc.Close()
			return
		}
	}
}

// handle takes one frame of the server's.
func (c *h2Conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		c.block = h2Block{streamID: f.StreamID, endStream: f.StreamEnded()}
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		c.recvUsed += int(f.Length)
		if c.recvUsed >= h2ConnWindow/4 {
			c.fr.WriteWindowUpdate(0, uint32(c.recvUsed))
			c.recvUsed = 0
		}
		if s := c.streams[f.StreamID]; s != nil {
			switch {
			case !s.gotHeaders:
				c.fr.WriteRSTStream(s.id, http2.ErrCodeProtocol)
				c.endLocked(s, 0, status.Error(codes.Internal, "h2: DATA before the response headers"))
			case f.StreamEnded():
				c.endLocked(s, 0, status.Error(codes.Internal, "h2: the response ended without trailers"))
			default:
				s.body = append(s.body, f.Data()...)
				if s.unacked += int(f.Length); s.unacked >= h2StreamWindow/2 {
					c.fr.WriteWindowUpdate(s.id, uint32(s.unacked))
					s.unacked = 0
				}
			}
		}
		c.flushLocked()
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if err := c.settingsLocked(f); err != nil {
			return err
		}
		c.flushLocked()
	case *http2.WindowUpdateFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		if f.StreamID == 0 {
			c.sendWindow += int64(f.Increment)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.sendWindow += int64(f.Increment)
		}
		c.cond.Broadcast()
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.fr.WritePing(true, f.Data)
		c.flushLocked()
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		if s := c.streams[f.StreamID]; s != nil {
			code := codes.Internal
			switch f.ErrCode {
			case http2.ErrCodeRefusedStream:
				code = codes.Unavailable
			case http2.ErrCodeCancel:
				code = codes.Canceled
			}
			c.endLocked(s, 0, status.Errorf(code, "h2: stream reset by the server: %v", f.ErrCode))
		}
	case *http2.GoAwayFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lastID = f.LastStreamID
		for id, s := range c.streams {
			if id > f.LastStreamID {
				c.endLocked(s, 0, status.Errorf(codes.Unavailable, "h2: GOAWAY %v", f.ErrCode))
			}
		}
	case *http2.PushPromiseFrame:
		return errors.New("PUSH_PROMISE with push disabled")
	}
	return nil
}

// settingsLocked applies the server's SETTINGS and acknowledges them.
func (c *h2Conn) settingsLocked(f *http2.SettingsFrame) error {
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			c.maxStreams = s.Val
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			for _, st := range c.streams {
				st.sendWindow += delta
			}
			c.peerWindow = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			// The blocks are encoded under the first SETTINGS; a
			// smaller table later would need them encoded again.
			if c.first != nil && s.Val < c.headerTable {
				return fmt.Errorf("the server's header table shrank from %d to %d bytes", c.headerTable, s.Val)
			}
			if c.first == nil {
				c.headerTable = s.Val
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.fr.WriteSettingsAck()
	c.cond.Broadcast()
	return nil
}

// emit takes a header field of the block being decoded.
func (c *h2Conn) emit(f hpack.HeaderField) {
	b := &c.block
	switch f.Name {
	case ":status":
		b.status, b.sawStatus = f.Value, true
	case "content-type":
		b.grpcType = f.Value == "application/grpc" || strings.HasPrefix(f.Value, "application/grpc+") || strings.HasPrefix(f.Value, "application/grpc;")
	case "grpc-status":
		b.grpcStatus, b.sawGRPC = f.Value, true
	case "grpc-message":
		b.grpcMsg = f.Value
	}
}

// headerFragment decodes a fragment of a header block and, at its end,
// takes the block as the response's headers or its trailers.
func (c *h2Conn) headerFragment(frag []byte, end bool) error {
	if _, err := c.dec.Write(frag); err != nil {
		return err
	}
	if !end {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return err
	}
	b := &c.block
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.streams[b.streamID]
	if s == nil {
		return nil
	}
	if !s.gotHeaders {
		s.gotHeaders = true
		switch {
		case !b.sawStatus || b.status != "200":
			c.endLocked(s, 0, status.Errorf(codes.Unknown, "h2: HTTP status %q", b.status))
			return nil
		case !b.grpcType && !b.endStream:
			c.endLocked(s, 0, status.Error(codes.Unknown, "h2: the response is not application/grpc"))
			return nil
		}
		if !b.endStream {
			return nil
		}
	} else if !b.endStream {
		c.fr.WriteRSTStream(s.id, http2.ErrCodeProtocol)
		c.endLocked(s, 0, status.Error(codes.Internal, "h2: trailers without END_STREAM"))
		c.flushLocked()
		return nil
	}
	// The trailers, or the headers of a trailers-only response.
	switch {
	case !b.sawGRPC:
		c.endLocked(s, 0, status.Error(codes.Internal, "h2: no grpc-status"))
	case b.grpcStatus != "0":
		n, err := strconv.Atoi(b.grpcStatus)
		if err != nil || n <= 0 {
			c.endLocked(s, 0, status.Errorf(codes.Internal, "h2: grpc-status %q", b.grpcStatus))
			return nil
		}
		c.endLocked(s, 0, status.Error(codes.Code(n), grpcMessage(b.grpcMsg)))
	default:
		code, err := rlsAnswer(s.body)
		c.endLocked(s, code, err)
	}
	return nil
}

// rlsAnswer checks a response body of one gRPC message and returns its
// overall code, which must be OK or OVER_LIMIT.
func rlsAnswer(body []byte) (rlsv3.RateLimitResponse_Code, error) {
	if len(body) < 5 || body[0] != 0 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		return 0, status.Errorf(codes.Internal, "h2: response body of %d bytes is not one uncompressed gRPC message", len(body))
	}
	code, err := overallCode(body[5:])
	if err != nil {
		return 0, status.Errorf(codes.Internal, "h2: response: %v", err)
	}
	if code != rlsv3.RateLimitResponse_OK && code != rlsv3.RateLimitResponse_OVER_LIMIT {
		return 0, status.Errorf(codes.Internal, "h2: overall code %v", code)
	}
	return code, nil
}

// grpcMessage decodes a grpc-message, percent-encoded as gRPC's HTTP/2
// protocol says; an escape that is not one is kept as it is.
func grpcMessage(m string) string {
	if !strings.Contains(m, "%") {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		if m[i] == '%' && i+2 < len(m) {
			if v, err := strconv.ParseUint(m[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(m[i])
	}
	return b.String()
}
