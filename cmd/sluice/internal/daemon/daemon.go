package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/rules"
)

// Option changes how New builds a Daemon; options are for programs that
// embed the daemon and for tests.
type Option func(*options)

type options struct {
	logOutput io.Writer
	logger    *slog.Logger
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration)
	ready     func(*Daemon)
	rulesCfg  func(*rules.WatchConfig)
	envoyCfg  func(*envoyrls.WatchConfig)
	xdsCfg    func(*envoyrls.XDSConfig)
	// clusterBase, set by tests, returns the node configuration the
	// daemon's settings apply to, instead of cluster.DefaultConfig.
	clusterBase func(name string) cluster.Config
}

// WithClusterBase builds the daemon's node on base(name) instead of
// cluster.DefaultConfig; the daemon's settings apply over it as they do
// over the default. It is for tests: cluster.TestConfig's gossip tolerates
// a process starved of CPU.
func WithClusterBase(base func(name string) cluster.Config) Option {
	return func(o *options) { o.clusterBase = base }
}

// WithLogOutput writes the daemon's logs, in Config.LogFormat, to w
// instead of os.Stderr.
func WithLogOutput(w io.Writer) Option { return func(o *options) { o.logOutput = w } }

// WithLogger logs to l, ignoring Config.LogFormat and LogLevel.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClock makes the node decide, and the HTTP API compute reset_after_ms,
// at the times now returns.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithSleep replaces the timer of Config.ShutdownDelay: sleep must return
// after d or once ctx ends.
func WithSleep(sleep func(ctx context.Context, d time.Duration)) Option {
	return func(o *options) { o.sleep = sleep }
}

// WithRulesWatch lets f change how Config.RulesFile is watched, from
// rules.DefaultWatchConfig with the daemon's logger: tests poll more
// often, or on their own ticks.
func WithRulesWatch(f func(*rules.WatchConfig)) Option {
	return func(o *options) { o.rulesCfg = f }
}

// WithEnvoyWatch lets f change how Config.EnvoyConfigDir is watched, from
// envoyrls.DefaultWatchConfig with the daemon's logger.
func WithEnvoyWatch(f func(*envoyrls.WatchConfig)) Option {
	return func(o *options) { o.envoyCfg = f }
}

// WithEnvoyXDS lets f change how Config.EnvoyXDSAddr is watched, from
// envoyrls.DefaultXDSConfig with the daemon's settings: tests back off
// less.
func WithEnvoyXDS(f func(*envoyrls.XDSConfig)) Option {
	return func(o *options) { o.xdsCfg = f }
}

// WithReady makes Run call f once the daemon serves, with its bound
// addresses known. f must not block for long.
func WithReady(f func(*Daemon)) Option { return func(o *options) { o.ready = f } }

