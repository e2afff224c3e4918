package testcluster

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testwait"
)

// DefaultWait bounds how long New, Add and WaitConverged wait for gossip.
// A wait ends as soon as the cluster converges, so the figure only bounds a
// failure: under -race on a machine whose CPU other test binaries take,
// gossip declares members failed and alive again, and hand-over
// confirmations are retried, for more than 20 seconds.
const DefaultWait = time.Minute

// T is what a Cluster needs of the test it serves: to mark its helpers,
// run its Close when the test ends, and report failures. It is satisfied by
// *testing.T and *testing.B (and testing.TB). Fatalf must not return: it
// stops the goroutine, as testing's does with runtime.Goexit, or panics.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Option changes how the cluster's nodes are configured.
type Option func(*options)

type options struct {
	configure func(i int, c *cluster.Config)
	wait      time.Duration
	offsets   []time.Duration // clock offsets by node index (clock.go)
}

// WithConfig lets the test change each node's config (i is the node's index)
// after it was derived from cluster.TestConfig.
func WithConfig(f func(i int, c *cluster.Config)) Option {
	return func(o *options) { o.configure = f }
}

// WithWait changes how long convergence may take before the test fails.
func WithWait(d time.Duration) Option { return func(o *options) { o.wait = d } }

// Cluster is a set of real nodes in this process. Its methods are safe for
// concurrent use; they report failures through the test's t.
type Cluster struct {
	t    T
	opts options
	net  *network // partitions and slow nodes (chaos.go)

	mu      sync.Mutex // guards nodes, stopped and next
	nodes   []*cluster.Node
	stopped []bool
	next    int // index for the next node's name
}

// New starts n nodes, joins them into one cluster, waits until every node
// sees all n alive, and closes them all when the test ends (t.Cleanup).
func New(t T, n int, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: options{wait: DefaultWait}, net: newNetwork()}
	for _, o := range opts {
		o(&c.opts)
	}
	t.Cleanup(c.Close)
	for range n {
		c.start()
	}
	c.WaitConverged()
	return c
}

// start creates node c.next and joins it to the first live node.
func (c *Cluster) start() *cluster.Node {
	c.t.Helper()
	c.mu.Lock()
	i := c.next
	c.next++
	c.mu.Unlock()
	nd := c.newNode(i)
	c.mu.Lock()
	c.nodes = append(c.nodes, nd)
	c.stopped = append(c.stopped, false)
	c.mu.Unlock()
	return nd
}

// newNode creates node i, joined to the first live node.
func (c *Cluster) newNode(i int) *cluster.Node {
	c.t.Helper()
	c.mu.Lock()
	var seed string
	for j, nd := range c.nodes {
		if !c.stopped[j] {
			seed = nd.GossipAddr()
			break
		}
	}
	c.mu.Unlock()
	cfg := cluster.TestConfig(fmt.Sprintf("node-%d", i))
	if seed != "" {
		cfg.Seeds = []string{seed}
	}
	if c.opts.configure != nil {
		c.opts.configure(i, &cfg)
	}
	c.skewClock(i, &cfg)
	c.net.wire(i, &cfg)
	nd, err := cluster.New(cfg)
	if err != nil {
		c.t.Fatalf("testcluster: start node %d: %v", i, err)
	}
	c.net.register(i, nd.GossipAddr(), nd.GRPCAddr())
	return nd
}

// Restart starts stopped node i again with the same name, on new ports and
// with an empty store, as a crashed process coming back would, and waits
// for convergence.
func (c *Cluster) Restart(i int) *cluster.Node {
	c.t.Helper()
	c.checkIndex("Restart", i)
	c.mu.Lock()
	was := c.stopped[i]
	c.mu.Unlock()
	if !was {
		c.t.Fatalf("testcluster: node %d is running", i)
	}
	nd := c.newNode(i)
	c.mu.Lock()
	c.nodes[i], c.stopped[i] = nd, false
	c.mu.Unlock()
	c.WaitConverged()
	return nd
}

// Node returns the i-th node started (stopped ones keep their index).
func (c *Cluster) Node(i int) *cluster.Node {
	c.t.Helper()
	c.checkIndex("Node", i)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Nodes returns the live nodes.
func (c *Cluster) Nodes() []*cluster.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*cluster.Node
	for i, nd := range c.nodes {
		if !c.stopped[i] {
			out = append(out, nd)
		}
	}
	return out
}

// Owner returns the live node that owns (name, key), as the first live
// node's ring says: Node(OwnerIndex(name, key)).
func (c *Cluster) Owner(name, key string) *cluster.Node {
	c.t.Helper()
	return c.Node(c.OwnerIndex(name, key))
}

