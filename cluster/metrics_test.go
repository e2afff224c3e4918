package cluster_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// metricValue returns the value of the sample of family name whose labels
// include want, summing counters, gauges and histogram counts.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestMetricsCountWhatWasSent(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	c := testcluster.New(t, 2, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Registerer = regs[i]
		cfg.Replicas = 1 // each store holds only the keys its node owns
	}))
	n := c.Node(0)
	var local, remote int
	for i := range 40 {
		req := request(limiter.FixedWindow, fmt.Sprint(i), 1)
		req.Name = "m"
		for range 2 { // the second check of each key is limited
			d, err := n.Check(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Owner == n.Name() {
				local++
			} else {
				remote++
			}
		}
	}
	bad := request(limiter.FixedWindow, "", 1)
	bad.Name = "m"
	if _, err := n.Check(context.Background(), bad); err == nil {
		t.Fatal("empty key accepted")
	}
	reg := regs[0]
	for result, want := range map[string]float64{"allowed": 40, "limited": 40, "error": 1} {
		got := metricValue(t, reg, "sluice_checks_total", map[string]string{"name": "m", "algorithm": "fixed_window", "result": result})
		if got != want {
			t.Errorf("sluice_checks_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if got := metricValue(t, reg, "sluice_check_duration_seconds", map[string]string{"path": "forwarded"}); got != float64(remote) {
		t.Errorf("forwarded latency samples %v, want %d", got, remote)
	}
	if local == 0 || remote == 0 {
		t.Fatalf("local %d, remote %d: want both paths exercised", local, remote)
	}
	if got := metricValue(t, reg, "sluice_members", nil); got != 2 {
		t.Errorf("sluice_members = %v, want 2", got)
	}
	// The owner of the remote keys holds them in its store.
	if got := metricValue(t, regs[1], "sluice_store_entries", nil); got != float64(remote/2) {
		t.Errorf("node 1 sluice_store_entries = %v, want %d", got, remote/2)
	}
}