// Daemon is a running sluice node: a cluster.Node, which serves its peers
// (and the public gRPC API without peer_addr), the public gRPC API's server
// with peer_addr, and an HTTP server for the JSON API, health and metrics.
// Its methods are safe for concurrent use.
type Daemon struct {
	cfg    Config
	opts   options
	logger *slog.Logger

	reg     *prometheus.Registry
	metrics *httpMetrics
	bodies  *bodyBudget // of the HTTP API's request bodies
	codec   transport.Codec

	// limiter decides every check of every API: node, or redis with
	// backend redis.
	limiter sluice.Limiter
	// node is the cluster member; nil with backend redis, where redis
	// decides and no gossip or Peer service runs.
	node   *cluster.Node
	redis  *redisBackend
	tracer *sdktrace.TracerProvider // nil without Config.TracingEndpoint
	// rules keeps Config.RulesFile current; nil without one. enforcer
	// applies its rules for POST /v1/rules/check and the Rules service;
	// registerPublic sets it before the public API serves.
	rules    *rules.Watcher
	enforcer rules.Enforcer
	// envoy keeps Config.EnvoyConfigDir current for Envoy's rate limit
	// service; nil without one.
	envoy *envoyrls.Watcher
	// envoyXDS keeps the configuration Config.EnvoyXDSAddr sends
	// current instead; nil without one.
	envoyXDS *envoyrls.XDSWatcher
	// envoySvc serves Envoy's rate limit service, for POST /json too;
	// registerPublic sets it, nil without an Envoy configuration.
	envoySvc *envoyrls.Service
	// health is grpc.health.v1 on the public gRPC API, its status
	// following readiness (refreshHealth).
	health *health.Server
	// public serves the public gRPC API on publicLis, grpc_addr, with
	// Config.PeerAddr; both are nil without it, the node's server
	// serving the public API beside the Peer service. publicDone is
	// closed when public.Serve has returned.
	// With backend redis there is no node, and public always serves.
	public    *grpc.Server
	publicLis net.Listener
	// publicBudget is the message budget and connection cap of public
	// and publicLis.
	publicBudget *transport.MessageBudget
	publicDone   chan struct{}
	lis          net.Listener
	// httpConns is lis's connection cap, before TLS (http_max_connections).
	httpConns *connLimit
	srv       *http.Server
	served    chan struct{} // closed when srv.Serve has returned
	serveMu   sync.Mutex    // guards serveErr
	// serveErr is srv.Serve's error other than http.ErrServerClosed.
	serveErr error

	shuttingDown atomic.Bool
	shutdownOnce sync.Once
	shutdownErr  error
}

