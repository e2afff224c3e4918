package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// fakeCalls records the outbox's calls, in order, and fails them while
// down is set.
type fakeCalls struct {
	mu    sync.Mutex
	down  map[string]bool
	calls []string // "to handoff n", "to replica n", "to confirm fp" (+ " back" when it asks for the peer's)
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

func (f *fakeCalls) confirm(_ context.Context, to string, fp uint64, wantBack bool) error {
	if wantBack {
		return f.record(to, fmt.Sprintf("confirm %d back", fp))
	}
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
	if err := testwait.Until(5*time.Second, func() error {
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
	calls   *fakeCalls
	givenUp atomicInt
	orphMu  sync.Mutex
	orphans int // states given to orphan
	clk     *fakeclock.Clock
	cancel  context.CancelFunc
	tick    chan time.Time // ends a backoff
}

func newTestOutbox(t *testing.T) *testOutbox {
	ctx, cancel := context.WithCancel(context.Background())
	var h, r, f atomicInt
	to := &testOutbox{calls: &fakeCalls{}, clk: fakeclock.New(time.Unix(1000, 0)), cancel: cancel, tick: make(chan time.Time)}
	counts := outboxCounts{handedOff: &h.Int64, replicated: &r.Int64, failures: &f.Int64, givenUp: &to.givenUp.Int64}
	to.outbox = newOutbox(ctx, to.calls, counts, to.clk, outboxGiveUp, func(s []limiter.Snapshot) {
		to.orphMu.Lock()
		to.orphans += len(s)
		to.orphMu.Unlock()
	})
	to.outbox.after = func(time.Duration) <-chan time.Time { return to.tick }
	t.Cleanup(func() {
		cancel()
		to.close()
	})
	return to
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
	o.confirmTo("b", 7, false)
	o.calls.waitCalls(t, "b failed handoff 1000")
	o.calls.setDown("b", false)
	o.confirmTo("b", 8, false) // replaces 7: only the latest membership is confirmed
	o.endBackoff(t)
	o.calls.waitCalls(t, "b failed handoff 1000", "b handoff 1000", "b handoff 1", "b replica 2", "b confirm 8")
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states still queued", n)
	}
}

// A key's reset drops the copies of the key queued before it, goes before
// the copies queued after it, and is retried past replicaAttempts.
func TestOutboxReset(t *testing.T) {
	o := newTestOutbox(t)
	o.calls.setDown("b", true)
	o.replicate("b", states(3)) // keys 0, 1, 2
	o.calls.waitCalls(t, "b failed replica 3")
	o.reset("b", limiter.Snapshot{Name: "n", Key: "1"})
	o.replicate("b", states(1)) // key 0 again
	for range replicaAttempts {
		o.endBackoff(t)
	}
	o.calls.waitCalls(t, "b failed replica 3", "b failed reset 1", "b failed reset 1", "b failed reset 1")
	o.calls.setDown("b", false)
	o.endBackoff(t)
	o.calls.waitCalls(t, "b failed replica 3", "b failed reset 1", "b failed reset 1", "b failed reset 1", "b reset 1", "b replica 3")
	o.mu.Lock()
	q := o.peers["b"]
	o.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.resets) != 0 || len(q.replica) != 0 {
		t.Fatalf("queued after delivery: %d resets, %d copies", len(q.resets), len(q.replica))
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
	o.confirmTo("b", 1, false)
	o.endBackoff(t) // the third failure backs off too
	o.calls.waitCalls(t, "b failed replica 1", "b failed replica 1", "b failed replica 1", "b failed handoff 3")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if n := o.waitHandedOff(ctx); n != 3 {
		t.Fatalf("%d hand-off states queued, want 3", n)
	}
	cancel()
	o.clk.Advance(outboxGiveUp - time.Second)
	o.handOff("b", states(2)) // younger: not given up with the 3
	o.confirmTo("b", 2, false)
	o.clk.Advance(time.Second + time.Nanosecond)
	o.calls.setDown("b", false)
	o.endBackoff(t)
	// The 3 are given up and counted; the confirmation queued after them
	// goes with them; the 2 are delivered.
	o.calls.waitCalls(t, "b failed replica 1", "b failed replica 1", "b failed replica 1", "b failed handoff 3", "b handoff 2")
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states queued after the give-up time", n)
	}
	if g := o.givenUp.Load(); g != 3 {
		t.Fatalf("%d states given up, want 3", g)
	}
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
	// b is no member now: what is handed to it goes back to the node.
	o.handOff("b", states(2))
	o.orphMu.Lock()
	defer o.orphMu.Unlock()
	if o.orphans != 2 {
		t.Fatalf("%d states orphaned, want 2", o.orphans)
	}
}

// States handed off while retain drops their peer are never lost: retain
// returns them, or the peer's queue is a new one that holds them, or they
// go back to the node.
func TestOutboxHandOffRacesRetain(t *testing.T) {
	for round := range 2000 {
		o := newTestOutbox(t)
		o.calls.setDown("b", true)
		o.handOff("b", states(1))
		var left []limiter.Snapshot
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); o.handOff("b", states(1)) }()
		go func() { defer wg.Done(); left = o.retain(map[string]string{}) }()
		wg.Wait()
		queued, _ := o.pendingHandoff()
		o.orphMu.Lock()
		got := len(left) + queued + o.orphans
		o.orphMu.Unlock()
		if got != 2 {
			t.Fatalf("round %d: %d of 2 states accounted for (%d returned, %d queued, %d orphaned)", round, got, len(left), queued, o.orphans)
		}
		o.cancel()
		o.close()
	}
}

type atomicInt struct{ atomic.Int64 }

// A confirmation is sent again, on request, only when the last one
// delivered to the peer was of the same membership and nothing queued
// after it was given up since.
func TestOutboxReconfirm(t *testing.T) {
	o := newTestOutbox(t)
	if o.reconfirm("b", 5, true) {
		t.Fatal("reconfirmed a membership never confirmed to the peer")
	}
	o.confirmTo("b", 5, false)
	o.calls.waitCalls(t, "b confirm 5")
	if n := o.waitConfirmed(context.Background()); n != 0 {
		t.Fatalf("%d confirmations still queued", n)
	}
	if o.reconfirm("b", 6, false) {
		t.Fatal("reconfirmed a membership other than the one confirmed")
	}
	if !o.reconfirm("b", 5, true) {
		t.Fatal("did not reconfirm the membership confirmed")
	}
	o.calls.waitCalls(t, "b confirm 5", "b confirm 5 back")
	// States given up after the confirmation make it untrue: it is not
	// sent again.
	o.calls.setDown("b", true)
	o.handOff("b", states(1))
	o.calls.waitCalls(t, "b confirm 5", "b confirm 5 back", "b failed handoff 1")
	o.clk.Advance(outboxGiveUp + time.Second)
	o.endBackoff(t)
	if n := o.waitHandedOff(context.Background()); n != 0 {
		t.Fatalf("%d hand-off states queued after the give-up time", n)
	}
	if o.reconfirm("b", 5, true) {
		t.Fatal("reconfirmed after states queued behind the confirmation were given up")
	}
}
