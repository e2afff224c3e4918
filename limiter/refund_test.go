package limiter

import (
	"testing"
	"time"
)

// Consuming then refunding leaves every algorithm as it was, at the same
// instant and after time has passed.
func TestRefundRestoresRemaining(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, err := NewStore(DefaultStoreConfig())
			if err != nil {
				t.Fatal(err)
			}
			req := Request{Name: "r", Key: "k", Hits: 3, Limit: 10, Period: time.Minute, Algorithm: a}
			if d, err := s.CheckAt(req, t0); err != nil || !d.Allowed || d.Remaining != 7 {
				t.Fatalf("consume 3: %+v, %v", d, err)
			}
			if d, _ := s.CheckAt(req, t0); d.Remaining != 4 {
				t.Fatalf("consume 3 more: remaining %d, want 4", d.Remaining)
			}
			back := req
			back.Behavior = Refund
			d, err := s.CheckAt(back, t0)
			if err != nil || d.Remaining != 7 || !d.Allowed {
				t.Fatalf("refund 3: %+v, %v; want remaining 7", d, err)
			}
			// A refund larger than what is counted stops at fresh.
			back.Hits = 10
			if d, _ := s.CheckAt(back, t0.Add(time.Millisecond)); d.Remaining != 10 {
				t.Fatalf("over-refund: remaining %d, want 10", d.Remaining)
			}
			// A refund on a key never seen creates nothing.
			fresh := back
			fresh.Key = "never"
			if d, _ := s.CheckAt(fresh, t0); d.Remaining != 10 {
				t.Fatalf("refund on a fresh key: %+v", d)
			}
		})
	}
}
