package testwait

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of ending the
// test.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failure = fmt.Sprintf(format, args...) }

func TestForPollsUntilTrue(t *testing.T) {
	polls := 0
	For(t, "the third poll", func() bool {
		polls++
		return polls == 3
	})
	if polls != 3 {
		t.Fatalf("polled %d times, want 3", polls)
	}
}

func TestForTimeoutFailsNamingWhat(t *testing.T) {
	r := &recorder{TB: t}
	ForTimeout(r, 20*time.Millisecond, "the moon to turn blue", func() bool { return false })
	if !strings.Contains(r.failure, "the moon to turn blue") {
		t.Fatalf("failure %q does not say what it waited for", r.failure)
	}
}

func TestUntil(t *testing.T) {
	errNotYet := errors.New("not yet")
	polls := 0
	if err := Until(time.Minute, func() error {
		if polls++; polls < 3 {
			return errNotYet
		}
		return nil
	}); err != nil || polls != 3 {
		t.Fatalf("Until = %v after %d polls, want nil after 3", err, polls)
	}
	err := Until(20*time.Millisecond, func() error { return errNotYet })
	if !errors.Is(err, errNotYet) || !strings.Contains(err.Error(), "still waiting after 20ms") {
		t.Fatalf("Until = %v, want errNotYet, wrapped with how long it waited", err)
	}
}
