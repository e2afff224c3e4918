package transport

import (
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// The messages of a Peer stream, PeerCheckRequest and PeerCheckResponse,
// are encoded and decoded here by hand rather than by the protobuf
// runtime: every forwarded check goes through them twice. The output and
// the decoded messages are exactly what proto.Marshal and proto.Unmarshal
// give (the tests compare them); whatever these functions do not handle
// (unknown fields, a padding field set by the caller or not first, invalid
// UTF-8, a nil item, malformed input) they leave to the protobuf runtime,
// which then encodes it or returns its error.
//
// Decoding allocates per message, not per item: the items of a message
// share one array, and the strings of a request up to smallMessage bytes
// share one copy of their bytes alone (see requestSpace.detach), where an
// item's name equal to the one before it is that one.

// smallMessage is the largest message whose strings share one copy: a
// string kept from a larger one keeps no more than itself alive.
const smallMessage = 4 << 10

// Field numbers of the Peer messages, as in sluice.proto.
const (
	peerReqFrom  = 1
	peerReqItems = 2
	peerReqSeq   = 3

	peerRespItems = 1
	peerRespSeq   = 2
	peerRespOwner = 3
)

// reader reads the fields of one message, b[i:end].
type reader struct {
	b      []byte
	i, end int
	// view makes str return strings that alias b, which the caller
	// copies (requestSpace.detach) before b is reused; false: str copies
	// each.
	view bool
}

// newReader reads b; view is reader.view, for a message up to
// smallMessage bytes.
func newReader(b []byte, view bool) reader {
	return reader{b: b, end: len(b), view: view && len(b) <= smallMessage}
}

func (r *reader) more() bool { return r.i < r.end }

func (r *reader) tag() (protowire.Number, protowire.Type, bool) {
	num, typ, n := protowire.ConsumeTag(r.b[r.i:r.end])
	r.i += max(n, 0)
	return num, typ, n > 0
}

func (r *reader) varint(typ protowire.Type) (uint64, bool) {
	if typ != protowire.VarintType {
		return 0, false
	}
	v, n := protowire.ConsumeVarint(r.b[r.i:r.end])
	r.i += max(n, 0)
	return v, n > 0
}

func (r *reader) int64(typ protowire.Type) (int64, bool) {
	v, ok := r.varint(typ)
	return int64(v), ok
}

func (r *reader) int32(typ protowire.Type) (int32, bool) {
	v, ok := r.varint(typ)
	return int32(v), ok
}

func (r *reader) bool(typ protowire.Type) (bool, bool) {
	v, ok := r.varint(typ)
	return v != 0, ok
}

// sub returns a reader of the length-delimited field at r.i, and skips it.
func (r *reader) sub(typ protowire.Type) (reader, bool) {
	if typ != protowire.BytesType {
		return reader{}, false
	}
	v, n := protowire.ConsumeBytes(r.b[r.i:r.end])
	if n < 0 {
		return reader{}, false
	}
	start := r.i + n - len(v)
	r.i += n
	return reader{b: r.b, i: start, end: r.i, view: r.view}, true
}

// str reads a string field, which must be valid UTF-8.
func (r *reader) str(typ protowire.Type) (string, bool) {
	v, ok := r.sub(typ)
	switch {
	case !ok || !utf8.Valid(v.b[v.i:v.end]):
		return "", false
	case v.i == v.end:
		return "", true
	case !r.view:
		return string(v.b[v.i:v.end]), true
	}
	return unsafe.String(&v.b[v.i], v.end-v.i), true
}

// count returns how many fields num of type typ the message has, and
// false when it is malformed.
func (r reader) count(num protowire.Number, typ protowire.Type) (int, bool) {
	n := 0
	for r.more() {
		f, t, ok := r.tag()
		if !ok {
			return 0, false
		}
		if f == num && t == typ {
			n++
		}
		m := protowire.ConsumeFieldValue(f, t, r.b[r.i:r.end])
		if m < 0 {
			return 0, false
		}
		r.i += m
	}
	return n, true
}

// PeerResponseBuffer receives the answers of a CheckStream call one after
// the other in the same memory: pass it to the stream's RecvMsg instead of
// calling Recv. Its PeerCheckResponse, and everything in it, is valid
// until the next RecvMsg with it. With the codec of CallOptions it is
// decoded without allocating (but for new strings); any other codec
// decodes it as a plain PeerCheckResponse. Not safe for concurrent use.
type PeerResponseBuffer struct {
	pb.PeerCheckResponse
	space responseSpace
}

// peerRequestBuffer is the same for the batches a CheckStream handler
// receives.
type peerRequestBuffer struct {
	pb.PeerCheckRequest
	space requestSpace
}

// itemSpace holds the items of decoded messages: new ones for each
// message, or, in a buffer, the same from one message to the next.
type itemSpace[T any] struct {
	slab []T
	ptrs []*T // ptrs[i] == &slab[i]
}

// items returns n zero items, and whether they are new.
func (s *itemSpace[T]) items(n int) ([]*T, bool) {
	if n == 0 {
		return nil, false
	}
	if cap(s.slab) >= n {
		clear(s.slab[:n])
		return s.ptrs[:n:n], false
	}
	s.slab = make([]T, n)
	s.ptrs = make([]*T, n)
	for i := range s.ptrs {
		s.ptrs[i] = &s.slab[i]
	}
	return s.ptrs, true
}

// requestSpace holds the items of decoded requests.
type requestSpace struct {
	itemSpace[pb.RateLimitRequest]
	hits []int64 // the items' hits fields; allocated when one has it
	// name is the last name detach copied, which the next items (of
	// this message, or of the next one in a buffer) share while theirs is
	// the same.
	name string
}

// detach makes the strings of m, decoded as views of its message
// (reader.view), its own before the message's memory is reused: their
// bytes alone are copied, into one allocation. An item's Name that
// decodeRequestItem found equal to the one before it (see sameName) is
// that one's. Every string field that decodeRequestItem reads is here.
func (s *requestSpace) detach(m *pb.PeerCheckRequest) {
	n := len(m.From)
	prev := s.name
	for _, it := range m.Items {
		if !identical(it.Name, prev) {
			n += len(it.Name)
			prev = it.Name
		}
		n += len(it.Key) + len(it.TimeZone) + len(it.Traceparent)
	}
	a := arena{b: make([]byte, n)}
	if m.From != "" {
		m.From = a.copy(m.From)
	}
	view, own := s.name, s.name // the last name read, and its copy
	for _, it := range m.Items {
		if identical(it.Name, view) {
			it.Name = own
		} else {
			view, own = it.Name, a.copy(it.Name)
			it.Name = own
		}
		it.Key = a.copy(it.Key)
		if it.TimeZone != "" {
			it.TimeZone = a.copy(it.TimeZone)
		}
		if it.Traceparent != "" {
			it.Traceparent = a.copy(it.Traceparent)
		}
	}
	s.name = own
}

// sameName returns the name of item i, just read: the name of the item
// before it (of the last message, for the first) when they are equal, so
// that detach copies it once.
func (s *requestSpace) sameName(name string, i int) string {
	prev := s.name
	if i > 0 {
		prev = s.slab[i-1].Name
	}
	if name == prev {
		return prev
	}
	return name
}

// identical reports whether a and b are the same bytes in memory, not
// only equal ones.
func identical(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

// forget drops the strings of m and its items, views of a message that
// was not decoded whole.
func forget(m *pb.PeerCheckRequest, items []*pb.RateLimitRequest) {
	m.From = ""
	for _, it := range items {
		it.Name, it.Key, it.TimeZone, it.Traceparent = "", "", "", ""
	}
}

// arena copies strings into b, which holds them all: each copy goes
// after the last, so the bytes of a string returned never change.
type arena struct {
	b   []byte
	off int
}

func (a *arena) copy(s string) string {
	if s == "" {
		return ""
	}
	c := a.b[a.off : a.off+len(s)]
	copy(c, s)
	a.off += len(s)
	return unsafe.String(&c[0], len(c))
}

func (s *requestSpace) items(n int) []*pb.RateLimitRequest {
	items, fresh := s.itemSpace.items(n)
	if fresh {
		s.hits = nil
	}
	return items
}

// hit returns where the hits of item i goes.
func (s *requestSpace) hit(i int) *int64 {
	if s.hits == nil {
		s.hits = make([]int64, len(s.slab))
	}
	return &s.hits[i]
}

// each calls field with the number and type of every field of the
// message, its value next to read, until field reports false. It reports
// whether the whole message was read.
func (r *reader) each(field func(protowire.Number, protowire.Type) bool) bool {
	for r.more() {
		num, typ, ok := r.tag()
		if !ok || !field(num, typ) {
			return false
		}
	}
	return true
}

// decodePeerRequest decodes b into m as proto.Unmarshal does, with the
// items in sp, and reports true; or it refuses b, holding more items than
// their limit (peerRequestLimits), with a *countError and allocates
// nothing; or it reports false, leaving m in any state, when b is not for
// it to decode.
func decodePeerRequest(b []byte, m *pb.PeerCheckRequest, sp *requestSpace) (bool, error) {
	r := newReader(b, true)
	n, ok := r.count(peerReqItems, protowire.BytesType)
	if !ok {
		return false, nil
	}
	if l := &peerRequestLimits[0]; n > l.max {
		return false, tooMany(l, n)
	}
	m.Reset()
	items := sp.items(n)
	i := 0
	ok = r.each(func(num protowire.Number, typ protowire.Type) (ok bool) {
		switch num {
		case peerReqFrom:
			m.From, ok = r.str(typ)
		case peerReqItems:
			var sub reader
			if sub, ok = r.sub(typ); ok {
				ok = decodeRequestItem(&sub, items[i], sp, i)
				i++
			}
		case peerReqSeq:
			m.Seq, ok = r.varint(typ)
		default:
			return false
		}
		return ok
	})
	switch {
	case !r.view:
		m.Items = items
		return ok, nil
	case !ok:
		forget(m, items)
		return false, nil
	}
	m.Items = items
	sp.detach(m)
	return true, nil
}

// decodeRequestItem decodes item i, whose hits field goes in sp.
func decodeRequestItem(r *reader, m *pb.RateLimitRequest, sp *requestSpace, i int) bool {
	return r.each(func(num protowire.Number, typ protowire.Type) (ok bool) {
		var v int32
		switch num {
		case 1:
			if m.Name, ok = r.str(typ); ok && r.view {
				m.Name = sp.sameName(m.Name, i)
			}
		case 2:
			m.Key, ok = r.str(typ)
		case 3:
			m.Hits = sp.hit(i)
			*m.Hits, ok = r.int64(typ)
		case 4:
			m.Limit, ok = r.int64(typ)
		case 5:
			m.PeriodNanos, ok = r.int64(typ)
		case 6:
			m.Burst, ok = r.int64(typ)
		case 7:
			v, ok = r.int32(typ)
			m.Algorithm = pb.Algorithm(v)
		case 8:
			v, ok = r.int32(typ)
			m.Calendar = pb.Calendar(v)
		case 9:
			m.TimeZone, ok = r.str(typ)
		case 10:
			m.Reset_, ok = r.bool(typ)
		case 11:
			m.DrainOverLimit, ok = r.bool(typ)
		case 12:
			v, ok = r.int32(typ)
			m.UnreachablePolicy = pb.UnreachablePolicy(v)
		case 13:
			m.Refund, ok = r.bool(typ)
		case 14:
			m.Traceparent, ok = r.str(typ)
		case 15:
			m.ChargedStartUnixNano, ok = r.int64(typ)
		case 16:
			m.ChargedEndUnixNano, ok = r.int64(typ)
		case 17:
			m.ChargedAtUnixNano, ok = r.int64(typ)
		case 18:
			m.Charge, ok = r.bool(typ)
		default:
			return false
		}
		return ok
	})
}

// responseSpace holds the items of decoded responses.
type responseSpace struct {
	itemSpace[pb.RateLimitResponse]
	owner string // the last message's owner, reused while it does not change
}

// decodePeerResponse is decodePeerRequest for a response
// (peerResponseLimits).
func decodePeerResponse(b []byte, m *pb.PeerCheckResponse, sp *responseSpace) (bool, error) {
	// A response has few strings, usually its owner only: each is copied.
	r := newReader(b, false)
	n, ok := r.count(peerRespItems, protowire.BytesType)
	if !ok {
		return false, nil
	}
	if l := &peerResponseLimits[0]; n > l.max {
		return false, tooMany(l, n)
	}
	m.Reset()
	items, _ := sp.items(n)
	i := 0
	ok = r.each(func(num protowire.Number, typ protowire.Type) (ok bool) {
		switch num {
		case peerRespItems:
			var sub reader
			if sub, ok = r.sub(typ); ok {
				ok = decodeResponseItem(&sub, items[i])
				i++
			}
		case peerRespSeq:
			m.Seq, ok = r.varint(typ)
		case peerRespOwner:
			var v reader
			if v, ok = r.sub(typ); ok {
				m.Owner, ok = v.sameOr(sp.owner)
				sp.owner = m.Owner
			}
		default:
			return false
		}
		return ok
	})
	m.Items = items
	return ok, nil
}

func decodeResponseItem(r *reader, m *pb.RateLimitResponse) bool {
	return r.each(func(num protowire.Number, typ protowire.Type) (ok bool) {
		var v int32
		switch num {
		case 1:
			m.Allowed, ok = r.bool(typ)
		case 2:
			m.Limit, ok = r.int64(typ)
		case 3:
			m.Remaining, ok = r.int64(typ)
		case 4:
			m.ResetAtUnixNano, ok = r.int64(typ)
		case 5:
			m.RetryAfterNanos, ok = r.int64(typ)
		case 6:
			m.DelayNanos, ok = r.int64(typ)
		case 7:
			m.Owner, ok = r.str(typ)
		case 8:
			m.WithoutOwner, ok = r.bool(typ)
		case 9:
			v, ok = r.int32(typ)
			m.ErrorCode = pb.ErrorCode(v)
		case 10:
			m.ErrorMessage, ok = r.str(typ)
		case 11:
			m.WindowStartUnixNano, ok = r.int64(typ)
		case 12:
			m.WindowEndUnixNano, ok = r.int64(typ)
		case 13:
			m.ChargedAtUnixNano, ok = r.int64(typ)
		default:
			return false
		}
		return ok
	})
}

// sameOr returns the string r holds, which must be valid UTF-8: s itself
// when they are equal.
func (r *reader) sameOr(s string) (string, bool) {
	v := r.b[r.i:r.end]
	if string(v) == s {
		return s, true
	}
	if !utf8.Valid(v) {
		return "", false
	}
	return string(v), true
}

// Sizes of the fields of the Peer messages, all numbered below 16 and so
// with a 1-byte tag but RateLimitRequest's charged_end_unix_nano (16: see
// sizeIntAt); 0 for a field that is not encoded (proto3 leaves out zero
// values).

func sizeVarint(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func sizeInt(v int64) int { return sizeVarint(uint64(v)) }

// sizeIntAt is sizeInt for field num, whatever the size of its tag.
func sizeIntAt(num protowire.Number, v int64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(v))
}

func sizeBool(v bool) int {
	if v {
		return 2
	}
	return 0
}

func sizeLen(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

// Appenders of the same fields: nothing for a zero value.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // most fields of a check are zero: kept inlinable
	}
	return appendVarintField(b, num, v)
}

// appendVarintField appends field num of value v: a 1-byte tag below 16.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if num < 16 {
		b = append(b, byte(num)<<3|byte(protowire.VarintType))
	} else {
		b = protowire.AppendTag(b, num, protowire.VarintType)
	}
	return protowire.AppendVarint(b, v)
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	return appendVarint(b, num, uint64(v))
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return append(b, byte(num)<<3|byte(protowire.VarintType), 1)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, byte(num)<<3|byte(protowire.BytesType))
	b = protowire.AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendLen(b []byte, num protowire.Number, n int) []byte {
	b = append(b, byte(num)<<3|byte(protowire.BytesType))
	return protowire.AppendVarint(b, uint64(n))
}

