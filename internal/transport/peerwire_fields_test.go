package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// The fields of sluice.proto are read from its descriptors here, not
// listed by hand, so that a field added to a message that peerwire.go
// encodes fails these tests until the hand-written encoder writes it.

// handEncoded returns the messages that the hand-written encoder writes
// (peerwire.go); it writes the messages under them too.
func handEncoded() []proto.Message {
	return []proto.Message{new(pb.PeerCheckRequest), new(pb.PeerCheckResponse)}
}

// notHandEncoded are the fields of the handEncoded messages that the
// hand-written encoder does not write, and why. A message with one of them
// set is declined, and encoded by the protobuf runtime instead.
var notHandEncoded = map[protoreflect.FullName]string{
	"sluice.v1.PeerCheckRequest.padding":  "the codec writes a padding field of its own ahead of the message (wire.go)",
	"sluice.v1.PeerCheckResponse.padding": "the codec writes a padding field of its own ahead of the message (wire.go)",
}

// fieldValues chooses the values fillMessage gives.
type fieldValues interface {
	// value reports whether to set the field, list element or map entry
	// fd, and gives its value when fd is not a message: n for a number, a
	// bool or an enum, s for a string or bytes.
	value(fd protoreflect.FieldDescriptor) (n uint64, s string, ok bool)
	// entries returns how many entries the repeated or map field fd gets.
	entries(fd protoreflect.FieldDescriptor) int
}

// maxFillDepth bounds how deep fillMessage nests messages, should a
// message ever hold one of its own type.
const maxFillDepth = 8

// fillMessage sets the fields of m, and of the messages under it, that
// src chooses; depth is how deep m is nested.
func fillMessage(m protoreflect.Message, src fieldValues, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range src.entries(fd) {
				v, _ := valueFor(fd, l.NewElement, src, depth)
				l.Append(v)
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range src.entries(fd) {
				k, _ := valueFor(fd.MapKey(), nil, src, depth)
				v, _ := valueFor(fd.MapValue(), mp.NewValue, src, depth)
				mp.Set(k.MapKey(), v)
			}
		default:
			newField := func() protoreflect.Value { return m.NewField(fd) }
			if v, ok := valueFor(fd, newField, src, depth); ok {
				m.Set(fd, v)
			}
		}
	}
}

// valueFor returns a value of fd's kind chosen by src, and whether src
// chose to set fd: when it did not, the zero value, or an empty message
// made by newMessage.
func valueFor(fd protoreflect.FieldDescriptor, newMessage func() protoreflect.Value, src fieldValues, depth int) (protoreflect.Value, bool) {
	n, s, ok := src.value(fd)
	if !ok {
		n, s = 0, ""
	}
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		v := newMessage()
		if ok && depth < maxFillDepth {
			fillMessage(v.Message(), src, depth+1)
		}
		return v, ok
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(n != 0), ok
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), ok
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n)), ok
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n)), ok
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n)), ok
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(n), ok
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n)), ok
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n)), ok
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(s), ok
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(s)), ok
	}
	panic(fmt.Sprintf("field %s of kind %v", fd.FullName(), fd.Kind()))
}

// distinctValues sets every field but those of notHandEncoded (except
// also), each to a value of its own that is not the default: 2 entries in
// each list and map, and of each oneof the member numbered variant (modulo
// its size).
type distinctValues struct {
	last    uint64
	variant int
	also    protoreflect.FullName
}

func (d *distinctValues) value(fd protoreflect.FieldDescriptor) (uint64, string, bool) {
	if _, skip := notHandEncoded[fd.FullName()]; skip && fd.FullName() != d.also {
		return 0, "", false
	}
	if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(d.variant%o.Fields().Len()) != fd {
		return 0, "", false
	}
	d.last++
	return d.last, fmt.Sprintf("%s-%d-é", fd.Name(), d.last), true
}

func (d *distinctValues) entries(protoreflect.FieldDescriptor) int { return 2 }

// oneofVariants returns how many messages distinctValues fills to set
// every member of every oneof of md and of the messages under it: the
// size of the largest oneof, at least 1.
func oneofVariants(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) int {
	if seen[md.FullName()] {
		return 1
	}
	seen[md.FullName()] = true
	n := 1
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		if o := oneofs.Get(i); !o.IsSynthetic() {
			n = max(n, o.Fields().Len())
		}
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if sub := fields.Get(i).Message(); sub != nil {
			n = max(n, oneofVariants(sub, seen))
		}
	}
	return n
}