// New validates cfg, starts the node (which joins cfg.Join) and the HTTP
// server, and returns the running daemon. If it fails half-way it stops
// what it started.
func New(cfg Config, opts ...Option) (d *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{logOutput: os.Stderr, now: time.Now, sleep: sleepTimer}
	for _, f := range opts {
		f(&o)
	}
	d = &Daemon{cfg: cfg.clone(), opts: o, logger: o.logger, served: make(chan struct{})}
	if d.logger == nil {
		d.logger = newLogger(o.logOutput, cfg.LogFormat, cfg.LogLevel)
	}
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_daemon_ready",
			Help: "1 when the daemon reports ready on /readyz, 0 otherwise.",
		}, func() float64 {
			if ok, _ := d.readiness(); ok {
				return 1
			}
			return 0
		}),
	)
	d.metrics = newHTTPMetrics(d.reg)
	d.health = health.NewServer()
	d.bodies = newBodyBudget(cfg.HTTPBodyBudget(), d.reg)

	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	// The rules are read first: an invalid file fails the daemon before
	// it starts anything.
	if cfg.RulesFile != "" {
		if err := d.watchRules(); err != nil {
			return nil, err
		}
		w := d.rules // d is nil once a failure is returned
		defer func() {
			if err != nil {
				w.Close()
			}
		}()
	}
	if cfg.EnvoyConfigDir != "" {
		if err := d.watchEnvoy(); err != nil {
			return nil, err
		}
		w := d.envoy
		defer func() {
			if err != nil {
				w.Close()
			}
		}()
	}
	if cfg.EnvoyXDSAddr != "" {
		if err := d.watchEnvoyXDS(); err != nil {
			return nil, err
		}
		w := d.envoyXDS
		defer func() {
			if err != nil {
				w.Close()
			}
		}()
	}
	if cfg.Backend == BackendRedis {
		if err = d.startRedis(tlsCfg); err != nil {
			return nil, err
		}
		return d, nil
	}
	cc := d.clusterConfig()
	cc.TLS = tlsCfg
	if cc.GossipKeys, err = decodeGossipKeys(cfg.GossipKeys); err != nil {
		return nil, &ConfigError{Field: "gossip_keys", Err: err}
	}
	if cfg.ClusterSecretFile != "" {
		if cc.ClusterSecret, err = readClusterSecret(cfg.ClusterSecretFile); err != nil {
			return nil, &ConfigError{Field: "cluster_secret_file", Err: err}
		}
	}
	cc.PeerIdentities = cfg.PeerIdentities
	cc.PublicPermit = d.permitGRPC
	cc.PublicInspectPermit = d.permitInspectGRPC
	if cfg.PeerAddr != "" {
		cc.GRPCAddr = cfg.PeerAddr // the node's server serves peers alone
	} else {
		cc.RegisterServices = d.registerPublic
	}
	// Listen for HTTP and the public API before the node starts, so that
	// a taken port fails the daemon before it joins the cluster.
	if d.lis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("daemon: listen on http_addr: %w", err)
	}
	d.httpConns = newConnLimit(d.lis, cfg.HTTPMaxConnections)
	d.lis = d.httpConns
	if tlsCfg != nil {
		// Verified when presented; the API's handlers require one
		// (requireClientCert), probes and scrapers do not.
		d.lis = tls.NewListener(d.lis, serverTLS(tlsCfg, tls.VerifyClientCertIfGiven))
	}
	if cfg.PeerAddr != "" {
		if d.publicBudget, err = transport.NewMessageBudget(d.publicLimits()); err != nil {
			d.lis.Close()
			return nil, fmt.Errorf("daemon: grpc_addr: %w", err)
		}
		if d.publicLis, err = d.publicBudget.Listen("tcp", cfg.GRPCAddr); err != nil {
			d.lis.Close()
			return nil, fmt.Errorf("daemon: listen on grpc_addr: %w", err)
		}
	}
	// closeListeners undoes the listens above for a failure before the
	// servers own them.
	closeListeners := func() {
		d.lis.Close()
		if d.publicLis != nil {
			d.publicLis.Close()
		}
	}
	if d.tracer, err = newTracerProvider(&cfg); err != nil {
		closeListeners()
		return nil, err
	}
	if d.tracer != nil {
		cc.TracerProvider = d.tracer
		cc.TraceKeys = cfg.TracingKeys
	}
	if d.node, err = cluster.New(cc); err != nil {
		closeListeners()
		d.stopTracing(context.Background())
		peerKey := "grpc_addr"
		if cfg.PeerAddr != "" {
			peerKey = "peer_addr"
		}
		return nil, fmt.Errorf("daemon: start node (gossip_addr %s, %s %s): %w", cfg.GossipAddr, peerKey, cc.GRPCAddr, err)
	}
	d.limiter = d.node
	d.refreshHealth()
	if d.publicLis != nil {
		if err = d.servePublic(tlsCfg); err != nil {
			closeListeners()
			d.node.Close()
			d.stopTracing(context.Background())
			return nil, err
		}
	} else {
		d.logger.Warn("sluice: peers and API clients share grpc_addr and its connection cap, so that clients that fill it keep peers out: set peer_addr to give peers a port of their own",
			"grpc", d.node.GRPCAddr())
	}
	d.serveHTTP()
	d.logger.Info("sluice: daemon started", "node", cfg.NodeName, "http", d.HTTPAddr(),
		"grpc", d.GRPCAddr(), "peer", d.PeerAddr(), "gossip", d.node.GossipAddr(), "join", cfg.Join)
	return d, nil
}

