package cluster

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/ring"
)

// Membership is earned. Gossip says who claims to be a member; a node
// routes keys to a member, hands keys off to it, replicates to it and takes
// leases from it only once the member has proved the credential the Peer
// service demands of callers (transport.Prove): under mutual TLS with peer
// identities, a certificate naming one (checked on every connection by the
// dial credentials); with a cluster secret, an HMAC under the peer key of
// a fresh nonce and both names. Each node challenges every member it sees,
// so both directions hold. With peer authentication off, every member is
// used at once.
//
// A member is pending until its first answer, then proven or refused. A
// refused member is challenged again after ProofRetry, doubled at every
// failure up to ProofRetryMax; a member that leaves the alive members, or
// whose gRPC address changes, starts over as pending.

// proofStatus is where a member stands in proving itself.
type proofStatus uint8

const (
	proofPending proofStatus = iota // no answer yet
	proofProven
	proofRefused
)

// memberProof is one member's standing.
type memberProof struct {
	addr     string
	status   proofStatus
	reason   string    // the last failure, when refused
	since    time.Time // when status last changed
	failures int       // consecutive failed attempts
	next     time.Time // when the next attempt is due
	running  bool      // an attempt is in flight
}

// RefusedMember is a member of the gossip that has not proved it belongs
// to the cluster: it owns no key and is sent nothing.
type RefusedMember struct {
	Name     string
	GRPCAddr string
	// Reason is why the last attempt failed.
	Reason string
	// Since is when the member was first refused, on the node's clock.
	Since time.Time
	// Attempts is how many challenges in a row it failed.
	Attempts int
}

// proofs tracks which members have proved themselves. Safe for concurrent
// use.
type proofs struct {
	open      bool // no proof is asked: every member counts as proven
	self      string
	retry     time.Duration // wait after the first failure
	retryMax  time.Duration
	mu        sync.Mutex // guards members and changed
	members   map[string]*memberProof
	changed   chan struct{} // closed and replaced when an answer is recorded
	wakeProve chan struct{} // tells the prover loop to look again
}

func newProofs(open bool, self string, retry, retryMax time.Duration) *proofs {
	return &proofs{open: open, self: self, retry: retry, retryMax: retryMax,
		members: map[string]*memberProof{}, changed: make(chan struct{}), wakeProve: make(chan struct{}, 1)}
}

// admit makes the table follow candidates, the alive members with a valid
// gRPC tag, and returns those the ring may hold: this node and every
// proven member. A new member, or one whose address changed, is pending.
func (p *proofs) admit(candidates []ring.Member, now time.Time) []ring.Member {
	if p.open {
		return candidates
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ring.Member, 0, len(candidates))
	seen := make(map[string]bool, len(candidates))
	pending := false
	for _, m := range candidates {
		seen[m.Name] = true
		if m.Name == p.self {
			out = append(out, m)
			continue
		}
		mp, ok := p.members[m.Name]
		if !ok || mp.addr != m.Addr {
			mp = &memberProof{addr: m.Addr, since: now, next: now}
			p.members[m.Name] = mp
		}
		switch mp.status {
		case proofProven:
			out = append(out, m)
		case proofPending:
			pending = true
		}
	}
	for name := range p.members {
		if !seen[name] {
			delete(p.members, name)
		}
	}
	if pending {
		p.wake()
	}
	return out
}

// wake tells the prover loop to look again.
func (p *proofs) wake() {
	select {
	case p.wakeProve <- struct{}{}:
	default:
	}
}

// due marks the members whose attempt is due at now as running and
// returns them, with when the next one falls due (zero: none waits).
func (p *proofs) due(now time.Time) (due []ring.Member, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, mp := range p.members {
		switch {
		case mp.running || mp.status == proofProven:
		case !mp.next.After(now):
			mp.running = true
			due = append(due, ring.Member{Name: name, Addr: mp.addr})
		case next.IsZero() || mp.next.Before(next):
			next = mp.next
		}
	}
	return due, next
}

// done records the answer of the member m to the attempt started for it:
// err nil proves it. It reports the member's new status and whether it
// changed; an answer for an address the member no longer has is dropped.
func (p *proofs) done(m ring.Member, err error, now time.Time) (proofStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mp, ok := p.members[m.Name]
	if !ok || mp.addr != m.Addr {
		return proofPending, false
	}
	mp.running = false
	close(p.changed)
	p.changed = make(chan struct{})
	before := mp.status
	if err == nil {
		mp.status, mp.failures, mp.reason = proofProven, 0, ""
	} else {
		mp.status, mp.reason = proofRefused, err.Error()
		mp.failures++
		mp.next = now.Add(p.backoff(mp.failures))
	}
	if mp.status != before {
		mp.since = now
	}
	return mp.status, mp.status != before
}

