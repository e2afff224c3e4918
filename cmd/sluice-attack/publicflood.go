package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Bounds of the public-flood attack.
const (
	// floodConns is how many connections the attackers hold at scale 1:
	// more than the public port's cap.
	floodConns = 5000
	// refusedWithin tells a connection the daemon closed soon after
	// accepting it from one it held longer.
	refusedWithin = time.Second
	// reopenPause is how long an attacker waits to open a connection again
	// once the daemon closed it.
	reopenPause = time.Second
)

// publicFlood: two daemons with --peer-addr. The attackers fill the first
// one's grpc_addr with TCP connections that send nothing, opening each
// again once the daemon closes it (at the cap, each new connection takes
// the slot of the one idle longest); while the port is flooded, the second
// daemon starts and joins the first, and the legitimate client checks, on
// the second daemon's public API, a key the first owns: each check crosses
// the first daemon's peer_addr, and must be decided there, by its owner.
func publicFlood(ctx context.Context, c *config) (*row, error) {
	args := []string{"--peer-addr", "127.0.0.1:0"}
	a, err := startDaemon(ctx, c, "flood-a", args...)
	if err != nil {
		return nil, err
	}
	defer a.stop(stopGrace)
	total := c.count(floodConns)
	stopFlood := make(chan struct{})
	f := &refill{}
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		f.hold(ctx, c, a.grpcAddr, total, stopFlood)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(stopFlood)
			<-flooded
		}
	}
	defer stop()
	// The flood fills the port before the second daemon starts.
	for until := time.Now().Add(startTimeout); f.opened.Load() < int64(total) && time.Now().Before(until) && ctx.Err() == nil; {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}

	b, err := startJoined(ctx, c, a, "flood-b", args...)
	if err != nil {
		return nil, err
	}
	defer b.stop(stopGrace)
	conn, err := b.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	keys, err := ownedBy(ctx, pb.NewSluiceClient(conn), a.name, 1)
	if err != nil {
		return nil, err
	}
	check := ownerCheck(conn, keys[0], a.name)
	if err := firstCheck(ctx, check); err != nil {
		return nil, err
	}
	r := &row{}
	l := startLegit(check, c.deadline)
	select {
	case <-time.After(c.duration):
	case <-ctx.Done():
	}
	r.legit = l.stop()
	stop()
	r.proc = a.stop(stopGrace)
	b.stop(stopGrace)

	limit := transport.DefaultServerLimits().MaxConnections
	r.did = fmt.Sprintf("%d attackers hold %s TCP connections to the first daemon's grpc_addr (cap %s), sending nothing and opening each again %v after the daemon closes it; meanwhile a second daemon joins, and the legitimate client checks a key of the first on the second's public API, forwarded over peer_addr, for %v",
		c.attackers, thousands(int64(total)), thousands(int64(limit)), reopenPause, c.duration)
	r.result = fmt.Sprintf("%s; %d of %d legitimate checks decided by %s, their owner, through its peer_addr",
		f.String(), r.legit.answered, r.legit.total, a.name)
	if total > limit && f.refused.Load()+f.timedOut.Load() == 0 {
		r.miss("the public port never closed a connection: the flood did not reach its cap")
	}
	r.judge(c)
	return r, nil
}

// refill is what refill.hold found.
type refill struct {
	dials
	refused  atomic.Int64 // closed by the daemon within refusedWithin
	timedOut atomic.Int64 // closed by the daemon later
}

func (f *refill) String() string {
	s := fmt.Sprintf("%s connections opened; the daemon closed %s within %v of opening (refused, or reclaimed for a newer one) and %s later (reclaimed, or at its handshake timeout)",
		thousands(f.opened.Load()), thousands(f.refused.Load()), refusedWithin, thousands(f.timedOut.Load()))
	if n := f.failed.Load(); n > 0 {
		s += fmt.Sprintf("; %s dials failed (%s)", thousands(n), f.dialErrs.String())
	}
	return s
}

// hold keeps total connections to addr open, shared among the attackers,
// until stop is closed or ctx ends: each connection the daemon closes is
// opened again after reopenPause. Nothing is sent on them.
func (f *refill) hold(ctx context.Context, c *config, addr string, total int, stop <-chan struct{}) {
	swarm(c.attackers, func(i int) {
		var slots sync.WaitGroup
		for range share(total, c.attackers, i) {
			slots.Go(func() { f.slot(ctx, addr, stop) })
		}
		slots.Wait()
	})
}

// slot is one connection of hold, opened again while the attack lasts.
func (f *refill) slot(ctx context.Context, addr string, stop <-chan struct{}) {
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-pause.C:
		}
		pause.Reset(reopenPause)
		nc := f.dial(addr)
		if nc == nil {
			continue
		}
		opened := time.Now()
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, nc)
			close(closed)
		}()
		select {
		case <-closed:
			if time.Since(opened) < refusedWithin {
				f.refused.Add(1)
			} else {
				f.timedOut.Add(1)
			}
			nc.Close()
			pause.Reset(reopenPause)
			continue
		case <-stop:
		case <-ctx.Done():
		}
		nc.Close()
		<-closed
		return
	}
}