// OwnerIndex returns the index of the live node that owns (name, key), as
// the first live node's ring says: the index StopHard, Restart, Leave and
// Slow take.
func (c *Cluster) OwnerIndex(name, key string) int {
	c.t.Helper()
	live := c.Nodes()
	if len(live) == 0 {
		c.t.Fatalf("testcluster: no live node")
	}
	m, ok := live[0].Owner(name, key)
	if !ok {
		c.t.Fatalf("testcluster: no owner for %q/%q", name, key)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, nd := range c.nodes {
		if !c.stopped[i] && nd.Name() == m.Name {
			return i
		}
	}
	c.t.Fatalf("testcluster: owner %s of %q/%q is not a live node", m.Name, name, key)
	return -1
}

// Index returns the index of nd, a node of the cluster (stopped or not),
// for StopHard, Restart, Leave and Slow.
func (c *Cluster) Index(nd *cluster.Node) int {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range c.nodes {
		if n == nd {
			return i
		}
	}
	name := "nil"
	if nd != nil {
		name = nd.Name()
	}
	c.t.Fatalf("testcluster: Index: node %s is not one of the cluster's", name)
	return -1
}

// StopHard closes node i without leaving: the others see it fail.
func (c *Cluster) StopHard(i int) {
	c.t.Helper()
	c.checkIndex("StopHard", i)
	c.mu.Lock()
	nd, was := c.nodes[i], c.stopped[i]
	c.stopped[i] = true
	c.mu.Unlock()
	if !was {
		nd.Close()
		c.net.forget(i)
	}
}

// Leave makes node i leave gracefully.
func (c *Cluster) Leave(i int) {
	c.t.Helper()
	c.checkIndex("Leave", i)
	c.mu.Lock()
	nd, was := c.nodes[i], c.stopped[i]
	c.stopped[i] = true
	c.mu.Unlock()
	if !was {
		if err := nd.Leave(); err != nil {
			c.t.Errorf("testcluster: node %d leave: %v", i, err)
		}
		c.net.forget(i)
	}
}

// size returns the number of nodes started, stopped ones included.
func (c *Cluster) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// checkIndex fails the test unless node i was started; op names the
// method called.
func (c *Cluster) checkIndex(op string, i int) {
	c.t.Helper()
	if n := c.size(); i < 0 || i >= n {
		c.t.Fatalf("testcluster: %s(%d): no such node (nodes are 0 to %d)", op, i, n-1)
	}
}

// Add starts one more node, joins it and waits for convergence.
func (c *Cluster) Add() *cluster.Node {
	c.t.Helper()
	nd := c.start()
	c.WaitConverged()
	return nd
}

// WaitConverged waits until every live node's ring holds exactly the live
// nodes it is not partitioned from, every node that is not cut off from
// all others is ready and has the hand-over confirmation of every member
// of its ring, and fails the test if that takes longer than the wait.
func (c *Cluster) WaitConverged() {
	c.t.Helper()
	if err := WaitFor(c.opts.wait, c.converged); err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
}

// converged reports whether every live node routes over the live nodes
// on its side of any partition.
func (c *Cluster) converged() error {
	c.mu.Lock()
	var live []int
	for i := range c.nodes {
		if !c.stopped[i] {
			live = append(live, i)
		}
	}
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	for _, i := range live {
		nd := nodes[i]
		var want []string
		for _, j := range live {
			if !c.net.cut(i, j) {
				want = append(want, nodes[j].Name())
			}
		}
		slices.Sort(want)
		var got []string
		for _, m := range nd.RingMembers() {
			got = append(got, m.Name)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s routes over %v, want %v", nd.Name(), got, want)
		}
		if len(want) == 1 && len(live) > 1 {
			// Cut off from every other node: it may not have joined.
			continue
		}
		if !nd.Ready() {
			return fmt.Errorf("%s is not ready", nd.Name())
		}
		if u := nd.Unconfirmed(); len(u) > 0 {
			return fmt.Errorf("%s waits for the hand-over of %v", nd.Name(), u)
		}
	}
	return nil
}

// WaitFor polls cond until it returns nil or d has passed, and returns
// cond's last error in the second case. It is how tests wait on a cluster:
// on a condition with a deadline, never on a fixed sleep.
func WaitFor(d time.Duration, cond func() error) error {
	return testwait.Until(d, cond)
}

// Close closes every node (New registers it with t.Cleanup).
func (c *Cluster) Close() {
	c.mu.Lock()
	var todo []*cluster.Node
	for i, nd := range c.nodes {
		if !c.stopped[i] {
			c.stopped[i] = true
			todo = append(todo, nd)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, nd := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd.Close()
		}()
	}
	wg.Wait()
}
