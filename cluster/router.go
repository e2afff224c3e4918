package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
)

// The router says where a check of a key is decided, for single checks,
// batches and lease requests alike: here, at the key's owner, at its
// previous owner while the key is handed over to this node, or nowhere now
// (wait, or the unreachable policy). It owns the breakers of the peers.
// Its shape is groupcache's PickPeer(key) (peer, ok): it picks, the caller
// calls, and the caller reports the call's outcome back.

// peerClients is where the router finds the client of a peer; peer.Pool
// is one. Safe for concurrent use.
type peerClients interface {
	Get(name string) (*peer.Client, bool)
}

var _ peerClients = (*peer.Pool)(nil)

// way is where the router sends a check.
type way uint8

const (
	// wayHere: this node is the key's settled owner; decide it here,
	// under the key's decide lock (decideOwned), which tests it again.
	wayHere way = iota
	// wayOwner: forward to the key's owner.
	wayOwner
	// wayPrevious: the key moved here and is not settled: forward to the
	// node that decided it before.
	wayPrevious
	// wayWait: nobody decides the key now (the ring or the hand-over is
	// about to move on): wait and pick again.
	wayWait
	// wayDown: the owner cannot be called (no client, or its breaker is
	// open): the unreachable policy decides.
	wayDown
	// wayNotReady: this node is not ready, so not part of a cluster
	// that formed: the unreachable policy decides, whoever owns the key.
	wayNotReady
)

// pick is the router's answer for one key.
type pick struct {
	way     way
	peer    string           // the node forwarded to, with wayOwner and wayPrevious
	client  *peer.Client     // its client
	breaker *breaker.Breaker // its breaker
	probe   bool             // the pick took its breaker's half-open probe
}

// router picks where checks go. Safe for concurrent use.
type router struct {
	self      string
	hand      *handover
	peers     peerClients
	breakers  breakers
	now       func() time.Time
	threshold int32
	cooldown  time.Duration
	// departing reports whether a member is leaving or gone as far as
	// gossip knows, while the ring may still route to it. It is asked only
	// on a failure.
	departing func(name string) bool
}

// pick returns where a check of the key of hash goes now.
func (r *router) pick(hash uint64) pick {
	if !r.hand.ready.Load() {
		// Not part of a cluster that formed (bootstrap.go), or no longer:
		// its ring may hold members that are not ready either, and
		// would only send the check back.
		return pick{way: wayNotReady}
	}
	st, owner := r.hand.stateOf(hash)
	target, w := owner.Name, wayOwner
	switch st {
	case owned:
		return pick{way: wayHere}
	case pending:
		prev, ok := r.hand.previous(hash)
		if !ok {
			return pick{way: wayWait}
		}
		target, w = prev, wayPrevious
	}
	c, ok := r.peers.Get(target)
	br := r.breakers.get(target)
	may, probe := ok && br.Closed(), false
	if ok && !may {
		may = br.Allow(r.now().UnixNano(), r.cooldown)
		probe = may
	}
	switch {
	case may:
		return pick{way: w, peer: target, client: c, breaker: br, probe: probe}
	case w == wayPrevious:
		return pick{way: wayWait}
	case !ok && r.departing(target):
		// The ring is about to drop it: rebuilds drop the client first.
		return pick{way: wayWait}
	}
	return pick{way: wayDown, peer: target}
}

// release gives back the probe of a pick whose call is not made (its
// check was invalid, or a lease admitted it): the next pick probes.
func (r *router) release(p *pick) {
	if p.probe {
		p.probe = false
		p.breaker.GiveBack()
	}
}

// outcome is what a forwarded call's error means for the check.
type outcome uint8

const (
	decided outcome = iota // an answer: a decision, or the owner's verdict
	retry                  // nobody decides the key now: wait and pick again
	failed                 // the owner could not be reached: policy
)

// done feeds the outcome of a call made for p, a single check or a batch
// (batchErr), to its breaker and says what it means. Only an unreachable
// peer counts as a failure; a call that ended because its caller stopped
// waiting counts as nothing, and gives back the probe if it was one. The
// peer does not decide the key now, or a previous or departing owner could
// not be reached before the check was sent: a retry; another unreachable
// owner, or one that may have decided the check (its call failed in
// flight, peer.ErrInFlight): a failure, since a retry elsewhere would
// count the check twice once the peer's count moves to the key's next
// owner; any other error is the owner's verdict (the caller's own context
// error included, which the caller returns).
func (r *router) done(p *pick, err error) outcome {
	probe := p.probe
	p.probe = false // the call's outcome settles the probe
	down := err != nil && errors.Is(err, transport.ErrUnavailable)
	if !down && callerGone(err) {
		if probe {
			p.breaker.GiveBack()
		}
		return decided
	}
	var now int64 // read by done only when the call failed
	if down {
		now = r.now().UnixNano()
	}
	p.breaker.Done(probe, !down, now, r.threshold, r.cooldown)
	switch {
	case err == nil:
		return decided
	case errors.Is(err, transport.ErrNotOwner):
		return retry
	case down && !errors.Is(err, peer.ErrInFlight) && (p.way == wayPrevious || r.departing(p.peer)):
		return retry
	case down:
		return failed
	}
	return decided
}

// callerGone reports whether err is a context's: the caller stopped
// waiting for the call, which says nothing of the peer.
func callerGone(err error) bool {
	return err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// batchErr is the error of a call that carried a batch of checks, as done
// takes it: an unreachable peer's when any check got one, otherwise nil
// when any check was answered (the peer spoke), otherwise the caller's
// context error, or nil.
func batchErr(rs []transport.Result) error {
	var gone error
	answered := false
	for _, r := range rs {
		switch {
		case r.Err != nil && errors.Is(r.Err, transport.ErrUnavailable):
			return r.Err
		case callerGone(r.Err):
			gone = r.Err
		default:
			answered = true
		}
	}
	if answered {
		return nil
	}
	return gone
}