// startRedis is New's second half with backend redis: the limiter on
// Redis, the public gRPC API on grpc_addr and the HTTP server; no node,
// no gossip, no Peer service. It undoes what it started when it fails.
func (d *Daemon) startRedis(tlsCfg *tls.Config) (err error) {
	if ignored := ignoredWithRedis(&d.cfg); len(ignored) > 0 {
		d.logger.Warn("sluice: backend redis runs no cluster: these settings are ignored", "settings", ignored)
	}
	if d.redis, err = newRedisBackend(&d.cfg, d.reg, d.opts.now); err != nil {
		return err
	}
	d.limiter = d.redis
	defer func() {
		if err != nil {
			d.redis.Close()
		}
	}()
	if d.lis, err = net.Listen("tcp", d.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("daemon: listen on http_addr: %w", err)
	}
	d.httpConns = newConnLimit(d.lis, d.cfg.HTTPMaxConnections)
	d.lis = d.httpConns
	if tlsCfg != nil {
		d.lis = tls.NewListener(d.lis, serverTLS(tlsCfg, tls.VerifyClientCertIfGiven))
	}
	if d.publicBudget, err = transport.NewMessageBudget(d.publicLimits()); err != nil {
		d.lis.Close()
		return fmt.Errorf("daemon: grpc_addr: %w", err)
	}
	// The budget's own listener: at the cap, a connection with no call
	// open gives its slot to a new one, as on backend cluster.
	if d.publicLis, err = d.publicBudget.Listen("tcp", d.cfg.GRPCAddr); err != nil {
		d.lis.Close()
		return fmt.Errorf("daemon: listen on grpc_addr: %w", err)
	}
	if err = d.servePublic(tlsCfg); err != nil {
		d.lis.Close()
		d.publicLis.Close()
		return err
	}
	d.serveHTTP()
	d.refreshHealth()
	d.logger.Info("sluice: daemon started", "node", d.cfg.NodeName, "http", d.HTTPAddr(),
		"grpc", d.GRPCAddr(), "backend", BackendRedis, "redis", d.cfg.RedisAddrs)
	return nil
}

// serveHTTP serves the HTTP API on lis.
func (d *Daemon) serveHTTP() {
	d.srv = &http.Server{
		Handler:           d.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnState:         d.httpConns.track, // idle connections give their slots up at the cap
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(d.logger.Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(d.served)
		if err := d.srv.Serve(d.lis); !errors.Is(err, http.ErrServerClosed) {
			d.serveMu.Lock()
			d.serveErr = err
			d.serveMu.Unlock()
		}
	}()
}

// publicLimits returns the limits of grpc_addr's server with peer_addr
// set: those of the peers' server (GRPCMessageBudget), under a connection
// cap and a message budget apart from the peers'.
func (d *Daemon) publicLimits() transport.ServerLimits { return d.cfg.GRPCMessageBudget() }

// serverTLS returns tlsCfg for a server that treats the certificates of
// its callers as auth says, when tlsCfg verifies them (has ClientCAs).
func serverTLS(tlsCfg *tls.Config, auth tls.ClientAuthType) *tls.Config {
	c := tlsCfg.Clone()
	if c.ClientCAs != nil {
		c.ClientAuth = auth
	}
	return c
}

// servePublic serves the public gRPC API on publicLis, with the limits of
// publicLimits and, under TLS, requiring a client certificate when
// tls_ca_file is set, as the node's server does.
func (d *Daemon) servePublic(tlsCfg *tls.Config) error {
	opts := d.publicBudget.ServerOptions()
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(serverTLS(tlsCfg, tls.RequireAndVerifyClientCert))))
	}
	d.public = grpc.NewServer(opts...)
	if err := d.registerPublic(transport.Registrar(d.public), d.node); err != nil { // node nil with backend redis
		return fmt.Errorf("daemon: register the public API: %w", err)
	}
	srv, lis, logger := d.public, d.publicLis, d.logger
	d.publicDone = make(chan struct{})
	go func() {
		defer close(d.publicDone)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logger.Error("sluice: public gRPC server stopped", "err", err)
		}
	}()
	return nil
}

// stopPublic stops the public gRPC server, when there is one: at once, or
// after its calls in flight have ended or ctx ends, whichever is first.
func (d *Daemon) stopPublic(ctx context.Context, graceful bool) {
	if d.public == nil {
		return
	}
	if graceful {
		stopped := make(chan struct{})
		go func() {
			d.public.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
		}
	}
	d.public.Stop() // nothing to do after a graceful stop
	<-d.publicDone
}

