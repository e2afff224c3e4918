package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/labelset"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/redislimit"
)

// RedisOwner is the Owner of a decision Redis made, with backend redis;
// a decision of the unreachable policy names the daemon's node_name.
const RedisOwner = "redis"

// redisBackend is the daemon's limiter with backend redis: a
// redislimit.Limiter, counted in the metrics the cluster's node exports
// (sluice_checks_total, sluice_check_duration_seconds with path "redis",
// sluice_without_owner_total), and the public gRPC API's Router and
// Health over it. Safe for concurrent use.
type redisBackend struct {
	lim  *redislimit.Limiter
	node string // the daemon's node_name, for Health
	now  func() time.Time

	checks       *prometheus.CounterVec // name, algorithm, result
	latency      prometheus.Observer
	withoutOwner *prometheus.CounterVec // policy
	names        *labelset.Set
	policy       sluice.Policy // the default unreachable policy
}

var (
	_ sluice.Limiter   = (*redisBackend)(nil)
	_ transport.Router = (*redisBackend)(nil)
	_ transport.Health = (*redisBackend)(nil)
)

// redisConfig returns the redislimit configuration of cfg's Redis
// settings, reading the password and TLS files.
func redisConfig(cfg *Config) (redislimit.Config, error) {
	rc := redislimit.DefaultConfig()
	rc.Addrs = append([]string(nil), cfg.RedisAddrs...)
	rc.Username = cfg.RedisUsername
	rc.Password = cfg.RedisPassword
	if cfg.RedisPasswordFile != "" {
		b, err := os.ReadFile(cfg.RedisPasswordFile)
		if err != nil {
			return rc, &ConfigError{Field: "redis_password_file", Err: err}
		}
		rc.Password = strings.TrimSpace(string(b))
		if err := checkSecretText(rc.Password); err != nil || rc.Password == "" {
			return rc, &ConfigError{Field: "redis_password_file", Err: fmt.Errorf("%s: the password is empty, or not UTF-8 of at most 1024 bytes without control characters", cfg.RedisPasswordFile)}
		}
	}
	if cfg.RedisTLS {
		tc, err := redisTLS(cfg)
		if err != nil {
			return rc, err
		}
		rc.TLS = tc
	}
	rc.Prefix = cfg.RedisPrefix
	rc.Timeout = cfg.RedisTimeout
	rc.Unreachable = cfg.Unreachable
	rc.DenyRetryAfter = cfg.DenyRetryAfter
	rc.BreakerThreshold = cfg.BreakerThreshold
	rc.BreakerCooldown = cfg.BreakerCooldown
	rc.OverLimitCache = cfg.RedisOverLimitCache
	rc.PoolSize = cfg.RedisPoolSize
	rc.Local.MaxEntries = cfg.MaxKeys
	rc.Local.MaxBytes = cfg.MaxBytes
	// As the cluster's store: callers who may not reset a key may not
	// lower its count by another rate either, in Redis or in the local
	// store the unreachable policy decides on.
	rc.KeepStrictest = cfg.Destructive == DestructiveDeny || cfg.Destructive == DestructiveAdmins
	rc.Local.KeepStrictest = rc.KeepStrictest
	if err := rc.Validate(); err != nil {
		return rc, &ConfigError{Field: "backend", Err: err}
	}
	return rc, nil
}

// redisTLS loads the TLS files of the Redis settings.
func redisTLS(cfg *Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.RedisTLSServerName}
	if cfg.RedisTLSCAFile != "" {
		pool, err := loadCAs("redis_tls_ca_file", cfg.RedisTLSCAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if cfg.RedisTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.RedisTLSCertFile, cfg.RedisTLSKeyFile)
		if err != nil {
			return nil, &ConfigError{Field: "redis_tls_cert_file", Err: err}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// newRedisBackend builds the limiter on cfg's Redis and registers its
// metrics on reg. It does not contact Redis.
func newRedisBackend(cfg *Config, reg prometheus.Registerer, now func() time.Time) (*redisBackend, error) {
	rc, err := redisConfig(cfg)
	if err != nil {
		return nil, err
	}
	rc.Clock = now
	lim, err := redislimit.New(rc)
	if err != nil {
		return nil, &ConfigError{Field: "backend", Err: err}
	}
	b := &redisBackend{
		lim: lim, node: cfg.NodeName, now: now, policy: cfg.Unreachable,
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_checks_total",
			Help: "Checks answered by this daemon, by limit name, algorithm and result (allowed, limited, error).",
		}, []string{"name", "algorithm", "result"}),
		withoutOwner: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_without_owner_total",
			Help: "Checks decided without Redis, by the unreachable policy applied.",
		}, []string{"policy"}),
		// Names beyond the cluster's bound count under labelset.Overflow.
		names: labelset.New(cluster.MaxMetricNames, limiter.MaxNameLen),
	}
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_check_duration_seconds",
		Help:    "Time to answer a check (a batch counts once), by path: redis.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
	}, []string{"path"})
	b.latency = latency.WithLabelValues("redis")
	if err := errors.Join(reg.Register(b.checks), reg.Register(b.withoutOwner), reg.Register(latency)); err != nil {
		lim.Close()
		return nil, err
	}
	return b, nil
}

