package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// Three nodes created one after the other, each joining the first, and
// checked at once from all three: no key admits more than its limit, for
// any algorithm, though the first node's ring lags the others'.
func TestStartTogetherExact(t *testing.T) {
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			nodes := make([]*cluster.Node, 3)
			for i := range nodes {
				cfg := cluster.TestConfig(fmt.Sprintf("start-%d", i))
				if i > 0 {
					cfg.Seeds = []string{nodes[0].GossipAddr()}
				}
				nodes[i] = startNode(t, cfg)
				if !nodes[i].Ready() {
					t.Fatalf("node %d is not ready once New returned", i)
				}
			}
			reqs := transitionRequests("start", a, 50, 20)
			allowed := make([]atomic.Int64, len(reqs))
			var wg sync.WaitGroup
			for g := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					nd := nodes[g%len(nodes)]
					for j := range 60 {
						i := (g*7 + j) % len(reqs)
						d, err := nd.Check(context.Background(), reqs[i], sluice.OnUnreachable(sluice.PolicyDeny))
						if err == nil && d.Allowed {
							allowed[i].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			var total int64
			for i := range allowed {
				got := allowed[i].Load()
				total += got
				if got > reqs[i].Limit {
					t.Errorf("%s: admitted %d, limit %d", reqs[i].Key, got, reqs[i].Limit)
				}
			}
			if total < int64(len(reqs))*reqs[0].Limit/2 {
				t.Errorf("admitted %d in all, want most of the %d the limits allow", total, int64(len(reqs))*reqs[0].Limit)
			}
		})
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// A node whose seed is not up yet is not ready: it decides nothing as
// owner (checks get the policy, WithoutOwner set) until it has joined;
// WaitReady returns once the seed is up and the node joined it.
func TestNotReadyUntilJoined(t *testing.T) {
	seedAddr := freeAddr(t)
	cfg := cluster.TestConfig("late-joiner")
	cfg.Seeds = []string{seedAddr}
	nd := startNode(t, cfg)
	if nd.Ready() {
		t.Fatal("ready before joining its seed")
	}
	req := limiter.Request{Name: "ready", Key: "k", Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.TokenBucket}
	d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
	if err != nil || d.Allowed || !d.WithoutOwner {
		t.Fatalf("check before joining: %+v, %v; want denied without owner", d, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := nd.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady with no seed up: %v, want DeadlineExceeded", err)
	}
	cancel()

	scfg := cluster.TestConfig("seed")
	scfg.GossipAddr = seedAddr
	seed := startNode(t, scfg)
	ctx, cancel = context.WithTimeout(context.Background(), testcluster.DefaultWait)
	defer cancel()
	if err := nd.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady once the seed is up: %v", err)
	}
	waitRing(t, 2, nd, seed)
	if err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
		d, err := nd.Check(context.Background(), req)
		if err != nil || d.WithoutOwner {
			return fmt.Errorf("check: %+v, %v", d, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// logLines is a slog handler's sink that keeps every line.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logLines) find(s string) bool { return l.count(s) > 0 }

// count returns how many lines hold s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// A second node started with the name of a live one never decides as that
// name: New or Join fails, or it reports not ready and says why at error
// level; a limit checked through both holds.
func TestDuplicateNameRefused(t *testing.T) {
	first := startNode(t, cluster.TestConfig("twin"))
	logs := &logLines{}
	cfg := cluster.TestConfig("twin")
	cfg.Seeds = []string{first.GossipAddr()}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	second, err := cluster.New(cfg)
	if err == nil {
		t.Cleanup(func() { second.Close() })
		if err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
			if second.Ready() {
				return errors.New("the second node is ready")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !logs.find("level=ERROR") {
			t.Errorf("the second node logged no error: %q", logs.lines)
		}
	} else {
		t.Logf("New: %v", err)
	}
	req := limiter.Request{Name: "twin", Key: "k", Hits: 1, Limit: 3, Period: time.Hour, Algorithm: limiter.FixedWindow}
	admitted := 0
	for _, nd := range []*cluster.Node{first, second} {
		if nd == nil {
			continue
		}
		for range 3 {
			d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
			if err == nil && d.Allowed {
				admitted++
			}
		}
	}
	if admitted > 3 {
		t.Fatalf("admitted %d through two nodes named alike, limit 3", admitted)
	}
}

// A nil context is taken as context.Background, for a key the node owns
// and for one it forwards, alone or in a batch: no panic in any goroutine.
func TestNilContext(t *testing.T) {
	c := testcluster.New(t, 2)
	n0, n1 := c.Node(0), c.Node(1)
	var reqs []limiter.Request
	for _, owner := range []string{n0.Name(), n1.Name()} {
		for i := 0; ; i++ {
			k := fmt.Sprintf("nil%d", i)
			if o, _ := n0.Owner("nilctx", k); o.Name == owner {
				reqs = append(reqs, limiter.Request{Name: "nilctx", Key: k, Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.GCRA})
				break
			}
		}
	}
	for _, r := range reqs {
		//lint:ignore SA1012 a nil context is what is tested
		if _, err := n0.Check(nil, r); !errors.Is(err, cluster.ErrNilContext) { //nolint:staticcheck
			t.Fatalf("Check(nil) of %s: %v, want ErrNilContext", r.Key, err)
		}
	}
	//lint:ignore SA1012 a nil context is what is tested
	for i, res := range n0.CheckMany(nil, reqs) { //nolint:staticcheck
		if !errors.Is(res.Err, cluster.ErrNilContext) {
			t.Fatalf("CheckMany(nil) item %d: %+v, want ErrNilContext", i, res)
		}
	}
	//lint:ignore SA1012 a nil context is what is tested
	if err := n0.WaitReady(nil); !errors.Is(err, cluster.ErrNilContext) { //nolint:staticcheck
		t.Fatalf("WaitReady(nil): %v, want ErrNilContext", err)
	}
	// Nothing was decided: every key still has all of its hits.
	for i, res := range n0.CheckMany(context.Background(), reqs) {
		if res.Err != nil || !res.Allowed || res.Remaining != 4 {
			t.Fatalf("item %d after the nil calls: %+v, want allowed with 4 remaining", i, res)
		}
	}
}
