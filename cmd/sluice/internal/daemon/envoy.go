package daemon

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/labelset"
)

// Bounds of the labels of sluice_envoy_hits_total: the domains and metric
// keys with a label value of their own (Config.EnvoyMetricKeys keys), each
// at most maxEnvoyMetricLabel bytes; the others count under "_other".
const (
	envoyMetricDomains  = 256
	maxEnvoyMetricLabel = 256
)

// watchEnvoy loads Config.EnvoyConfigDir and keeps it current, and exports
// the watcher's counters.
func (d *Daemon) watchEnvoy() error {
	wc := envoyrls.DefaultWatchConfig()
	wc.Logger = d.logger.With("component", "envoyrls")
	wc.Load = d.envoyLoadConfig()
	if d.opts.envoyCfg != nil {
		d.opts.envoyCfg(&wc)
	}
	w, err := envoyrls.WatchDir(d.cfg.EnvoyConfigDir, wc)
	if err != nil {
		// envoyrls's errors name the file and line already.
		return &ConfigError{Field: "envoy_config_dir", Err: err}
	}
	d.envoy = w
	d.exportWatcher("sluice_envoy_config", "sluice_envoy_domains", "Domains of Envoy's rate limit service in force, from envoy_config_dir.", "envoy_config_dir",
		func() int { return w.Current().Len() }, func() (int64, int64) { s := w.Stats(); return s.Reloads, s.Errors })
	d.logger.Info("sluice: envoy rate limit configuration loaded", "dir", d.cfg.EnvoyConfigDir, "domains", w.Current().Len())
	return nil
}

// watchEnvoyXDS starts taking Envoy's rate limit configuration from
// Config.EnvoyXDSAddr, and exports the watcher's counters. The daemon is
// not ready until the first configuration is accepted; after it, the
// last good configuration stays in force while the server is away.
func (d *Daemon) watchEnvoyXDS() error {
	xc := envoyrls.DefaultXDSConfig()
	xc.Addr, xc.NodeID = d.cfg.EnvoyXDSAddr, d.cfg.EnvoyXDSNodeID
	xc.NodeCluster = "sluice"
	xc.Logger = d.logger.With("component", "envoyrls")
	xc.Load = d.envoyLoadConfig()
	creds, err := d.cfg.xdsCredentials()
	if err != nil {
		return err
	}
	xc.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if d.opts.xdsCfg != nil {
		d.opts.xdsCfg(&xc)
	}
	w, err := envoyrls.WatchXDS(xc)
	if err != nil {
		return &ConfigError{Field: "envoy_xds_addr", Err: err}
	}
	d.envoyXDS = w
	d.exportWatcher("sluice_envoy_config", "sluice_envoy_domains", "Domains of Envoy's rate limit service in force, from envoy_xds_addr.", "envoy_xds_addr",
		func() int { return w.Current().Len() }, func() (int64, int64) { s := w.Stats(); return s.Updates, s.Rejects })
	d.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_envoy_xds_disconnects_total",
		Help: "Streams to envoy_xds_addr that ended; the daemon connects again with backoff, the last configuration in force.",
	}, func() float64 { return float64(w.Stats().Disconnects) }))
	d.logger.Info("sluice: envoy rate limit configuration from xds", "addr", d.cfg.EnvoyXDSAddr, "node_id", d.cfg.EnvoyXDSNodeID)
	return nil
}

// xdsReady reports whether w has accepted a configuration.
func xdsReady(w *envoyrls.XDSWatcher) bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

// envoyLoadConfig is how Envoy configuration files and xDS resources are
// read: lenient unless envoy_strict_config, each key ignored logged and
// counted.
func (d *Daemon) envoyLoadConfig() envoyrls.LoadConfig {
	warnings := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_envoy_config_warnings_total",
		Help: "Keys of Envoy configuration files ignored where they stand (known keys out of place), as envoyproxy/ratelimit ignores them; envoy_strict_config refuses them instead.",
	})
	d.reg.MustRegister(warnings)
	logger := d.logger.With("component", "envoyrls")
	return envoyrls.LoadConfig{
		Strict:       d.cfg.EnvoyStrictConfig,
		MergeDomains: d.cfg.EnvoyMergeDomains,
		Warn: func(e *envoyrls.ConfigError) {
			warnings.Inc()
			logger.Warn("sluice: envoy configuration key ignored", "err", e.Error())
		},
	}
}

// unknownDomainLogEvery is the least time between two logs of requests
// of unknown domains; the metric counts every one.
const unknownDomainLogEvery = 10 * time.Second

