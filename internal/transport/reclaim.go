package transport

import (
	"net"
	"sync"
)

// The connection cap of a MessageBudget's listener (MessageBudget.Listen).
// A connection that has no call open holds its slot only until another
// connection needs it: at the cap, the connection idle longest (since it
// was accepted, or since its last call ended) is closed and its slot given
// to the new one. A call counts as open from its first message in until
// it ends. A connection with a call open, a peer's stream that has carried
// a batch included, is never closed for another; with every connection
// busy, the new one is closed at once, as ServerLimits.Listen closes it.
// So clients that open connections and no calls (raw TCP, the HTTP/2
// preface alone, a handshake and silence), or calls without their message
// (each renewed before MessageTimeout), cannot hold the cap for the
// handshake or idle timeouts: each holds it until the next connection
// arrives. The budget's hooks in each call (its interceptors) tell the
// listener which connections have calls open, so the two must serve the
// same server.

// reclaimListener is the listener of MessageBudget.Listen.
type reclaimListener struct {
	net.Listener
	b   *MessageBudget
	max int
}

// slotConn is a connection that holds one of its listener's slots until
// it is closed.
type slotConn struct {
	net.Conn
	b   *MessageBudget
	key string // connKey of its addresses
	// The fields below are guarded by MessageBudget.connsMu.
	calls     int    // calls open, counted from their first message in
	idleSince uint64 // connSeq when it last had no call open
	closed    bool
}

// connKey names a connection by its two addresses, as the listener and
// gRPC's peer of each call both see them.
func connKey(local, remote net.Addr) string { return local.String() + " " + remote.String() }

// Listen listens on the local network address, as ServerLimits.Listen
// does, with a cap of b's MaxConnections that reclaims the slots of
// connections with no call open (see above). Serve it with a server that
// has b's ServerOptions, and no other.
func (b *MessageBudget) Listen(network, address string) (net.Listener, error) {
	lis, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &reclaimListener{Listener: lis, b: b, max: b.limits.MaxConnections}, nil
}

func (l *reclaimListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		sc := &slotConn{Conn: c, b: l.b, key: connKey(c.LocalAddr(), c.RemoteAddr())}
		ok, victim := l.b.admit(sc, l.max)
		if victim != nil {
			l.b.reclaimed.Add(1)
			victim.Conn.Close()
		}
		if ok {
			return sc, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset: nothing lingers in TIME_WAIT
		}
		c.Close()
	}
}

// admit gives sc a slot of max: a free one, or that of the connection
// idle longest, which it returns for the caller to close. ok is false when
// every slot is held by a connection with a call open.
func (b *MessageBudget) admit(sc *slotConn, max int) (ok bool, victim *slotConn) {
	b.connsMu.Lock()
	defer b.connsMu.Unlock()
	if len(b.conns) >= max {
		for _, c := range b.conns {
			if c.calls == 0 && (victim == nil || c.idleSince < victim.idleSince) {
				victim = c
			}
		}
		if victim == nil {
			return false, nil
		}
		victim.closed = true
		delete(b.conns, victim.key)
	}
	b.connSeq++
	sc.idleSince = b.connSeq
	b.conns[sc.key] = sc
	return true, victim
}

// Close gives back the connection's slot, once.
func (c *slotConn) Close() error {
	c.b.connsMu.Lock()
	if !c.closed {
		c.closed = true
		if c.b.conns[c.key] == c {
			delete(c.b.conns, c.key)
		}
	}
	c.b.connsMu.Unlock()
	return c.Conn.Close()
}

// slotOf returns the connection of b's listener with those addresses, or
// nil (another listener's, or one already closed).
func (b *MessageBudget) slotOf(local, remote net.Addr) *slotConn {
	if local == nil || remote == nil {
		return nil
	}
	b.connsMu.Lock()
	defer b.connsMu.Unlock()
	return b.conns[connKey(local, remote)]
}

// callBegan and callEnded count the calls open on c.
func (b *MessageBudget) callBegan(c *slotConn) {
	b.connsMu.Lock()
	c.calls++
	b.connsMu.Unlock()
}

func (b *MessageBudget) callEnded(c *slotConn) {
	b.connsMu.Lock()
	if c.calls--; c.calls == 0 {
		b.connSeq++
		c.idleSince = b.connSeq
	}
	b.connsMu.Unlock()
}

// connSlots is what a MessageBudget keeps for its listener.
type connSlots struct {
	connsMu sync.Mutex // guards conns, connSeq and each slotConn's fields
	conns   map[string]*slotConn
	connSeq uint64 // orders the connections by when they became idle
}