// fieldDiffs describes every field of the messages under path that sent
// and got do not hold alike, naming it.
func fieldDiffs(path string, sent, got protoreflect.Message) []string {
	var diffs []string
	fields := sent.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		at := path + "." + string(fd.Name())
		s, g := sent.Get(fd), got.Get(fd)
		switch {
		case sent.Has(fd) != got.Has(fd) || (fd.IsList() && s.List().Len() != g.List().Len()):
			diffs = append(diffs, fmt.Sprintf("%s (%s): sent %s, decoded %s", at, fd.FullName(), describe(sent, fd), describe(got, fd)))
		case fd.IsList() && fd.Message() != nil:
			for j := range s.List().Len() {
				diffs = append(diffs, fieldDiffs(fmt.Sprintf("%s[%d]", at, j), s.List().Get(j).Message(), g.List().Get(j).Message())...)
			}
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			diffs = append(diffs, fieldDiffs(at, s.Message(), g.Message())...)
		case !s.Equal(g):
			diffs = append(diffs, fmt.Sprintf("%s (%s): sent %v, decoded %v", at, fd.FullName(), s, g))
		}
	}
	return diffs
}

// describe says what field fd of m holds, for fieldDiffs.
func describe(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	switch {
	case !m.Has(fd):
		return "nothing"
	case fd.IsList():
		return fmt.Sprintf("%d entries", m.Get(fd).List().Len())
	case fd.IsMap():
		return fmt.Sprintf("%d entries", m.Get(fd).Map().Len())
	case fd.Message() != nil:
		return "a message"
	}
	return fmt.Sprintf("%v", m.Get(fd))
}

// encodeByHand encodes m as the codec does, without padding, and reports
// whether the hand-written encoder did.
func encodeByHand(t testing.TB, m proto.Message) ([]byte, bool) {
	t.Helper()
	size, _, byHand := measure(m)
	if !byHand {
		return nil, false
	}
	b, err := appendMessage(nil, m, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != size {
		t.Errorf("%s: encoded %d bytes, measured %d", m.ProtoReflect().Descriptor().Name(), len(b), size)
	}
	return b, true
}

// Every field of the messages the hand-written encoder writes, and of the
// messages under them, set to a value of its own, comes out of
// proto.Unmarshal and of the hand-written decoder as it went in. The
// fields are those of the descriptors: one added to sluice.proto fails
// here, by name, until peerwire.go encodes it or notHandEncoded says why
// it does not.
func TestPeerWireEncodesEveryField(t *testing.T) {
	for _, root := range handEncoded() {
		md := root.ProtoReflect().Descriptor()
		for variant := range oneofVariants(md, map[protoreflect.FullName]bool{}) {
			sent := root.ProtoReflect().New()
			fillMessage(sent, &distinctValues{variant: variant}, 0)
			b, byHand := encodeByHand(t, sent.Interface())
			if !byHand {
				t.Fatalf("%s: the hand-written encoder declines %v", md.Name(), sent.Interface())
			}
			got := sent.New()
			if err := proto.Unmarshal(b, got.Interface()); err != nil {
				t.Fatalf("%s: proto.Unmarshal of the hand-written encoding: %v", md.Name(), err)
			}
			for _, d := range fieldDiffs(string(md.Name()), sent, got) {
				t.Errorf("not encoded by the hand-written encoder (peerwire.go): %s", d)
			}
			if !proto.Equal(got.Interface(), sent.Interface()) {
				t.Errorf("%s: proto.Unmarshal decoded %v, want %v", md.Name(), got.Interface(), sent.Interface())
			}

			dec := sent.New()
			if !handDecode(b, dec.Interface()) {
				t.Errorf("%s: the hand-written decoder (peerwire.go) leaves it to the protobuf runtime", md.Name())
			}
			for _, d := range fieldDiffs(string(md.Name()), sent, dec) {
				t.Errorf("not decoded by the hand-written decoder (peerwire.go): %s", d)
			}
		}

		// A field the encoder does not write makes it decline the message,
		// rather than drop the field.
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if _, skip := notHandEncoded[fd.FullName()]; !skip {
				continue
			}
			m := root.ProtoReflect().New()
			fillMessage(m, &distinctValues{also: fd.FullName()}, 0)
			if !m.Has(fd) {
				t.Fatalf("%s not set", fd.FullName())
			}
			if _, byHand := encodeByHand(t, m.Interface()); byHand {
				t.Errorf("%s set: encoded by hand, which does not write it", fd.FullName())
			}
		}
	}

	for name := range notHandEncoded {
		found := false
		for _, root := range handEncoded() {
			md := root.ProtoReflect().Descriptor()
			found = found || md.Fields().ByName(name.Name()) != nil && md.FullName() == name.Parent()
		}
		if !found {
			t.Errorf("notHandEncoded names %s, not a field of a message the hand-written encoder writes", name)
		}
	}
}

