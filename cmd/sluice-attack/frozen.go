package main

import (
	"context"
	"fmt"
	"syscall"

	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// frozenOwner: two daemons in one cluster; the second, which owns the keys
// of the attack and of the legitimate client, is frozen with SIGSTOP (it
// keeps its connections open and answers nothing), and the attackers and
// the legitimate client check those keys on the first, each check with a
// deadline of twice the daemons' --peer-timeout. Every check must be
// answered: by the unreachable policy, or by the first daemon once it
// owns the keys.
func frozenOwner(ctx context.Context, c *config) (*row, error) {
	args := []string{"--peer-timeout", c.peerTimeout.String()}
	a, b, err := startPair(ctx, c, "frozen", nil, args...)
	if err != nil {
		return nil, err
	}
	defer a.stop(stopGrace)
	defer b.stop(stopGrace)
	conn, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pb.NewSluiceClient(conn)
	keys, err := ownedBy(ctx, client, b.name, max(c.count(64), 4)+1)
	if err != nil {
		return nil, err
	}
	legitConn, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer legitConn.Close()
	deadline := 2 * c.peerTimeout
	check := grpcCheck(legitConn, keys[0])
	if err := firstCheck(ctx, check); err != nil {
		return nil, err
	}

	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return nil, err
	}
	defer b.cmd.Process.Signal(syscall.SIGCONT) // before b.stop: defers run last in, first out
	r := &row{}
	l := startLegit(check, deadline)
	var outcomes tally
	attackKeys := keys[1:]
	calls := c.rounds(ctx, c.count(1_600_000), c.hostile(), func(i, k int) {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		res, err := client.Check(cctx, &pb.CheckRequest{Request: attackKeys[(i+k)%len(attackKeys)]})
		switch it := res.GetResponse(); {
		case err != nil:
			outcomes.add(codeOf(err), 1)
		case it.GetErrorCode() != pb.ErrorCode_ERROR_CODE_NONE:
			outcomes.add(itemOutcome(it), 1)
		case it.GetWithoutOwner():
			outcomes.add("answered without_owner", 1)
		default:
			outcomes.add("answered by "+it.GetOwner(), 1)
		}
	})
	r.legit = l.stop()
	b.cmd.Process.Signal(syscall.SIGCONT)
	r.proc = a.stop(stopGrace)
	b.stop(stopGrace)

	r.did = fmt.Sprintf("%d attackers check %d keys owned by a second daemon, frozen with SIGSTOP, on the first, with a deadline of %v (twice --peer-timeout) each, for %v",
		c.attackers, len(attackKeys), deadline, c.duration)
	r.result = fmt.Sprintf("%s checks: %s", thousands(calls), outcomes.String())
	if n := outcomes.others("answered without_owner", "answered by "+b.name, "answered by "+a.name); n > 0 {
		r.miss("%d checks unanswered", n)
	}
	r.judge(c)
	return r, nil
}

// ownedBy returns n legitimate requests of distinct keys that client's node
// says owner owns: their peeks' decisions name it.
func ownedBy(ctx context.Context, client pb.SluiceClient, owner string, n int) ([]*pb.RateLimitRequest, error) {
	return ownedOf(ctx, client, owner, n, func(i int) *pb.RateLimitRequest { return legitRequest(fmt.Sprintf("frozen-%d", i)) })
}

// ownedOf returns n of the requests req(0), req(1)... that client's node
// says owner owns: their peeks' decisions name it.
func ownedOf(ctx context.Context, client pb.SluiceClient, owner string, n int, req func(i int) *pb.RateLimitRequest) ([]*pb.RateLimitRequest, error) {
	var keys []*pb.RateLimitRequest
	for i := 0; len(keys) < n && i < 100*n; i++ {
		r := req(i)
		peek := proto.Clone(r).(*pb.RateLimitRequest)
		peek.Hits = proto.Int64(0)
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		res, err := client.Check(cctx, &pb.CheckRequest{Request: peek})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("finding keys of %s: %w", owner, err)
		}
		if res.GetResponse().GetOwner() == owner {
			keys = append(keys, r)
		}
	}
	if len(keys) < n {
		return nil, fmt.Errorf("%s owns %d of the keys tried, want %d", owner, len(keys), n)
	}
	return keys, nil
}
