package limiter

import (
	"errors"
	"testing"
	"time"
)

// refundStep is one check of a refund table: at (after t0), the request
// as charge makes it, and what the decision must say.
type refundStep struct {
	name   string
	at     time.Duration
	req    func(r *Request)
	refund bool // a refund carrying the window the first step charged
	// wantRemaining is the decision's Remaining; wantBack, for a refund,
	// whether it gave the hits back (its decision's Window).
	wantRemaining int64
	wantBack      bool
}

// runRefundSteps runs steps on a fresh store from t0: the first step's
// decision gives the window every refund step carries.
func runRefundSteps(t *testing.T, cfg StoreConfig, t0 time.Time, base Request, steps []refundStep) {
	t.Helper()
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var charged Window
	for i, st := range steps {
		req := base
		if st.req != nil {
			st.req(&req)
		}
		if st.refund {
			req.Behavior, req.Charged = Refund, charged
		}
		d, err := s.CheckAt(req, t0.Add(st.at))
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, st.name, err)
		}
		if i == 0 {
			if d.Window.IsZero() || !d.Allowed {
				t.Fatalf("step 0 (%s): the charge reports no window: %+v", st.name, d)
			}
			charged = d.Window
		}
		if d.Remaining != st.wantRemaining {
			t.Errorf("step %d (%s): remaining %d, want %d (%+v)", i, st.name, d.Remaining, st.wantRemaining, d)
		}
		if st.refund && (d.Window == charged) != st.wantBack {
			t.Errorf("step %d (%s): refund's window %+v, want given back %v to %+v", i, st.name, d.Window, st.wantBack, charged)
		}
	}
}

// A refund carrying its charge's window gives the hits back to that
// window only: never to a later one, nor to a key that has gone fresh
// and been charged again, nor to a state of another algorithm or Period.
func TestRefundOnlyToTheChargedWindow(t *testing.T) {
	span := time.Unix(1_700_000_000-1_700_000_000%70, 0) // 7s and 10s windows start here
	fixed := Request{Name: "r", Key: "k", Hits: 1, Limit: 10, Period: 10 * time.Second, Algorithm: FixedWindow}
	counter := fixed
	counter.Algorithm = SlidingWindowCounter
	seven := func(r *Request) { r.Period = 7 * time.Second }
	bucket := func(r *Request) { r.Algorithm = TokenBucket }
	keep := DefaultStoreConfig()
	keep.KeepStrictest = true
	for _, tc := range []struct {
		name  string
		cfg   StoreConfig
		base  Request
		steps []refundStep
	}{
		{"fixed, same window", DefaultStoreConfig(), fixed, []refundStep{
			{name: "charge", at: 9 * time.Second, wantRemaining: 9},
			{name: "another", at: 9500 * time.Millisecond, wantRemaining: 8},
			{name: "refund", at: 9900 * time.Millisecond, refund: true, wantRemaining: 9, wantBack: true},
		}},
		{"fixed, the window ended", DefaultStoreConfig(), fixed, []refundStep{
			{name: "charge", at: 9500 * time.Millisecond, wantRemaining: 9},
			{name: "next window", at: 10500 * time.Millisecond, wantRemaining: 9},
			{name: "refund", at: 10500 * time.Millisecond, refund: true, wantRemaining: 9},
		}},
		// The 7s window [7s, 14s) ends after the 10s one: the count moves
		// to it, at the least either rate allows over 7s (7), and stays
		// counted until 14s.
		{"fixed, moved to a later-ending window", keep, fixed, []refundStep{
			{name: "charge 10s", at: time.Second, wantRemaining: 9},
			{name: "charge 7s, moved to [7s, 14s) at 7", at: 9500 * time.Millisecond, req: seven, wantRemaining: 5},
			{name: "past 10s, still counted", at: 10500 * time.Millisecond, req: seven, wantRemaining: 4},
			{name: "refund 7s", at: 10500 * time.Millisecond, req: seven, refund: true, wantRemaining: 4},
			{name: "fresh at 14s", at: 14 * time.Second, req: seven, wantRemaining: 9},
		}},
		{"fixed, moved to another Period", DefaultStoreConfig(), fixed, []refundStep{
			{name: "charge 10s", at: 8 * time.Second, wantRemaining: 9},
			{name: "charge 7s: both count in [7s, 14s)", at: 9 * time.Second, req: seven, wantRemaining: 8},
			{name: "refund 10s", at: 9500 * time.Millisecond, refund: true, wantRemaining: 8},
		}},
		{"fixed, then another algorithm", DefaultStoreConfig(), fixed, []refundStep{
			{name: "charge", at: 9 * time.Second, wantRemaining: 9},
			{name: "bucket", at: 9 * time.Second, req: bucket, wantRemaining: 8},
			{name: "refund", at: 9 * time.Second, refund: true, wantRemaining: 8},
			{name: "the bucket as it was", at: 9 * time.Second, req: func(r *Request) { r.Algorithm, r.Hits = TokenBucket, 0 }, wantRemaining: 8},
		}},
		{"counter, same window", DefaultStoreConfig(), counter, []refundStep{
			{name: "charge", at: 5 * time.Second, wantRemaining: 9},
			{name: "refund", at: 9 * time.Second, refund: true, wantRemaining: 10, wantBack: true},
		}},
		{"counter, the window is the previous one", DefaultStoreConfig(), counter, []refundStep{
			{name: "charge", at: 5 * time.Second, wantRemaining: 9},
			{name: "another", at: 5 * time.Second, wantRemaining: 8},
			{name: "next window", at: 10 * time.Second, wantRemaining: 7}, // 1 + 2 of the previous
			{name: "refund from the previous", at: 10 * time.Second, refund: true, wantRemaining: 8, wantBack: true},
		}},
		{"counter, both windows over", DefaultStoreConfig(), counter, []refundStep{
			{name: "charge", at: 5 * time.Second, wantRemaining: 9},
			{name: "after two windows", at: 20 * time.Second, wantRemaining: 9},
			{name: "refund", at: 20 * time.Second, refund: true, wantRemaining: 9},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runRefundSteps(t, tc.cfg, span, tc.base, tc.steps) })
	}
}

