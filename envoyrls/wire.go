package envoyrls

import (
	"context"
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// serviceDesc is envoy.service.ratelimit.v3.RateLimitService with a
// handler that decodes each request into a wireRequest.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}},
	Streams:     []grpc.StreamDesc{},
	Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
}

// shouldRateLimitHandler is the generated handler of ShouldRateLimit but
// for the message it decodes into: a wireRequest, whose RateLimitRequest
// the service and the interceptors see.
func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(wireRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	req := &in.RateLimitRequest
	if interceptor == nil {
		return srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, req, info, func(ctx context.Context, r any) (any, error) {
		return srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, r.(*rlsv3.RateLimitRequest))
	})
}

// wireRequest is a RateLimitRequest that can decode its wire form with
// strings that are not UTF-8. Envoy fills descriptor values with request
// headers' bytes, which HTTP allows above 0x7f, and its protobuf sends
// them as they are; the protobuf runtime refuses a proto3 string that is
// not UTF-8, and a refused request is a failure of the rate limit
// service, which Envoy answers by letting the request through unless
// failure_mode_deny is set: one such byte in a header would skip every
// limit of the request. Counter keys of such values are hashed
// (Match.CounterKey), and what the response echoes is made valid.
//
// sluice's server codec calls UnmarshalWire; gRPC's own codec decodes
// the embedded message, strictly.
type wireRequest struct {
	rlsv3.RateLimitRequest
}

// UnmarshalWire decodes b: with the protobuf runtime when it can, else
// field by field, keeping the strings' bytes as they are (fields it does
// not know are dropped). It copies what it keeps.
func (w *wireRequest) UnmarshalWire(b []byte) error {
	if err := proto.Unmarshal(b, &w.RateLimitRequest); err == nil {
		return nil
	}
	proto.Reset(&w.RateLimitRequest)
	return decodeRequest(b, &w.RateLimitRequest)
}

// decodeRequest decodes the RateLimitRequest b into w field by field,
// keeping the bytes of its strings.
func decodeRequest(b []byte, w *rlsv3.RateLimitRequest) error {
	return decodeFields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			w.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := new(rlcommon.RateLimitDescriptor)
			if err := decodeDescriptor(v, d); err != nil {
				return err
			}
			w.Descriptors = append(w.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			w.HitsAddend = uint32(x)
		}
		return nil
	})
}

// decodeDescriptor decodes the RateLimitDescriptor b into d, keeping the
// bytes of its entries.
func decodeDescriptor(b []byte, d *rlcommon.RateLimitDescriptor) error {
	merge := proto.UnmarshalOptions{Merge: true}
	return decodeFields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			e := new(rlcommon.RateLimitDescriptor_Entry)
			err := decodeFields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					e.Key = string(v)
				case num == 2 && typ == protowire.BytesType:
					e.Value = string(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case 2:
			if d.Limit == nil {
				d.Limit = new(rlcommon.RateLimitDescriptor_RateLimitOverride)
			}
			return merge.Unmarshal(v, d.Limit)
		case 3:
			if d.HitsAddend == nil {
				d.HitsAddend = new(wrapperspb.UInt64Value)
			}
			return merge.Unmarshal(v, d.HitsAddend)
		}
		return nil
	})
}

// decodeFields calls f with each field of the message b: its number and
// type, and its bytes (of a length-delimited field) or its value (of a
// varint or fixed one).
func decodeFields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("envoyrls: a request cannot be decoded: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x32 uint32
			x32, n = protowire.ConsumeFixed32(b)
			x = uint64(x32)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("envoyrls: a request cannot be decoded: field %d: %w", num, protowire.ParseError(n))
		}
		if err := f(num, typ, v, x); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