// clusterConfig returns the node's configuration.
func (d *Daemon) clusterConfig() cluster.Config {
	c := cluster.DefaultConfig()
	if d.opts.clusterBase != nil {
		c = d.opts.clusterBase(d.cfg.NodeName)
	}
	c.NodeName = d.cfg.NodeName
	c.GossipAddr = d.cfg.GossipAddr
	c.GRPCAddr = d.cfg.GRPCAddr
	c.AdvertiseHost = d.cfg.AdvertiseHost
	c.Seeds = d.cfg.Join
	c.RetryJoinInterval = d.cfg.RetryJoinInterval
	c.BootstrapExpect = d.cfg.BootstrapExpect
	c.Profile = d.cfg.GossipProfile
	c.Unreachable = d.cfg.Unreachable
	c.DenyRetryAfter = d.cfg.DenyRetryAfter
	c.Peer.Timeout = d.cfg.PeerTimeout
	c.BreakerThreshold = d.cfg.BreakerThreshold
	c.BreakerCooldown = d.cfg.BreakerCooldown
	c.Replicas = d.cfg.Replicas
	c.ReplicateInterval = d.cfg.ReplicateInterval
	c.LeaveTimeout = d.cfg.LeaveTimeout
	c.DataDir = d.cfg.DataDir
	c.PersistInterval = d.cfg.PersistInterval
	if d.cfg.DataDamaged == DataDamagedSetAside {
		c.DamagedData = cluster.SetDamagedAside
	}
	c.Lease = d.cfg.Lease
	c.MaxClockSkew = d.cfg.MaxClockSkew
	c.ClockProbeInterval = d.cfg.ClockProbeInterval
	c.Store.MaxEntries = d.cfg.MaxKeys
	c.Store.MaxBytes = d.cfg.MaxBytes
	// Callers who may not reset a key may not lower what it counts by
	// changing its rate either.
	c.Store.KeepStrictest = d.cfg.Destructive == DestructiveDeny || d.cfg.Destructive == DestructiveAdmins
	c.ServerLimits = d.cfg.GRPCMessageBudget()
	c.Logger = d.logger.With("component", "cluster")
	if d.opts.now != nil {
		c.Clock = cluster.ClockFunc(d.opts.now)
	}
	c.Registerer = d.reg // /metrics shows the node's metrics with the daemon's
	return c
}

// watchRules loads Config.RulesFile and keeps it current, and exports
// the watcher's counters.
func (d *Daemon) watchRules() error {
	wc := rules.DefaultWatchConfig()
	wc.Logger = d.logger.With("component", "rules")
	if d.opts.rulesCfg != nil {
		d.opts.rulesCfg(&wc)
	}
	w, err := rules.Watch(d.cfg.RulesFile, wc)
	if err != nil {
		// rules' errors name the file, line and column already.
		return &ConfigError{Field: "rules_file", Err: err}
	}
	d.rules = w
	d.exportWatcher("sluice_rules", "sluice_rules", "Rules in force, from rules_file.", "rules_file",
		func() int { return w.Current().Len() }, func() (int64, int64) { s := w.Stats(); return s.Reloads, s.Errors })
	d.logger.Info("sluice: rules loaded", "file", d.cfg.RulesFile, "rules", w.Current().Len())
	return nil
}

// exportWatcher registers the metrics of a configuration watched from the
// setting field: the gauge size, what is in force, and the counters
// prefix_reloads_total and prefix_reload_errors_total of stats.
func (d *Daemon) exportWatcher(prefix, size, sizeHelp, field string, count func() int, stats func() (reloads, errors int64)) {
	d.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: size, Help: sizeHelp}, func() float64 { return float64(count()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: prefix + "_reloads_total",
			Help: "Changes of " + field + " made current after the first load.",
		}, func() float64 { r, _ := stats(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: prefix + "_reload_errors_total",
			Help: "Reloads of " + field + " that failed; what was in force stayed.",
		}, func() float64 { _, e := stats(); return float64(e) }),
	)
}

