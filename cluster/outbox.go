package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// The outbox carries a node's background traffic to each other node: the
// states it hands off, the resets and copies it replicates, and its
// hand-over confirmations. Each peer has one queue and one worker, with its
// own trigger and stop (raft's followerReplication is the model), which
// sends in order: hand-off states, then resets, then copies, then the
// confirmation. So a
// confirmation goes out only once every hand-off state queued for the peer
// before it has been delivered. A failed call is retried after a backoff
// that doubles from outboxBackoff to outboxMaxBackoff, on the system's
// timer whatever the node's clock does: hand-off states for
// the outbox's give-up time since they were queued (then they are counted
// as given up, and the confirmation queued after them is dropped with
// them), copies for replicaAttempts calls (the next copies supersede
// them), resets until the peer is no member (nothing supersedes a reset).
// Queuing a key's reset drops the copies of the key queued before it,
// which hold the state the reset cleared; copies queued after it wait
// for it. Only members have queues: states for a node that is not, or no
// longer, a member go back to the node (orphan), to be sent to their keys'
// owners now.

const (
	outboxBackoff    = 50 * time.Millisecond
	outboxMaxBackoff = time.Second
	// outboxGiveUp is the least give-up time of hand-off states.
	outboxGiveUp    = 10 * time.Second
	replicaAttempts = 3
	// maxQueuedCopies bounds the copies queued for one peer; beyond it the
	// oldest are dropped (newer copies of the same keys follow them).
	maxQueuedCopies = 100_000
)

// outboxCalls makes the outbox's calls to a peer. Safe for concurrent use.
type outboxCalls interface {
	// transfer sends at most transport.MaxTransferStates states to the
	// peer named to.
	transfer(ctx context.Context, to string, reason transport.TransferReason, states []limiter.Snapshot) error
	// confirm sends the peer named to the hand-over confirmation of the
	// membership of fingerprint fp; wantBack asks for the peer's own.
	confirm(ctx context.Context, to string, fp uint64, wantBack bool) error
}

// outboxCounts are the counters the outbox adds to.
type outboxCounts struct {
	handedOff, replicated, failures, givenUp *atomic.Int64
}

// outbox holds one queue per peer. Safe for concurrent use.
type outbox struct {
	calls  outboxCalls
	counts outboxCounts
	now    func() time.Time                     // for the give-up time of queued states
	after  func(time.Duration) <-chan time.Time // the backoff's timer: the system's (liveness)
	ctx    context.Context                      // cancelled by close: ends the calls in flight

	giveUp time.Duration            // how long hand-off states are tried
	orphan func([]limiter.Snapshot) // takes states for a node that is no member

	mu      sync.Mutex // guards peers, members, closed and drained
	peers   map[string]*peerQueue
	members map[string]string // set by retain; nil: every name is a member
	closed  bool
	// drained is closed and replaced when a queue's hand-off drains, or
	// its confirmation is sent or dropped: waiters look again.
	drained chan struct{}
	wg      sync.WaitGroup
}

// handoffBatch is hand-off states queued together.
type handoffBatch struct {
	states []limiter.Snapshot
	at     time.Time // when they were queued
}

// pendingStates counts the states of batches.
func pendingStates(bs []handoffBatch) int {
	n := 0
	for _, b := range bs {
		n += len(b.states)
	}
	return n
}

// peerQueue is one peer's queue and worker.
type peerQueue struct {
	name    string
	trigger chan struct{} // holds one pending wake
	stop    chan struct{} // closed by retain or close

	mu         sync.Mutex // guards the fields below
	dead       bool       // retain or close stopped it: it takes nothing
	cuts       int        // counts the times the queue was cut under a call
	handoff    []handoffBatch
	replica    []limiter.Snapshot
	resets     []limiter.Snapshot // keys reset by their owner: Name and Key only
	attempts   int                // failed calls of the copies at the queue's head
	confirm    uint64             // the confirmation to send, when hasConfirm
	hasConfirm bool
	wantBack   bool   // the confirmation asks for the peer's own
	delivered  uint64 // the last confirmation delivered, 0 once states after it were given up
}

