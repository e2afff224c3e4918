package transport

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/limiter"
)

// The count guard. Decoding a repeated field allocates per entry, and an
// entry can take as little as 2 bytes on the wire (an empty item: tag and
// length) or 1 (a packed varint): a message of MaxMessageSize bytes could
// make the decoder allocate tens of times its size before any handler
// looks at how many items it holds. So before a message is decoded, the
// codec counts the entries of its repeated fields on the wire, which
// allocates nothing, and refuses it when one has more than its limit
// below. The hand-written decoders of peerwire.go check the same limits
// with the count they already take.

// A countLimit bounds the entries of one repeated field.
type countLimit struct {
	name string           // "Message.field", for errors
	num  protowire.Number // the field's number
	// typ is the wire type of one entry: BytesType for messages,
	// VarintType for integers, which may also come packed in one
	// BytesType field.
	typ protowire.Type
	max int // entries in one message
	// total bounds the entries of this field over every message of its
	// type within one message received; 0 for no bound beyond max.
	total int
	each  []countLimit // limits within each entry, a message
}

// maxLimitsPerMessage is the most limits one message type has (a test
// checks it): the guard counts in an array of this size.
const maxLimitsPerMessage = 4

// The limits of the messages of sluice.proto; a test checks that every
// repeated field of the file has one, with its number and wire type.
var (
	peerRequestLimits   = []countLimit{{name: "PeerCheckRequest.items", num: peerReqItems, typ: protowire.BytesType, max: MaxBatchItems}}
	peerResponseLimits  = []countLimit{{name: "PeerCheckResponse.items", num: peerRespItems, typ: protowire.BytesType, max: MaxBatchItems}}
	batchRequestLimits  = []countLimit{{name: "BatchCheckRequest.requests", num: 1, typ: protowire.BytesType, max: MaxBatchItems}}
	batchResponseLimits = []countLimit{{name: "BatchCheckResponse.responses", num: 1, typ: protowire.BytesType, max: MaxBatchItems}}
	keyStateLimits      = []countLimit{
		{name: "KeyState.words", num: 5, typ: protowire.VarintType, max: 3},
		{name: "KeyState.log", num: 6, typ: protowire.BytesType, max: limiter.MaxSnapshotLog, total: MaxTransferLogEntries},
		{name: "KeyState.settle_parts", num: 13, typ: protowire.BytesType, max: limiter.MaxSettleParts},
		{name: "KeyState.lease_grants", num: 17, typ: protowire.BytesType, max: limiter.MaxLeaseGrants},
	}
	transferRequestLimits = []countLimit{
		{name: "TransferRequest.states", num: 3, typ: protowire.BytesType, max: MaxTransferStates, each: keyStateLimits},
		{name: "TransferRequest.cut_off", num: 7, typ: protowire.BytesType, max: MaxCutOff},
		{name: "TransferRequest.newcomers", num: 8, typ: protowire.BytesType, max: MaxCutOff},
	}
	inspectResponseLimits = []countLimit{
		{name: "InspectResponse.states", num: 1, typ: protowire.BytesType, max: 1, each: keyStateLimits},
		{name: "InspectResponse.replicas", num: 3, typ: protowire.BytesType, max: MaxInspectReplicas},
	}
	rulesRequestLimits = []countLimit{
		{name: "RulesCheckRequest.headers", num: 5, typ: protowire.BytesType, max: MaxRulesEntries},
		{name: "RulesCheckRequest.descriptors", num: 6, typ: protowire.BytesType, max: MaxRulesEntries},
	}
	rulesResponseLimits = []countLimit{{name: "RulesCheckResponse.rules", num: 4, typ: protowire.BytesType, max: MaxRulesResults}}
)

// countLimits returns the limits of the message type named msg: none for
// a message without repeated fields, or of another file.
func countLimits(msg protoreflect.FullName) []countLimit {
	switch msg {
	case "sluice.v1.PeerCheckRequest":
		return peerRequestLimits
	case "sluice.v1.PeerCheckResponse":
		return peerResponseLimits
	case "sluice.v1.BatchCheckRequest":
		return batchRequestLimits
	case "sluice.v1.BatchCheckResponse":
		return batchResponseLimits
	case "sluice.v1.TransferRequest":
		return transferRequestLimits
	case "sluice.v1.KeyState":
		return keyStateLimits
	case "sluice.v1.InspectResponse":
		return inspectResponseLimits
	case "sluice.v1.RulesCheckRequest":
		return rulesRequestLimits
	case "sluice.v1.RulesCheckResponse":
		return rulesResponseLimits
	}
	return nil
}

// countError refuses a message whose repeated field has too many entries.
// It wraps ErrInvalidArgument.
type countError struct {
	field  string // the limit's name
	in     string // the entry of the outer message that holds the field, "" for the message itself
	n, max int
	total  bool // n counts the field over the whole message
}

func (e *countError) Error() string {
	switch {
	case e.total:
		return fmt.Sprintf("transport: %s has %d entries in all, more than the maximum %d in one message", e.field, e.n, e.max)
	case e.in != "":
		return fmt.Sprintf("transport: %s: %s has %d entries, more than the maximum %d", e.in, e.field, e.n, e.max)
	}
	return fmt.Sprintf("transport: %s has %d entries, more than the maximum %d", e.field, e.n, e.max)
}

func (e *countError) Unwrap() error { return ErrInvalidArgument }