// NewLogger returns the daemon's logger on w: format "json" or "text",
// records of level and above.
func NewLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	return newLogger(w, format, level)
}

func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	ho := &slog.HandlerOptions{Level: level, ReplaceAttr: readableAttr}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, ho))
	}
	return slog.New(slog.NewJSONHandler(w, ho))
}

func sleepTimer(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Node returns the daemon's cluster node; nil with backend redis.
func (d *Daemon) Node() *cluster.Node { return d.node }

// Limiter returns what the daemon decides checks on: the node, or the
// limiter on Redis with backend redis.
func (d *Daemon) Limiter() sluice.Limiter { return d.limiter }

// Registry returns the registry /metrics serves.
func (d *Daemon) Registry() *prometheus.Registry { return d.reg }

// Config returns the daemon's configuration.
func (d *Daemon) Config() Config { return d.cfg.clone() }

// HTTPAddr returns the address the HTTP server listens on.
func (d *Daemon) HTTPAddr() string { return d.lis.Addr().String() }

// GRPCAddr returns the address of the public gRPC API, where API clients
// call: grpc_addr, or, bound to every interface, its port on the host
// the node advertises. Without peer_addr it is PeerAddr.
func (d *Daemon) GRPCAddr() string {
	if d.publicLis == nil {
		return d.node.GRPCAddr()
	}
	addr := d.publicLis.Addr().(*net.TCPAddr)
	if !addr.IP.IsUnspecified() || d.node == nil {
		return addr.String()
	}
	host, _, err := net.SplitHostPort(d.node.GRPCAddr())
	if err != nil {
		return addr.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// PeerAddr returns the address the node advertises to its peers, where
// they call its Peer service: peer_addr, or grpc_addr without one; ""
// with backend redis.
func (d *Daemon) PeerAddr() string {
	if d.node == nil {
		return ""
	}
	return d.node.GRPCAddr()
}

// GossipAddr returns the address other nodes join this one at; "" with
// backend redis.
func (d *Daemon) GossipAddr() string {
	if d.node == nil {
		return ""
	}
	return d.node.GossipAddr()
}

// Ready reports what /readyz does: the node is ready (cluster.Node.Ready:
// it has joined the cluster when it was given addresses to join, it sees
// bootstrap_expect members or a member of a ready cluster, and serf runs,
// which a node name taken by another node stops), or with backend redis
// Redis answers PING within redis_timeout (every master of a Redis
// Cluster), and the daemon is not shutting down.
func (d *Daemon) Ready() bool {
	ok, _ := d.readiness()
	return ok
}

// readiness returns whether the daemon is ready and, when not, why.
func (d *Daemon) readiness() (bool, string) {
	switch {
	case d.shuttingDown.Load():
		return false, "shutting down"
	case d.envoyXDS != nil && !xdsReady(d.envoyXDS):
		return false, "waiting for the first Envoy rate limit configuration from envoy_xds_addr"
	case d.redis != nil:
		if err := d.redis.ready(context.Background()); err != nil {
			return false, "redis does not answer: " + err.Error()
		}
	case !d.node.Ready():
		return false, d.node.NotReadyReason()
	}
	return true, ""
}

// Run calls the WithReady function, serves until ctx ends or the HTTP
// server fails, then shuts down gracefully (see Shutdown). It returns nil
// after a shutdown caused by ctx, or the error that stopped it.
func (d *Daemon) Run(ctx context.Context) error {
	if d.opts.ready != nil {
		d.opts.ready(d)
	}
	var cause error
	select {
	case <-ctx.Done():
		d.logger.Info("sluice: shutting down", "reason", context.Cause(ctx))
	case <-d.served:
		d.serveMu.Lock()
		cause = d.serveErr
		d.serveMu.Unlock()
		d.logger.Error("sluice: HTTP server failed", "err", cause)
	}
	err := d.Shutdown(context.WithoutCancel(ctx))
	if cause != nil {
		return fmt.Errorf("daemon: http server: %w", cause)
	}
	return err
}

// Shutdown stops the daemon gracefully: /readyz fails at once; after
// Config.ShutdownDelay the HTTP server, then the public gRPC server of
// grpc_addr when peer_addr is set, stop accepting and wait, within
// Config.ShutdownTimeout (or until ctx ends), for in-flight requests, then
// close the rest, and the daemon stops watching the rule file; last the
// node leaves the cluster, telling the other members, and stops its gRPC
// server. Later calls return the first call's result.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdownOnce.Do(func() { d.shutdownErr = d.shutdown(ctx) })
	return d.shutdownErr
}

func (d *Daemon) shutdown(ctx context.Context) error {
	d.shuttingDown.Store(true)
	d.health.Shutdown() // NOT_SERVING to every watcher, from now on
	if d.cfg.ShutdownDelay > 0 {
		d.opts.sleep(ctx, d.cfg.ShutdownDelay)
	}
	var errs []error
	sctx, cancel := context.WithTimeout(ctx, d.cfg.ShutdownTimeout)
	err := d.srv.Shutdown(sctx)
	if err != nil {
		d.logger.Warn("sluice: in-flight HTTP requests did not finish in time", "err", err)
		d.srv.Close()
	}
	<-d.served
	d.stopPublic(sctx, true)
	cancel()
	d.closeRules()
	if d.redis != nil {
		if err := d.redis.Close(); err != nil {
			errs = append(errs, fmt.Errorf("daemon: close redis: %w", err))
		}
		d.logger.Info("sluice: daemon stopped", "node", d.cfg.NodeName)
		return errors.Join(errs...)
	}
	switch err := d.node.Leave(); {
	case err == nil, errors.Is(err, cluster.ErrClosed):
	case errors.Is(err, cluster.ErrHandoff):
		// The new owners could not all be reached (they may be stopping
		// too): the node is gone all the same, and the others go on with
		// their replicas' copies of its keys.
		d.logger.Warn("sluice: some key states were not handed off", "err", err)
	default:
		errs = append(errs, fmt.Errorf("daemon: leave: %w", err))
	}
	// Last, so that the spans of the hand-off go out too.
	tctx, cancel := context.WithTimeout(ctx, exportTimeout)
	if err := d.stopTracing(tctx); err != nil {
		d.logger.Warn("sluice: traces not exported", "err", err)
	}
	cancel()
	d.logger.Info("sluice: daemon stopped", "node", d.cfg.NodeName)
	return errors.Join(errs...)
}

// Close stops the daemon at once: the HTTP server, the rule watcher and
// the node, without leaving the cluster (other members see it fail). Safe after Shutdown.
func (d *Daemon) Close() error {
	d.shuttingDown.Store(true)
	d.health.Shutdown()
	d.srv.Close()
	<-d.served
	d.stopPublic(context.Background(), false)
	d.closeRules()
	if d.redis != nil {
		return d.redis.Close()
	}
	err := d.node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), exportTimeout)
	defer cancel()
	d.stopTracing(ctx) // spans that do not go out in time are lost
	return err
}

// closeRules stops watching Config.RulesFile and Config.EnvoyConfigDir,
// once no HTTP request uses the rules any more. Envoy's rate limit
// service and the Rules service, on the node's gRPC server until the node
// stops when there is no peer_addr, keep the last configuration.
func (d *Daemon) closeRules() {
	// Only the notifiers' close can fail: nothing to do about it.
	if d.rules != nil {
		d.rules.Close()
	}
	if d.envoy != nil {
		d.envoy.Close()
	}
	if d.envoyXDS != nil {
		d.envoyXDS.Close()
	}
}

// Run builds a daemon from cfg and runs it until ctx ends; see New and
// Daemon.Run.
func Run(ctx context.Context, cfg Config, opts ...Option) error {
	d, err := New(cfg, opts...)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
