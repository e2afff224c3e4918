package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// endedContexts returns a cancelled context and one past its deadline,
// with the errors they end with.
func endedContexts() map[error]context.Context {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	cancel2()
	return map[error]context.Context{context.Canceled: cancelled, context.DeadlineExceeded: late}
}

// A check whose context has ended returns the context's error and
// consumes nothing, on every path: decided by the owner here, forwarded,
// in a batch of both, and admitted from a lease.
func TestEndedContextConsumesNothing(t *testing.T) {
	c := testcluster.New(t, 2)
	const limit = 100
	req := limiter.Request{Name: "ctx", Key: "k", Hits: 1, Limit: limit, Period: time.Hour, Algorithm: limiter.FixedWindow}
	owner := c.Owner(req.Name, req.Key)
	other := nonOwners(c, req.Name, req.Key)[0]
	other2 := req
	other2.Key = "k2"
	for _, st := range []struct {
		path  string
		check func(ctx context.Context) []error
	}{
		{"owned", func(ctx context.Context) []error {
			_, err := owner.Check(ctx, req)
			return []error{err}
		}},
		{"forwarded", func(ctx context.Context) []error {
			_, err := other.Check(ctx, req)
			return []error{err}
		}},
		{"batched", func(ctx context.Context) []error {
			var errs []error
			for _, nd := range []*cluster.Node{owner, other} {
				for _, r := range nd.CheckMany(ctx, []limiter.Request{req, other2, req}) {
					errs = append(errs, r.Err)
				}
			}
			return errs
		}},
	} {
		for want, ctx := range endedContexts() {
			for i, err := range st.check(ctx) {
				if !errors.Is(err, want) {
					t.Fatalf("%s, check %d: err %v, want %v", st.path, i, err, want)
				}
			}
		}
	}
	for _, r := range []limiter.Request{req, other2} {
		if err := atMost(c, []limiter.Request{r}, limit); err != nil {
			t.Fatal(err)
		}
		remainingIs(t, c.Owner(r.Name, r.Key), r, limit)
	}
}

// A node that holds a lease of a key answers a check whose context has
// ended with the context's error, and takes nothing from the lease.
func TestEndedContextLeaseConsumesNothing(t *testing.T) {
	c := leaseCluster(t, 2, time.Minute, 0.5)
	req := limiter.Request{Name: "ctx", Key: "hot", Hits: 1, Limit: 1_000_000, Period: time.Hour, Algorithm: limiter.TokenBucket}
	holder := nonOwners(c, req.Name, req.Key)[0]
	checkUntilLeased(t, holder, req)
	// The grant may come with the last checks checkUntilLeased made: the
	// next ones are decided from it.
	if err := testcluster.WaitFor(30*time.Second, func() error {
		if _, err := holder.Check(context.Background(), req); err != nil {
			return err
		}
		if holder.Stats().Leases.Local == 0 {
			return errors.New("no check decided from the lease")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before := holder.Stats().Leases.Local
	for want, ctx := range endedContexts() {
		for i := range 10 {
			if _, err := holder.Check(ctx, req); !errors.Is(err, want) {
				t.Fatalf("check %d: err %v, want %v", i, err, want)
			}
			for j, r := range holder.CheckMany(ctx, []limiter.Request{req, req}) {
				if !errors.Is(r.Err, want) {
					t.Fatalf("batch %d, check %d: err %v, want %v", i, j, r.Err, want)
				}
			}
		}
	}
	if after := holder.Stats().Leases.Local; after != before {
		t.Fatal(fmt.Errorf("%d checks decided from the lease with an ended context", after-before))
	}
}
