package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/retry"
)

// A client of a throttled HTTP API: it retries 429 and 503 answers, never
// sooner than the server's Retry-After, and gives up on other errors.
func ExampleDo() {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) < 3 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()

	errThrottled := errors.New("throttled")
	call := func(ctx context.Context) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			return 0, retry.Permanent(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return 0, nil
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			after, _ := retry.HTTPRetryAfter(resp, time.Now())
			return after, fmt.Errorf("%w: %s", errThrottled, resp.Status)
		}
		return 0, retry.Permanent(fmt.Errorf("unexpected %s", resp.Status))
	}

	// The example records the waits instead of sleeping them.
	var waits []time.Duration
	sleep := func(_ context.Context, d time.Duration) error {
		waits = append(waits, d)
		return nil
	}
	err := retry.Do(context.Background(), retry.DefaultPolicy(), call, retry.WithSleep(sleep))
	fmt.Println("err:", err)
	fmt.Println("calls:", n.Load())
	fmt.Println("waits:", waits)
	// Output:
	// err: <nil>
	// calls: 3
	// waits: [1s 1s]
}