// newOutbox returns an outbox whose hand-off states are given up by
// clock's time, and whose failed calls are retried on the system's timer:
// retrying a lost message is liveness, which a clock that stands still
// must not stop.
func newOutbox(ctx context.Context, calls outboxCalls, counts outboxCounts, clock Clock, giveUp time.Duration, orphan func([]limiter.Snapshot)) *outbox {
	return &outbox{calls: calls, counts: counts, now: clock.Now, after: time.After, ctx: ctx,
		giveUp: max(giveUp, outboxGiveUp), orphan: orphan,
		peers: map[string]*peerQueue{}, drained: make(chan struct{})}
}

// queue returns the queue of the peer named to, starting its worker, or
// nil once the outbox is closed.
func (o *outbox) queue(to string) *peerQueue {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	if _, member := o.members[to]; o.members != nil && !member {
		return nil
	}
	q := o.peers[to]
	if q == nil {
		q = &peerQueue{name: to, trigger: make(chan struct{}, 1), stop: make(chan struct{})}
		o.peers[to] = q
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.work(q)
		}()
	}
	return q
}

func (q *peerQueue) wake() {
	select {
	case q.trigger <- struct{}{}:
	default:
	}
}

// handOff queues states for the peer named to; states for a node that is
// no member go to orphan.
func (o *outbox) handOff(to string, states []limiter.Snapshot) {
	if len(states) == 0 {
		return
	}
	q := o.queue(to)
	if q != nil {
		q.mu.Lock()
		if !q.dead {
			q.handoff = append(q.handoff, handoffBatch{states: states, at: o.now()})
			q.mu.Unlock()
			q.wake()
			return
		}
		q.mu.Unlock()
	}
	if o.orphan != nil && !o.isClosed() {
		o.orphan(states)
	}
}

func (o *outbox) isClosed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closed
}

// replicate queues copies for the peer named to.
func (o *outbox) replicate(to string, states []limiter.Snapshot) {
	if len(states) == 0 {
		return
	}
	o.enqueue(to, func(q *peerQueue) {
		q.replica = append(q.replica, states...)
		if over := len(q.replica) - maxQueuedCopies; over > 0 {
			q.replica = slices.Clone(q.replica[over:])
			q.cuts++ // a call in flight must not drop what it did not send
		}
	})
}

// enqueue calls add with the queue of the peer named to, locked, unless
// the peer is no member or the outbox is closed, and wakes its worker.
func (o *outbox) enqueue(to string, add func(q *peerQueue)) {
	q := o.queue(to)
	if q == nil {
		return
	}
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return
	}
	add(q)
	q.mu.Unlock()
	q.wake()
}

// reset queues the reset of (name, key) for the peer named to, a replica
// of the key, and drops the copies of the key queued for it.
func (o *outbox) reset(to string, reset limiter.Snapshot) {
	name, key := reset.Name, reset.Key
	stale := func(s limiter.Snapshot) bool { return s.Name == name && s.Key == key }
	o.enqueue(to, func(q *peerQueue) {
		if slices.ContainsFunc(q.replica, stale) {
			q.replica = slices.DeleteFunc(slices.Clone(q.replica), stale)
			q.cuts++ // a call in flight must not drop what it did not send
		}
		if len(q.resets) < maxQueuedCopies {
			q.resets = append(q.resets, reset)
		}
	})
}

// confirmTo queues the confirmation of the membership of fingerprint fp
// for the peer named to, replacing one not sent yet: only the latest
// membership is confirmed. wantBack asks the peer for its own
// confirmation of fp again (handover.go).
func (o *outbox) confirmTo(to string, fp uint64, wantBack bool) {
	q := o.queue(to)
	if q == nil {
		return
	}
	q.mu.Lock()
	q.confirm, q.hasConfirm, q.wantBack = fp, true, wantBack
	q.mu.Unlock()
	q.wake()
}

