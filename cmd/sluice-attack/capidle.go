package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// idleCap: more connections than the gRPC port's cap (4096; grpc_addr,
// shared with peers: no --peer-addr) that open no call, a third each raw
// TCP, the HTTP/2 preface alone, and the preface with SETTINGS, held for
// the hostile phase; once they are all open, new clients, one after
// another, each open a connection of their own and make one check, which must be answered
// within the legitimate deadline: idle connections give up their slots
// to new ones instead of holding the cap for the handshake or idle
// timeouts.
func idleCap(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "idle-connection-cap", nil, overGRPC, func(t *target, r *row) error {
		const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
		settings := append([]byte(preface), 0, 0, 0, 4, 0, 0, 0, 0, 0) // an empty SETTINGS frame
		total := max(c.count(6000), 3)
		var h [3]*held
		var wg sync.WaitGroup
		for j, opening := range [][]byte{nil, []byte(preface), settings} {
			h[j] = &held{hold: c.duration}
			wg.Go(func() { h[j].holdConns(ctx, c, t.d.grpcAddr, total/3, opening, nil, 0) })
		}
		var fresh legitStats
		wg.Go(func() {
			end := c.hostile()
			// The flood opens all its connections first: the cap is
			// full of them, and the kernel's accept queue no longer
			// overflows with their dials.
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for n := 0; n < 3*(total/3) && time.Now().Before(end) && ctx.Err() == nil; <-tick.C {
				n = 0
				for _, hj := range h {
					n += int(hj.opened.Load() + hj.failed.Load())
				}
			}
			for time.Now().Before(end) && ctx.Err() == nil {
				began := time.Now()
				err := freshClientCheck(ctx, t.d.grpcAddr, c.deadline)
				took := time.Since(began)
				fresh.total++
				fresh.worst = max(fresh.worst, took)
				switch {
				case err != nil:
					fresh.missed.addErr("gRPC "+codeOf(err), err)
				case took > c.deadline:
					fresh.missed.add("late", 1)
				default:
					fresh.answered++
				}
			}
		})
		wg.Wait()
		r.did = fmt.Sprintf("%d attackers open %s connections to the gRPC port (cap 4096) that open no call, a third each raw TCP, the HTTP/2 preface, the preface and SETTINGS, held for %v; once they are open, new clients connect one after another and check once",
			c.attackers, thousands(int64(3*(total/3))), c.duration)
		r.result = fmt.Sprintf("raw: %s. preface: %s. SETTINGS: %s. New clients: %s",
			h[0], h[1], h[2], fresh.String())
		if fresh.answered == 0 || fresh.answered < fresh.total {
			r.miss("%d of %d new clients not answered within %v", fresh.total-fresh.answered, fresh.total, c.deadline)
		}
		return nil
	})
}

// freshClientCheck connects to addr with a client of its own and makes
// one check within deadline.
func freshClientCheck(ctx context.Context, addr string, deadline time.Duration) error {
	conn, err := dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	req := limiter.Request{Name: "fresh", Key: "k", Hits: 1, Limit: 1_000_000, Period: time.Second, Algorithm: limiter.GCRA}
	_, err = pb.NewSluiceClient(conn).Check(cctx, &pb.CheckRequest{Request: transport.RequestToProto(req)})
	return err
}
