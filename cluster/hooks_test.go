package cluster_test

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"

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
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the nodes' cleanups
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
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := cluster.TestConfig("nil-transport")
	cfg.GossipTransport = func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport { return nil }
	if n, err := cluster.New(cfg); !errors.Is(err, cluster.ErrInvalidConfig) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
}