// validStrings reports whether every string is valid UTF-8, as proto3
// requires.
func validStrings(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// sizePeerRequest returns the size of m as proto.Marshal encodes it, or
// false when m is not for appendPeerRequest to encode.
func sizePeerRequest(m *pb.PeerCheckRequest) (int, bool) {
	if len(m.Padding) > 0 || len(m.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(m.From) {
		return 0, false
	}
	n := sizeLen(len(m.From)) + sizeVarint(m.Seq)
	for _, it := range m.Items {
		if it == nil || len(it.ProtoReflect().GetUnknown()) > 0 || !validStrings(it.Name, it.Key, it.TimeZone, it.Traceparent) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(sizeRequestItem(it))
	}
	return n, true
}

func sizeRequestItem(m *pb.RateLimitRequest) int {
	n := sizeLen(len(m.Name)) + sizeLen(len(m.Key)) +
		sizeInt(m.Limit) + sizeInt(m.PeriodNanos) + sizeInt(m.Burst) +
		sizeInt(int64(m.Algorithm)) + sizeInt(int64(m.Calendar)) + sizeLen(len(m.TimeZone)) +
		sizeBool(m.Reset_) + sizeBool(m.DrainOverLimit) + sizeInt(int64(m.UnreachablePolicy)) + sizeBool(m.Refund) +
		sizeLen(len(m.Traceparent))
	if m.ChargedStartUnixNano|m.ChargedEndUnixNano|m.ChargedAtUnixNano != 0 { // refunds' only
		n += sizeInt(m.ChargedStartUnixNano) + sizeIntAt(16, m.ChargedEndUnixNano) + sizeIntAt(17, m.ChargedAtUnixNano)
	}
	if m.Hits != nil {
		n += 1 + protowire.SizeVarint(uint64(*m.Hits))
	}
	if m.Charge {
		n += sizeIntAt(18, 1)
	}
	return n
}

// appendPeerRequest appends m, for which sizePeerRequest reported true.
func appendPeerRequest(b []byte, m *pb.PeerCheckRequest) []byte {
	b = appendString(b, peerReqFrom, m.From)
	for _, it := range m.Items {
		b = appendLen(b, peerReqItems, sizeRequestItem(it))
		b = appendString(b, 1, it.Name)
		b = appendString(b, 2, it.Key)
		if it.Hits != nil {
			b = append(b, 3<<3|byte(protowire.VarintType))
			b = protowire.AppendVarint(b, uint64(*it.Hits))
		}
		b = appendInt(b, 4, it.Limit)
		b = appendInt(b, 5, it.PeriodNanos)
		b = appendInt(b, 6, it.Burst)
		b = appendInt(b, 7, int64(it.Algorithm))
		b = appendInt(b, 8, int64(it.Calendar))
		b = appendString(b, 9, it.TimeZone)
		b = appendBool(b, 10, it.Reset_)
		b = appendBool(b, 11, it.DrainOverLimit)
		b = appendInt(b, 12, int64(it.UnreachablePolicy))
		b = appendBool(b, 13, it.Refund)
		b = appendString(b, 14, it.Traceparent)
		if it.ChargedStartUnixNano|it.ChargedEndUnixNano|it.ChargedAtUnixNano != 0 {
			b = appendInt(b, 15, it.ChargedStartUnixNano)
			b = appendInt(b, 16, it.ChargedEndUnixNano)
			b = appendInt(b, 17, it.ChargedAtUnixNano)
		}
		if it.Charge {
			b = appendVarintField(b, 18, 1)
		}
	}
	return appendVarint(b, peerReqSeq, m.Seq)
}

// sizePeerResponse returns the size of m as proto.Marshal encodes it, or
// false when m is not for appendPeerResponse to encode.
func sizePeerResponse(m *pb.PeerCheckResponse) (int, bool) {
	if len(m.Padding) > 0 || len(m.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(m.Owner) {
		return 0, false
	}
	n := sizeVarint(m.Seq) + sizeLen(len(m.Owner))
	for _, it := range m.Items {
		if it == nil || len(it.ProtoReflect().GetUnknown()) > 0 || !validStrings(it.Owner, it.ErrorMessage) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(sizeResponseItem(it))
	}
	return n, true
}

func sizeResponseItem(m *pb.RateLimitResponse) int {
	return sizeBool(m.Allowed) + sizeInt(m.Limit) + sizeInt(m.Remaining) +
		sizeInt(m.ResetAtUnixNano) + sizeInt(m.RetryAfterNanos) + sizeInt(m.DelayNanos) +
		sizeLen(len(m.Owner)) + sizeBool(m.WithoutOwner) + sizeInt(int64(m.ErrorCode)) + sizeLen(len(m.ErrorMessage)) +
		sizeInt(m.WindowStartUnixNano) + sizeInt(m.WindowEndUnixNano) + sizeInt(m.ChargedAtUnixNano)
}

// appendPeerResponse appends m, for which sizePeerResponse reported true.
func appendPeerResponse(b []byte, m *pb.PeerCheckResponse) []byte {
	for _, it := range m.Items {
		b = appendLen(b, peerRespItems, sizeResponseItem(it))
		b = appendBool(b, 1, it.Allowed)
		b = appendInt(b, 2, it.Limit)
		b = appendInt(b, 3, it.Remaining)
		b = appendInt(b, 4, it.ResetAtUnixNano)
		b = appendInt(b, 5, it.RetryAfterNanos)
		b = appendInt(b, 6, it.DelayNanos)
		b = appendString(b, 7, it.Owner)
		b = appendBool(b, 8, it.WithoutOwner)
		b = appendInt(b, 9, int64(it.ErrorCode))
		b = appendString(b, 10, it.ErrorMessage)
		b = appendInt(b, 11, it.WindowStartUnixNano)
		b = appendInt(b, 12, it.WindowEndUnixNano)
		b = appendInt(b, 13, it.ChargedAtUnixNano)
	}
	b = appendVarint(b, peerRespSeq, m.Seq)
	return appendString(b, peerRespOwner, m.Owner)
}