// backoff is the wait after the failures-th failure in a row.
func (p *proofs) backoff(failures int) time.Duration {
	d := p.retry
	for i := 1; i < failures && d < p.retryMax; i++ {
		d *= 2
	}
	return min(d, p.retryMax)
}

// settled returns a channel closed at the next answer, and whether no
// member is pending now.
func (p *proofs) settled() (<-chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, mp := range p.members {
		if mp.status == proofPending {
			return p.changed, false
		}
	}
	return p.changed, true
}

// refused returns the refused members, sorted by name.
func (p *proofs) refused() []RefusedMember {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []RefusedMember
	for name, mp := range p.members {
		if mp.status == proofRefused {
			out = append(out, RefusedMember{Name: name, GRPCAddr: mp.addr, Reason: mp.reason, Since: mp.since, Attempts: mp.failures})
		}
	}
	slices.SortFunc(out, func(a, b RefusedMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// proveLoop challenges every member whose attempt is due, each in a
// goroutine of its own, until the node closes.
func (n *Node) proveLoop() {
	var t *clocks.Timer
	defer func() { t.Stop() }()
	for {
		due, next := n.proofs.due(n.now())
		for _, m := range due {
			n.goFunc(func() { n.prove(m) })
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(n.now()), MinInterval)
		}
		t.Stop()
		t = clocks.NewTimer(n.clock, wait)
		select {
		case <-n.shutdown:
			return
		case <-n.proofs.wakeProve:
		case <-t.C:
		}
	}
}

// prove challenges m once and applies the answer: a member whose status
// changed is logged, once, and the ring rebuilt.
func (n *Node) prove(m ring.Member) {
	ctx, cancel := clocks.WithTimeout(n.proofCtx, n.clock, n.cfg.ProofTimeout)
	defer cancel()
	_, err := n.challenge(ctx, m)
	if n.closed.Load() {
		return
	}
	status, changed := n.proofs.done(m, err, n.now())
	n.proofs.wake() // the next attempt may be due before the loop's timer
	if !changed {
		return
	}
	if status == proofProven {
		n.logger.Info("cluster: member proved it belongs to the cluster", "member", m.Name, "grpc", m.Addr)
	} else {
		n.logger.Warn("cluster: member refused: it has not proved it belongs to the cluster, so it owns no key and is sent nothing; retrying",
			"member", m.Name, "grpc", m.Addr, "err", err)
	}
	n.rebuild(0)
}

// challenge runs one transport.Prove of m on a connection of its own,
// and returns the gossip address m reports ("" for none). With peer
// authentication off it still checks that the member answers under
// m.Name.
func (n *Node) challenge(ctx context.Context, m ring.Member) (gossip string, err error) {
	conn, err := grpc.NewClient(m.Addr, n.proveDial...)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return transport.ProveGossip(ctx, conn, n.cfg.NodeName, m.Name, n.proveKeys)
}

// awaitProofs waits until every member known has answered its first
// challenge, for at most ProofTimeout, so that a node that joins does not
// decide keys as owner while its ring lacks members that are about to
// prove themselves. It reports whether it waited for any.
func (n *Node) awaitProofs() (waited bool) {
	t := clocks.NewTimer(n.clock, n.cfg.ProofTimeout)
	defer t.Stop()
	for {
		changed, ok := n.proofs.settled()
		if ok {
			return waited
		}
		waited = true
		select {
		case <-changed:
		case <-t.C:
			return waited
		case <-n.shutdown:
			return waited
		}
	}
}

// RefusedMembers returns the members of the gossip this node keeps out of
// its ring, sorted by name: those that have not proved they belong to the
// cluster (see Config.ClusterSecret and Config.PeerIdentities), and those
// that speak no protocol version this node speaks (protocol.go). They own
// no key, and no check, hand-off, replica or lease goes to them.
func (n *Node) RefusedMembers() []RefusedMember {
	out := append(n.proofs.refused(), n.versions.list()...)
	slices.SortFunc(out, func(a, b RefusedMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}
