package limiter

import (
	"fmt"
	"time"
)

// TakeAt consumes up to want hits of req's key at now, in one step: as many
// as the limit admits right now, at most want (and at most req.Capacity()).
// req.Hits and req.Behavior are ignored. It returns how many hits it took
// (0 when the limit admits none) and the decision for them; when it took
// none, the decision is that of one hit and says when to retry.
//
// A node leasing tokens of a hot key uses it on the key's owner: the hits
// taken are counted there at once, whoever admits them later.
func (s *Store) TakeAt(req Request, want int64, now time.Time) (int64, Decision, error) {
	req.Hits, req.Behavior = 0, 0
	if err := req.Validate(); err != nil {
		return 0, Decision{}, err
	}
	if want < 1 {
		return 0, Decision{}, fmt.Errorf("%w: want %d is below 1", ErrInvalidHits, want)
	}
	var d Decision
	take := s.decideKey(&req, now.UnixNano(), want, &d)
	if take > 0 && !d.Allowed { // cannot happen: Remaining said it fits
		return 0, Decision{}, fmt.Errorf("limiter: %s did not admit the %d hits it reported remaining", req.Algorithm, take)
	}
	return take, d, nil
}
