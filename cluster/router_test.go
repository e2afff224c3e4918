package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
)

// fakePeers has a client, never called, for the names it holds.
type fakePeers map[string]bool

func (f fakePeers) Get(name string) (*peer.Client, bool) { return nil, f[name] }

// routerOf is node self's router over a ring of members, ready and with
// every other member's confirmation, on the clock at.
func routerOf(t *testing.T, self string, at *time.Time, names ...string) (*router, *handover) {
	t.Helper()
	h, _ := handoverOf(t, self)
	h.setReady(true, *at)
	if err := h.adopt(members(names...), *at, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		h.confirm(n, h.fingerprint())
	}
	r := &router{self: self, hand: h, peers: fakePeers{}, now: func() time.Time { return *at },
		threshold: 2, cooldown: time.Second, departing: func(string) bool { return false }}
	return r, h
}

// hashOwnedBy returns a key hash h's ring gives name.
func hashOwnedBy(t *testing.T, h *handover, name string) uint64 {
	t.Helper()
	for x := range uint64(10_000) {
		if m, ok := h.r.OwnerOfHash(x); ok && m.Name == name {
			return x
		}
	}
	t.Fatalf("no hash owned by %s", name)
	return 0
}

func (w way) String() string {
	return [...]string{"here", "owner", "previous", "wait", "down", "not ready"}[w]
}

// The router's answers for a key another node owns, as a table of steps
// on one clock: each step reports a call's outcome, moves the clock or
// changes what the router knows, then picks.
func TestRouterSteps(t *testing.T) {
	at := time.Unix(1000, 0)
	r, h := routerOf(t, "a", &at, "a", "b")
	key := hashOwnedBy(t, h, "b")
	unavailable := fmt.Errorf("call: %w", transport.ErrUnavailable)
	inFlight := fmt.Errorf("call: %w", errors.Join(peer.ErrClosed, peer.ErrInFlight))
	for i, s := range []struct {
		at        time.Duration // since the start
		client    bool          // b has a client
		departing bool          // gossip says b is leaving
		call      error         // the outcome of a call to b, reported before picking
		callMade  bool
		want      way
		wantDone  outcome
	}{
		{want: wayDown},                  // no client
		{departing: true, want: wayWait}, // no client, leaving: the ring moves on
		{client: true, want: wayOwner},   // a client, breaker closed
		{client: true, callMade: true, call: nil, want: wayOwner, wantDone: decided},
		{client: true, callMade: true, call: transport.ErrNotOwner, want: wayOwner, wantDone: retry},
		{client: true, callMade: true, call: unavailable, want: wayOwner, wantDone: failed},
		{client: true, callMade: true, call: unavailable, want: wayDown, wantDone: failed}, // threshold 2: open
		{at: 999 * time.Millisecond, client: true, want: wayDown},                          // cooling down
		{at: time.Second, client: true, want: wayOwner},                                    // one probe
		{at: time.Second, client: true, want: wayDown},                                     // while it is out
		{at: time.Second, client: true, callMade: true, call: nil, want: wayOwner, wantDone: decided},
		{at: time.Second, client: true, departing: true, callMade: true, call: unavailable, want: wayOwner, wantDone: retry},
		{at: time.Second, client: true, callMade: true, call: limitErr, want: wayOwner, wantDone: decided}, // the owner's verdict
		// The call failed after the check was sent: b may have counted
		// it, and its count moves to the key's next owner.
		{at: time.Second, client: true, departing: true, callMade: true, call: inFlight, want: wayOwner, wantDone: failed},
	} {
		at = time.Unix(1000, 0).Add(s.at)
		r.peers = fakePeers{"b": s.client}
		r.departing = func(string) bool { return s.departing }
		if s.callMade {
			p := pick{way: wayOwner, peer: "b", breaker: r.breakers.get("b")}
			if got := r.done(&p, s.call); got != s.wantDone {
				t.Fatalf("step %d: done(%v) = %d, want %d", i, s.call, got, s.wantDone)
			}
		}
		if got := r.pick(key); got.way != s.want {
			t.Fatalf("step %d: pick = %v, want %v", i, got.way, s.want)
		}
	}
}

var limitErr = errors.New("limiter: invalid limit")