// reconfirm queues the confirmation of fp for the peer named to again,
// with wantBack, when the last one delivered to it was of fp and no state
// queued after it was given up since; it reports whether one is queued.
// A confirmation of fp queued already (not sent yet) is left as it is,
// with wantBack added.
func (o *outbox) reconfirm(to string, fp uint64, wantBack bool) bool {
	q := o.queue(to)
	if q == nil {
		return false
	}
	q.mu.Lock()
	queued := false
	switch {
	case q.hasConfirm:
		if queued = q.confirm == fp; queued {
			q.wantBack = q.wantBack || wantBack
		}
	case q.delivered == fp:
		q.confirm, q.hasConfirm, q.wantBack, queued = fp, true, wantBack, true
	}
	q.mu.Unlock()
	if queued {
		q.wake()
	}
	return queued
}

// retain makes keep the members, stops the workers of the peers not in
// it, and returns the hand-off states they had not delivered, for their
// keys' owners now.
func (o *outbox) retain(keep map[string]string) []limiter.Snapshot {
	o.mu.Lock()
	o.members = keep
	var gone []*peerQueue
	for name, q := range o.peers {
		if _, ok := keep[name]; !ok {
			delete(o.peers, name)
			gone = append(gone, q)
		}
	}
	o.mu.Unlock()
	var left []limiter.Snapshot
	for _, q := range gone {
		close(q.stop)
		q.mu.Lock()
		for _, b := range q.handoff {
			left = append(left, b.states...)
		}
		q.handoff, q.replica, q.resets, q.hasConfirm, q.dead = nil, nil, nil, false, true
		q.cuts++
		q.mu.Unlock()
	}
	o.signalDrained()
	return left
}

// close stops every worker and waits for them; what is queued is dropped,
// and nothing is queued any more.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	for name, q := range o.peers {
		close(q.stop)
		q.mu.Lock()
		q.dead = true
		q.mu.Unlock()
		delete(o.peers, name)
	}
	o.mu.Unlock()
	o.wg.Wait()
}

func (o *outbox) signalDrained() {
	o.mu.Lock()
	close(o.drained)
	o.drained = make(chan struct{})
	o.mu.Unlock()
}

// pending returns the sum of count over every peer's queue, each locked
// while counted, and a channel closed when a queue's hand-off drains or
// its confirmation is sent or dropped.
func (o *outbox) pending(count func(q *peerQueue) int) (int, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, q := range o.peers {
		q.mu.Lock()
		n += count(q)
		q.mu.Unlock()
	}
	return n, o.drained
}

// waitNone waits until pending(count) is 0, or ctx ends, and returns it.
func (o *outbox) waitNone(ctx context.Context, count func(q *peerQueue) int) int {
	for {
		n, drained := o.pending(count)
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-drained:
		}
	}
}

func queuedStates(q *peerQueue) int { return pendingStates(q.handoff) }

func queuedConfirmation(q *peerQueue) int {
	if q.hasConfirm {
		return 1
	}
	return 0
}

// pendingHandoff returns the hand-off states queued for every peer, and a
// channel closed when a queue's hand-off drains.
func (o *outbox) pendingHandoff() (int, <-chan struct{}) { return o.pending(queuedStates) }

// handingOff reports whether hand-off states queued for the peer named
// to are not delivered yet.
func (o *outbox) handingOff(to string) bool {
	o.mu.Lock()
	q := o.peers[to]
	o.mu.Unlock()
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.handoff) > 0
}

// waitHandedOff waits until every queued hand-off state was delivered or
// given up, or ctx ends, and returns how many were still queued.
func (o *outbox) waitHandedOff(ctx context.Context) int { return o.waitNone(ctx, queuedStates) }

// waitConfirmed waits until every queued confirmation was delivered, or
// dropped with the states it followed, or ctx ends, and returns how many
// peers still had one queued.
func (o *outbox) waitConfirmed(ctx context.Context) int { return o.waitNone(ctx, queuedConfirmation) }

