package cluster

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/transport"
)

// Clock skew. Every ClockProbeInterval a node samples each ring member's
// clock with one Prove round trip (transport.ProbeClock): the member
// reports when the challenge arrived and when its answer left, and the
// node's own send and receive times give the offset NTP style, within half
// the round trip. The node keeps the sample of least round trip among the
// member's last clockSamples, exports the offsets
// (sluice_peer_clock_offset_seconds), lists them in PeerClocks and logs a
// warning when a member's offset is certainly beyond MaxClockSkew (by more
// than the estimate's error), once per change.
//
// What depends on two clocks: a lease's lifetime travels as a duration,
// counted by the holder from when it asked (lease.go); a transfer of key
// states carries the sender's clock reading, by which the receiver moves
// the states' times onto its own clock (transport's Transfer). What is
// left is a window whose end the two clocks straddle (the README's
// Guarantees state it).

// clockSamples is how many samples per member the estimate is chosen from.
const clockSamples = 4

// maxClockSeries bounds the members exported with a label of their own:
// those of the largest offsets.
const maxClockSeries = 64

// PeerClock is what a node knows of a ring member's clock.
type PeerClock struct {
	Name string
	// Offset is how far the member's clock is ahead of this node's
	// (negative: behind), within RTT/2.
	Offset time.Duration
	// RTT is the round trip of the sample, less the member's time
	// answering.
	RTT time.Duration
	// At is when the sample was taken, on this node's clock.
	At time.Time
	// Beyond is true when the offset is beyond Config.MaxClockSkew by more
	// than the estimate's error.
	Beyond bool
}

// clockTable holds the latest clock samples of each member. Safe for
// concurrent use.
type clockTable struct {
	maxSkew time.Duration
	logger  *slog.Logger

	mu    sync.Mutex // guards peers
	peers map[string]*peerSamples
}

// peerSamples is a member's last samples, the newest at last%clockSamples.
type peerSamples struct {
	samples [clockSamples]transport.ClockSample
	n       int // samples taken
	beyond  bool
}

func newClockTable(maxSkew time.Duration, logger *slog.Logger) *clockTable {
	return &clockTable{maxSkew: maxSkew, logger: logger, peers: map[string]*peerSamples{}}
}

// best returns the sample of least round trip.
func (p *peerSamples) best() transport.ClockSample {
	b := p.samples[0]
	for _, s := range p.samples[1:min(p.n, clockSamples)] {
		if s.RTT < b.RTT {
			b = s
		}
	}
	return b
}

// beyondBound reports whether s is certainly beyond maxSkew.
func beyondBound(s transport.ClockSample, maxSkew time.Duration) bool {
	off := s.Offset
	if off < 0 {
		off = -off
	}
	return off-s.RTT/2 > maxSkew
}

// add records a sample of name's clock and logs a change of its standing.
func (t *clockTable) add(name string, s transport.ClockSample) {
	t.mu.Lock()
	p := t.peers[name]
	if p == nil {
		p = &peerSamples{}
		t.peers[name] = p
	}
	p.samples[p.n%clockSamples] = s
	p.n++
	best := p.best()
	beyond := beyondBound(best, t.maxSkew)
	changed := beyond != p.beyond
	p.beyond = beyond
	t.mu.Unlock()
	switch {
	case changed && beyond:
		t.logger.Warn("cluster: member's clock is beyond MaxClockSkew: windows whose end the two clocks straddle may admit their limit once more when a key moves between them",
			"member", name, "offset", best.Offset, "rtt", best.RTT, "max_clock_skew", t.maxSkew)
	case changed:
		t.logger.Info("cluster: member's clock is within MaxClockSkew again", "member", name, "offset", best.Offset, "rtt", best.RTT)
	}
}

// retain forgets the members not in names.
func (t *clockTable) retain(names map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.peers {
		if !names[name] {
			delete(t.peers, name)
		}
	}
}

// list returns every member's estimate, sorted by name.
func (t *clockTable) list() []PeerClock {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]PeerClock, 0, len(t.peers))
	for name, p := range t.peers {
		b := p.best()
		out = append(out, PeerClock{Name: name, Offset: b.Offset, RTT: b.RTT, At: b.At, Beyond: p.beyond})
	}
	slices.SortFunc(out, func(a, b PeerClock) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// PeerClocks returns the node's estimate of each ring member's clock
// offset, sorted by name; members not sampled yet are missing.
func (n *Node) PeerClocks() []PeerClock { return n.clocks.list() }

// probeClocks samples the clock of every ring member but this node, one
// round trip each, the members in parallel, and forgets those gone.
func (n *Node) probeClocks(ctx context.Context) {
	names := map[string]bool{}
	var wg sync.WaitGroup
	for _, m := range n.ring.Members() {
		if m.Name == n.cfg.NodeName {
			continue
		}
		names[m.Name] = true
		cl, ok := n.peers.Get(m.Name)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := cl.ProbeClock(ctx, n.now)
			if err != nil {
				n.logger.Debug("cluster: clock sample failed", "member", m.Name, "err", err)
				return
			}
			n.clocks.add(m.Name, s)
		}()
	}
	wg.Wait()
	n.clocks.retain(names)
}

// clockLoop samples the members' clocks every ClockProbeInterval until
// the node shuts down.
func (n *Node) clockLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t := clocks.NewTicker(n.clock, n.cfg.ClockProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
			n.probeClocks(ctx)
		}
	}
}

// clockCollector exports the offsets: a gauge per member, at most
// maxClockSeries of them (the largest offsets), and how many members are
// beyond the bound.
type clockCollector struct {
	t              *clockTable
	offset, beyond *prometheus.Desc
}

func newClockCollector(t *clockTable) *clockCollector {
	return &clockCollector{t: t,
		offset: prometheus.NewDesc("sluice_peer_clock_offset_seconds",
			"How far a ring member's clock is ahead of this node's (negative: behind), estimated from Prove round trips; at most 64 members, those of the largest offsets.",
			[]string{"peer"}, nil),
		beyond: prometheus.NewDesc("sluice_peer_clocks_beyond_max_skew",
			"Ring members whose clock offset is beyond MaxClockSkew by more than the estimate's error.", nil, nil),
	}
}

func (c *clockCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.offset; ch <- c.beyond }

func (c *clockCollector) Collect(ch chan<- prometheus.Metric) {
	list := c.t.list()
	beyond := 0
	for _, p := range list {
		if p.Beyond {
			beyond++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.beyond, prometheus.GaugeValue, float64(beyond))
	abs := func(d time.Duration) time.Duration { return max(d, -d) }
	sort.SliceStable(list, func(i, j int) bool { return abs(list[i].Offset) > abs(list[j].Offset) })
	for _, p := range list[:min(len(list), maxClockSeries)] {
		ch <- prometheus.MustNewConstMetric(c.offset, prometheus.GaugeValue, p.Offset.Seconds(), p.Name)
	}
}
