package dockertest

import "testing"

// peersAlias stands in for a Kubernetes headless Service: every container
// carries it, and Docker's DNS answers it with all of their addresses.
const peersAlias = "sluice-peers"

// TestJoinThroughDNSName starts three containers whose only join address
// is one DNS name, as deploy/kubernetes configures its pods. The first,
// alone under the name, is not ready: the name answers with its own
// address only, which it does not join. The other two start; every node
// resolves the name again, finds the others, and all three converge to
// three members. A limit then holds exactly across them, checked through
// the HTTP ports of different containers.
func TestJoinThroughDNSName(t *testing.T) {
	c := newCluster(t, 3, joinAlias(peersAlias))
	first := c.nodes[0]
	c.start(first)
	c.waitFor(first.name+" to answer /readyz", func() error {
		_, err := c.readyz(first)
		return err
	})
	// The first join ran before the HTTP server served.
	if r, err := c.readyz(first); err != nil || r.Status == "ready" {
		t.Fatalf("%s alone under %s: /readyz %+v, %v; want not ready", first.name, peersAlias, r, err)
	}
	for _, nd := range c.nodes[1:] {
		c.start(nd)
	}
	c.waitMembers(c.nodes, 3)

	const limit, sent, workers = 60, 180, 6
	req := checkRequest{Name: "dockertest", Key: "dns-join", Limit: limit, Period: longPeriod, Algorithm: "sliding_window_log"}
	c.checkExact(req, sent, workers)
	for _, nd := range c.nodes {
		if d, err := c.check(nd, req); err != nil || d.Allowed {
			t.Errorf("%s after the limit: %+v, %v; want limited", nd.name, d, err)
		}
	}
}
