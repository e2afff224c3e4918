// Package ruletest starts what the tests of the rules adapters (httplimit,
// grpclimit) stand on: one real cluster node on a fake clock, and a rule
// source. It is for tests only.
package ruletest

import (
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/testcluster"
)

// Start is 40 s into a minute, so that a one-minute window resets 20 s
// after it.
var Start = time.Unix(1_700_000_020, 0)

// Backend is a one-node cluster whose clock is Clock, and the rules in
// force.
type Backend struct {
	Node   *cluster.Node
	Clock  *fakeclock.Clock
	Source *rules.Source
}

// T is what New needs of a test: *testing.T satisfies it.
type T interface {
	testcluster.T
	Fatal(args ...any)
}

// New starts the node, closed when the test ends, and parses yaml's
// rules, failing the test when they do not parse.
func New(t T, yaml string) *Backend {
	t.Helper()
	b := &Backend{Clock: fakeclock.New(Start)}
	c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) { cfg.Clock = cluster.ClockFunc(b.Clock.Now) }))
	b.Node = c.Node(0)
	set, err := rules.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	b.Source = rules.NewSource(set)
	return b
}

// Wait bounds how long Next waits.
const Wait = 10 * time.Second

// Next returns the next value on ch, failing the test when none comes
// within Wait.
func Next[E any](t T, ch <-chan E) E {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Wait):
		t.Fatalf("nothing came on the channel within %v", Wait)
	}
	var zero E
	return zero
}
