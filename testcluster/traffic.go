package testcluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Traffic is steady checks of one request from several callers, each paced
// by a ticker; a check whose owner cannot be reached is denied
// (PolicyDeny), so nothing is admitted without an owner. It counts the
// checks admitted.
type Traffic struct {
	allowed atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

// StartTraffic starts callers goroutines, caller g checking req on
// nodes[g%len(nodes)], together about rate checks per second.
func StartTraffic(nodes []*cluster.Node, req limiter.Request, callers int, rate float64) *Traffic {
	tr := &Traffic{stop: make(chan struct{})}
	every := time.Duration(float64(callers) / rate * float64(time.Second))
	for g := range callers {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			nd := nodes[g%len(nodes)]
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-tr.stop:
					return
				case <-tick.C:
				}
				d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
				if err == nil && d.Allowed {
					tr.allowed.Add(1)
				}
			}
		}()
	}
	return tr
}

// Admitted returns the checks admitted so far.
func (tr *Traffic) Admitted() int64 { return tr.allowed.Load() }

// Stop stops the callers, waits for them and returns the checks admitted.
func (tr *Traffic) Stop() int64 {
	close(tr.stop)
	tr.wg.Wait()
	return tr.allowed.Load()
}

// FailoverKey returns a key of the limit name that victim owns and whose
// next owner, once victim is gone, is its first replica: a key whose
// failover the replicas cover without a hand-off. cfg is the nodes' ring
// config.
func FailoverKey(victim *cluster.Node, name string, cfg ring.Config) (string, error) {
	rest := slices.DeleteFunc(victim.RingMembers(), func(m ring.Member) bool { return m.Name == victim.Name() })
	after, err := ring.New(cfg)
	if err == nil {
		err = after.SetMembers(rest)
	}
	if err != nil {
		return "", err
	}
	for i := range 10_000 {
		k := fmt.Sprintf("f%d", i)
		ms := victim.Replicas(name, k)
		if o, _ := after.Owner(name, k); ms[0].Name == victim.Name() && len(ms) > 1 && o.Name == ms[1].Name {
			return k, nil
		}
	}
	return "", fmt.Errorf("testcluster: no key of %s moves to its first replica", victim.Name())
}
