package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/transport"
)

// fakeCalls records the outbox's calls, in order, and fails them while
// down is set.
type fakeCalls struct {
	mu    sync.Mutex
	down  map[string]bool
	calls []string // "to handoff n", "to replica n", "to confirm fp"
}

func (f *fakeCalls) record(to, what string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[to] {
		f.calls = append(f.calls, to+" failed "+what)
		return transport.ErrUnavailable
	}
	f.calls = append(f.calls, to+" "+what)
	return nil
}

func (f *fakeCalls) transfer(_ context.Context, to string, reason transport.TransferReason, states []limiter.Snapshot) error {
	return f.record(to, fmt.Sprintf("%s %d", reason, len(states)))
}

func (f *fakeCalls) confirm(_ context.Context, to string, fp uint64) error {
	return f.record(to, fmt.Sprintf("confirm %d", fp))
}

func (f *fakeCalls) setDown(to string, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down == nil {
		f.down = map[string]bool{}
	}
	f.down[to] = down
}

func (f *fakeCalls) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// waitCalls waits until the calls made are want.
func (f *fakeCalls) waitCalls(t *testing.T, want ...string) {
	t.Helper()
	if err := waitUntil(5*time.Second, func() error {
		if got := f.log(); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("calls %q, want %q", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// testOutbox is an outbox on a clock the test moves, whose backoffs end
// when the test says.
type testOutbox struct {
	*outbox
	calls  *fakeCalls
	mu     sync.Mutex
	now    time.Time
	cancel context.CancelFunc
	tick   chan time.Time // ends a backoff
}

func newTestOutbox(t *testing.T) *testOutbox {
	ctx, cancel := context.WithCancel(context.Background())
	var h, r, f atomicInt
	to := &testOutbox{calls: &fakeCalls{}, now: time.Unix(1000, 0), cancel: cancel, tick: make(chan time.Time)}
	to.outbox = newOutbox(ctx, to.calls, outboxCounts{handedOff: &h.Int64, replicated: &r.Int64, failures: &f.Int64}, to.clock)
	to.outbox.after = func(time.Duration) <-chan time.Time { return to.tick }
	t.Cleanup(func() {
		cancel()
		to.close()
	})
	return to
}

func (to *testOutbox) clock() time.Time {
	to.mu.Lock()
	defer to.mu.Unlock()
	return to.now
}

func (to *testOutbox) advance(d time.Duration) {
	to.mu.Lock()
	to.now = to.now.Add(d)
	to.mu.Unlock()
}

// endBackoff lets a worker waiting out a backoff go on.
func (to *testOutbox) endBackoff(t *testing.T) {
	t.Helper()
	select {
	case to.tick <- time.Time{}:
	case <-time.After(5 * time.Second):
		t.Fatal("no worker is backing off")
	}
}

func states(n int) []limiter.Snapshot {
	out := make([]limiter.Snapshot, n)
	for i := range out {
		out[i] = limiter.Snapshot{Name: "n", Key: fmt.Sprint(i), Algorithm: limiter.TokenBucket}
	}
	return out
}

// A peer's hand-off states go before its copies and its confirmation, in
// chunks of at most MaxTransferStates; a failed call is retried after a
// backoff, and the confirmation waits for the states before it.
func TestOutboxOrderAndRetry(t *testing.T) {
	o := newTestOutbox(t)
	o.calls.setDown("b", true)
	o.handOff("b", states(transport.MaxTransferStates+1))
	o.replicate("b", states(2))
	o.confirmTo("b", 7)
	o.calls.waitCalls(t, "b failed handoff 1000")
	o.calls.setDown("b", false)
	o.confirmTo("b", 8) // replaces 7: only the latest membership is confirmed
	o.endBackoff(t)
	o.calls.waitCalls(t, "b failed handoff 1000", "b handoff 1000", "b handoff 1", "b replica 2", "b confirm 8")
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states still queued", n)
	}
}

// Copies are given up after replicaAttempts failed calls, hand-off states
// and confirmations only outboxGiveUp after they were queued.
func TestOutboxGivesUp(t *testing.T) {
	o := newTestOutbox(t)
	o.calls.setDown("b", true)
	o.replicate("b", states(1))
	o.calls.waitCalls(t, "b failed replica 1")
	o.endBackoff(t)
	o.endBackoff(t)
	o.calls.waitCalls(t, "b failed replica 1", "b failed replica 1", "b failed replica 1")
	o.handOff("b", states(3))
	o.confirmTo("b", 1)
	o.endBackoff(t) // the third failure backs off too
	o.calls.waitCalls(t, "b failed replica 1", "b failed replica 1", "b failed replica 1", "b failed handoff 3")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if n := o.waitHandedOff(ctx); n != 3 {
		t.Fatalf("%d hand-off states queued, want 3", n)
	}
	cancel()
	o.advance(outboxGiveUp + time.Nanosecond)
	o.endBackoff(t)
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states queued after the give-up time", n)
	}
	o.calls.setDown("b", false)
	o.handOff("b", states(1))
	o.calls.waitCalls(t, "b failed replica 1", "b failed replica 1", "b failed replica 1", "b failed handoff 3", "b handoff 1")
}

// retain stops the worker of a peer that left and returns the hand-off
// states it had not delivered.
func TestOutboxRetain(t *testing.T) {
	o := newTestOutbox(t)
	o.calls.setDown("b", true)
	o.handOff("b", states(4))
	o.calls.waitCalls(t, "b failed handoff 4")
	left := o.retain(map[string]string{"c": ""})
	if len(left) != 4 {
		t.Fatalf("retain returned %d states, want 4", len(left))
	}
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states queued after retain", n)
	}
}

type atomicInt struct{ atomic.Int64 }

// waitUntil polls cond until it returns nil or d has passed, and returns
// its last error then (testcluster.WaitFor, which this package's own tests
// cannot import).
func waitUntil(d time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}
