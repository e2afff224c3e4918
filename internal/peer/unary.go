package peer

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Transfer sends key states to the peer, in calls of the size
// transport.TransferSplit gives, each with Config.Timeout, and returns how many
// the peer merged and rejected. It stops at the first call that fails; the
// error wraps ErrUnavailable when the peer could not be reached, and is
// ErrClosed after Close.
func (c *Client) Transfer(ctx context.Context, reason transport.TransferReason, states []limiter.Snapshot) (merged, rejected int, err error) {
	for len(states) > 0 {
		n := transport.TransferSplit(states)
		in := &pb.TransferRequest{From: c.cfg.Self, Reason: transport.ReasonToProto(reason), States: make([]*pb.KeyState, n)}
		for i := range n {
			in.States[i] = transport.SnapshotToProto(&states[i])
		}
		var out *pb.TransferResponse
		err := c.unary(ctx, func(ctx context.Context) (err error) {
			in.SentUnixNano = c.sendClock().UnixNano() // at each attempt
			transport.StampLeaseGrants(in, states[:n], in.SentUnixNano)
			out, err = c.rpc.Transfer(ctx, in, transport.CallOptions()...)
			return err
		})
		if err != nil {
			return merged, rejected, err
		}
		merged += int(max(out.Merged, 0))
		rejected += int(max(out.Rejected, 0))
		states = states[n:]
	}
	return merged, rejected, nil
}

// sendClock is the clock transfers are stamped with: Config.SendClock,
// else Config.Clock, else the system's.
func (c *Client) sendClock() time.Time {
	switch {
	case c.cfg.SendClock != nil:
		return c.cfg.SendClock()
	}
	return c.now()
}

// HandoffDone tells the peer that this node has adopted the membership
// whose fingerprint is fp and delivered every key state it owed the peer
// under it (transport.HandoverSink); wantBack asks the peer for its own
// confirmation of that membership again; cut is what this node holds cut
// off. Errors are Transfer's.
func (c *Client) HandoffDone(ctx context.Context, fp uint64, wantBack bool, cut transport.CutOff) error {
	in := &pb.TransferRequest{From: c.cfg.Self, Reason: transport.ReasonToProto(transport.HandoffDone), RingFingerprint: fp, WantConfirmation: wantBack}
	transport.CutOffToProto(cut, in)
	return c.unary(ctx, func(ctx context.Context) error {
		_, err := c.rpc.Transfer(ctx, in, transport.CallOptions()...)
		return err
	})
}

// Lease asks the peer, the owner of req's key, for up to want hits of it
// for ttl. The error wraps ErrUnavailable when the peer could not be reached
// and is ErrClosed after Close; a refusal by the owner is returned as is.
func (c *Client) Lease(ctx context.Context, req limiter.Request, want int64, ttl time.Duration) (transport.Lease, error) {
	req.Hits, req.Behavior = 0, 0
	req.Charged = limiter.Window{}
	if err := req.Validate(); err != nil {
		return transport.Lease{}, err
	}
	in := &pb.LeaseRequest{From: c.cfg.Self, Request: transport.RequestToProto(req), Want: want, TtlNanos: int64(ttl)}
	var out *pb.LeaseResponse
	err := c.unary(ctx, func(ctx context.Context) (err error) {
		out, err = c.rpc.Lease(ctx, in, transport.CallOptions()...)
		return err
	})
	if err != nil {
		return transport.Lease{}, err
	}
	return transport.LeaseFromProto(out, want)
}

// Ready reports whether the connection to the peer is ready now, and has
// it connect when it is idle, or at once when it waits to try again. A
// call made when it is not fails without leaving this node; one made over
// a ready connection may fail after the peer acted on it.
func (c *Client) Ready() bool {
	switch st := c.conn.GetState(); st {
	case connectivity.Idle:
		c.conn.Connect()
	case connectivity.TransientFailure:
		c.conn.ResetConnectBackoff()
	default:
		return st == connectivity.Ready
	}
	return false
}

// ReturnLease gives the peer, the owner of req's key, hits of this node's
// leases of the key that it did not use. Errors are Lease's.
func (c *Client) ReturnLease(ctx context.Context, req limiter.Request, hits int64) error {
	req.Hits, req.Behavior = 0, 0
	req.Charged = limiter.Window{}
	if err := req.Validate(); err != nil {
		return err
	}
	in := &pb.LeaseRequest{From: c.cfg.Self, Request: transport.RequestToProto(req), GiveBack: hits}
	return c.unary(ctx, func(ctx context.Context) error {
		_, err := c.rpc.Lease(ctx, in, transport.CallOptions()...)
		return err
	})
}

// Inspect asks the peer, the owner of (name, key), for the key's state.
// The error wraps transport.ErrNotOwner when the peer does not decide the
// key now, ErrUnavailable when it could not be reached, and is ErrClosed
// after Close.
func (c *Client) Inspect(ctx context.Context, name, key string) (sluice.Inspection, error) {
	if err := limiter.ValidateKey(name, key); err != nil {
		return sluice.Inspection{}, err
	}
	in := &pb.InspectRequest{From: c.cfg.Self, Name: name, Key: key}
	var out *pb.InspectResponse
	err := c.unary(ctx, func(ctx context.Context) (err error) {
		out, err = c.rpc.Inspect(ctx, in, transport.CallOptions()...)
		if status.Code(err) == codes.Aborted {
			err = fmt.Errorf("%w: %w", transport.ErrNotOwner, err)
		}
		return err
	})
	if err != nil {
		return sluice.Inspection{}, err
	}
	return transport.InspectionFromProto(out, name, key)
}

// unary makes one call with the client's Timeout and turns its failure into
// the package's errors.
func (c *Client) unary(ctx context.Context, call func(context.Context) error) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	ctx, cancel := clocks.WithTimeout(ctx, c.clock, c.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel) // Close cancels the call
	defer stop()
	err := call(ctx)
	if err == nil {
		return nil
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		return fmt.Errorf("%w: %s at %s: %w", ErrUnavailable, c.name, c.addr, err)
	}
	return fmt.Errorf("peer: %s: %w", c.name, err)
}

// ProbeClock samples the peer's clock against now, this node's clock,
// with one Prove round trip (transport.ProbeClock), within Config.Timeout.
func (c *Client) ProbeClock(ctx context.Context, now func() time.Time) (transport.ClockSample, error) {
	var s transport.ClockSample
	err := c.unary(ctx, func(ctx context.Context) (err error) {
		s, err = transport.ProbeClock(ctx, c.conn, c.cfg.Self, c.name, now)
		return err
	})
	return s, err
}