// registerEnvoy is part of registerPublic: Envoy's rate limit
// service, counting through lim (the node, or Redis), beside the node's
// own services.
func (d *Daemon) registerEnvoy(s grpc.ServiceRegistrar, lim sluice.Limiter) error {
	cfg := envoyrls.DefaultConfig()
	cfg.Limiter = serverLimits{lim}
	if d.envoyXDS != nil {
		cfg.Rules = d.envoyXDS
	} else {
		cfg.Rules = d.envoy
	}
	cfg.Now = d.opts.now
	switch d.cfg.EnvoyResponseHeaders {
	case EnvoyHeadersDraft:
		cfg.Headers = envoyrls.DraftHeaders()
	case EnvoyHeadersX:
		cfg.Headers = envoyrls.XRateLimitHeaders()
	}
	if d.cfg.EnvoyWindowAlignment == EnvoyAlignEpoch {
		cfg.Alignment = envoyrls.AlignEpoch
	}
	cfg.ShadowMode, cfg.QuotaMode = d.cfg.EnvoyShadowMode, d.cfg.EnvoyQuotaMode
	cfg.DynamicMetadata, cfg.ExactReset = d.cfg.EnvoyDynamicMetadata, d.cfg.EnvoyExactReset
	cfg.StopIncrementOverLimit = d.cfg.EnvoyStopIncrementOverLimit
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_envoy_hits_total",
		Help: "Hits of the descriptors of Envoy's rate limit service, by domain, metric key (envoyproxy/ratelimit's, detailed_metric and value_to_metric included; beyond envoy_metric_keys keys, or longer than 256 bytes, _other) and stat: total_hits, within_limit, near_limit, over_limit, shadow_mode.",
	}, []string{"domain", "key", "stat"})
	if err := d.reg.Register(hits); err != nil {
		return err
	}
	// Domains and keys come from requests (detailed_metric and
	// value_to_metric name a key after its request's values, and so do
	// limits sent with the descriptors): bounded, the rest under
	// labelset.Overflow.
	domains := labelset.New(envoyMetricDomains, maxEnvoyMetricLabel)
	keys := labelset.New(d.cfg.EnvoyMetricKeys, maxEnvoyMetricLabel)
	counters := newHitCounters(hits, domains, keys)
	cfg.OnHit = counters.add
	byDomain := func(name, help string) (*prometheus.CounterVec, error) {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"domain"})
		return c, d.reg.Register(c)
	}
	unknown, err := byDomain("sluice_envoy_unknown_domain_total",
		"Requests of Envoy's rate limit service naming a domain that is not configured, answered OK, by domain (beyond 256 domains, or longer than 256 bytes, _other).")
	if err != nil {
		return err
	}
	shadowed, err := byDomain("sluice_envoy_global_shadow_mode_total",
		"Requests of Envoy's rate limit service over the limit that envoy_shadow_mode answered OK, by domain (beyond 256 domains, or longer than 256 bytes, _other).")
	if err != nil {
		return err
	}
	// The domain of a request comes from its caller: bounded apart from
	// the configured ones, so that unknown names cannot push them out.
	unknownDomains := labelset.New(envoyMetricDomains, maxEnvoyMetricLabel)
	var lastLog atomic.Int64 // unix nanoseconds of the last log of an unknown domain
	logger := d.logger.With("component", "envoyrls")
	cfg.OnUnknownDomain = func(domain string) {
		unknown.WithLabelValues(unknownDomains.Label(domain)).Inc()
		now := d.opts.now().UnixNano()
		if last := lastLog.Load(); now-last >= int64(unknownDomainLogEvery) && lastLog.CompareAndSwap(last, now) {
			logger.Warn("sluice: envoy rate limit request of an unknown domain, answered OK (logged at most every 10s; sluice_envoy_unknown_domain_total counts them all)",
				"domain", strconv.QuoteToASCII(truncate(domain, maxEnvoyMetricLabel)))
		}
	}
	cfg.OnGlobalShadow = func(domain string) { shadowed.WithLabelValues(domains.Label(domain)).Inc() }
	svc, err := envoyrls.New(cfg)
	if err != nil {
		return err
	}
	svc.Register(s)
	d.envoySvc = svc
	return nil
}

// truncate returns s cut to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// envoyStats are the stat labels of sluice_envoy_hits_total, in the
// order of hitCounters.series.
var envoyStats = [...]string{"total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"}

// hitCounters counts the hits of Envoy's rate limit service in
// sluice_envoy_hits_total. The series of a domain and metric key that
// both have labels of their own are resolved once and kept: the labels
// and the vector's lookups cost more than the check itself otherwise.
// What keeps them bounded are the label sets: a domain or key counted
// under labelset.Overflow is looked up each time, never kept.
type hitCounters struct {
	vec           *prometheus.CounterVec
	domains, keys *labelset.Set
	known         sync.Map // hitKey -> *hitSeries
}

type hitKey struct{ domain, key string }

// hitSeries are the series of one domain and key, each made on its first
// hit, so that a stat that never counted shows no series.
type hitSeries struct {
	domain, key string // labels
	once        [len(envoyStats)]sync.Once
	series      [len(envoyStats)]prometheus.Counter
}

func newHitCounters(vec *prometheus.CounterVec, domains, keys *labelset.Set) *hitCounters {
	return &hitCounters{vec: vec, domains: domains, keys: keys}
}

// add counts h: total_hits always, the other stats when not zero.
func (c *hitCounters) add(h *envoyrls.Hit) {
	s := c.series(h.Domain, h.Key)
	for i, n := range [len(envoyStats)]uint64{h.TotalHits, h.WithinLimit, h.NearLimit, h.OverLimit, h.ShadowMode} {
		if n > 0 || i == 0 {
			s.once[i].Do(func() { s.series[i] = c.vec.WithLabelValues(s.domain, s.key, envoyStats[i]) })
			s.series[i].Add(float64(n))
		}
	}
}

func (c *hitCounters) series(domain, key string) *hitSeries {
	if s, ok := c.known.Load(hitKey{domain, key}); ok {
		return s.(*hitSeries)
	}
	s := &hitSeries{domain: c.domains.Label(domain), key: c.keys.Label(key)}
	if s.domain == labelset.Overflow || s.key == labelset.Overflow {
		return s
	}
	k := hitKey{strings.Clone(domain), strings.Clone(key)} // not the request's memory
	got, _ := c.known.LoadOrStore(k, s)
	return got.(*hitSeries)
}
