package rules

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/limiter"
)

// A rule name is at most MaxNameLen bytes, one less than a limiter Name,
// so that a daemon's one-byte prefix for its rules' counters always fits.
func TestRuleNameLeavesRoomForAPrefix(t *testing.T) {
	want := map[int]error{MaxNameLen: nil, MaxNameLen + 1: ErrInvalidName, limiter.MaxNameLen + 5: ErrInvalidName}
	for n, wantErr := range want {
		r := Rule{Name: fmt.Sprintf("%0*d", n, 0), Algorithm: limiter.GCRA, Limit: 1, Period: 1e9}
		_, err := NewSet(r)
		if !errors.Is(err, wantErr) && (err != nil || wantErr != nil) {
			t.Errorf("a name of %d bytes: %v, want %v", n, err, wantErr)
		}
		if err == nil {
			req, _ := r.Request(&Descriptor{}, 1)
			req.Name = "@" + req.Name
			if err := req.Validate(); err != nil {
				t.Errorf("a name of %d bytes with the prefix: %v", n, err)
			}
		}
	}
}
