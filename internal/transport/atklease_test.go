package transport

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A forged TransferRequest whose state carries more lease grants (KeyState
// field 17) than limiter.MaxLeaseGrants, one over and a million, each
// grant a full one (a holder and a request), is refused by the count guard
// before it is decoded, allocating next to nothing beyond its input; one
// at the limit decodes.
func TestAtkLeaseGrantsCountedBeforeDecoding(t *testing.T) {
	const budget = 64 << 10
	grant := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "holder") // LeaseGrant.holder
	grant = protowire.AppendVarint(protowire.AppendTag(grant, 2, protowire.VarintType), 5)      // LeaseGrant.hits
	for _, tc := range []struct {
		n      int
		refuse bool
	}{{limiter.MaxLeaseGrants, false}, {limiter.MaxLeaseGrants + 1, true}, {1_000_000, true}} {
		b := field(3, entries(17, protowire.BytesType, grant, tc.n))
		var err error
		var m pb.TransferRequest
		n := allocated(budget, func() { m.Reset(); err = wireUnmarshal(b, &m) })
		if !tc.refuse {
			if err != nil || len(m.States) != 1 || len(m.States[0].LeaseGrants) != tc.n {
				t.Errorf("%d grants: %v, want them decoded", tc.n, err)
			}
			continue
		}
		var ce *countError
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "KeyState.lease_grants has") {
			t.Fatalf("%d grants: error %v, want a count error naming KeyState.lease_grants", tc.n, err)
		}
		if n > budget {
			t.Errorf("refusing %d grants (%d bytes) allocated %d bytes, more than %d", tc.n, len(b), n, budget)
		}
	}
}
