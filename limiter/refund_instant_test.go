package limiter

import (
	"errors"
	"testing"
	"time"
)

// A refund carrying the instant its hits were charged at gives back to a
// token bucket, leaky bucket or GCRA only what of them has not drained
// since, and to a sliding window log only the hits of that instant's
// entry while it is in the window: never another request's hits.
func TestRefundOnlyWhatOfTheChargeIsCounted(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	base := Request{Name: "r", Key: "k", Hits: 1, Limit: 10, Period: 10 * time.Second} // one hit a second
	four := func(r *Request) { r.Hits = 4 }
	other := func(r *Request) { r.Period = 20 * time.Second }
	type tc struct {
		name  string
		algo  Algorithm
		steps []refundStep
	}
	var cases []tc
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		cases = append(cases,
			tc{"drained, then another's hit", a, []refundStep{
				{name: "charge", wantRemaining: 9},
				{name: "another, after it drained", at: 2 * time.Second, wantRemaining: 9},
				{name: "refund", at: 2 * time.Second, refund: true, wantRemaining: 9},
			}},
			tc{"partly drained, then another's hits", a, []refundStep{
				{name: "charge 4", req: four, wantRemaining: 6},
				{name: "another 4, 2 of the first drained", at: 2 * time.Second, req: four, wantRemaining: 4},
				{name: "refund 4 gives 2", at: 2 * time.Second, req: four, refund: true, wantRemaining: 6, wantBack: true},
			}},
			tc{"not drained", a, []refundStep{
				{name: "charge 4", req: four, wantRemaining: 6},
				{name: "refund 4 gives the 3 left", at: time.Second, req: four, refund: true, wantRemaining: 10, wantBack: true},
			}},
			tc{"another rate", a, []refundStep{
				{name: "charge 4", req: four, wantRemaining: 6},
				{name: "refund at another Period", req: func(r *Request) { four(r); other(r) }, refund: true, wantRemaining: 6},
			}},
			tc{"another algorithm", a, []refundStep{
				{name: "charge 4", req: four, wantRemaining: 6},
				{name: "a fixed window", req: func(r *Request) { r.Algorithm = FixedWindow }, wantRemaining: 5},
				{name: "refund", req: four, refund: true, wantRemaining: 5},
			}},
		)
	}
	cases = append(cases,
		tc{"reset, then the clock stepped back", GCRA, []refundStep{
			{name: "charge", at: time.Second, wantRemaining: 9},
			{name: "reset", at: time.Second, req: func(r *Request) { r.Hits, r.Behavior = 0, Reset }, wantRemaining: 10},
			{name: "refund, half a second earlier", at: 500 * time.Millisecond, refund: true, wantRemaining: 10},
		}},
		tc{"drained, then another's hit", SlidingWindowLog, []refundStep{
			{name: "charge", wantRemaining: 9},
			{name: "another, after it left the window", at: 11 * time.Second, wantRemaining: 9},
			{name: "refund", at: 11 * time.Second, refund: true, wantRemaining: 9},
		}},
		tc{"another's hit later in the window", SlidingWindowLog, []refundStep{
			{name: "charge", wantRemaining: 9},
			{name: "another", at: 2 * time.Second, wantRemaining: 8},
			{name: "refund to the first instant", at: 2 * time.Second, refund: true, wantRemaining: 9, wantBack: true},
			{name: "the other's hit still counts", at: 10500 * time.Millisecond, req: func(r *Request) { r.Hits = 0 }, wantRemaining: 9},
		}},
		tc{"the same instant", SlidingWindowLog, []refundStep{
			{name: "charge", wantRemaining: 9},
			{name: "another", wantRemaining: 8},
			{name: "refund 4 takes 2", req: four, refund: true, wantRemaining: 10, wantBack: true},
		}},
		tc{"another rate", SlidingWindowLog, []refundStep{
			{name: "charge", wantRemaining: 9},
			{name: "refund", req: other, refund: true, wantRemaining: 9},
		}},
	)
	for _, c := range cases {
		b := base
		b.Algorithm = c.algo
		t.Run(c.algo.String()+", "+c.name, func(t *testing.T) { runRefundSteps(t, DefaultStoreConfig(), t0, b, c.steps) })
	}
}

// A charge of an algorithm without windows names its instant; Validate
// takes an instant for those only.
func TestChargedInstant(t *testing.T) {
	s, err := NewStore(DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA, SlidingWindowLog} {
		req := Request{Name: "r", Key: a.String(), Hits: 1, Limit: 10, Period: time.Second, Algorithm: a}
		d, err := s.CheckAt(req, t0)
		if err != nil || d.Window != (Window{t0.UnixNano(), t0.UnixNano()}) {
			t.Fatalf("%s: %+v, %v", a, d, err)
		}
		req.Behavior, req.Charged = Refund, Window{2, 1}
		if err := req.Validate(); !errors.Is(err, ErrInvalidBehavior) {
			t.Fatalf("%s: a window ending before it starts: %v", a, err)
		}
		req.Charged = Window{t0.UnixNano(), t0.Add(time.Second).UnixNano()}
		if d, err := s.CheckAt(req, t0); err != nil || !d.Window.IsZero() || d.Remaining != 9 {
			t.Fatalf("%s: a refund to a window: %+v, %v", a, d, err)
		}
	}
	// Far past and far future instants overflow nothing.
	for _, at := range []int64{-1 << 63, 1<<63 - 1} {
		for _, a := range []Algorithm{TokenBucket, GCRA, SlidingWindowLog} {
			req := Request{Name: "r", Key: a.String(), Hits: 1, Limit: 10, Period: time.Second, Algorithm: a, Behavior: Refund, Charged: Window{at, at}}
			d, err := s.CheckAt(req, t0)
			if err != nil {
				t.Fatalf("%s at %d: %v", a, at, err)
			}
			if at < 0 && !d.Window.IsZero() {
				t.Fatalf("%s: a refund from the far past gave back: %+v", a, d)
			}
		}
	}
}
