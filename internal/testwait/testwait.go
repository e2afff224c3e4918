// Package testwait is how sluice's tests wait for something that happens
// in another goroutine: they poll a condition until it holds or a deadline
// passes, and never sleep for a fixed time hoping it has happened by then.
//
// It imports only the standard library, so that any package's tests can
// use it, the cluster's own internal tests included.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// Timeout is how long For waits. A wait ends as soon as its condition
// holds, so the figure only bounds a failure: it is generous because the
// tests run under -race on loaded machines, beside other test binaries.
const Timeout = 30 * time.Second

// interval is the time between two polls of a condition.
const interval = 5 * time.Millisecond

// For polls cond until it returns true, and fails t, naming what it waited
// for, if that has not happened within Timeout.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ForTimeout(t, Timeout, what, cond)
}

// ForTimeout is For with a timeout of d.
func ForTimeout(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Until(d, func() error {
		if !cond() {
			return fmt.Errorf("%s", what)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s after %v", what, d)
	}
}

// Until polls cond until it returns nil or d has passed. It returns nil in
// the first case and cond's last error, wrapped, in the second.
func Until(d time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still waiting after %v: %w", d, err)
		}
		<-tick.C
	}
}
