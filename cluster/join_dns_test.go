package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/testcluster"
)

// switchDNS answers one name with what the test last set: an error, or
// addresses. It counts lookups. Safe for concurrent use.
type switchDNS struct {
	name string

	mu      sync.Mutex // guards the fields below
	ips     []string
	lookups int
}

func (d *switchDNS) answer(ips ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ips = ips
}

func (d *switchDNS) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lookups
}

func (d *switchDNS) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lookups++
	if host != d.name || d.ips == nil {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]net.IPAddr, len(d.ips))
	for i, s := range d.ips {
		out[i] = net.IPAddr{IP: net.ParseIP(s)}
	}
	return out, nil
}

// waitLookups waits until the name has been looked up n more times: the
// join attempt after each of them but the last has ended by then, since
// one loop makes them in turn.
func waitLookups(t *testing.T, d *switchDNS, n int) {
	t.Helper()
	want := d.count() + n
	testwait.For(t, strconv.Itoa(n)+" more lookups of "+d.name, func() bool { return d.count() >= want })
}

// freePortOn returns a port free for TCP and UDP on each of hosts.
func freePortOn(t *testing.T, hosts ...string) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Skipf("cannot listen on %s: %v", hosts[0], err)
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		l.Close()
		free := true
		for _, h := range hosts {
			tl, terr := net.Listen("tcp", net.JoinHostPort(h, port))
			ul, uerr := net.ListenPacket("udp", net.JoinHostPort(h, port))
			if tl != nil {
				tl.Close()
			}
			if ul != nil {
				ul.Close()
			}
			if terr != nil || uerr != nil {
				free = false
			}
		}
		if free {
			return port
		}
	}
	t.Fatal("no port free on every host")
	return ""
}

// A seed that is a DNS name, as a Kubernetes headless Service's, is
// resolved again at every attempt until it answers with another node: the
// name is unknown at first, then names this node alone (which it does not
// join), then every pod, and the node joins all the others. The nodes
// listen on one port of several loopback addresses, as pods do on theirs.
func TestJoinThroughDNSName(t *testing.T) {
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	port := freePortOn(t, hosts...)
	dns := &switchDNS{name: "sluice-headless.test"}

	cfg := cluster.TestConfig("dns-joiner")
	cfg.GossipAddr = net.JoinHostPort(hosts[0], port)
	cfg.Seeds = []string{net.JoinHostPort(dns.name, port)}
	cfg.Resolver = dns
	joiner := startNode(t, cfg)

	waitLookups(t, dns, 2)
	if joiner.Ready() {
		t.Fatal("ready while its seed's name is unknown")
	}
	dns.answer(hosts[0])
	waitLookups(t, dns, 2)
	if joiner.Ready() {
		t.Fatal("ready while its seed's name names only itself")
	}
	if _, err := joiner.Join(net.JoinHostPort(hosts[0], port)); err == nil {
		t.Fatal("Join of its own address alone succeeded")
	}

	var others []*cluster.Node
	for i, h := range hosts[1:] {
		c := cluster.TestConfig("dns-peer-" + strconv.Itoa(i+1))
		c.GossipAddr = net.JoinHostPort(h, port)
		others = append(others, startNode(t, c)) // alone: no seeds
	}
	dns.answer(hosts...)
	ctx, cancel := context.WithTimeout(context.Background(), testcluster.DefaultWait)
	defer cancel()
	if err := joiner.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady once the name answers: %v", err)
	}
	waitRing(t, 3, append(others, joiner)...)

	// Every address the name resolves to is joined, this node's left out.
	// A join is a push/pull with each, which a loaded machine may time
	// out: it is asked again until both answer.
	if err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
		if k, err := joiner.Join(cfg.Seeds...); err != nil || k != 2 {
			return fmt.Errorf("Join(%s) = %d, %v; want the 2 other nodes", cfg.Seeds[0], k, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A node bound to every interface answers at addresses other than the one
// it advertises: a seed naming one of them reaches the node itself, which
// is no join.
func TestJoinReachingOnlyItself(t *testing.T) {
	port := freePortOn(t, "0.0.0.0", "127.0.0.2")
	cfg := cluster.TestConfig("self-joiner")
	cfg.GossipAddr = net.JoinHostPort("0.0.0.0", port)
	cfg.AdvertiseHost = "127.0.0.1"
	cfg.Seeds = []string{net.JoinHostPort("127.0.0.2", port)}
	nd := startNode(t, cfg)
	if nd.Ready() {
		t.Fatal("ready after joining only itself")
	}
	if _, err := nd.Join(cfg.Seeds...); !errors.Is(err, cluster.ErrJoin) {
		t.Fatalf("Join of its own other address: %v, want ErrJoin", err)
	}
	if nd.Ready() {
		t.Fatal("ready after joining only itself")
	}
}
