package peer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// storeSide serves Transfer and Lease from a real store, recording who
// called with what.
type storeSide struct {
	store *limiter.Store
	now   time.Time

	mu      sync.Mutex
	from    []string
	reasons []transport.TransferReason
}

func newStoreSide(t *testing.T) *storeSide {
	t.Helper()
	s, err := limiter.NewStore(limiter.StoreConfig{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	return &storeSide{store: s, now: time.Unix(1_700_000_000, 0)}
}

func (s *storeSide) TakeStates(_ context.Context, from string, reason transport.TransferReason, states []limiter.Snapshot) (int, int, error) {
	s.mu.Lock()
	s.from = append(s.from, from)
	s.reasons = append(s.reasons, reason)
	s.mu.Unlock()
	merged, err := s.store.Merge(states, s.now)
	if err != nil {
		return merged, 1, nil
	}
	return merged, 0, nil
}

func (s *storeSide) Lease(_ context.Context, _ string, req limiter.Request, want int64, ttl time.Duration) (transport.Lease, error) {
	n, d, err := s.store.TakeAt(req, want, s.now)
	if err != nil {
		return transport.Lease{}, err
	}
	return transport.Lease{Granted: n, ExpiresAt: s.now.Add(ttl), Decision: d}, nil
}

func TestTransferMergesInBatches(t *testing.T) {
	side := newStoreSide(t)
	srv := startServer(t, newOwner("node-b"), transport.WithStateSink(side))
	c := newTestClient(t, srv.addr, testConfig())

	src, err := limiter.NewStore(limiter.StoreConfig{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	req := limiter.Request{Name: "api", Hits: 7, Limit: 10, Period: time.Hour, Algorithm: limiter.FixedWindow}
	const keys = transport.MaxTransferStates + 500 // two calls
	for i := range keys {
		req.Key = "k" + string(rune('a'+i%26)) + time.Duration(i).String()
		if _, err := src.CheckAt(req, side.now); err != nil {
			t.Fatal(err)
		}
	}
	var states []limiter.Snapshot
	src.Range(side.now, func(s limiter.Snapshot) bool { states = append(states, s); return true })
	states = append(states, limiter.Snapshot{Name: "api", Key: "bad", Algorithm: limiter.FixedWindow, ExpireAt: 1, Words: [3]int64{0, -1, 0}})

	merged, rejected, err := c.Transfer(context.Background(), transport.Handoff, states)
	if err != nil {
		t.Fatal(err)
	}
	if merged != keys || rejected != 1 {
		t.Errorf("merged %d, rejected %d; want %d and 1", merged, rejected, keys)
	}
	if got := side.store.Len(); got != keys {
		t.Errorf("receiver holds %d keys, want %d", got, keys)
	}
	side.mu.Lock()
	if len(side.from) != 2 || side.from[0] != "node-a" || side.reasons[0] != transport.Handoff {
		t.Errorf("calls from %q with reasons %v; want two from node-a, handoff", side.from, side.reasons)
	}
	side.mu.Unlock()
	peek := req
	peek.Hits = 0
	d, err := side.store.CheckAt(peek, side.now)
	if err != nil || d.Remaining != 3 {
		t.Errorf("a transferred key has %d remaining (%v), want 3", d.Remaining, err)
	}
}

func TestLeaseTakesFromTheOwner(t *testing.T) {
	side := newStoreSide(t)
	srv := startServer(t, newOwner("node-b"), transport.WithLeaser(side))
	c := newTestClient(t, srv.addr, testConfig())
	req := limiter.Request{Name: "api", Key: "hot", Limit: 100, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for i, want := range []int64{60, 60, 60} {
		l, err := c.Lease(context.Background(), req, want, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		wantGranted := []int64{60, 40, 0}[i]
		if l.Granted != wantGranted {
			t.Errorf("lease %d granted %d, want %d", i, l.Granted, wantGranted)
		}
		if l.Granted > 0 && !l.ExpiresAt.Equal(side.now.Add(100*time.Millisecond)) {
			t.Errorf("lease %d expires at %v", i, l.ExpiresAt)
		}
	}
	if _, err := c.Lease(context.Background(), req, 0, time.Second); err == nil {
		t.Error("a lease of 0 hits was accepted")
	}
	if _, err := c.Lease(context.Background(), req, 1, time.Hour); err == nil {
		t.Error("a lease of an hour was accepted")
	}
}

func TestUnaryUnimplementedAndUnavailable(t *testing.T) {
	srv := startServer(t, newOwner("node-b"))
	c := newTestClient(t, srv.addr, testConfig())
	req := limiter.Request{Name: "api", Key: "k", Limit: 1, Period: time.Second, Algorithm: limiter.TokenBucket}
	if _, err := c.Lease(context.Background(), req, 1, time.Second); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("lease from a server without a leaser: %v, want a refusal that is not ErrUnavailable", err)
	}
	srv.stop()
	cfg := testConfig()
	cfg.Timeout = time.Second
	c2 := newTestClient(t, srv.addr, cfg)
	if _, _, err := c2.Transfer(context.Background(), transport.Replica, []limiter.Snapshot{{Name: "a"}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("transfer to a stopped server: %v, want ErrUnavailable", err)
	}
	c2.Close()
	if _, err := c2.Lease(context.Background(), req, 1, time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("lease after Close: %v, want ErrClosed", err)
	}
}