// A key this node owns and has settled is decided here; one that moved
// here and has not settled goes to its previous owner, or waits when that
// one cannot be called; a node that is not ready decides nothing.
func TestRouterHandover(t *testing.T) {
	at := time.Unix(1000, 0)
	r, h := routerOf(t, "a", &at, "a")
	if err := h.adopt(members("a", "b"), at, nil); err != nil { // b joins: a keeps what it keeps
		t.Fatal(err)
	}
	mine := hashOwnedBy(t, h, "a")
	if p := r.pick(mine); p.way != wayHere {
		t.Fatalf("a key a kept: %v, want here", p.way)
	}
	// b leaves again: what a gains from b waits for the hand-over.
	if err := h.adopt(members("a", "c"), at, nil); err != nil {
		t.Fatal(err)
	}
	var gained uint64
	found := false
	for x := range uint64(10_000) {
		if st, _ := h.stateOf(x); st == pending {
			gained, found = x, true
			break
		}
	}
	if !found {
		t.Fatal("a gained no key")
	}
	prev, _ := h.previous(gained)
	r.peers = fakePeers{prev: true}
	if p := r.pick(gained); p.way != wayPrevious || p.peer != prev {
		t.Fatalf("a key settling here: %v to %q, want previous to %q", p.way, p.peer, prev)
	}
	r.peers = fakePeers{}
	if p := r.pick(gained); p.way != wayWait {
		t.Fatalf("a key settling here, previous owner without a client: %v, want wait", p.way)
	}
	p := pick{way: wayPrevious, peer: prev, breaker: r.breakers.get(prev)}
	if got := r.done(&p, transport.ErrUnavailable); got != retry {
		t.Fatalf("the previous owner unreachable: %d, want retry", got)
	}
	h.confirm("c", h.fingerprint())
	if p := r.pick(gained); p.way != wayHere {
		t.Fatalf("a key confirmed here: %v, want here", p.way)
	}
	h.setReady(false, at)
	if p := r.pick(hashOwnedBy(t, h, "a")); p.way != wayNotReady {
		t.Fatalf("not ready: %v, want not ready", p.way)
	}

}

// A pick that took the half-open probe and made no call gives it back:
// the next pick probes, and the breaker does not stay open.
func TestRouterReleasesProbe(t *testing.T) {
	at := time.Unix(1000, 0)
	r, h := routerOf(t, "a", &at, "a", "b")
	r.peers = fakePeers{"b": true}
	key := hashOwnedBy(t, h, "b")
	for range r.threshold {
		p := r.pick(key)
		r.done(&p, transport.ErrUnavailable)
	}
	at = at.Add(r.cooldown)
	p := r.pick(key)
	if p.way != wayOwner || !p.probe {
		t.Fatalf("after the cooldown: %v, probe %v; want owner with the probe", p.way, p.probe)
	}
	if q := r.pick(key); q.way != wayDown {
		t.Fatalf("while the probe is out: %v, want down", q.way)
	}
	r.release(&p) // say, the check was invalid
	q := r.pick(key)
	if q.way != wayOwner || !q.probe {
		t.Fatalf("after the probe was given back: %v, probe %v; want owner with the probe", q.way, q.probe)
	}
	r.done(&q, nil)
	if s := r.pick(key); s.way != wayOwner || s.probe {
		t.Fatalf("after a good probe: %v, probe %v; want owner, closed", s.way, s.probe)
	}
}

