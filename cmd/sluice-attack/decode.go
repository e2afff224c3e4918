package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// decodeAmplification: CheckBatch messages of a million empty items, about
// 2 MB each, half to the public Sluice service and half to the Peer
// service of a daemon of default settings, as fast as they are answered.
// Each empty item decodes to a whole message. A daemon that refuses the
// message for its size tells its bound ("larger than max (N vs. M)"), and
// the attackers go on with messages of as many empty items as fit in it.
func decodeAmplification(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "decode-amplification", nil, overGRPC, func(t *target, r *row) error {
		first := newEmptyBatches(c.count(1_000_000))
		var current atomic.Pointer[emptyBatches]
		current.Store(first)
		var codes tally
		calls := c.rounds(ctx, c.count(16_000), c.hostile(), func(i, k int) {
			b := current.Load()
			method, msg := pb.Sluice_CheckBatch_FullMethodName, b.public
			if i%2 == 1 {
				method, msg = pb.Peer_CheckBatch_FullMethodName, b.peer
			}
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			var reply rawMessage
			err := t.conn.Invoke(cctx, method, rawMessage(msg), &reply, grpc.ForceCodec(rawCodec{}))
			codes.addErr(fmt.Sprintf("%s items to %s: %s", thousands(int64(b.items)), shortMethod(method), codeOf(err)), err)
			if bound, ok := sizeBound(err); ok && bound < len(msg) && b == first {
				current.CompareAndSwap(first, newEmptyBatches(bound/2))
			}
		})
		r.did = fmt.Sprintf("%d attackers send CheckBatch messages of %s empty items (%s each), half to Sluice and half to Peer, for %v",
			c.attackers, thousands(int64(first.items)), size(int64(len(first.public))), c.duration)
		if b := current.Load(); b != first {
			r.did += fmt.Sprintf("; refused for their size, then of %s items (%s), the most the daemon's bound admits", thousands(int64(b.items)), size(int64(len(b.public))))
		}
		r.result = fmt.Sprintf("%s calls: %s", thousands(calls), codes.String())
		if errs := codes.firstErrors(); errs != "" {
			r.result += " (" + errs + ")"
		}
		sent := []*emptyBatches{first}
		if b := current.Load(); b != first {
			sent = append(sent, b)
		}
		for _, b := range sent {
			for _, m := range []string{pb.Sluice_CheckBatch_FullMethodName, pb.Peer_CheckBatch_FullMethodName} {
				name := fmt.Sprintf("%s items to %s: OK", thousands(int64(b.items)), shortMethod(m))
				if n := codes.get(name); n > 0 && b.items > 1000 {
					r.miss("%d batches of %s items answered", n, thousands(int64(b.items)))
				}
			}
		}
		return nil
	})
}

// emptyBatches are a batch of empty items for each service.
type emptyBatches struct {
	items        int
	public, peer []byte
}

// newEmptyBatches returns the batches of n items. BatchCheckRequest's
// requests are field 1, PeerCheckRequest's items field 2.
func newEmptyBatches(n int) *emptyBatches {
	return &emptyBatches{items: n, public: emptyItems(1, n), peer: emptyItems(2, n)}
}

// tooLarge is gRPC's refusal of a message for its size.
var tooLarge = regexp.MustCompile(`received message larger than max \((\d+) vs\. (\d+)\)`)

// sizeBound returns the bound on messages that err reports, if it is a
// refusal for size.
func sizeBound(err error) (int, bool) {
	m := tooLarge.FindStringSubmatch(status.Convert(err).Message())
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[2])
	return n, err == nil
}

// emptyItems returns a message whose field num holds n empty messages.
func emptyItems(num protowire.Number, n int) []byte {
	item := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), nil)
	b := make([]byte, 0, n*len(item))
	for range n {
		b = append(b, item...)
	}
	return b
}

// shortMethod turns "/sluice.v1.Peer/CheckBatch" into "Peer.CheckBatch".
func shortMethod(full string) string {
	switch full {
	case pb.Sluice_CheckBatch_FullMethodName:
		return "Sluice.CheckBatch"
	case pb.Peer_CheckBatch_FullMethodName:
		return "Peer.CheckBatch"
	}
	return full
}

// rawMessage is a message's wire bytes, sent and received as they are by
// rawCodec.
type rawMessage []byte

// rawCodec is a gRPC codec of rawMessage: what an attacker who writes
// protobuf by hand sends.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return m, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*m = append((*m)[:0], data...)
	return nil
}
