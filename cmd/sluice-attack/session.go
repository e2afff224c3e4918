package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// api is how the legitimate client reaches a daemon.
type api uint8

const (
	overGRPC api = iota // the public gRPC API, on one connection made before the attack
	overHTTP            // the HTTP API, on a new connection per check
)

// target is the daemon an attack is run against.
type target struct {
	d     *daemon
	legit *pb.RateLimitRequest // the legitimate client's check
	// conn is the attackers' connection to the gRPC port, apart from the
	// legitimate client's; client is the public API on it.
	conn   *grpc.ClientConn
	client pb.SluiceClient
}

// admits sends req to the public API on the attackers' connection and
// reports whether it was admitted.
func (t *target) admits(ctx context.Context, req limiter.Request) (bool, error) {
	res, err := t.client.Check(ctx, &pb.CheckRequest{Request: transport.RequestToProto(req)})
	if err != nil {
		return false, err
	}
	return res.GetResponse().GetAllowed(), nil
}

// onDaemon runs hostile against a fresh daemon started with args while a
// legitimate client checks its own key through via, then stops both and
// judges the row hostile filled in. The client's first check, before the
// attack, must be answered: it makes its connection and proves the daemon
// serves.
func onDaemon(ctx context.Context, c *config, name string, args []string, via api, hostile func(t *target, r *row) error) (*row, error) {
	d, err := startDaemon(ctx, c, name, args...)
	if err != nil {
		return nil, err
	}
	defer d.stop(stopGrace)
	t := &target{d: d, legit: legitRequest("legit-" + name)}
	if t.conn, err = d.dial(); err != nil {
		return nil, err
	}
	defer t.conn.Close()
	t.client = pb.NewSluiceClient(t.conn)
	check := httpCheck(d.httpAddr, t.legit)
	if via == overGRPC {
		conn, err := d.dial()
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		check = grpcCheck(conn, t.legit)
	}
	if err := firstCheck(ctx, check); err != nil {
		return nil, err
	}
	r := &row{}
	l := startLegit(check, c.deadline)
	err = hostile(t, r)
	r.legit = l.stop()
	r.proc = d.stop(stopGrace)
	if err != nil {
		return nil, err
	}
	r.judge(c)
	return r, nil
}

// firstCheck makes a check that must be answered before an attack starts.
func firstCheck(ctx context.Context, check checkFunc) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := check(ctx); err != nil {
		return fmt.Errorf("the legitimate client's check before the attack: %w", err)
	}
	return nil
}
