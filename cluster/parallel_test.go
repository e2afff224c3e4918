package cluster_test

import (
	"strings"
	"sync"
	"testing"
)

// parallelTests holds the names of the top-level tests marked waitBound.
var parallelTests sync.Map

// waitBound runs t beside the other tests marked waitBound (up to
// TestMain's limit at once), after every test not so marked has ended:
// the tests that read the whole process (allocations, goroutines, the
// default logger) never run beside it, nor do those whose callers check
// flat out and keep the CPU busy, which would slow every test beside
// them. A test that mostly waits (on gossip, lease lifetimes, reaps,
// hand-offs) calls it first; its subtests may call it too, to run beside
// each other. TestMain checks the goroutines of such a test once every
// test has ended; noLeaksAfter does nothing in it, since it would count
// those of the tests beside it.
func waitBound(t *testing.T) {
	t.Helper()
	parallelTests.Store(topLevel(t), true)
	t.Parallel()
}

// runsBeside reports whether t belongs to a test marked waitBound.
func runsBeside(t *testing.T) bool {
	_, ok := parallelTests.Load(topLevel(t))
	return ok
}

// topLevel returns the name of the top-level test t belongs to.
func topLevel(t *testing.T) string {
	name, _, _ := strings.Cut(t.Name(), "/")
	return name
}
