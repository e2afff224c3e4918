package cluster

import (
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/transport"
)

// RegisterPublicAPI registers the public gRPC API, the Sluice service, on
// s: its checks are routed as Check routes them, each with its own
// unreachable policy, its Inspect reads as Inspect does, and every request
// is asked of Config.PublicPermit and Config.PublicInspectPermit first.
// Config.ServePublicAPI registers it on the node's own server, beside the
// Peer service; a program that serves API clients on a listener of its
// own, apart from the peers' Config.GRPCAddr (the daemon's grpc_addr
// beside its peer_addr), registers it on that listener's server instead.
func (n *Node) RegisterPublicAPI(s grpc.ServiceRegistrar) {
	api := publicAPI{n}
	transport.RegisterPublic(s, api, api, transport.WithPermit(n.cfg.PublicPermit),
		transport.WithInspector(api), transport.WithInspectPermit(n.cfg.PublicInspectPermit))
}
