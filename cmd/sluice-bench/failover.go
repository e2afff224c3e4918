package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// failover runs trials of failoverTrial and prints each and a summary.
func failover(trials, callers int, rate float64, interval time.Duration) error {
	fmt.Printf("3 nodes (fast gossip profile), 2 replicas, ReplicateInterval %v; %d callers on 2 nodes, %.0f checks/s on one key; owner killed hard\n",
		interval, callers, rate)
	var lost []int64
	for tr := range trials {
		admitted, forgotten, err := failoverTrial(tr, callers, rate, interval)
		if err != nil {
			return fmt.Errorf("trial %d: %w", tr, err)
		}
		fmt.Printf("trial %d: %6d admitted, %4d forgotten (%.1f ms of traffic)\n", tr, admitted, forgotten, float64(forgotten)/rate*1000)
		lost = append(lost, forgotten)
	}
	slices.Sort(lost)
	fmt.Printf("forgotten: min %d, median %d, max %d; traffic of one ReplicateInterval: %.0f\n",
		lost[0], lost[len(lost)/2], lost[len(lost)-1], rate*interval.Seconds())
	return nil
}

// failoverTrial starts 3 nodes, sends steady traffic from two of them on a
// key the third owns (one whose next owner is its first replica), kills the
// owner hard, and measures the hits forgotten: admitted minus what the
// surviving state counts. Callers deny when the owner is unreachable, so
// nothing is admitted without an owner.
func failoverTrial(tr, callers int, rate float64, interval time.Duration) (admitted, forgotten int64, err error) {
	nodes, err := startWith(3, func(i int) cluster.Config {
		cfg := cluster.TestConfig(fmt.Sprintf("fo%d-%d", tr, i))
		cfg.Replicas = 2
		cfg.ReplicateInterval = interval
		return cfg
	})
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	if err != nil {
		return 0, 0, err
	}
	victim := nodes[2]
	key, err := testcluster.FailoverKey(victim, "failover", cluster.TestConfig("").Ring)
	if err != nil {
		return 0, 0, err
	}
	const limit = 1_000_000_000
	req := limiter.Request{Name: "failover", Key: key, Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow}
	traffic := testcluster.StartTraffic(nodes[:2], req, callers, rate)
	time.Sleep(time.Second) // traffic before the kill
	victim.Close()
	err = waitMembers(nodes[:2], 2)
	if err == nil {
		time.Sleep(500 * time.Millisecond) // traffic on the new owner
	}
	admitted = traffic.Stop()
	if err != nil {
		return 0, 0, err
	}
	peek := req
	peek.Hits = 0
	d, err := nodes[0].Check(context.Background(), peek)
	if err != nil {
		return 0, 0, err
	}
	return admitted, admitted - (limit - d.Remaining), nil
}
