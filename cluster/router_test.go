package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/peer"
	"github.com/sluicehq/sluice/transport"
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
	if err := h.adopt(members(names...), *at); err != nil {
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
	} {
		at = time.Unix(1000, 0).Add(s.at)
		r.peers = fakePeers{"b": s.client}
		r.departing = func(string) bool { return s.departing }
		if s.callMade {
			p := pick{way: wayOwner, peer: "b", br: r.breakers.get("b")}
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
	if err := h.adopt(members("a", "b"), at); err != nil { // b joins: a keeps what it keeps
		t.Fatal(err)
	}
	mine := hashOwnedBy(t, h, "a")
	if p := r.pick(mine); p.way != wayHere {
		t.Fatalf("a key a kept: %v, want here", p.way)
	}
	// b leaves again: what a gains from b waits for the hand-over.
	if err := h.adopt(members("a", "c"), at); err != nil {
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
	p := pick{way: wayPrevious, peer: prev, br: r.breakers.get(prev)}
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