// Across a calendar window's end, a refund finds the next window and
// gives nothing back.
func TestRefundAcrossACalendarWindow(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip(err)
	}
	midnight := time.Date(2026, 3, 29, 0, 0, 0, 0, paris) // a day of 23 hours
	day := Request{Name: "r", Key: "k", Hits: 1, Limit: 10, Algorithm: FixedWindow, Calendar: Day, Location: paris}
	runRefundSteps(t, DefaultStoreConfig(), midnight.Add(-time.Second), day, []refundStep{
		{name: "charge, the day before", wantRemaining: 9},
		{name: "the next day", at: 2 * time.Second, wantRemaining: 9},
		{name: "refund", at: 2 * time.Second, refund: true, wantRemaining: 9},
	})
	runRefundSteps(t, DefaultStoreConfig(), midnight.Add(22*time.Hour), day, []refundStep{
		{name: "charge, the short day's last hour", wantRemaining: 9},
		{name: "refund before its end", at: 59 * time.Minute, refund: true, wantRemaining: 10, wantBack: true},
	})
}

// A refund that gives nothing back keeps nothing: a key it finds fresh
// stays absent.
func TestRefundOfAnotherWindowKeepsNothing(t *testing.T) {
	s, err := NewStore(DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	req := Request{Name: "r", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: FixedWindow,
		Behavior: Refund, Charged: Window{t0.UnixNano(), t0.Add(time.Second).UnixNano()}}
	if d, err := s.CheckAt(req, t0); err != nil || !d.Window.IsZero() || d.Remaining != 10 {
		t.Fatalf("refund on a fresh key: %+v, %v", d, err)
	}
	if s.Len() != 0 {
		t.Fatalf("%d keys after a refund that gave nothing back", s.Len())
	}
}

func TestChargedNeedsARefund(t *testing.T) {
	req := Request{Name: "r", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: FixedWindow, Charged: Window{0, 1}}
	if err := req.Validate(); !errors.Is(err, ErrInvalidBehavior) {
		t.Fatalf("Charged without Refund: %v", err)
	}
	req.Behavior, req.Charged = Refund, Window{1, 1}
	if err := req.Validate(); !errors.Is(err, ErrInvalidBehavior) {
		t.Fatalf("an empty Charged window: %v", err)
	}
}