// The breaker hears only what a call says of the peer, and one probe is
// out at a time, for single checks and batches alike (both report through
// done): a call that ended because its caller stopped waiting counts as
// nothing and gives back its probe if it was one; a call let through
// before the breaker opened that fails while the probe is out does not end
// the probe. Steps on one clock (threshold 2, cooldown 1s): each may pick
// and keep the pick under a name, then may report the outcome of a kept
// pick's call; then a fresh pick, given back at once, says where a check
// would go.
func TestRouterBreakerHearsOnlyThePeer(t *testing.T) {
	at := time.Unix(1000, 0)
	r, h := routerOf(t, "a", &at, "a", "b")
	r.peers = fakePeers{"b": true}
	key := hashOwnedBy(t, h, "b")
	unavailable := fmt.Errorf("call: %w", transport.ErrUnavailable)
	kept := map[string]*pick{}
	for i, s := range []struct {
		at        time.Duration // since the start
		keep      string        // pick, and keep the pick under this name
		keptProbe bool          // the kept pick took the probe
		call      string        // report the outcome of this kept pick's call
		err       error
		want      way
		wantProbe bool // the fresh pick took the probe
	}{
		{keep: "early", want: wayOwner},                                                                      // a slow call, let through while closed
		{keep: "a", call: "a", err: unavailable, want: wayOwner},                                             // one failure
		{keep: "b", call: "b", err: context.Canceled, want: wayOwner},                                        // counts nothing
		{keep: "c", call: "c", err: unavailable, want: wayDown},                                              // the second failure in a row
		{at: time.Second, keep: "probe", keptProbe: true, want: wayDown},                                     // the probe is out
		{at: time.Second, call: "early", err: unavailable, want: wayDown},                                    // open again, until 2s
		{at: 2 * time.Second, want: wayDown},                                                                 // the probe is still out
		{at: 2 * time.Second, call: "probe", err: context.DeadlineExceeded, want: wayOwner, wantProbe: true}, // given back
		{at: 2 * time.Second, keep: "good", keptProbe: true, call: "good", want: wayOwner},                   // closed
	} {
		at = time.Unix(1000, 0).Add(s.at)
		if s.keep != "" {
			p := r.pick(key)
			if p.way != wayOwner || p.probe != s.keptProbe {
				t.Fatalf("step %d: kept pick %v, probe %v; want owner, probe %v", i, p.way, p.probe, s.keptProbe)
			}
			kept[s.keep] = &p
		}
		if s.call != "" {
			r.done(kept[s.call], s.err)
		}
		p := r.pick(key)
		probe := p.probe
		r.release(&p)
		if p.way != s.want || probe != s.wantProbe {
			t.Fatalf("step %d: pick %v, probe %v; want %v, probe %v", i, p.way, probe, s.want, s.wantProbe)
		}
	}
}

// A batch's call is reported as one check's would be: unreachable when any
// of its checks found the peer unreachable, answered when any was
// answered, and otherwise ended by its caller.
func TestBatchErr(t *testing.T) {
	unavailable := fmt.Errorf("call: %w", transport.ErrUnavailable)
	for _, tt := range []struct {
		name string
		errs []error
		want error
	}{
		{"answered", []error{nil, limitErr}, nil},
		{"unreachable", []error{nil, context.Canceled, unavailable}, unavailable},
		{"answered before the caller left", []error{context.Canceled, nil}, nil},
		{"caller left", []error{context.Canceled, context.Canceled}, context.Canceled},
		{"nothing", nil, nil},
	} {
		rs := make([]sluice.Result, len(tt.errs))
		for i, err := range tt.errs {
			rs[i].Err = err
		}
		if got := batchErr(rs); got != tt.want {
			t.Errorf("%s: batchErr = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// PeerClientStats returns the counters of n's client of the member name,
// for the tests of package cluster_test.
func (n *Node) PeerClientStats(name string) (peer.Stats, bool) {
	c, ok := n.peers.Get(name)
	if !ok {
		return peer.Stats{}, false
	}
	return c.Stats(), true
}

// A check of a batch is retried on a departing peer only when it was not
// sent: one that failed in flight may have been counted there.
func TestItemOutcome(t *testing.T) {
	unsent := fmt.Errorf("call: %w", peer.ErrClosed)
	inFlight := fmt.Errorf("call: %w", errors.Join(peer.ErrClosed, peer.ErrInFlight))
	for _, tt := range []struct {
		name string
		call outcome
		err  error
		want outcome
	}{
		{"answered", retry, nil, decided},
		{"not the owner", failed, transport.ErrNotOwner, retry},
		{"not sent, departing", retry, unsent, retry},
		{"in flight, departing", retry, inFlight, failed},
		{"not sent, down", failed, unsent, failed},
		{"the owner's verdict", retry, limitErr, decided},
	} {
		if got := itemOutcome(tt.call, tt.err); got != tt.want {
			t.Errorf("%s: itemOutcome(%d, %v) = %d, want %d", tt.name, tt.call, tt.err, got, tt.want)
		}
	}
}
