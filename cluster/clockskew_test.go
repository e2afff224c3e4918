package cluster_test

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/testcluster"
)

// TestPeerClockOffsets: with clocks at 0, +400 ms and -400 ms and
// MaxClockSkew 250 ms, node 0 estimates each member's offset within the
// sample's RTT/2 (plus 5 ms), marks both beyond the bound, exports the
// offsets as sluice_peer_clock_offset_seconds and warns once for each;
// node 1 sees node 2 800 ms behind it. A member within the bound (node 3,
// +100 ms) is neither marked nor warned about.
func TestPeerClockOffsets(t *testing.T) {
	offsets := []time.Duration{0, 400 * time.Millisecond, -400 * time.Millisecond, 100 * time.Millisecond}
	reg := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	c := testcluster.New(t, 4, testcluster.WithClockOffsets(offsets...), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.MaxClockSkew = 250 * time.Millisecond
		cfg.ClockProbeInterval = 20 * time.Millisecond
		if i == 0 {
			cfg.Registerer = reg
			cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
	}))
	within := func(from, to int) error {
		want := offsets[to] - offsets[from]
		for _, p := range c.Node(from).PeerClocks() {
			if p.Name != c.Node(to).Name() {
				continue
			}
			if d := p.Offset - want; d > p.RTT/2+5*time.Millisecond || -d > p.RTT/2+5*time.Millisecond {
				return fmt.Errorf("%s sees %s at %v (rtt %v), want %v", c.Node(from).Name(), p.Name, p.Offset, p.RTT, want)
			}
			wantBeyond := want > 250*time.Millisecond || want < -250*time.Millisecond
			if p.Beyond != wantBeyond {
				return fmt.Errorf("%s sees %s at %v: beyond %v, want %v", c.Node(from).Name(), p.Name, p.Offset, p.Beyond, wantBeyond)
			}
			return nil
		}
		return fmt.Errorf("%s has no sample of %s", c.Node(from).Name(), c.Node(to).Name())
	}
	if err := testcluster.WaitFor(10*time.Second, func() error {
		for _, pair := range [][2]int{{0, 1}, {0, 2}, {0, 3}, {1, 2}} {
			if err := within(pair[0], pair[1]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The metric exports node 0's current estimate, which a newer sample
	// may replace between two reads: wait until a read of both agrees, with
	// the estimate within its sample's error of the true offset.
	if err := testcluster.WaitFor(10*time.Second, func() error {
		for _, i := range []int{1, 2} {
			if err := within(0, i); err != nil {
				return err
			}
			var est time.Duration
			for _, p := range c.Node(0).PeerClocks() {
				if p.Name == c.Node(i).Name() {
					est = p.Offset
				}
			}
			got := metricValue(t, reg, "sluice_peer_clock_offset_seconds", map[string]string{"peer": c.Node(i).Name()})
			if math.Abs(got-est.Seconds()) > 1e-6 {
				return fmt.Errorf("sluice_peer_clock_offset_seconds{peer=%q} = %v, the estimate is %v", c.Node(i).Name(), got, est)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if got := metricValue(t, reg, "sluice_peer_clocks_beyond_max_skew", nil); got != 2 {
		t.Errorf("sluice_peer_clocks_beyond_max_skew = %v, want 2", got)
	}
	out := logs.String()
	for i, want := range map[int]int{1: 1, 2: 1, 3: 0} {
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "beyond MaxClockSkew") && strings.Contains(line, "member="+c.Node(i).Name()+" ") {
				n++
			}
		}
		if n != want {
			t.Errorf("%d warnings about %s, want %d:\n%s", n, c.Node(i).Name(), want, out)
		}
	}
}
