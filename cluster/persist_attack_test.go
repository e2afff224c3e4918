package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// TestRestartKeepsTheStrictestRate attacks keys restored from a data
// directory on a node with KeepStrictest (the daemon's under
// destructive_behaviors deny): each key's day is spent, the node restarts
// on its directory, and a caller checks the keys at 50 a second. Each key
// keeps its rate across the restart, a 24h Period's and a calendar day's
// (in UTC and in a zone) alike, and stays spent.
func TestRestartKeepsTheStrictestRate(t *testing.T) {
	dir := t.TempDir()
	clk := fakeclock.New(time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC))
	start := func() *cluster.Node {
		cfg := cluster.TestConfig("strict-restart")
		cfg.DataDir, cfg.Store.KeepStrictest, cfg.Clock = dir, true, cluster.ClockFunc(clk.Now)
		nd, err := cluster.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		return nd
	}
	tokyo, err := limiter.LoadZone("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]limiter.Request{
		"period_24h":   {Name: "daily", Key: "a", Hits: 50, Limit: 50, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow},
		"calendar_day": {Name: "daily", Key: "b", Hits: 50, Limit: 50, Calendar: limiter.Day, Algorithm: limiter.FixedWindow},
		"calendar_day_tokyo": {Name: "daily", Key: "c", Hits: 50, Limit: 50, Calendar: limiter.Day, Algorithm: limiter.FixedWindow,
			Location: tokyo},
	}
	nd := start()
	for _, r := range keys {
		consume(t, nd, []limiter.Request{r})
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
	nd = start()
	for range 3 {
		clk.Advance(1500 * time.Millisecond)
		for name, r := range keys {
			lax := limiter.Request{Name: r.Name, Key: r.Key, Hits: 1, Limit: 50, Period: time.Second, Algorithm: limiter.FixedWindow}
			d, err := nd.Check(context.Background(), lax)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Errorf("%s: a spent key restored from the data directory admitted a check at 50 a second at %v", name, clk.Now())
			}
		}
	}
}
