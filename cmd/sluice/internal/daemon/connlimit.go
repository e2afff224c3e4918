package daemon

import (
	"net"
	"net/http"
	"sync"
)

// connLimit is the HTTP listener's connection cap (http_max_connections)
// that idle keep-alive connections cannot hold: a connection accepted at
// the cap takes the slot of the connection that has been idle longest,
// which is closed; with none idle it waits for a slot, or for one to turn
// idle. Without this, clients that each make one request and keep their
// connections would hold the cap for the server's IdleTimeout. Safe for
// concurrent use; track is the http.Server's ConnState.
type connLimit struct {
	net.Listener
	slots chan struct{} // one token per open connection
	done  chan struct{} // closed by Close

	mu        sync.Mutex
	idle      map[net.Conn]uint64 // connections idle now, by when they became so
	seq       uint64              // orders idle
	idleNow   chan struct{}       // closed when a connection turns idle; nil if no one waits
	closeOnce sync.Once
}

func newConnLimit(l net.Listener, max int) *connLimit {
	return &connLimit{Listener: l, slots: make(chan struct{}, max), done: make(chan struct{}), idle: make(map[net.Conn]uint64)}
}

// Accept accepts a connection, then gives it a slot: a free one, the
// slot of the longest idle connection, or the first that frees or whose
// connection turns idle.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: l.release}, nil
		default:
		}
		if l.closeIdlest() {
			continue
		}
		l.mu.Lock()
		if l.idleNow == nil {
			l.idleNow = make(chan struct{})
		}
		idleNow := l.idleNow
		l.mu.Unlock()
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: l.release}, nil
		case <-idleNow:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

func (l *connLimit) release() { <-l.slots }

// closeIdlest closes the connection idle longest, if any, and reports
// whether there was one. Its slot is free once it is closed.
func (l *connLimit) closeIdlest() bool {
	l.mu.Lock()
	var oldest net.Conn
	var at uint64
	for c, s := range l.idle {
		if oldest == nil || s < at {
			oldest, at = c, s
		}
	}
	if oldest != nil {
		delete(l.idle, oldest)
	}
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	oldest.Close()
	return true
}

// track is the server's ConnState: it keeps the set of idle connections.
func (l *connLimit) track(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s != http.StateIdle {
		delete(l.idle, c)
		return
	}
	l.seq++
	l.idle[c] = l.seq
	if l.idleNow != nil {
		close(l.idleNow)
		l.idleNow = nil
	}
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back once, when it is first closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