// fuzzValues takes the values fillMessage gives from fuzz input: for each
// field or entry a selector byte, which leaves it unset or picks a small,
// negative or 8-byte number, or a string of valid UTF-8 or of any bytes,
// followed by the value's bytes; for each list or map a count byte. It
// sets no field of notHandEncoded, and past the end of the input nothing.
type fuzzValues struct{ b []byte }

func (f *fuzzValues) take(n int) []byte {
	n = min(n, len(f.b))
	v := f.b[:n]
	f.b = f.b[n:]
	return v
}

func (f *fuzzValues) byte() byte {
	if b := f.take(1); len(b) == 1 {
		return b[0]
	}
	return 0
}

func (f *fuzzValues) value(fd protoreflect.FieldDescriptor) (uint64, string, bool) {
	sel := f.byte()
	if _, skip := notHandEncoded[fd.FullName()]; skip || sel%4 == 0 {
		return 0, "", false
	}
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind:
		s := string(f.take(int(f.byte() % 64)))
		if sel&4 == 0 {
			s = strings.ToValidUTF8(s, "\uFFFD")
		}
		return 0, s, true
	}
	switch sel % 4 {
	case 1:
		return uint64(f.byte()), "", true
	case 2:
		return uint64(int64(int8(f.byte()))), "", true
	}
	var w [8]byte
	copy(w[:], f.take(8))
	return binary.LittleEndian.Uint64(w[:]), "", true
}

func (f *fuzzValues) entries(protoreflect.FieldDescriptor) int { return int(f.byte() % 4) }

// FuzzPeerEncodeRoundTrip builds the messages the hand-written encoder
// writes from arbitrary bytes, with the fields of their descriptors, and
// encodes them by hand: it must decline only what proto.Marshal refuses
// (invalid UTF-8) and write what proto.Marshal writes; and what it writes,
// padded by the codec or not, must decode by hand, fresh or into the
// buffers reused from one input to the next, and by proto.Unmarshal, to
// the message encoded (and so each to the other).
func FuzzPeerEncodeRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{1}, 100))
	f.Add(bytes.Repeat([]byte{3, 0x80, 0xff, 0, 0x7f, 1, 2, 3, 4}, 40))
	f.Add(bytes.Repeat([]byte{2, 0xfe, 5, 'h', 0xc3, 0xa9, 'l', 'o'}, 40))
	f.Add(bytes.Repeat([]byte{6, 2, 0xc3, 0x28}, 40)) // invalid UTF-8
	var reqBuf peerRequestBuffer
	var respBuf PeerResponseBuffer
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &fuzzValues{b: data}
		for _, root := range handEncoded() {
			sent := root.ProtoReflect().New()
			fillMessage(sent, src, 0)
			m := sent.Interface()
			plain, errPlain := proto.Marshal(m)
			b, byHand := encodeByHand(t, m)
			switch {
			case !byHand && errPlain == nil:
				t.Fatalf("the hand-written encoder declines %v, which proto.Marshal encodes", m)
			case !byHand:
				continue
			case errPlain != nil:
				t.Fatalf("encoded by hand %v, which proto.Marshal refuses: %v", m, errPlain)
			case !bytes.Equal(b, plain):
				t.Fatalf("encoded by hand %x\nproto.Marshal %x\nof %v", b, plain, m)
			}

			byRuntime := sent.New().Interface()
			if err := proto.Unmarshal(b, byRuntime); err != nil || !proto.Equal(byRuntime, m) {
				t.Fatalf("proto.Unmarshal decoded %v (%v), want %v", byRuntime, err, m)
			}
			decoded := sent.New().Interface()
			if !handDecode(b, decoded) || !proto.Equal(decoded, m) {
				t.Fatalf("decoded by hand %v, want %v", decoded, m)
			}

			wire := wireMarshal(t, m)
			var buf, inBuf proto.Message = &reqBuf, &reqBuf.PeerCheckRequest
			if _, ok := m.(*pb.PeerCheckResponse); ok {
				buf, inBuf = &respBuf, &respBuf.PeerCheckResponse
			}
			if err := wireUnmarshal(wire, buf); err != nil || !proto.Equal(inBuf, m) {
				t.Fatalf("the codec decoded %v (%v) into a buffer, want %v", inBuf, err, m)
			}
			byRuntime = sent.New().Interface()
			err := proto.Unmarshal(wire, byRuntime)
			clearPadding(byRuntime)
			if err != nil || !proto.Equal(byRuntime, m) {
				t.Fatalf("proto.Unmarshal decoded the codec's %v (%v), want %v", byRuntime, err, m)
			}
		}
	})
}
