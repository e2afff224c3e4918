package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/transport"
)

// The outbox carries a node's background traffic to each other node: the
// states it hands off, the copies it replicates, and its hand-over
// confirmations. Each peer has one queue and one worker, with its own
// trigger and stop (raft's followerReplication is the model), which sends
// in order: hand-off states, then copies, then the confirmation. So a
// confirmation goes out only once every hand-off state queued for the peer
// before it has been delivered. A failed call is retried after a backoff
// that doubles from outboxBackoff to outboxMaxBackoff: hand-off states and
// the confirmation for outboxGiveUp since they were queued, copies for
// replicaAttempts calls (the next copies supersede them).

const (
	outboxBackoff    = 50 * time.Millisecond
	outboxMaxBackoff = time.Second
	outboxGiveUp     = 10 * time.Second
	replicaAttempts  = 3
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
	// membership of fingerprint fp.
	confirm(ctx context.Context, to string, fp uint64) error
}

// outboxCounts are the counters the outbox adds to.
type outboxCounts struct {
	handedOff, replicated, failures *atomic.Int64
}

// outbox holds one queue per peer. Safe for concurrent use.
type outbox struct {
	calls  outboxCalls
	counts outboxCounts
	now    func() time.Time                     // for the give-up time of queued states
	after  func(time.Duration) <-chan time.Time // the backoff's timer
	ctx    context.Context                      // cancelled by close: ends the calls in flight

	mu      sync.Mutex // guards peers, closed and drained
	peers   map[string]*peerQueue
	closed  bool
	drained chan struct{} // closed and replaced when a queue's hand-off drains
	wg      sync.WaitGroup
}

// peerQueue is one peer's queue and worker.
type peerQueue struct {
	name    string
	trigger chan struct{} // holds one pending wake
	stop    chan struct{} // closed by retain or close

	mu         sync.Mutex // guards the fields below
	gen        int        // counts the times retain emptied the queue
	handoff    []limiter.Snapshot
	since      time.Time // when the oldest hand-off state was queued
	replica    []limiter.Snapshot
	attempts   int    // failed calls of the copies at the queue's head
	confirm    uint64 // the confirmation to send, when hasConfirm
	hasConfirm bool
	confirmAt  time.Time // when it was queued
}

func newOutbox(ctx context.Context, calls outboxCalls, counts outboxCounts, now func() time.Time) *outbox {
	return &outbox{calls: calls, counts: counts, now: now, after: time.After, ctx: ctx,
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

// handOff queues states for the peer named to.
func (o *outbox) handOff(to string, states []limiter.Snapshot) {
	if len(states) == 0 {
		return
	}
	q := o.queue(to)
	if q == nil {
		return
	}
	q.mu.Lock()
	if len(q.handoff) == 0 {
		q.since = o.now()
	}
	q.handoff = append(q.handoff, states...)
	q.mu.Unlock()
	q.wake()
}

// replicate queues copies for the peer named to.
func (o *outbox) replicate(to string, states []limiter.Snapshot) {
	if len(states) == 0 {
		return
	}
	q := o.queue(to)
	if q == nil {
		return
	}
	q.mu.Lock()
	q.replica = append(q.replica, states...)
	if over := len(q.replica) - maxQueuedCopies; over > 0 {
		q.replica = slices.Clone(q.replica[over:])
		q.gen++ // a call in flight must not drop what it did not send
	}
	q.mu.Unlock()
	q.wake()
}

// confirmTo queues the confirmation of the membership of fingerprint fp
// for the peer named to, replacing one not sent yet: only the latest
// membership is confirmed.
func (o *outbox) confirmTo(to string, fp uint64) {
	q := o.queue(to)
	if q == nil {
		return
	}
	q.mu.Lock()
	q.confirm, q.hasConfirm, q.confirmAt = fp, true, o.now()
	q.mu.Unlock()
	q.wake()
}

// retain stops the workers of the peers not in keep, and returns the
// hand-off states they had not delivered, for their keys' owners now.
func (o *outbox) retain(keep map[string]string) []limiter.Snapshot {
	o.mu.Lock()
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
		left = append(left, q.handoff...)
		q.handoff, q.replica, q.hasConfirm = nil, nil, false
		q.gen++
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

// pendingHandoff returns the hand-off states queued for every peer, and a
// channel closed when a queue's hand-off drains.
func (o *outbox) pendingHandoff() (int, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, q := range o.peers {
		q.mu.Lock()
		n += len(q.handoff)
		q.mu.Unlock()
	}
	return n, o.drained
}

// waitHandedOff waits until every queued hand-off state was delivered or
// given up, or ctx ends, and returns how many were still queued.
func (o *outbox) waitHandedOff(ctx context.Context) int {
	for {
		n, drained := o.pendingHandoff()
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
// copies, else the confirmation. sent says it succeeded; more that q held
// something to send.
func (o *outbox) sendOne(q *peerQueue) (sent, more bool) {
	now := o.now()
	q.mu.Lock()
	drained := false
	// What waited too long is given up.
	if len(q.handoff) > 0 && now.Sub(q.since) > outboxGiveUp {
		q.handoff, drained = nil, true
	}
	if q.hasConfirm && now.Sub(q.confirmAt) > outboxGiveUp {
		q.hasConfirm = false
	}
	var (
		reason = transport.Handoff
		chunk  []limiter.Snapshot
		fp     uint64
	)
	switch {
	case len(q.handoff) > 0:
		chunk = q.handoff[:min(len(q.handoff), transport.MaxTransferStates)]
	case len(q.replica) > 0:
		reason, chunk = transport.Replica, q.replica[:min(len(q.replica), transport.MaxTransferStates)]
	case q.hasConfirm:
		fp = q.confirm
	default:
		q.mu.Unlock()
		if drained {
			o.signalDrained()
		}
		return false, false
	}
	confirming, gen := chunk == nil, q.gen
	q.mu.Unlock()

	var err error
	if confirming {
		err = o.calls.confirm(o.ctx, q.name, fp)
	} else {
		err = o.calls.transfer(o.ctx, q.name, reason, chunk)
	}
	if err != nil {
		o.counts.failures.Add(1)
	}

	q.mu.Lock()
	switch {
	case confirming:
		if err == nil && q.confirm == fp {
			q.hasConfirm = false
		}
	case reason == transport.Handoff:
		// retain may have emptied the queue meanwhile; else what was
		// sent is still at its head.
		if err == nil && q.gen == gen {
			o.counts.handedOff.Add(int64(len(chunk)))
			q.handoff = q.handoff[len(chunk):]
			q.since = now
			if len(q.handoff) == 0 {
				q.handoff, drained = nil, true
			}
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
		if q.gen == gen {
			q.replica = q.replica[len(chunk):]
		}
	}
	q.mu.Unlock()
	if drained {
		o.signalDrained()
	}
	return err == nil, true
}
