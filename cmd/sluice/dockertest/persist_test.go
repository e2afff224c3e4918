package dockertest

import (
	"fmt"
	"os"
	"testing"
)

// TestStopAndStartKeepsDailyLimit: three containers, each with a volume
// for its data_dir, spend a daily limit, are all stopped (SIGTERM, a
// graceful leave) and all started again: the limit stays spent.
func TestStopAndStartKeepsDailyLimit(t *testing.T) {
	dirs := make([]string, 3)
	for i := range dirs {
		dirs[i] = t.TempDir()
		// The daemon runs as 65532, not as the owner of the directory.
		if err := os.Chmod(dirs[i], 0o777); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(c *cluster, i int) (runOpts, serveArgs []string) {
		runOpts, serveArgs = joinFirst(c, i)
		return append(runOpts, "--volume", dirs[i]+":/data"), append(serveArgs, "--data-dir", "/data")
	}
	c := newCluster(t, 3, plan, "--persist-interval", "500ms")
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.waitMembers(c.nodes, 3)
	req := checkRequest{Name: "dockertest-daily", Key: "plan", Limit: 50, Period: "24h", Algorithm: "fixed_window"}
	allowed, _, err := c.spread(c.nodes, req, 80, 4)
	if err != nil {
		t.Fatal(err)
	}
	if allowed != 50 {
		t.Fatalf("admitted %d of 80 before the stop, want 50", allowed)
	}
	for _, nd := range c.nodes {
		if _, err := docker(dockerTimeout, "stop", "--time", "30", nd.name); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		if _, err := docker(dockerTimeout, "start", nd.name); err != nil {
			t.Fatal(err)
		}
		c.findPort(nd)
	}
	c.waitMembers(c.nodes, 3)
	c.waitFor("every hand-over to be confirmed", func() error {
		for _, nd := range c.nodes {
			r, err := c.readyz(nd)
			if err != nil {
				return err
			}
			if r.Unconfirmed != 0 {
				return fmt.Errorf("%s waits for %d members", nd.name, r.Unconfirmed)
			}
		}
		return nil
	})
	allowed, _, err = c.spread(c.nodes, req, 30, 3)
	if err != nil {
		t.Fatal(err)
	}
	if allowed != 0 {
		t.Fatalf("admitted %d after every container was stopped and started, want 0", allowed)
	}
}