// tooMany returns the error of l for n entries.
func tooMany(l *countLimit, n int) error {
	return &countError{field: l.name, n: n, max: l.max}
}

// checkCounts returns a *countError when the message in b, of the type
// whose limits are given, has more entries in a repeated field than the
// field's limit allows, in itself or in the messages it holds; nil
// otherwise. It reads b without allocating, and leaves whatever is
// malformed to the decoder, which fails it. A field of a wire type other
// than its own is not counted: the decoder keeps it as an unknown field.
func checkCounts(b []byte, limits []countLimit) error {
	if len(limits) == 0 {
		return nil
	}
	var s countScan
	if err := s.message(b, limits); err != nil {
		return err
	}
	for _, t := range s.totals[:s.nTotals] {
		if t.n > t.limit.total {
			return &countError{field: t.limit.name, n: t.n, max: t.limit.total, total: true}
		}
	}
	return nil
}

// countScan is one run of checkCounts: the running counts of the limits
// that bound a field over the whole message.
type countScan struct {
	totals [maxLimitsPerMessage]struct {
		limit *countLimit
		n     int
	}
	nTotals int
}

// message counts the fields of one message. Every entry of the top-level
// message is counted, so that the error says how many there are; the
// entries of a field over its limit are not looked into.
func (s *countScan) message(b []byte, limits []countLimit) error {
	var counts [maxLimitsPerMessage]int
	over := -1 // the first field over its limit
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		v := b[:n]
		b = b[n:]
		i := limitOf(limits, num)
		if i < 0 {
			continue
		}
		l := &limits[i]
		switch {
		case typ == l.typ:
			counts[i]++
			if l.each != nil && over < 0 && counts[i] <= l.max {
				entry, _ := protowire.ConsumeBytes(v)
				if err := s.message(entry, l.each); err != nil {
					if e, ok := err.(*countError); ok && e.in == "" && !e.total {
						e.in = fmt.Sprintf("%s[%d]", l.name, counts[i]-1)
					}
					return err
				}
			}
		case l.typ == protowire.VarintType && typ == protowire.BytesType:
			packed, _ := protowire.ConsumeBytes(v)
			counts[i] += packedVarints(packed)
		default:
			continue
		}
		if over < 0 && counts[i] > l.max {
			over = i
		}
	}
	if over >= 0 {
		return tooMany(&limits[over], counts[over])
	}
	for i := range limits {
		if limits[i].total > 0 {
			s.add(&limits[i], counts[i])
		}
	}
	return nil
}

// add adds n entries to the running count of l.
func (s *countScan) add(l *countLimit, n int) {
	for i := range s.totals[:s.nTotals] {
		if s.totals[i].limit == l {
			s.totals[i].n += n
			return
		}
	}
	if s.nTotals < len(s.totals) {
		s.totals[s.nTotals].limit, s.totals[s.nTotals].n = l, n
		s.nTotals++
	}
}

// limitOf returns the index of the limit of field num, or -1.
func limitOf(limits []countLimit, num protowire.Number) int {
	for i := range limits {
		if limits[i].num == num {
			return i
		}
	}
	return -1
}

// packedVarints returns how many varints b holds: one per byte without
// the continuation bit.
func packedVarints(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// guarded is what the services of RegisterPeer, RegisterPublic and
// RegisterRules decode
// their requests into: the message and, when the codec refused it for a
// count over its limit, why. grpc-go reports every error of a server's
// codec as Internal ("error unmarshalling request"), whatever status the
// codec returns; the codec therefore records the refusal here and reports
// success, and the service answers InvalidArgument. With another codec
// than ServerOptions', the message decodes as it would unwrapped
// (guarded is a proto.Message through the one it holds).
type guarded struct {
	proto.Message
	refused error
}

// err returns the refusal as an InvalidArgument status, or nil.
func (g *guarded) err() error {
	if g.refused == nil {
		return nil
	}
	return status.Error(codes.InvalidArgument, g.refused.Error())
}

// guardService returns a copy of sd whose handlers decode their requests
// through guarded.
func guardService(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	g := *sd
	g.Methods = make([]grpc.MethodDesc, len(sd.Methods))
	for i, m := range sd.Methods {
		h := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error { return decodeGuarded(dec, v) }, ic)
		}
		g.Methods[i] = m
	}
	g.Streams = make([]grpc.StreamDesc, len(sd.Streams))
	for i, st := range sd.Streams {
		h := st.Handler
		st.Handler = func(srv any, stream grpc.ServerStream) error {
			return h(srv, &guardedStream{ServerStream: stream})
		}
		g.Streams[i] = st
	}
	return &g
}

// decodeGuarded decodes a request into v with dec, through guarded.
func decodeGuarded(dec func(any) error, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return dec(v)
	}
	g := guarded{Message: m}
	if err := dec(&g); err != nil {
		return err
	}
	return g.err()
}

// guardedStream receives the messages of a stream through guarded.
type guardedStream struct {
	grpc.ServerStream
	g guarded // reused from one message to the next
}

func (s *guardedStream) RecvMsg(v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return s.ServerStream.RecvMsg(v)
	}
	s.g = guarded{Message: m}
	err := s.ServerStream.RecvMsg(&s.g)
	refused := s.g.err()
	s.g = guarded{} // keeps nothing of the message
	if err != nil {
		return err
	}
	return refused
}