// work is q's worker: it sends what q holds, in order, until q is empty,
// and waits for the next trigger, until q is stopped.
func (o *outbox) work(q *peerQueue) {
	backoff := outboxBackoff
	for {
		select {
		case <-q.stop:
			return
		case <-o.ctx.Done():
			return
		case <-q.trigger:
		}
		for {
			sent, more := o.sendOne(q)
			if !more {
				break
			}
			if sent {
				backoff = outboxBackoff
				continue
			}
			select {
			case <-q.stop:
				return
			case <-o.ctx.Done():
				return
			case <-o.after(backoff):
			}
			backoff = min(2*backoff, outboxMaxBackoff)
		}
	}
}

// sendOne makes q's next call: a chunk of hand-off states, else a chunk of
// resets, else a chunk of copies, else the confirmation. sent says it succeeded; more that q held
// something to send.
func (o *outbox) sendOne(q *peerQueue) (sent, more bool) {
	now := o.now()
	q.mu.Lock()
	drained := false
	// Hand-off states tried for too long are given up, and the
	// confirmation that was to follow them: the receiver settles by its
	// own timeout instead.
	if k := slices.IndexFunc(q.handoff, func(b handoffBatch) bool { return now.Sub(b.at) <= o.giveUp }); k != 0 && len(q.handoff) > 0 {
		if k < 0 {
			k = len(q.handoff)
		}
		o.counts.givenUp.Add(int64(pendingStates(q.handoff[:k])))
		q.handoff = slices.Delete(q.handoff, 0, k)
		q.hasConfirm, q.delivered, q.cuts, drained = false, 0, q.cuts+1, true
	}
	var (
		reason   = transport.Handoff
		chunk    []limiter.Snapshot
		fp       uint64
		wantBack bool
	)
	switch {
	case len(q.handoff) > 0:
		b := q.handoff[0].states
		chunk = b[:min(len(b), transport.MaxTransferStates)]
	case len(q.resets) > 0:
		reason, chunk = transport.Reset, q.resets[:min(len(q.resets), transport.MaxTransferStates)]
	case len(q.replica) > 0:
		reason, chunk = transport.Replica, q.replica[:min(len(q.replica), transport.MaxTransferStates)]
	case q.hasConfirm:
		fp, wantBack = q.confirm, q.wantBack
	default:
		q.mu.Unlock()
		if drained {
			o.signalDrained()
		}
		return false, false
	}
	confirming, cutsBefore := chunk == nil, q.cuts
	q.mu.Unlock()
	if drained {
		o.signalDrained()
		drained = false
	}

	var err error
	if confirming {
		err = o.calls.confirm(o.ctx, q.name, fp, wantBack)
	} else {
		err = o.calls.transfer(o.ctx, q.name, reason, chunk)
	}
	if err != nil {
		o.counts.failures.Add(1)
	}

	q.mu.Lock()
	switch {
	case confirming:
		if err == nil {
			// This worker alone gives states up, so none was meanwhile.
			q.delivered = fp
		}
		if err == nil && q.confirm == fp {
			q.hasConfirm, drained = false, true
		}
	case reason == transport.Handoff:
		// Unless the queue was cut meanwhile, what was sent is still at
		// its head.
		if err == nil && q.cuts == cutsBefore {
			o.counts.handedOff.Add(int64(len(chunk)))
			if head := &q.handoff[0]; len(head.states) > len(chunk) {
				head.states = head.states[len(chunk):]
			} else {
				q.handoff = slices.Delete(q.handoff, 0, 1)
			}
			drained = len(q.handoff) == 0
		}
	case reason == transport.Reset:
		// Only this function takes resets from the queue's head, and
		// the queue is cut by retain and close alone, which empty it.
		if err == nil && len(q.resets) >= len(chunk) {
			o.counts.replicated.Add(int64(len(chunk)))
			q.resets = q.resets[len(chunk):]
		}
	default:
		if err != nil {
			if q.attempts++; q.attempts < replicaAttempts {
				break
			}
		} else {
			o.counts.replicated.Add(int64(len(chunk)))
		}
		q.attempts = 0
		if q.cuts == cutsBefore {
			q.replica = q.replica[len(chunk):]
		}
	}
	q.mu.Unlock()
	if drained {
		o.signalDrained()
	}
	return err == nil, true
}
