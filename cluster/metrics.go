package cluster

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/labelset"
	"github.com/sluicehq/sluice/limiter"
)

// MaxMetricNames bounds the distinct limit names that get their own label
// value in metrics; further names are counted under "_other", so that
// clients sending arbitrary names cannot grow the registry without bound.
const MaxMetricNames = 256

// metrics holds a node's Prometheus collectors. A nil *metrics records
// nothing, which is what a node without Config.Registerer has.
type metrics struct {
	checks       *prometheus.CounterVec   // name, algorithm, result
	latency      *prometheus.HistogramVec // path: local, forwarded
	withoutOwner *prometheus.CounterVec   // policy
	forwarded    prometheus.Counter
	batchSize    prometheus.Histogram
	peerLatency  *prometheus.HistogramVec // peer, outcome

	names *labelset.Set // the limit names with a label of their own
	// counters caches the labelled check counters: the hot path looks one
	// up without hashing label values each time.
	counters sync.Map // checkLabels -> prometheus.Counter
	// latencyOf caches the two latency series, local and forwarded, each
	// made on its first check.
	latencyOf [2]atomic.Pointer[latencySeries]
}

type latencySeries struct{ prometheus.Observer }

type checkLabels struct {
	name   string
	algo   limiter.Algorithm
	result string
}

func newMetrics(reg prometheus.Registerer, n *Node) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_checks_total",
			Help: "Checks answered by this node, by limit name, algorithm and result (allowed, limited, error).",
		}, []string{"name", "algorithm", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_check_duration_seconds",
			Help:    "Time to answer a check, by path: decided here (local) or by the owner (forwarded).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		}, []string{"path"}),
		withoutOwner: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_without_owner_total",
			Help: "Checks decided without their owner, by the unreachable policy applied.",
		}, []string{"policy"}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_forwarded_checks_total",
			Help: "Checks forwarded to their owner.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_peer_batch_size",
			Help:    "Checks per batch sent to a peer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		peerLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_peer_call_duration_seconds",
			Help:    "Latency of batches sent to peers, by peer and outcome (ok, error).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14),
		}, []string{"peer", "outcome"}),
		names: labelset.New(MaxMetricNames, limiter.MaxNameLen),
	}
	members := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_members",
		Help: "Members in this node's ring.",
	}, func() float64 { return float64(n.ring.Len()) })
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_store_entries",
		Help: "Keys held in this node's store.",
	}, func() float64 { return float64(n.store.Stats().Entries) })
	evictions := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_store_evictions_total",
		Help: "Keys with live state evicted because the store was full.",
	}, func() float64 { return float64(n.store.Stats().Evictions) })
	expired := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_store_expired_total",
		Help: "Keys dropped because their state had returned to fresh.",
	}, func() float64 { return float64(n.store.Stats().Expired) })
	refused := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_members_refused",
		Help: "Members of the gossip kept out of this node's ring: they have not proved they belong to the cluster, or speak no protocol version this node speaks.",
	}, func() float64 { return float64(len(n.RefusedMembers())) })
	cs := []prometheus.Collector{m.checks, m.latency, m.withoutOwner, m.forwarded, m.batchSize, m.peerLatency, members, refused, entries, evictions, expired}
	cs = append(cs, budgetCollectors(n)...)
	for _, c := range append(cs, transferCollectors(&n.transfers)...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// check records one answered check.
func (m *metrics) check(req *limiter.Request, d *sluice.Decision, err error, forwarded bool, took time.Duration) {
	if m == nil {
		return
	}
	result := "limited"
	switch {
	case err != nil:
		result = "error"
	case d.Allowed:
		result = "allowed"
	}
	key := checkLabels{name: req.Name, algo: req.Algorithm, result: result}
	c, ok := m.counters.Load(key)
	if !ok {
		name := m.names.Label(req.Name)
		c = m.checks.WithLabelValues(name, req.Algorithm.String(), result)
		if name == req.Name { // cache only the bounded set of names
			m.counters.Store(key, c)
		}
	}
	c.(prometheus.Counter).Inc()
	m.latencySeries(forwarded).Observe(took.Seconds())
}

// latencySeries returns the check latency series of a local or a
// forwarded check.
func (m *metrics) latencySeries(forwarded bool) prometheus.Observer {
	i, path := 0, "local"
	if forwarded {
		i, path = 1, "forwarded"
	}
	if s := m.latencyOf[i].Load(); s != nil {
		return s.Observer
	}
	s := &latencySeries{m.latency.WithLabelValues(path)}
	m.latencyOf[i].Store(s)
	return s.Observer
}

// unreachable records a decision made under policy without the owner.
func (m *metrics) unreachable(policy sluice.Policy) {
	if m != nil {
		m.withoutOwner.WithLabelValues(policy.String()).Inc()
	}
}

// peerCall records one batch sent to a peer.
func (m *metrics) peerCall(peer string, items int, took time.Duration, err error) {
	if m == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.forwarded.Add(float64(items))
	m.batchSize.Observe(float64(items))
	m.peerLatency.WithLabelValues(peer, outcome).Observe(took.Seconds())
}

// budgetCollectors read the counters of the gRPC server's message budget
// (transport.MessageBudget), which New creates first.
func budgetCollectors(n *Node) []prometheus.Collector {
	stats := n.budget.Stats
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_grpc_message_bytes_reserved",
			Help: "Bytes of the gRPC server's inbound message budget reserved by calls whose messages are on their way (ServerLimits.MessageBytes bounds it).",
		}, func() float64 { return float64(stats().Reserved) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_grpc_message_budget_waiting",
			Help: "gRPC calls whose handlers wait for room in the message budget for their message, each holding its stream window.",
		}, func() float64 { return float64(stats().Waiting) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_grpc_message_budget_refused_total",
			Help: "gRPC calls refused as they opened: for want of room in the message budget for their stream window, or Peer calls without the peer credential.",
		}, func() float64 { return float64(stats().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_grpc_message_timeouts_total",
			Help: "gRPC calls reset because their first message was not all in within ServerLimits.MessageTimeout.",
		}, func() float64 { return float64(stats().TimedOut) }),
	}
}

// transferCollectors reads the hand-off and replication counters.
func transferCollectors(t *transfers) []prometheus.Collector {
	counter := func(name, help string, labels prometheus.Labels, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v()) })
	}
	const received = "Key states received from other nodes, by result: merged (changed the store) or rejected (invalid)."
	return []prometheus.Collector{
		counter("sluice_handoff_keys_total", "Key states handed off to their new owner after a membership change.", nil, t.handedOff.Load),
		counter("sluice_replicated_keys_total", "Key states copied to replicas.", nil, t.replicated.Load),
		counter("sluice_transfer_failures_total", "Transfer calls to other nodes that failed.", nil, t.failures.Load),
		counter("sluice_received_states_total", received, prometheus.Labels{"result": "merged"}, t.merged.Load),
		counter("sluice_received_states_total", received, prometheus.Labels{"result": "rejected"}, t.rejected.Load),
	}
}
