package transport

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Padding of the Peer messages. grpc-go's connection writer, finding less
// than minBatchSize (1000) bytes to write, yields to the scheduler once
// before writing, hoping that more will come to write together. On a
// stream that carries one batch at a time nothing more comes, and under
// load the yield (through the global run queue) adds tens to hundreds of
// microseconds to each message in each direction. Messages of the Peer
// service are therefore padded to padTo bytes, counting the 9-byte HTTP/2
// frame header and the 5-byte gRPC message prefix, with a leading padding
// field (number 15) that the codec below skips on receipt without copying
// it, and that any other protobuf decoder reads as an ordinary bytes field.
//
// padTo is also above grpc-go's buffer pooling threshold (mem, 1 KiB of
// DATA frame payload): the receiver reads a frame of that size into a
// pooled buffer, where a smaller one costs a fresh allocation per message.
//
// Both are internals of grpc-go (v1.77.0): the yield is loopyWriter.run's
// runtime.Gosched while its writer holds less than minBatchSize bytes
// (internal/transport/controlbuf.go), the pooling framer.readDataFrame's
// test of mem.IsBelowBufferPoolingThreshold (internal/transport/
// http_util.go). TestPaddingMatchesGrpc (wire_test.go) runs both through a
// Peer stream and fails when grpc-go no longer holds small writes back,
// holds back a padded message too, or reads one unpooled.
const (
	padTo       = 9 + 1024 + 16 // frame header, pooling threshold, a margin
	frameHeader = 9 + 5
	paddingTag  = 15<<3 | byte(protowire.BytesType)
)

// CallOptions returns the options a client of the Peer service should
// give each call (the peer package does): the codec that pads small
// messages and skips padding on receipt. It interoperates with the plain
// protobuf codec in either direction.
func CallOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.ForceCodecV2(wireCodec{})}
}

// wireCodec is the protobuf codec of gRPC, except that it pads messages of
// the Peer service that are smaller than padTo, skips a leading padding
// field of any message it decodes, and encodes and decodes the messages of
// a Peer stream by hand (peerwire.go), into buffers reused from one
// message to the next where the receiver has one; and that it refuses,
// before decoding, a message with more entries in a repeated field than
// the field's limit (guard.go).
type wireCodec struct{}

var _ encoding.CodecV2 = wireCodec{}

// Name is that of the protobuf codec, so that either end may use either.
func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("transport: cannot marshal %T, want a proto.Message", v)
	}
	size, peer, byHand := measure(m)
	filler := -1 // no padding field
	if peer {
		filler = fillerLen(size)
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(paddingSize(filler) + size)
	b := appendPadding((*buf)[:0], filler)
	b, err := appendMessage(b, m, byHand)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// measure returns the size of m, whether it is a message of the Peer
// service (which is padded), and whether it is encoded by hand
// (peerwire.go) rather than by the protobuf runtime.
func measure(m proto.Message) (size int, peer, byHand bool) {
	switch m := m.(type) {
	case *pb.PeerCheckRequest:
		if size, ok := sizePeerRequest(m); ok {
			return size, true, true
		}
		return proto.Size(m), true, false
	case *pb.PeerCheckResponse:
		if size, ok := sizePeerResponse(m); ok {
			return size, true, true
		}
		return proto.Size(m), true, false
	}
	return proto.Size(m), false, false
}

// appendMessage appends m, which measure has just measured. The protobuf
// runtime reuses the size it computed (UseCachedSize), as gRPC's own codec
// does.
func appendMessage(b []byte, m proto.Message, byHand bool) ([]byte, error) {
	if byHand {
		switch m := m.(type) {
		case *pb.PeerCheckRequest:
			return appendPeerRequest(b, m), nil
		case *pb.PeerCheckResponse:
			return appendPeerResponse(b, m), nil
		}
	}
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
}

// Unmarshal decodes data into v, or into the message v wraps when it is a
// *guarded. Before decoding, it checks the counts of the message's repeated
// fields (guard.go) and refuses a message over its limits with a
// *countError. Into a *guarded, it records the refusal, or any other
// failure to decode, there, so that the service answers InvalidArgument.
func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	g, _ := v.(*guarded)
	if g != nil {
		v = g.Message
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("transport: cannot unmarshal into %T, want a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	err := unmarshal(skipPadding(buf.ReadOnlyData()), m)
	if err != nil && g != nil {
		// A request that cannot be decoded, a string of invalid UTF-8
		// above all, is the caller's error, not the server's.
		if _, counted := err.(*countError); !counted {
			err = fmt.Errorf("%w: %s cannot be decoded: %v", ErrInvalidArgument, m.ProtoReflect().Descriptor().FullName(), err)
		}
		g.refused = err
		return nil
	}
	return err
}

// unmarshal decodes b into m, checking counts first. The Peer messages are
// decoded by hand (peerwire.go, which checks their counts itself) unless
// they hold what only the protobuf runtime decodes.
func unmarshal(b []byte, m proto.Message) error {
	var done bool
	var err error
	switch m := m.(type) {
	case *peerRequestBuffer:
		done, err = decodePeerRequest(b, &m.PeerCheckRequest, &m.space)
	case *PeerResponseBuffer:
		done, err = decodePeerResponse(b, &m.PeerCheckResponse, &m.space)
	case *pb.PeerCheckRequest:
		var sp requestSpace
		done, err = decodePeerRequest(b, m, &sp)
	case *pb.PeerCheckResponse:
		var sp responseSpace
		done, err = decodePeerResponse(b, m, &sp)
	}
	if done || err != nil {
		return err
	}
	if err := checkCounts(b, countLimits(m.ProtoReflect().Descriptor().FullName())); err != nil {
		return err
	}
	if w, ok := m.(wireUnmarshaler); ok {
		return w.UnmarshalWire(b)
	}
	return proto.Unmarshal(b, m)
}

// wireUnmarshaler is a request that decodes its own wire form, which
// unmarshal hands it after checking its counts. Envoy's rate limit
// requests are (envoyrls): their strings are the bytes of HTTP headers,
// which the protobuf runtime would refuse when they are not UTF-8. b is
// the codec's buffer: what UnmarshalWire keeps, it copies.
type wireUnmarshaler interface {
	UnmarshalWire(b []byte) error
}

// fillerLen returns how many filler bytes bring a message of size bytes to
// padTo on the wire, or -1 when it needs no padding.
func fillerLen(size int) int {
	n := padTo - frameHeader - size - 3 // tag and a 2-byte length
	if n < 0 {
		return -1
	}
	return n
}

// paddingSize returns the size of a padding field of n filler bytes, 0
// for n < 0.
func paddingSize(n int) int {
	if n < 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

// appendPadding appends to b a padding field of n filler bytes, or nothing
// when n < 0.
func appendPadding(b []byte, n int) []byte {
	if n < 0 {
		return b
	}
	b = append(b, paddingTag)
	b = protowire.AppendVarint(b, uint64(n))
	return append(b, make([]byte, n)...)
}

// skipPadding returns b without its first field when that is a well-formed
// padding field, and b as it is otherwise (a malformed one then fails to
// decode, as it would anyway).
func skipPadding(b []byte) []byte {
	if len(b) == 0 || b[0] != paddingTag {
		return b
	}
	_, n := protowire.ConsumeBytes(b[1:])
	if n < 0 {
		return b
	}
	return b[1+n:]
}
