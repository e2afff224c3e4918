package transport

import (
	"google.golang.org/grpc"
)

// Unary methods served as streams. The message budget reserves a call's
// message in the call's own goroutine before gRPC reads it (see
// MessageBudget), and grpc-go reads a unary call's message before any
// interceptor runs; a stream's handler reads its own. So the services of
// this package, and those registered through Registrar, have each unary
// method served as a stream whose handler receives one message and sends
// one answer: the same on the wire (a unary client calls it unchanged),
// the same handler, its message reserved for before it is read.

// Registrar returns a grpc.ServiceRegistrar that registers each service
// on s with its unary methods served as streams, so that the message
// budget of s's ServerOptions reserves their messages before they are
// read. Their unary interceptors are the budget's
// (MessageBudget.ChainUnaryInterceptor), not the server's; stream
// interceptors see each call as a stream that neither client nor server
// streams (grpc.StreamServerInfo's IsClientStream and IsServerStream
// false).
func Registrar(s grpc.ServiceRegistrar) grpc.ServiceRegistrar { return streamRegistrar{s} }

type streamRegistrar struct{ s grpc.ServiceRegistrar }

func (r streamRegistrar) RegisterService(sd *grpc.ServiceDesc, impl any) {
	r.s.RegisterService(servedAsStreams(sd), impl)
}

// servedAsStreams returns sd with its unary methods served as streams.
func servedAsStreams(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	if len(sd.Methods) == 0 {
		return sd
	}
	g := *sd
	g.Methods = nil
	g.Streams = make([]grpc.StreamDesc, 0, len(sd.Methods)+len(sd.Streams))
	for _, m := range sd.Methods {
		g.Streams = append(g.Streams, grpc.StreamDesc{StreamName: m.MethodName, Handler: unaryStream(m.Handler)})
	}
	g.Streams = append(g.Streams, sd.Streams...)
	return &g
}

// unaryStream serves the unary method handler h as a stream: one message
// in, decoded by h, and its answer out, h's interceptor the budget's.
func unaryStream(h grpc.MethodHandler) grpc.StreamHandler {
	return func(srv any, ss grpc.ServerStream) error {
		ctx := ss.Context()
		var ic grpc.UnaryServerInterceptor
		if s, ok := ss.(*budgetStream); ok { // no interceptor after the budget's wrapped it
			ic = s.c.b.unary
		} else if c, _ := ctx.Value(budgetCallKey{}).(*budgetCall); c != nil {
			ic = c.b.unary
		}
		resp, err := h(srv, ctx, ss.RecvMsg, ic)
		if err != nil {
			return err
		}
		return ss.SendMsg(resp)
	}
}
