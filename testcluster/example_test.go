package testcluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// In a test, the cluster gets the test's *testing.T (or *testing.B).
var (
	_ testcluster.T = (*testing.T)(nil)
	_ testcluster.T = (*testing.B)(nil)
)

// exampleT stands in for the *testing.T an example has not got: it keeps
// the cleanups and runs them, last first, when the example ends, and
// panics on a failure.
type exampleT struct{ cleanups []func() }

func (t *exampleT) Helper()          {}
func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Errorf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (t *exampleT) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func (t *exampleT) runCleanups() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// A test of code that embeds a cluster.Node: three nodes in one process,
// checks of one key spread over them, and the limit holds across the
// cluster, whichever node owns the key.
func Example() {
	t := new(exampleT) // in a test: func TestLimit(t *testing.T)
	defer t.runCleanups()

	c := testcluster.New(t, 3) // returns once every node sees all three
	req := limiter.Request{Name: "api_per_user", Key: "user:42", Hits: 1,
		Limit: 4, Period: time.Hour, Algorithm: limiter.TokenBucket}
	admitted := 0
	for i := range 6 {
		nd := c.Node(i % 3)
		// Deny rather than decide locally if the owner cannot be reached,
		// so that a lost forward shows as a failure, not as extra hits.
		d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			t.Fatalf("check on %s: %v", nd.Name(), err)
		}
		if d.WithoutOwner {
			t.Fatalf("check on %s: owner unreachable", nd.Name())
		}
		if d.Allowed {
			admitted++
		}
		fmt.Println(nd.Name(), d.Allowed, d.Remaining)
	}
	fmt.Println("admitted:", admitted)
	// Output:
	// node-0 true 3
	// node-1 true 2
	// node-2 true 1
	// node-0 true 0
	// node-1 false 0
	// node-2 false 0
	// admitted: 4
}