// Check decides req on Redis; see redislimit.Limiter.Check.
func (b *redisBackend) Check(ctx context.Context, req limiter.Request, opts ...sluice.CheckOption) (sluice.Decision, error) {
	r := b.CheckMany(ctx, []limiter.Request{req}, opts...)[0]
	return r.Decision, r.Err
}

// CheckMany decides reqs on Redis in one pipeline; see
// redislimit.Limiter.CheckMany.
func (b *redisBackend) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	start := b.now()
	out := b.lim.CheckMany(ctx, reqs, opts...)
	b.latency.Observe(b.now().Sub(start).Seconds())
	policy := sluice.Options(opts).Unreachable
	if policy == sluice.PolicyDefault || !policy.Valid() {
		policy = b.policy
	}
	for i := range out {
		if out[i].Err == nil {
			out[i].Owner = RedisOwner
			if out[i].WithoutOwner {
				out[i].Owner = b.node
			}
		}
		result := "limited"
		switch {
		case out[i].Err != nil:
			result = "error"
		case out[i].Allowed:
			result = "allowed"
		}
		b.checks.WithLabelValues(b.names.Label(reqs[i].Name), reqs[i].Algorithm.String(), result).Inc()
		if out[i].Err == nil && out[i].WithoutOwner {
			b.withoutOwner.WithLabelValues(policy.String()).Inc()
		}
	}
	return out
}

// Route decides the public API's requests, one CheckMany per unreachable
// policy.
func (b *redisBackend) Route(ctx context.Context, rr []transport.RoutedRequest) []sluice.Result {
	out := make([]sluice.Result, len(rr))
	byPolicy := make(map[sluice.Policy][]int, 1)
	var order []sluice.Policy
	for i := range rr {
		p := rr[i].Policy
		if _, ok := byPolicy[p]; !ok {
			order = append(order, p)
		}
		byPolicy[p] = append(byPolicy[p], i)
	}
	for _, p := range order {
		idx := byPolicy[p]
		reqs := make([]limiter.Request, len(idx))
		for j, i := range idx {
			reqs[j] = rr[i].Request
		}
		for j, res := range b.CheckMany(ctx, reqs, sluice.OnUnreachable(p)) {
			out[idx[j]] = res
		}
	}
	return out
}

// Health answers the Sluice service's health check: serving while Redis
// answers PING, "redis unreachable" otherwise; the daemon is its only
// member.
func (b *redisBackend) Health(ctx context.Context) transport.HealthReport {
	status := "serving"
	if err := b.lim.Ping(ctx); err != nil {
		status = "redis unreachable"
		if errors.Is(err, redislimit.ErrClosed) {
			status = "closed"
		}
	}
	return transport.HealthReport{Status: status, Members: 1, Node: b.node}
}

// register registers the Sluice service over b on s, asking permit about
// every request. Inspect is not served: a key's state in Redis is read
// by the script alone.
func (b *redisBackend) register(s grpc.ServiceRegistrar, permit transport.Permit) {
	transport.RegisterPublic(s, b, b, transport.WithPermit(permit))
}

// ready reports whether Redis answers, and why not.
func (b *redisBackend) ready(ctx context.Context) error { return b.lim.Ping(ctx) }

// Close closes the connections to Redis.
func (b *redisBackend) Close() error { return b.lim.Close() }
