package transport

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// maxGrantAge bounds how long ago a carried lease grant's hits entered its
// state or its lease ended, and how far ahead its window ends: older
// grants no longer free anything a holder could give back.
const maxGrantAge = 24 * time.Hour

// StampLeaseGrants writes into each state of in the lease grants of the
// matching snapshot of states (limiter.Snapshot.Grants), their times as
// durations from sent, the instant in.SentUnixNano says, on the sender's
// clock. Grants whose window has ended, or whose times lie beyond what a
// receiver takes, are left out. in.States[i] must be the wire form of
// states[i].
func StampLeaseGrants(in *pb.TransferRequest, states []limiter.Snapshot, sent int64) {
	for i, m := range in.States {
		m.LeaseGrants = m.LeaseGrants[:0]
		for _, g := range states[i].Grants {
			if len(m.LeaseGrants) == limiter.MaxLeaseGrants {
				break
			}
			w := &pb.LeaseGrant{
				Holder:          g.Holder,
				Hits:            g.Hits,
				EnteredAgoNanos: sent - g.Entered,
				ExpiresInNanos:  g.Expires - sent,
			}
			if g.Window != 0 {
				w.WindowEndsInNanos = g.Window - sent
			}
			if grantTimesOK(w, g.Window != 0) {
				r := g.Request
				r.Hits, r.Behavior = 0, 0
				r.Charged = limiter.Window{}
				w.Request = RequestToProto(r)
				m.LeaseGrants = append(m.LeaseGrants, w)
			}
		}
	}
}

// grantTimesOK reports whether w's durations are within their bounds.
func grantTimesOK(w *pb.LeaseGrant, window bool) bool {
	age := int64(maxGrantAge)
	switch {
	case w.EnteredAgoNanos < -int64(MaxLeaseTTL) || w.EnteredAgoNanos > age:
		return false
	case w.ExpiresInNanos < -age || w.ExpiresInNanos > int64(MaxLeaseTTL):
		return false
	case window && (w.WindowEndsInNanos <= 0 || w.WindowEndsInNanos > age):
		return false
	case !window && w.WindowEndsInNanos != 0:
		return false
	}
	return true
}

// leaseGrantsFromProto reads m's lease grants into s, their durations from
// now, the receiver's clock at receipt; m's count was bounded before it
// was decoded (the count guard). Every grant is validated against s
// (limiter.LeaseGrant.Validate); an error leaves s without grants.
func (c *Codec) leaseGrantsFromProto(m *pb.KeyState, s *limiter.Snapshot, now int64) error {
	if len(m.LeaseGrants) == 0 {
		return nil
	}
	if len(m.LeaseGrants) > limiter.MaxLeaseGrants {
		return fmt.Errorf("%w: KeyState has %d lease_grants, more than %d", ErrInvalidArgument, len(m.LeaseGrants), limiter.MaxLeaseGrants)
	}
	gs := make([]limiter.LeaseGrant, 0, len(m.LeaseGrants))
	for i, w := range m.LeaseGrants {
		if w == nil || w.Request == nil {
			return fmt.Errorf("%w: lease_grants %d is nil or has no request", ErrInvalidArgument, i)
		}
		req, err := c.RequestFromProto(w.Request)
		if err != nil {
			return fmt.Errorf("%w: lease_grants %d: %w", limiter.ErrInvalidSnapshot, i, err)
		}
		req.Hits, req.Behavior = 0, 0
		req.Charged = limiter.Window{}
		if !grantTimesOK(w, req.Algorithm == limiter.FixedWindow) {
			return fmt.Errorf("%w: lease_grants %d: times out of bounds", ErrInvalidArgument, i)
		}
		g := limiter.LeaseGrant{
			Holder:  w.Holder,
			Hits:    w.Hits,
			Request: req,
			Entered: now - w.EnteredAgoNanos,
			Expires: now + w.ExpiresInNanos,
		}
		if w.WindowEndsInNanos != 0 {
			g.Window = now + w.WindowEndsInNanos
		}
		if err := g.Validate(s); err != nil {
			return fmt.Errorf("lease_grants %d: %w", i, err)
		}
		gs = append(gs, g)
	}
	s.Grants = gs
	return nil
}
