package limiter

import (
	"fmt"
	"unicode/utf8"
)

// MaxLeaseGrants bounds the lease grants a Snapshot carries.
const MaxLeaseGrants = 16

// LeaseGrant is hits of a key that its owner leased to a holder (a node
// of a cluster) and that the holder has neither used nor given back yet,
// hits that the snapshot's state counts: they entered it at Entered. A
// cluster carries them beside the key's state to the key's next owner,
// so that the holder's return of unused hits frees them there. Stores
// ignore them.
type LeaseGrant struct {
	Holder string
	Hits   int64
	// Request is the rate the hits were leased at: its Name, Key and
	// Algorithm are the state's; Hits and Behavior are ignored.
	Request Request
	// Entered is when the hits entered the state, Expires when the lease
	// ends (or ended), and Window, for a fixed window, when the window
	// the hits count in ends (0 for the other algorithms); Unix ns.
	Entered, Expires, Window int64
}

// leasedAlgorithm reports whether a's hits are ever leased.
func leasedAlgorithm(a Algorithm) bool {
	return a == TokenBucket || a == GCRA || a == FixedWindow
}

// Validate checks g as a grant of sn's key: a holder of at most
// MaxNameLen bytes of UTF-8, its request valid (with Hits 0) for sn's
// name, key and algorithm, one that is leased, Hits in [1, the request's
// capacity], and a Window set for a fixed window only. Errors wrap
// ErrInvalidSnapshot.
func (g *LeaseGrant) Validate(sn *Snapshot) error {
	r := g.Request
	r.Hits, r.Behavior = 0, 0
	r.Charged = Window{}
	switch {
	case g.Holder == "" || len(g.Holder) > MaxNameLen || !utf8.ValidString(g.Holder):
		return fmt.Errorf("%w: lease grant holder of %d bytes is empty, longer than %d or not UTF-8", ErrInvalidSnapshot, len(g.Holder), MaxNameLen)
	case r.Name != sn.Name || r.Key != sn.Key || r.Algorithm != sn.Algorithm:
		return fmt.Errorf("%w: lease grant of %q/%q (%s) for a state of %q/%q (%s)", ErrInvalidSnapshot, r.Name, r.Key, r.Algorithm, sn.Name, sn.Key, sn.Algorithm)
	case !leasedAlgorithm(r.Algorithm):
		return fmt.Errorf("%w: lease grant of %s, which is not leased", ErrInvalidSnapshot, r.Algorithm)
	case (r.Algorithm == FixedWindow) != (g.Window != 0):
		return fmt.Errorf("%w: lease grant of %s with window end %d", ErrInvalidSnapshot, r.Algorithm, g.Window)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: lease grant request: %w", ErrInvalidSnapshot, err)
	}
	if g.Hits < 1 || g.Hits > r.Capacity() {
		return fmt.Errorf("%w: lease grant of %d hits, outside [1, %d]", ErrInvalidSnapshot, g.Hits, r.Capacity())
	}
	return nil
}
