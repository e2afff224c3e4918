package cluster_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// stall makes a node's gRPC stop answering checks while its gossip goes
// on: while it is on, every message the node's check streams receive is
// held until the stall is released or the stream ends.
type stall struct {
	on      atomic.Bool
	held    atomic.Int64 // messages held
	release chan struct{}
}

func (st *stall) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != pb.Peer_CheckStream_FullMethodName {
		return handler(srv, ss)
	}
	return handler(srv, &stalledStream{ServerStream: ss, st: st})
}

type stalledStream struct {
	grpc.ServerStream
	st *stall
}

func (s *stalledStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil || !s.st.on.Load() {
		return err
	}
	s.st.held.Add(1)
	select {
	case <-s.st.release:
		return nil
	case <-s.Context().Done():
		return s.Context().Err()
	}
}

// An owner whose gRPC stalls while gossip still sees it alive: 40 callers
// of CheckMany on another node, whose checks queue behind the one batch
// the owner holds, all get the unreachable policy's decisions once
// Peer.Timeout has passed since they were queued, and none an error; none
// of the checks queued behind the held batch is sent to the owner. The
// caller's peer clock stands still until the test moves it, once, by
// Peer.Timeout: were deadlines counted from sending, the checks queued
// behind the held batch would be sent when it fails, and wait for a
// second Timeout that never comes.
func TestCheckManyOwnerStalled(t *testing.T) {
	waitBound(t)
	const callers, perCaller = 40, 3
	clk := newClock()
	st := &stall{release: make(chan struct{})}
	var timeout time.Duration
	c := testcluster.New(t, 2, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		switch i {
		case 0:
			cfg.Peer.Clock = peer.ClockFunc(clk.Now)
			timeout = cfg.Peer.Timeout
		case 1:
			cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainStreamInterceptor(st.intercept))
		}
	}))
	t.Cleanup(func() { close(st.release) }) // before the nodes close
	caller, owner := c.Node(0), c.Node(1)
	var reqs []limiter.Request
	for i := 0; len(reqs) < callers*perCaller; i++ {
		r := request(limiter.TokenBucket, fmt.Sprint("stalled-", i), 100)
		if m, _ := caller.Owner(r.Name, r.Key); m.Name == owner.Name() {
			reqs = append(reqs, r)
		}
	}
	before, ok := caller.PeerClientStats(owner.Name())
	if !ok {
		t.Fatalf("%s has no client of %s", caller.Name(), owner.Name())
	}

	st.on.Store(true)
	results := make(chan []sluice.Result, callers)
	for g := range callers {
		go func() {
			results <- caller.CheckMany(context.Background(), reqs[g*perCaller:(g+1)*perCaller])
		}()
	}
	// Every check is in the held batch or queued behind it.
	var queued int
	err := testcluster.WaitFor(20*time.Second, func() error {
		s, _ := caller.PeerClientStats(owner.Name())
		sent := int(s.Items - before.Items)
		if s.InFlight != 1 || st.held.Load() != 1 || sent+s.Pending != len(reqs) {
			return fmt.Errorf("%d checks sent, %d queued, %d batches in flight, %d held by the owner; want %d checks in one held batch and the queue", sent, s.Pending, s.InFlight, st.held.Load(), len(reqs))
		}
		queued = s.Pending
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(timeout)
	for range callers {
		var rs []sluice.Result
		select {
		case rs = <-results:
		case <-time.After(20 * time.Second):
			t.Fatal("callers still waiting after the deadline of every check")
		}
		for _, r := range rs {
			if r.Err != nil || !r.WithoutOwner {
				t.Fatalf("a caller got %+v, error %v; want the unreachable policy's decision", r.Decision, r.Err)
			}
		}
	}
	s, _ := caller.PeerClientStats(owner.Name())
	if expired := int(s.ExpiredItems - before.ExpiredItems); expired != queued || st.held.Load() != 1 {
		t.Fatalf("%d checks failed unsent of %d queued, %d batches reached the owner; want all of them, and only the held batch", expired, queued, st.held.Load())
	}
}
