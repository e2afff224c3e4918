package dockertest

import (
	"fmt"
	"slices"
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
	c.checkExact(req, sent, workers)
}

// TestKillOwner kills the container that owns a key: the other two keep
// answering checks of that key (decided by the unreachable policy until
// they notice), then route it to a new owner among themselves; the killed
// container, started again under the same name, rejoins and all three
// agree on the owner again.
func TestKillOwner(t *testing.T) {
	c := startCluster(t, 3)
	req := checkRequest{Name: "dockertest", Limit: 1_000_000, Period: longPeriod, Algorithm: "fixed_window"}
	victim := c.keyOwnedBeyondSeed(&req)
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

// keyOwnedBeyondSeed sets req.Key to a key owned by a node other than the
// seed, and returns that node: a restarted seed has no address to join and
// would start a cluster of its own.
func (c *cluster) keyOwnedBeyondSeed(req *checkRequest) *node {
	c.t.Helper()
	for i := range 200 {
		req.Key = fmt.Sprintf("user:%d", i)
		owner, err := c.agreedOwner(c.nodes, *req)
		if err != nil {
			c.t.Fatal(err)
		}
		if owner != c.nodes[0].name {
			return c.nodes[slices.IndexFunc(c.nodes, func(nd *node) bool { return nd.name == owner })]
		}
	}
	c.t.Fatal("no key of 200 is owned by a node other than the seed")
	return nil
}

// TestGracefulStopHandsOff stops a key's owner with SIGTERM (docker stop)
// after 60 of its 100 hits were consumed. With no replicas, only the
// hand-off of the daemon's graceful shutdown can carry the count: the new
// owner must have at most 40 left.
func TestGracefulStopHandsOff(t *testing.T) {
	c := startCluster(t, 3, "--replicas", "1")
	req := checkRequest{Name: "dockertest-handoff", Limit: 100, Period: longPeriod, Algorithm: "fixed_window"}
	owner := c.keyOwnedBeyondSeed(&req)
	living := slices.DeleteFunc(slices.Clone(c.nodes), func(nd *node) bool { return nd == owner })
	for i := range 60 {
		d, err := c.check(living[i%2], req)
		if err != nil || !d.Allowed || d.Owner != owner.name {
			t.Fatalf("check %d: %+v, %v; want allowed by %s", i, d, err, owner.name)
		}
	}
	if _, err := docker(dockerTimeout, "stop", "--time", "30", owner.name); err != nil {
		t.Fatal(err)
	}
	c.waitMembers(living, 2)
	zero := int64(0)
	peek := req
	peek.Hits = &zero
	for _, nd := range living {
		d, err := c.check(nd, peek)
		if err != nil {
			t.Fatal(err)
		}
		if d.WithoutOwner || d.Owner == owner.name || d.Remaining > 40 {
			t.Errorf("%s after the stop: %+v; want a living owner with at most 40 remaining", nd.name, d)
		}
	}
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
