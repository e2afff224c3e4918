package transport

import (
	"google.golang.org/grpc"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Limits of the Rules service's messages. A RulesCheckRequest with more
// than MaxRulesEntries headers or descriptors is refused with
// InvalidArgument before it is decoded; a RulesCheckResponse lists at
// most MaxRulesResults rules (truncated says when more applied), and a
// client decoding with this package's codec refuses one that lists more.
const (
	MaxRulesEntries = 64
	MaxRulesResults = 256
)

// RegisterRules registers the Rules service on s, served by srv. Requests
// are decoded through the count guard of ServerOptions' codec, like the
// Sluice service's: more than MaxRulesEntries headers or descriptors
// fail with InvalidArgument before the message is decoded. srv validates
// the rest. It panics if srv is nil.
func RegisterRules(s grpc.ServiceRegistrar, srv pb.RulesServer) {
	if srv == nil {
		panic("transport: RegisterRules with a nil server")
	}
	s.RegisterService(servedAsStreams(guardService(&pb.Rules_ServiceDesc)), srv)
}
