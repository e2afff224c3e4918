package transport

import (
	"testing"
	"time"
)

// TestStalledCallsGiveUpTheCap fills a port's connection cap with
// connections that each open a call and never send its message (a
// slowloris of calls: an attacker renews a call before MessageTimeout
// cancels it, modelled here by a MessageTimeout far longer than the
// test), and ping. A call whose first message is not in does not keep its
// connection's slot: a new client is still served, while a peer whose
// stream has carried a message keeps its own.
func TestStalledCallsGiveUpTheCap(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxConnections = 4
	l.HandshakeTimeout, l.MaxConnectionIdle, l.MessageTimeout = time.Hour, time.Hour, time.Hour
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveReclaiming(t, b)

	peer := newRawPeer(t, addr)
	peer.send(1)
	if got := peer.answer(); got != 1 {
		t.Fatalf("peer answer %d", got)
	}
	for range l.MaxConnections {
		open := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
		open = appendFrame(open, frameHeaders, flagEndHeaders, 1, grpcHeaders("/sluice.v1.Peer/CheckBatch"))
		open = appendFrame(open, frameHeaders, flagEndHeaders, 3, grpcHeaders("/sluice.v1.Peer/CheckStream"))
		open = appendFrame(open, framePing, 0, 0, make([]byte, 8)) // pings keep no slot either
		if _, err := tryRaw(t, addr, open); err != nil {
			t.Logf("stalling connection: %v", err)
		}
	}
	servedWhilePeerKept(t, addr, peer, "a client's call on a port whose cap stalled calls fill")
}
