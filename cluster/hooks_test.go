package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/testcluster"
)

// countingTransport counts the packets and streams a node sends.
type countingTransport struct {
	memberlist.NodeAwareTransport
	packets, streams *atomic.Int64
}

func (c countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	c.packets.Add(1)
	return c.NodeAwareTransport.WriteToAddress(b, a)
}

func (c countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c.streams.Add(1)
	return c.NodeAwareTransport.DialAddressTimeout(a, timeout)
}

// Gossip goes through Config.GossipTransport's wrapper, the nodes converge
// over it, the port bound is the one advertised, and Close shuts the
// transport down with everything else.
func TestGossipTransportCarriesGossip(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { verifyNoLeaks(t, ignore) }) // after the nodes' cleanups
	var packets, streams atomic.Int64
	var nodes []*cluster.Node
	for i := range 2 {
		cfg := cluster.TestConfig(fmt.Sprintf("wrapped-%d", i))
		cfg.AdvertiseHost = "127.0.0.1" // the bound port is advertised
		cfg.GossipTransport = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
			return countingTransport{t, &packets, &streams}
		}
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		nodes = append(nodes, startNode(t, cfg))
	}
	waitRing(t, 2, nodes...)
	err := testcluster.WaitFor(10*time.Second, func() error {
		if packets.Load() == 0 || streams.Load() == 0 {
			return fmt.Errorf("%d packets and %d streams went through the wrapper", packets.Load(), streams.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A GossipTransport that returns nil fails New with ErrInvalidConfig, and
// the transport New bound is shut down.
func TestGossipTransportNil(t *testing.T) {
	defer verifyNoLeaks(t, goleak.IgnoreCurrent())
	cfg := cluster.TestConfig("nil-transport")
	cfg.GossipTransport = func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport { return nil }
	if n, err := cluster.New(cfg); !errors.Is(err, cluster.ErrInvalidConfig) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
}

// Config.RegisterServices adds services to the node's gRPC server, given
// the node, and they answer on its gRPC address.
func TestRegisterServices(t *testing.T) {
	cfg := cluster.TestConfig("services")
	var given *cluster.Node
	cfg.RegisterServices = func(s grpc.ServiceRegistrar, n *cluster.Node) error {
		given = n
		hs := health.NewServer()
		hs.SetServingStatus("extra", healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(s, hs)
		return nil
	}
	n := startNode(t, cfg)
	if given != n {
		t.Fatalf("RegisterServices got node %p, want %p", given, n)
	}
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "extra"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the registered service: %v, %v", resp, err)
	}

	// An error fails New, which stops what it started.
	cfg = cluster.TestConfig("services-fail")
	cfg.RegisterServices = func(grpc.ServiceRegistrar, *cluster.Node) error { return errors.New("no") }
	if _, err := cluster.New(cfg); err == nil || !strings.Contains(err.Error(), "register services: no") {
		t.Errorf("a failing RegisterServices: %v", err)
	}
}
