package limiter_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// A token bucket of 2 refilled at 2 per second: the third request at the
// same instant waits for a token, which comes back continuously.
func ExampleStore_CheckAt() {
	s, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	now := time.Date(2024, 5, 15, 10, 0, 0, 0, time.UTC)
	req := limiter.Request{
		Name: "api", Key: "user:42", Hits: 1,
		Limit: 2, Period: time.Second, Algorithm: limiter.TokenBucket,
	}
	for _, at := range []time.Duration{0, 0, 0, 500 * time.Millisecond} {
		d, err := s.CheckAt(req, now.Add(at))
		if err != nil {
			panic(err)
		}
		fmt.Printf("at %v: allowed=%v remaining=%d retry_after=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// at 0s: allowed=true remaining=1 retry_after=0s
	// at 0s: allowed=true remaining=0 retry_after=0s
	// at 0s: allowed=false remaining=0 retry_after=500ms
	// at 500ms: allowed=true remaining=0 retry_after=0s
}

// A fixed window of 3 per calendar day in New York: the window ends at local
// midnight, and the rejection says how long until then.
func ExampleStore_CheckAt_calendarDay() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	s, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	req := limiter.Request{
		Name: "signup", Key: "203.0.113.7", Hits: 1, Limit: 3,
		Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: ny,
	}
	evening := time.Date(2024, 11, 2, 22, 0, 0, 0, ny)
	for range 4 {
		d, err := s.CheckAt(req, evening)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry_after=%v reset_at=%s\n",
			d.Allowed, d.Remaining, d.RetryAfter, d.ResetAt.In(ny).Format(time.DateTime+" MST"))
	}
	// Output:
	// allowed=true remaining=2 retry_after=0s reset_at=2024-11-03 00:00:00 EDT
	// allowed=true remaining=1 retry_after=0s reset_at=2024-11-03 00:00:00 EDT
	// allowed=true remaining=0 retry_after=0s reset_at=2024-11-03 00:00:00 EDT
	// allowed=false remaining=0 retry_after=2h0m0s reset_at=2024-11-03 00:00:00 EDT
}

// A leaky bucket paces a burst: each admitted request gets the Delay after
// which it should proceed, one every Period/Limit; a full queue rejects.
func ExampleStore_CheckAt_leakyBucket() {
	s, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	req := limiter.Request{
		Name: "webhook", Key: "tenant:9", Hits: 1,
		Limit: 5, Period: time.Second, Burst: 3, Algorithm: limiter.LeakyBucket,
	}
	now := time.Date(2024, 5, 15, 10, 0, 0, 0, time.UTC)
	for range 4 {
		d, err := s.CheckAt(req, now)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v delay=%v retry_after=%v\n", d.Allowed, d.Delay, d.RetryAfter)
	}
	// Output:
	// allowed=true delay=0s retry_after=0s
	// allowed=true delay=200ms retry_after=0s
	// allowed=true delay=400ms retry_after=0s
	// allowed=false delay=0s retry_after=200ms
}

// A GCRA limit of 10 per second with a burst of 2: a hit every 100ms on
// average, at most 2 at once.
func ExampleStore_CheckAt_gcra() {
	s, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	req := limiter.Request{
		Name: "api", Key: "user:7", Hits: 1,
		Limit: 10, Period: time.Second, Burst: 2, Algorithm: limiter.GCRA,
	}
	now := time.Date(2024, 5, 15, 10, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 0, 0, 100 * time.Millisecond} {
		d, err := s.CheckAt(req, now.Add(at))
		if err != nil {
			panic(err)
		}
		fmt.Printf("at %v: allowed=%v remaining=%d retry_after=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// at 0s: allowed=true remaining=1 retry_after=0s
	// at 0s: allowed=true remaining=0 retry_after=0s
	// at 0s: allowed=false remaining=0 retry_after=100ms
	// at 100ms: allowed=true remaining=0 retry_after=0s
}
