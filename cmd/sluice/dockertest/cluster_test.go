package dockertest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// longPeriod makes one fixed window outlast any test run.
const longPeriod = "8760h"

// TestExactLimitAcrossContainers spreads checks of one key round-robin
// over the HTTP APIs of three daemons, from several goroutines at once:
// exactly the limit is admitted, every check decided by the one owner.
func TestExactLimitAcrossContainers(t *testing.T) {
	c := startCluster(t, 3)
	const limit, sent, workers = 100, 300, 6
	req := checkRequest{Name: "dockertest", Key: "exact", Limit: limit, Period: longPeriod, Algorithm: "fixed_window"}

	jobs := make(chan int)
	var (
		mu      sync.Mutex // guards allowed, owners and errs
		allowed int
		owners  = map[string]int{}
		errs    []error
	)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				d, err := c.check(c.nodes[i%len(c.nodes)], req)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case d.WithoutOwner:
					errs = append(errs, fmt.Errorf("check %d decided without its owner: %+v", i, d))
				default:
					owners[d.Owner]++
					if d.Allowed {
						allowed++
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range sent {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(owners) != 1 {
		t.Errorf("checks of one key were decided by %v, want one owner", owners)
	}
	if allowed != limit {
		t.Errorf("admitted %d of %d checks over 3 containers, want exactly %d", allowed, sent, limit)
	}
}

// TestKillOwner kills the container that owns a key: the other two keep
// answering checks of that key (decided by the unreachable policy until
// they notice), then route it to a new owner among themselves; the killed
// container, started again under the same name, rejoins and all three
// agree on the owner again.
func TestKillOwner(t *testing.T) {
	c := startCluster(t, 3)
	// A key owned by a node other than the seed: a restarted seed has no
	// address to join and would start a cluster of its own.
	var victim *node
	req := checkRequest{Name: "dockertest", Limit: 1_000_000, Period: longPeriod, Algorithm: "fixed_window"}
	for i := 0; victim == nil; i++ {
		if i == 200 {
			t.Fatal("no key of 200 is owned by a node other than the seed")
		}
		req.Key = fmt.Sprintf("user:%d", i)
		owner, err := c.agreedOwner(c.nodes, req)
		if err != nil {
			t.Fatal(err)
		}
		if owner != c.nodes[0].name {
			victim = c.nodes[slices.IndexFunc(c.nodes, func(nd *node) bool { return nd.name == owner })]
		}
	}
	living := slices.DeleteFunc(slices.Clone(c.nodes), func(nd *node) bool { return nd == victim })
	t.Logf("key %s is owned by %s; killing it", req.Key, victim.name)

	if _, err := docker(dockerTimeout, "kill", victim.name); err != nil {
		t.Fatal(err)
	}
	// Until they see the owner gone the living forward to it and fail,
	// and the local policy decides on the node asked; every check is
	// answered either way, and none names the dead node.
	withoutOwner := c.waitRoutesWithout(victim, living, req)
	t.Logf("%d checks were decided without their owner before the kill was noticed", withoutOwner)
	owner, err := c.agreedOwner(living, req)
	if err != nil {
		t.Fatal(err)
	}
	if owner == victim.name || !slices.ContainsFunc(living, func(nd *node) bool { return nd.name == owner }) {
		t.Fatalf("after the kill the key is owned by %s, want one of %s", owner, names(living))
	}

	if _, err := docker(dockerTimeout, "start", victim.name); err != nil {
		t.Fatal(err)
	}
	c.findPort(victim)
	c.waitMembers(c.nodes, 3)
	c.waitFor("all three to agree on the owner of "+req.Key, func() error {
		_, err := c.agreedOwner(c.nodes, req)
		return err
	})
}

// TestPartition disconnects the seed container from the network: the
// other two keep answering and converge to two members; once it is
// reconnected, all three converge to three again and agree on owners.
func TestPartition(t *testing.T) {
	c := startCluster(t, 3)
	cut, living := c.nodes[0], c.nodes[1:]
	req := checkRequest{Name: "dockertest", Key: "partition", Limit: 1_000_000, Period: longPeriod, Algorithm: "fixed_window"}
	if _, err := c.agreedOwner(c.nodes, req); err != nil {
		t.Fatal(err)
	}
	ipBefore, err := containerIP(cut.name, c.env.network)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := docker(dockerTimeout, "network", "disconnect", c.env.network, cut.name); err != nil {
		t.Fatal(err)
	}
	if n := c.waitRoutesWithout(cut, living, req); n > 0 {
		t.Logf("%d checks were decided without their owner before the partition was noticed", n)
	}
	if _, err := c.agreedOwner(living, req); err != nil {
		t.Fatal(err)
	}

	if _, err := docker(dockerTimeout, "network", "connect", c.env.network, cut.name); err != nil {
		t.Fatal(err)
	}
	ipAfter, err := containerIP(cut.name, c.env.network)
	if err != nil {
		t.Fatal(err)
	}
	if ipAfter != ipBefore {
		// The daemon advertises the address it had when it started.
		t.Fatalf("docker gave %s the address %s on reconnecting, not its own %s", cut.name, ipAfter, ipBefore)
	}
	c.findPort(cut) // Docker publishes the port anew on reconnecting
	c.waitMembers(c.nodes, 3)
	c.waitFor("all three to agree on the owner of "+req.Key, func() error {
		_, err := c.agreedOwner(c.nodes, req)
		return err
	})
}

// containerIP returns the address of container name on network.
func containerIP(name, network string) (string, error) {
	ip, err := docker(dockerTimeout, "inspect", "--format", fmt.Sprintf("{{(index .NetworkSettings.Networks %q).IPAddress}}", network), name)
	if err != nil {
		return "", err
	}
	if ip == "" {
		return "", fmt.Errorf("dockertest: %s has no address on %s", name, network)
	}
	return ip, nil
}
