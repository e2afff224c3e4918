package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// idleConnections: connections to the gRPC port (grpc_addr, shared with
// peers: no --peer-addr) that send the HTTP/2 client preface and nothing
// else, held for the hostile phase.
func idleConnections(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "idle-connections", nil, overGRPC, func(t *target, r *row) error {
		const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
		total := c.count(2000)
		h := holdConns(ctx, c, t.d.grpcAddr, total, []byte(preface), nil, 0)
		r.did = fmt.Sprintf("%d attackers open %s TCP connections to the gRPC port, send the HTTP/2 client preface and nothing more, and hold them for %v",
			c.attackers, thousands(int64(total)), c.duration)
		r.result = h.String()
		return nil
	})
}

// slowloris: HTTP connections that send a request's headers one byte at a
// time, a byte per connection every slowDrip, for the hostile phase.
func slowloris(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "slowloris", nil, overHTTP, func(t *target, r *row) error {
		total := c.count(2000)
		h := holdConns(ctx, c, t.d.httpAddr, total, nil, slowHeader, slowDrip)
		r.did = fmt.Sprintf("%d attackers open %s HTTP connections and send endless request headers one byte per connection every %v, for %v",
			c.attackers, thousands(int64(total)), slowDrip, c.duration)
		r.result = h.String()
		return nil
	})
}

const slowDrip = 200 * time.Millisecond

// slowHeader returns byte i of an HTTP request whose headers never end.
func slowHeader(i int) byte {
	const head, line = "POST /v1/check HTTP/1.1\r\nHost: sluice\r\n", "X-Slowloris: 1\r\n"
	if i < len(head) {
		return head[i]
	}
	return line[(i-len(head))%len(line)]
}

// dials counts an attack's connections: opened, and failed by cause.
type dials struct {
	opened, failed atomic.Int64
	dialErrs       tally
}

// dial opens a connection to addr and counts it, or returns nil and counts
// the failure.
func (d *dials) dial(addr string) net.Conn {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		d.failed.Add(1)
		d.dialErrs.add(dialError(err), 1)
		return nil
	}
	d.opened.Add(1)
	return nc
}

// held is what holdConns found.
type held struct {
	dials
	mu          sync.Mutex // guards closed, first and last
	closed      int
	first, last time.Duration // of the closes, after the connection opened
	hold        time.Duration
}

func (h *held) String() string {
	s := fmt.Sprintf("%s connections opened", thousands(h.opened.Load()))
	if n := h.failed.Load(); n > 0 {
		s += fmt.Sprintf(", %s failed (%s)", thousands(n), h.dialErrs.String())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed == 0 {
		return s + fmt.Sprintf("; the daemon closed none within %v", h.hold)
	}
	return s + fmt.Sprintf("; the daemon closed %s within %v, %s to %s after they opened",
		thousands(int64(h.closed)), h.hold, ms(h.first), ms(h.last))
}

func (h *held) closedAfter(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed == 0 || d < h.first {
		h.first = d
	}
	h.last = max(h.last, d)
	h.closed++
}

// holdConns opens total connections to addr, shared among the attackers,
// writes opening on each, then, when drip is set, writes drip(0), drip(1)...
// to each, one byte every dripEvery, until the hostile phase ends; and
// counts the connections the other side closed meanwhile.
func holdConns(ctx context.Context, c *config, addr string, total int, opening []byte, drip func(int) byte, dripEvery time.Duration) *held {
	h := &held{hold: c.duration}
	h.holdConns(ctx, c, addr, total, opening, drip, dripEvery)
	return h
}

// holdConns is holdConns counting in h, which the caller may read as the
// connections open.
func (h *held) holdConns(ctx context.Context, c *config, addr string, total int, opening []byte, drip func(int) byte, dripEvery time.Duration) {
	end := c.hostile()
	swarm(c.attackers, func(i int) {
		var conns []*heldConn
		var readers sync.WaitGroup
		for range share(total, c.attackers, i) {
			if !time.Now().Before(end) || ctx.Err() != nil {
				break
			}
			nc := h.dial(addr)
			if nc == nil {
				continue
			}
			hc := &heldConn{Conn: nc, opened: time.Now()}
			conns = append(conns, hc)
			readers.Go(func() { hc.read(h) })
			if len(opening) > 0 {
				hc.Write(opening)
			}
		}
		if drip != nil {
			t := time.NewTicker(dripEvery)
			for pos := 0; time.Now().Before(end) && ctx.Err() == nil; pos++ {
				for _, hc := range conns {
					if !hc.gone.Load() {
						hc.Write([]byte{drip(pos)})
					}
				}
				select {
				case <-t.C:
				case <-ctx.Done():
				}
			}
			t.Stop()
		}
		if wait := time.Until(end); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
		for _, hc := range conns {
			hc.ours.Store(true)
			hc.Close()
		}
		readers.Wait()
	})
}

// heldConn is a connection an attacker holds.
type heldConn struct {
	net.Conn
	opened time.Time
	ours   atomic.Bool // the attacker closed it
	gone   atomic.Bool // it is closed
}

// read discards what the other side sends until the connection closes,
// and counts it in h when the other side closed it.
func (hc *heldConn) read(h *held) {
	io.Copy(io.Discard, hc.Conn)
	hc.gone.Store(true)
	if !hc.ours.Load() {
		h.closedAfter(time.Since(hc.opened))
	}
}

// dialError classifies a failed dial.
func dialError(err error) string {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return "timeout"
	}
	return "refused or reset"
}
