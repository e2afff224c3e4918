package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/internal/yamlfile"
	"github.com/sluicehq/sluice/redislimit"
)

// Config is the daemon's configuration. Build it with DefaultConfig (or
// Load, which starts from it) and change fields; New validates it.
type Config struct {
	// NodeName must be unique in the cluster. Load fills it with the host
	// name when no source sets it.
	NodeName string
	// GossipAddr, GRPCAddr and HTTPAddr are host:port bind addresses; port
	// 0 picks a free one (see Daemon's address methods for the result).
	// GRPCAddr serves API clients: the Sluice service, the Rules service
	// and Envoy's rate limit service.
	GossipAddr string
	GRPCAddr   string
	HTTPAddr   string
	// PeerAddr, host:port, serves the Peer service on a listener of its
	// own, with its own connection cap, and is the address the node
	// advertises to its peers: connections of API clients on GRPCAddr
	// never take a peer's place. Empty: peers share GRPCAddr, and its
	// connection cap, with API clients.
	PeerAddr string
	// AdvertiseHost is the host other nodes reach this one at; empty means
	// the bind host.
	AdvertiseHost string
	// Join are gossip addresses, host:port, of members to join. A host
	// name stands for every address it resolves to, looked up again at
	// each attempt (every RetryJoinInterval until one answers), with this
	// node's own left out: one Kubernetes headless Service name finds
	// every pod. Empty starts a new cluster.
	Join              []string
	RetryJoinInterval time.Duration
	// BootstrapExpect is how many nodes start a new cluster together
	// (cluster.Config.BootstrapExpect): a node is ready once it sees that
	// many members, or a member of a cluster that is ready. 1 runs a node
	// alone; 0, the default, only joins a cluster that is ready.
	BootstrapExpect int
	GossipProfile   cluster.Profile
	// Unreachable is the policy of checks that set none.
	Unreachable    sluice.Policy
	DenyRetryAfter time.Duration
	PeerTimeout    time.Duration
	// MaxKeys bounds the keys this node's store holds; 0 means no bound.
	MaxKeys int
	// MaxBytes bounds the memory of the keys this node's store holds, as
	// limiter.StoreConfig.MaxBytes counts it; 0 means no bound.
	MaxBytes int64
	// MemoryLimit is the soft memory limit of the daemon's process
	// (GOMEMLIMIT), which makes the garbage collector work harder as the
	// heap nears it rather than let it double: 0 means MaxBytes plus
	// MemoryHeadroom, or none when MaxBytes is 0. The GOMEMLIMIT
	// environment variable, when set, wins (GOMEMLIMIT=off for none).
	MemoryLimit int64
	// MaxBodyBytes bounds an HTTP request body.
	MaxBodyBytes int64
	// HTTPBodyBytes bounds the bytes of HTTP request bodies held at once,
	// across all requests, beyond the first 4 KiB of each: a request
	// whose body finds no room is answered 503. 0: a quarter of
	// SoftMemoryLimit, or 64 MiB without one (HTTPBodyBudget).
	HTTPBodyBytes int64
	// HTTPBodyTimeout is how long a request's body may take to arrive
	// whole, from when its handler starts reading: 408 after it.
	HTTPBodyTimeout time.Duration
	// HTTPMaxConnections bounds the HTTP connections open at once; one
	// more waits to be accepted until another closes.
	HTTPMaxConnections int
	// GRPCMessageBytes is the budget of inbound gRPC message bytes of
	// every connection together (transport.ServerLimits.MessageBytes; one
	// connection holds at most a 64th of it, or one call's reservation,
	// while more than half is in use). 0: a quarter of SoftMemoryLimit, or the transport's default
	// without one (GRPCMessageBudget).
	GRPCMessageBytes int64
	// GRPCMessageTimeout is how long the first message of a gRPC call
	// may take to arrive whole (transport.ServerLimits.MessageTimeout).
	GRPCMessageTimeout time.Duration
	// MaxBatchItems bounds the items of one POST /v1/check/batch.
	MaxBatchItems int
	// RulesFile is a rule file in the rules package's format. With one,
	// POST /v1/rules/check checks requests described by their route,
	// user, descriptors and so on against the rules it holds; the file is
	// loaded at start (an invalid file fails New) and reloaded as it
	// changes, an invalid version leaving the previous rules in force.
	// Empty: no rules, and POST /v1/rules/check answers 404.
	RulesFile string
	// EnvoyConfigDir is a directory of configuration files in
	// envoyproxy/ratelimit's format, one domain per *.yaml file. With
	// one, grpc_addr also serves Envoy's rate limit service
	// (envoy.service.ratelimit.v3.RateLimitService), counting each
	// descriptor through the cluster; the directory is loaded at start
	// (an invalid file fails New) and reloaded as it changes, an invalid
	// version leaving the previous configuration in force.
	EnvoyConfigDir string
	// EnvoyResponseHeaders adds the limit closest to being reached to
	// the rate limit service's responses: EnvoyHeadersOff, EnvoyHeadersDraft
	// (RateLimit-Limit, -Remaining, -Reset) or EnvoyHeadersX
	// (X-RateLimit-Limit, -Remaining, -Reset).
	EnvoyResponseHeaders string
	// EnvoyWindowAlignment places the windows of weeks, months and years:
	// EnvoyAlignCalendar (the UTC calendar's) or EnvoyAlignEpoch (blocks of
	// 7, 30 and 365 days since the Unix epoch, as envoyproxy/ratelimit).
	EnvoyWindowAlignment string
	// EnvoyMetricKeys bounds the metric keys of sluice_envoy_hits_total
	// that get a label value of their own; the hits of the others, and of
	// keys longer than 256 bytes, count under "_other".
	EnvoyMetricKeys int
	// EnvoyStrictConfig refuses a configuration file with a key of the
	// format out of place (unit on a descriptor, say); otherwise such a
	// key is ignored with a warning (logged and counted in
	// sluice_envoy_config_warnings_total), as envoyproxy/ratelimit
	// ignores it.
	EnvoyStrictConfig bool
	// EnvoyMergeDomains merges the files of one domain
	// (MERGE_DOMAIN_CONFIG); otherwise a domain in two files is an error.
	EnvoyMergeDomains bool
	// EnvoyShadowMode answers every request OK overall (SHADOW_MODE),
	// counting as usual; EnvoyQuotaMode puts every descriptor in quota
	// mode (QUOTA_MODE); EnvoyDynamicMetadata adds envoyproxy/ratelimit's
	// dynamic metadata to responses (RESPONSE_DYNAMIC_METADATA);
	// EnvoyStopIncrementOverLimit charges a request over on any
	// descriptor only on the descriptors over
	// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	EnvoyShadowMode, EnvoyQuotaMode, EnvoyDynamicMetadata, EnvoyStopIncrementOverLimit bool
	// EnvoyExactReset gives duration_until_reset to the nanosecond rather
	// than in whole seconds rounded up, as envoyproxy/ratelimit does.
	EnvoyExactReset bool
	// EnvoyXDSAddr, host:port of an xDS management server, makes Envoy's
	// rate limit service take its configuration from there (state of the
	// world, RateLimitConfig resources of type
	// ratelimit.config.ratelimit.v3.RateLimitConfig, as Envoy Gateway
	// serves them) instead of EnvoyConfigDir; the two exclude each
	// other. EnvoyXDSNodeID is the node id the daemon gives the server.
	// With EnvoyXDSCAFile (PEM) the connection uses TLS verified by it,
	// and EnvoyXDSCertFile and EnvoyXDSKeyFile present a client
	// certificate; EnvoyXDSServerName overrides the name verified.
	EnvoyXDSAddr       string
	EnvoyXDSNodeID     string
	EnvoyXDSCAFile     string
	EnvoyXDSCertFile   string
	EnvoyXDSKeyFile    string
	EnvoyXDSServerName string
	// ShutdownDelay is how long the daemon reports not ready before it
	// stops accepting requests, so that load balancers notice first.
	ShutdownDelay time.Duration
	// ShutdownTimeout bounds the wait for in-flight HTTP requests.
	ShutdownTimeout time.Duration
	LogFormat       string // "json" or "text"
	LogLevel        slog.Level

	// TLSCertFile and TLSKeyFile, PEM files, turn on TLS for gRPC (peers
	// and clients) and HTTP. TLSCAFile, a PEM bundle, verifies peers'
	// certificates and requires every caller, node or client, gRPC or
	// HTTP, to present a certificate it signs (mutual TLS).
	TLSCertFile string
	TLSKeyFile  string
	TLSCAFile   string
	// GossipKeys are base64 AES keys (16, 24 or 32 bytes) that encrypt
	// gossip; the first encrypts, all decrypt. Empty: a key derived from
	// ClusterSecretFile, or gossip in clear without one.
	GossipKeys []string
	// PeerIdentities, with mutual TLS, are the URI or DNS SANs that mark a
	// certificate as a cluster member's: only such callers may use the
	// Peer service, and only a member whose server certificate carries one
	// owns keys (cluster.Config.PeerIdentities). They need GossipKeys or
	// ClusterSecretFile: without either, Validate fails with
	// cluster.ErrPlainGossip.
	PeerIdentities []string
	// ClusterSecretFile holds a secret of at least 16 bytes that every
	// peer call proves (cluster.Config.ClusterSecret). Empty with
	// GossipKeys: the secret is derived from the gossip keys.
	ClusterSecretFile string
	// Destructive says who may use reset, drain_over_limit and refund, on
	// the HTTP and gRPC APIs, the admin API's reset included: DestructiveAllow,
	// DestructiveDeny or DestructiveAdmins (callers whose certificate
	// names one of AdminIdentities). Under DestructiveAdmins, inspecting
	// keys (the admin API's inspect) is for admins only too. Under
	// DestructiveDeny and DestructiveAdmins, the node's store keeps the
	// strictest rate each live key was charged under
	// (limiter.StoreConfig.KeepStrictest); with backend redis, so do the
	// script (redislimit.Config.KeepStrictest) and the local store of the
	// unreachable policy.
	Destructive     string
	AdminIdentities []string

	// BreakerThreshold consecutive failed calls to a peer open its circuit
	// breaker for BreakerCooldown (cluster.Config).
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// Replicas, ReplicateInterval and LeaveTimeout are cluster.Config's:
	// how many nodes hold each key's state, how often owners copy changed
	// keys to the others, and how long a graceful leave may hand off.
	Replicas          int
	ReplicateInterval time.Duration
	LeaveTimeout      time.Duration
	// DataDir, PersistInterval and DataDamaged are cluster.Config's
	// DataDir, PersistInterval and DamagedData: where key states outlive
	// the process, how often changed keys are written there, and what a
	// damaged state file does to a start (DataDamagedRefuse or
	// DataDamagedSetAside). Empty DataDir: states live in memory only.
	DataDir         string
	PersistInterval time.Duration
	DataDamaged     string
	// Lease configures token leases for hot keys (cluster.LeaseConfig);
	// a Threshold of 0 turns them off.
	Lease cluster.LeaseConfig
	// MaxClockSkew is the largest offset between two nodes' clocks the
	// cluster tolerates (cluster.Config.MaxClockSkew): members beyond it
	// are warned about and listed on /readyz.
	MaxClockSkew time.Duration
	// ClockProbeInterval is how often the node samples each member's clock
	// (cluster.Config.ClockProbeInterval).
	ClockProbeInterval time.Duration

	// TracingEndpoint, host:port of an OTLP/gRPC collector, turns on
	// tracing (cluster.Config.TracerProvider): spans are batched and sent
	// there. Empty, the default: no tracing.
	TracingEndpoint string
	// TracingInsecure sends spans without TLS (a collector on the same
	// host or a trusted network); otherwise TLS verified by the system's
	// roots.
	TracingInsecure bool
	// TracingSampleRatio is the share of checks without a sampled parent
	// that are traced, in [0, 1]; a check whose caller's trace is sampled
	// is traced whatever it is.
	TracingSampleRatio float64
	// TracingKeys adds client keys to spans (cluster.Config.TraceKeys).
	TracingKeys bool

	// Backend is where counters live: BackendCluster (the default), the
	// embedded cluster of sluice nodes that gossip and forward checks to
	// their keys' owners, or BackendRedis, a Redis server or Redis Cluster
	// (package redislimit), where the daemon is stateless and runs no
	// gossip and no Peer service. With BackendRedis the settings of a
	// cluster that name peers (join, peer_addr, gossip_keys,
	// peer_identities, cluster_secret_file) and tracing_endpoint are
	// refused; the other cluster settings (gossip_addr, gossip_profile,
	// retry_join_interval, advertise_host, peer_timeout, replicas,
	// replicate_interval, leave_timeout, lease_*) are ignored, with a
	// warning at start when they differ from their defaults. unreachable,
	// deny_retry_after, breaker_threshold and breaker_cooldown apply to
	// Redis's nodes as to peers, and max_keys and max_bytes bound the
	// store the local policy decides on while Redis is unreachable.
	Backend string
	// RedisAddrs are host:port addresses of one Redis server (one
	// address) or of Redis Cluster nodes (several; the cluster's other
	// nodes are found from them).
	RedisAddrs []string
	// RedisUsername and RedisPassword authenticate (AUTH; a username for
	// Redis ACLs, or none for the default user). RedisPasswordFile holds
	// the password instead, read at start with surrounding space trimmed.
	RedisUsername     string
	RedisPassword     string
	RedisPasswordFile string
	// RedisTLS connects to Redis with TLS, verified by RedisTLSCAFile
	// (the system's roots when empty) for RedisTLSServerName (the
	// address's host when empty); RedisTLSCertFile and RedisTLSKeyFile
	// are a client certificate for a Redis that requires one.
	RedisTLS           bool
	RedisTLSCAFile     string
	RedisTLSCertFile   string
	RedisTLSKeyFile    string
	RedisTLSServerName string
	// RedisTimeout bounds one check (or batch) on Redis, connecting
	// included; past it the unreachable policy decides.
	RedisTimeout time.Duration
	// RedisPrefix begins every key the daemon writes in Redis.
	RedisPrefix string
	// RedisPoolSize is the most connections to each Redis node; 0 is
	// go-redis's default, 10 per CPU.
	RedisPoolSize int
	// RedisOverLimitCache is the most keys remembered in the daemon as
	// admitting nothing until their retry_after, denied without a call to
	// Redis (redislimit.Config.OverLimitCache); 0, the default, is off.
	RedisOverLimitCache int
}

// The values of Config.Backend.
const (
	BackendCluster = "cluster"
	BackendRedis   = "redis"
)

// Bounds on Config fields.
const (
	// MemoryHeadroom is what the default MemoryLimit allows beside the
	// store's MaxBytes: connections, batches in flight, the replication
	// change lists and the runtime.
	MemoryHeadroom = 96 << 20
	MinMemoryLimit = 64 << 20
	MinBodyBytes   = 1 << 10
	MaxBodyBytes   = 64 << 20
	// MinGRPCMessageBytes is the least grpc_message_bytes: room for 12
	// calls (transport.MessageReservation each).
	MinGRPCMessageBytes = 16 << 20
	// MinStoreBytes is the least max_bytes: 16 MiB gives each of the
	// store's 128 shards room for limiter.MaxKeyBytes, the most one key
	// costs.
	MinStoreBytes = 16 << 20
	maxNameLen    = 128
	// maxEnvoyMetricKeys bounds envoy_metric_keys: about 5 MB of series.
	maxEnvoyMetricKeys = 10_000
)

// DefaultConfig returns the configuration of a production node: gossip on
// 7946, gRPC on 7947 and HTTP on 8080 of every interface.
func DefaultConfig() Config {
	cc := cluster.DefaultConfig()
	rd := redislimit.DefaultConfig()
	return Config{
		GossipAddr:           cc.GossipAddr,
		GRPCAddr:             cc.GRPCAddr,
		HTTPAddr:             ":8080",
		RetryJoinInterval:    cc.RetryJoinInterval,
		GossipProfile:        cluster.ProfileLAN,
		Unreachable:          sluice.PolicyLocal,
		DenyRetryAfter:       cc.DenyRetryAfter,
		PeerTimeout:          cc.Peer.Timeout,
		BreakerThreshold:     cc.BreakerThreshold,
		BreakerCooldown:      cc.BreakerCooldown,
		Replicas:             cc.Replicas,
		ReplicateInterval:    cc.ReplicateInterval,
		LeaveTimeout:         cc.LeaveTimeout,
		PersistInterval:      cc.PersistInterval,
		DataDamaged:          DataDamagedRefuse,
		Lease:                cc.Lease,
		MaxClockSkew:         cc.MaxClockSkew,
		ClockProbeInterval:   cc.ClockProbeInterval,
		MaxKeys:              cc.Store.MaxEntries,
		MaxBytes:             cc.Store.MaxBytes,
		Destructive:          DestructiveAllow,
		Backend:              BackendCluster,
		RedisTimeout:         rd.Timeout,
		RedisPrefix:          rd.Prefix,
		MaxBodyBytes:         1 << 20,
		HTTPBodyTimeout:      10 * time.Second,
		HTTPMaxConnections:   4096,
		GRPCMessageTimeout:   transport.DefaultServerLimits().MessageTimeout,
		EnvoyResponseHeaders: EnvoyHeadersOff,
		EnvoyWindowAlignment: EnvoyAlignCalendar,
		EnvoyMetricKeys:      1000,
		EnvoyXDSNodeID:       "default",
		MaxBatchItems:        transport.MaxBatchItems,
		ShutdownTimeout:      10 * time.Second,
		LogFormat:            "json",
		LogLevel:             slog.LevelInfo,

		TracingSampleRatio: 0.01,
	}
}

// ErrInvalidConfig is wrapped by every configuration error; the error is a
// *ConfigError that names the field and where its value came from.
var ErrInvalidConfig = errors.New("daemon: invalid config")

// ConfigError is an invalid configuration value.
type ConfigError struct {
	// Source is where the value came from: a file name, "env SLUICE_X",
	// "flag --x", or "" for a Config built in code.
	Source string
	// Line and Column are the value's position in the file Source, or
	// 0 (a YAML syntax error names only its line).
	Line, Column int
	// Field is the YAML key of the field ("" for an error of the file as a
	// whole).
	Field string
	Err   error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
			if e.Column > 0 {
				fmt.Fprintf(&b, ":%d", e.Column)
			}
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns ErrInvalidConfig and the cause.
func (e *ConfigError) Unwrap() []error { return []error{ErrInvalidConfig, e.Err} }

// field is one setting: its YAML key (the flag is the key with '-' for
// '_', the environment variable SLUICE_ and the key in upper case), how to
// parse it from text and how to check the result.
type field struct {
	key   string
	usage string
	list  bool // a list: comma-separated text, or a YAML sequence
	parse func(c *Config, v string) error
	check func(c *Config) error // nil: parse checks everything
	show  func(c *Config) string
}

func (f *field) flagName() string { return strings.ReplaceAll(f.key, "_", "-") }
func (f *field) envName() string  { return "SLUICE_" + strings.ToUpper(f.key) }

// fields lists every setting, in the order of the usage text.
var fields = []field{
	{key: "node_name", usage: "unique name of this node (default: the host name)",
		parse: func(c *Config, v string) error { c.NodeName = v; return nil },
		check: func(c *Config) error { return checkName(c.NodeName) },
		show:  func(c *Config) string { return c.NodeName }},
	{key: "gossip_addr", usage: "serf gossip bind address, host:port",
		parse: func(c *Config, v string) error { c.GossipAddr = v; return nil },
		check: func(c *Config) error { return checkAddr(c.GossipAddr) },
		show:  func(c *Config) string { return c.GossipAddr }},
	{key: "grpc_addr", usage: "gRPC bind address of the public API (and of peers, without peer_addr), host:port",
		parse: func(c *Config, v string) error { c.GRPCAddr = v; return nil },
		check: func(c *Config) error { return checkAddr(c.GRPCAddr) },
		show:  func(c *Config) string { return c.GRPCAddr }},
	{key: "peer_addr", usage: "gRPC bind address of the Peer service, apart from the public API's, host:port; empty: peers share grpc_addr",
		parse: func(c *Config, v string) error { c.PeerAddr = v; return nil },
		check: func(c *Config) error {
			if c.PeerAddr == "" {
				return nil
			}
			return checkAddr(c.PeerAddr)
		},
		show: func(c *Config) string { return c.PeerAddr }},
	{key: "http_addr", usage: "HTTP bind address (JSON API, health, metrics), host:port",
		parse: func(c *Config, v string) error { c.HTTPAddr = v; return nil },
		check: func(c *Config) error { return checkAddr(c.HTTPAddr) },
		show:  func(c *Config) string { return c.HTTPAddr }},
	{key: "advertise_host", usage: "host other nodes reach this one at (default: the bind host)",
		parse: func(c *Config, v string) error { c.AdvertiseHost = v; return nil },
		check: func(c *Config) error { return checkHost(c.AdvertiseHost) },
		show:  func(c *Config) string { return c.AdvertiseHost }},
	{key: "join", list: true, usage: "gossip addresses of members to join, comma-separated; a host name means all its addresses, resolved at each attempt",
		parse: func(c *Config, v string) error { c.Join = splitList(v); return nil },
		check: func(c *Config) error {
			for i, a := range c.Join {
				if err := checkAddr(a); err != nil {
					return fmt.Errorf("address %d: %w", i+1, err)
				}
			}
			return nil
		},
		show: func(c *Config) string { return strings.Join(c.Join, ",") }},
	{key: "retry_join_interval", usage: "how often to retry joining while no seed answers",
		parse: func(c *Config, v string) error { return parseDuration(&c.RetryJoinInterval, v) },
		check: func(c *Config) error { return atLeast(c.RetryJoinInterval, cluster.MinInterval) },
		show:  func(c *Config) string { return c.RetryJoinInterval.String() }},
	{key: "bootstrap_expect", usage: "how many nodes start a new cluster together: ready once that many members are seen, or a member of a ready cluster; 1 runs alone, 0 only joins a ready cluster",
		parse: func(c *Config, v string) error { return parseInt(&c.BootstrapExpect, v) },
		check: func(c *Config) error {
			if c.BootstrapExpect < 0 || c.BootstrapExpect > cluster.MaxBootstrapExpect {
				return fmt.Errorf("%d is outside [0, %d]", c.BootstrapExpect, cluster.MaxBootstrapExpect)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.BootstrapExpect) }},
	{key: "gossip_profile", usage: "gossip timings: lan, or fast for nodes on one host",
		parse: func(c *Config, v string) error {
			switch v {
			case "lan":
				c.GossipProfile = cluster.ProfileLAN
			case "fast":
				c.GossipProfile = cluster.ProfileFast
			default:
				return fmt.Errorf("%q is not lan or fast", v)
			}
			return nil
		},
		show: func(c *Config) string {
			if c.GossipProfile == cluster.ProfileFast {
				return "fast"
			}
			return "lan"
		}},
	{key: "unreachable", usage: "policy when a key's owner is unreachable: local, allow or deny",
		parse: func(c *Config, v string) error {
			p, err := sluice.ParsePolicy(v)
			if err != nil || p == sluice.PolicyDefault {
				return fmt.Errorf("%q is not local, allow or deny", v)
			}
			c.Unreachable = p
			return nil
		},
		check: func(c *Config) error {
			switch c.Unreachable {
			case sluice.PolicyLocal, sluice.PolicyAllow, sluice.PolicyDeny:
				return nil
			}
			return fmt.Errorf("policy %d is not local, allow or deny", c.Unreachable)
		},
		show: func(c *Config) string { return c.Unreachable.String() }},
	{key: "deny_retry_after", usage: "retry_after of checks denied by the deny policy",
		parse: func(c *Config, v string) error { return parseDuration(&c.DenyRetryAfter, v) },
		check: func(c *Config) error { return nonNegative(c.DenyRetryAfter) },
		show:  func(c *Config) string { return c.DenyRetryAfter.String() }},
	{key: "peer_timeout", usage: "deadline of a check forwarded to its owner",
		parse: func(c *Config, v string) error { return parseDuration(&c.PeerTimeout, v) },
		check: func(c *Config) error { return positive(c.PeerTimeout) },
		show:  func(c *Config) string { return c.PeerTimeout.String() }},
	{key: "max_keys", usage: "most keys this node's store holds, least recently used evicted; 0: no bound",
		parse: func(c *Config, v string) error { return parseInt(&c.MaxKeys, v) },
		check: func(c *Config) error {
			if c.MaxKeys != 0 && c.MaxKeys < 1024 {
				return fmt.Errorf("%d is below 1024 (0 means no bound)", c.MaxKeys)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.MaxKeys) }},
	{key: "max_bytes", usage: "most bytes of keys and logs this node's store holds, least recently used evicted; 0: no bound",
		parse: func(c *Config, v string) error { return parseInt(&c.MaxBytes, v) },
		check: func(c *Config) error {
			if c.MaxBytes != 0 && c.MaxBytes < MinStoreBytes {
				return fmt.Errorf("%d is below %d (0 means no bound)", c.MaxBytes, MinStoreBytes)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatInt(c.MaxBytes, 10) }},
	{key: "memory_limit", usage: "soft memory limit of the process in bytes (GOMEMLIMIT); 0: max_bytes plus 96 MiB",
		parse: func(c *Config, v string) error { return parseInt(&c.MemoryLimit, v) },
		check: func(c *Config) error {
			if c.MemoryLimit != 0 && c.MemoryLimit < MinMemoryLimit {
				return fmt.Errorf("%d is below %d (0 means max_bytes plus %d)", c.MemoryLimit, MinMemoryLimit, MemoryHeadroom)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatInt(c.MemoryLimit, 10) }},
	{key: "max_body_bytes", usage: "largest HTTP request body",
		parse: func(c *Config, v string) error { return parseInt(&c.MaxBodyBytes, v) },
		check: func(c *Config) error {
			if c.MaxBodyBytes < MinBodyBytes || c.MaxBodyBytes > MaxBodyBytes {
				return fmt.Errorf("%d is outside [%d, %d]", c.MaxBodyBytes, MinBodyBytes, MaxBodyBytes)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatInt(c.MaxBodyBytes, 10) }},
	{key: "http_body_bytes", usage: "most bytes of HTTP request bodies held at once, beyond the first 4 KiB of each (503 beyond); 0: a quarter of the memory limit, or 64 MiB without one",
		parse: func(c *Config, v string) error { return parseInt(&c.HTTPBodyBytes, v) },
		check: func(c *Config) error {
			if c.HTTPBodyBytes != 0 && c.HTTPBodyBytes < c.MaxBodyBytes {
				return fmt.Errorf("%d is below max_body_bytes %d (0 means derived from the memory limit)", c.HTTPBodyBytes, c.MaxBodyBytes)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatInt(c.HTTPBodyBytes, 10) }},
	{key: "http_body_timeout", usage: "how long an HTTP request body may take to arrive whole (408 after)",
		parse: func(c *Config, v string) error { return parseDuration(&c.HTTPBodyTimeout, v) },
		check: func(c *Config) error { return positive(c.HTTPBodyTimeout) },
		show:  func(c *Config) string { return c.HTTPBodyTimeout.String() }},
	{key: "http_max_connections", usage: "most HTTP connections open at once; one more closes the connection idle longest, or waits",
		parse: func(c *Config, v string) error { return parseInt(&c.HTTPMaxConnections, v) },
		check: func(c *Config) error {
			if c.HTTPMaxConnections < 1 {
				return fmt.Errorf("%d is less than 1", c.HTTPMaxConnections)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.HTTPMaxConnections) }},
	{key: "grpc_message_bytes", usage: "most bytes of inbound gRPC messages on their way, all connections together (ResourceExhausted beyond); 0: a quarter of the memory limit, or 256 MiB without one",
		parse: func(c *Config, v string) error { return parseInt(&c.GRPCMessageBytes, v) },
		check: func(c *Config) error {
			if c.GRPCMessageBytes != 0 && c.GRPCMessageBytes < MinGRPCMessageBytes {
				return fmt.Errorf("%d is below %d (0 means derived from the memory limit)", c.GRPCMessageBytes, MinGRPCMessageBytes)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatInt(c.GRPCMessageBytes, 10) }},
	{key: "grpc_message_timeout", usage: "how long the first message of a gRPC call may take to arrive whole; the call is reset after",
		parse: func(c *Config, v string) error { return parseDuration(&c.GRPCMessageTimeout, v) },
		check: func(c *Config) error { return positive(c.GRPCMessageTimeout) },
		show:  func(c *Config) string { return c.GRPCMessageTimeout.String() }},
	{key: "max_batch_items", usage: "most items of one POST /v1/check/batch",
		parse: func(c *Config, v string) error { return parseInt(&c.MaxBatchItems, v) },
		check: func(c *Config) error {
			if c.MaxBatchItems < 1 || c.MaxBatchItems > transport.MaxBatchItems {
				return fmt.Errorf("%d is outside [1, %d]", c.MaxBatchItems, transport.MaxBatchItems)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.MaxBatchItems) }},
	{key: "rules_file", usage: "YAML rule file (the rules package's format) for POST /v1/rules/check; reloaded as it changes",
		parse: func(c *Config, v string) error { c.RulesFile = v; return nil },
		show:  func(c *Config) string { return c.RulesFile }},
	{key: "envoy_config_dir", usage: "directory of envoyproxy/ratelimit configuration files (one domain per *.yaml) for Envoy's rate limit service on grpc_addr; reloaded as they change",
		parse: func(c *Config, v string) error { c.EnvoyConfigDir = v; return nil },
		show:  func(c *Config) string { return c.EnvoyConfigDir }},
	{key: "envoy_response_headers", usage: "response headers of Envoy's rate limit service: off, draft (RateLimit-Limit, -Remaining, -Reset) or x-ratelimit (X-RateLimit-*)",
		parse: func(c *Config, v string) error { c.EnvoyResponseHeaders = v; return nil },
		check: func(c *Config) error {
			return oneOf(c.EnvoyResponseHeaders, EnvoyHeadersOff, EnvoyHeadersDraft, EnvoyHeadersX)
		},
		show: func(c *Config) string { return c.EnvoyResponseHeaders }},
	{key: "envoy_window_alignment", usage: "windows of Envoy week, month and year limits: calendar (UTC) or epoch (7, 30 and 365 days since 1970, as envoyproxy/ratelimit)",
		parse: func(c *Config, v string) error { c.EnvoyWindowAlignment = v; return nil },
		check: func(c *Config) error { return oneOf(c.EnvoyWindowAlignment, EnvoyAlignCalendar, EnvoyAlignEpoch) },
		show:  func(c *Config) string { return c.EnvoyWindowAlignment }},
	{key: "envoy_metric_keys", usage: "most metric keys of Envoy's rate limit service with a series of their own in sluice_envoy_hits_total; the rest count under _other",
		parse: func(c *Config, v string) error { return parseInt(&c.EnvoyMetricKeys, v) },
		check: func(c *Config) error {
			if c.EnvoyMetricKeys < 1 || c.EnvoyMetricKeys > maxEnvoyMetricKeys {
				return fmt.Errorf("%d is outside [1, %d]", c.EnvoyMetricKeys, maxEnvoyMetricKeys)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.EnvoyMetricKeys) }},
	{key: "shutdown_delay", usage: "how long to report not ready before refusing requests on shutdown",
		parse: func(c *Config, v string) error { return parseDuration(&c.ShutdownDelay, v) },
		check: func(c *Config) error { return nonNegative(c.ShutdownDelay) },
		show:  func(c *Config) string { return c.ShutdownDelay.String() }},
	{key: "shutdown_timeout", usage: "how long in-flight HTTP requests may take on shutdown",
		parse: func(c *Config, v string) error { return parseDuration(&c.ShutdownTimeout, v) },
		check: func(c *Config) error { return positive(c.ShutdownTimeout) },
		show:  func(c *Config) string { return c.ShutdownTimeout.String() }},
	{key: "log_format", usage: "log format: json or text",
		parse: func(c *Config, v string) error { c.LogFormat = v; return nil },
		check: func(c *Config) error {
			if c.LogFormat != "json" && c.LogFormat != "text" {
				return fmt.Errorf("%q is not json or text", c.LogFormat)
			}
			return nil
		},
		show: func(c *Config) string { return c.LogFormat }},
	{key: "log_level", usage: "least level logged: debug, info, warn or error",
		parse: func(c *Config, v string) error {
			if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("%q is not debug, info, warn or error", v)
			}
			return nil
		},
		show: func(c *Config) string { return strings.ToLower(c.LogLevel.String()) }},
	{key: "breaker_threshold", usage: "consecutive failed calls to a peer that open its circuit breaker",
		parse: func(c *Config, v string) error { return parseInt(&c.BreakerThreshold, v) },
		check: func(c *Config) error {
			if c.BreakerThreshold < 1 || c.BreakerThreshold > 1000 {
				return fmt.Errorf("%d is outside [1, 1000]", c.BreakerThreshold)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.BreakerThreshold) }},
	{key: "breaker_cooldown", usage: "how long an open circuit breaker sends a peer's keys to the unreachable policy",
		parse: func(c *Config, v string) error { return parseDuration(&c.BreakerCooldown, v) },
		check: func(c *Config) error { return positive(c.BreakerCooldown) },
		show:  func(c *Config) string { return c.BreakerCooldown.String() }},
	{key: "replicas", usage: "nodes holding each key's state, the owner included; 1 keeps no copies",
		parse: func(c *Config, v string) error { return parseInt(&c.Replicas, v) },
		check: func(c *Config) error {
			if c.Replicas < 1 || c.Replicas > cluster.MaxReplicas {
				return fmt.Errorf("%d is outside [1, %d]", c.Replicas, cluster.MaxReplicas)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.Replicas) }},
	{key: "replicate_interval", usage: "how often an owner copies the keys it changed to their replicas",
		parse: func(c *Config, v string) error { return parseDuration(&c.ReplicateInterval, v) },
		check: func(c *Config) error { return atLeast(c.ReplicateInterval, cluster.MinInterval) },
		show:  func(c *Config) string { return c.ReplicateInterval.String() }},
	{key: "leave_timeout", usage: "how long a graceful shutdown may hand this node's keys to their new owners",
		parse: func(c *Config, v string) error { return parseDuration(&c.LeaveTimeout, v) },
		check: func(c *Config) error { return positive(c.LeaveTimeout) },
		show:  func(c *Config) string { return c.LeaveTimeout.String() }},
	{key: "data_dir", usage: "directory where this node keeps the key states it holds, so that they outlive restarts (a volume of its own per node); empty: in memory only",
		parse: func(c *Config, v string) error { c.DataDir = v; return nil },
		show:  func(c *Config) string { return c.DataDir }},
	{key: "persist_interval", usage: "how often the keys that changed are written to data_dir: a kill of every node forgets at most this much traffic",
		parse: func(c *Config, v string) error { return parseDuration(&c.PersistInterval, v) },
		check: func(c *Config) error { return atLeast(c.PersistInterval, cluster.MinInterval) },
		show:  func(c *Config) string { return c.PersistInterval.String() }},
	{key: "data_damaged", usage: "a damaged, truncated or foreign state file in data_dir: refuse (do not start) or set-aside (rename it *.damaged, start without its states)",
		parse: func(c *Config, v string) error { c.DataDamaged = v; return nil },
		check: func(c *Config) error { return oneOf(c.DataDamaged, DataDamagedRefuse, DataDamagedSetAside) },
		show:  func(c *Config) string { return c.DataDamaged }},
	{key: "max_clock_skew", usage: "largest offset between two nodes' clocks the cluster tolerates; members beyond it are warned about and listed on /readyz",
		parse: func(c *Config, v string) error { return parseDuration(&c.MaxClockSkew, v) },
		check: func(c *Config) error {
			if c.MaxClockSkew <= 0 || c.MaxClockSkew > cluster.MaxMaxClockSkew {
				return fmt.Errorf("%v is outside (0, %v]", c.MaxClockSkew, cluster.MaxMaxClockSkew)
			}
			return nil
		},
		show: func(c *Config) string { return c.MaxClockSkew.String() }},
	{key: "clock_probe_interval", usage: "how often this node samples each member's clock offset",
		parse: func(c *Config, v string) error { return parseDuration(&c.ClockProbeInterval, v) },
		check: func(c *Config) error { return atLeast(c.ClockProbeInterval, cluster.MinInterval) },
		show:  func(c *Config) string { return c.ClockProbeInterval.String() }},
	{key: "lease_threshold", usage: "checks per second of one key on this node, not its owner, that start leasing its hits; 0: no leases",
		parse: func(c *Config, v string) error { return parseInt(&c.Lease.Threshold, v) },
		check: checkLease,
		show:  func(c *Config) string { return strconv.FormatInt(c.Lease.Threshold, 10) }},
	{key: "lease_ttl", usage: "how long a lease of a hot key's hits lasts",
		parse: func(c *Config, v string) error { return parseDuration(&c.Lease.TTL, v) },
		check: checkLease,
		show:  func(c *Config) string { return c.Lease.TTL.String() }},
	{key: "lease_share", usage: "most of a key's capacity one lease takes, in (0, 1]",
		parse: func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", v)
			}
			c.Lease.Share = f
			return nil
		},
		check: checkLease,
		show:  func(c *Config) string { return strconv.FormatFloat(c.Lease.Share, 'g', -1, 64) }},
	{key: "tls_cert_file", usage: "PEM certificate of this node; with tls_key_file turns on TLS for gRPC and HTTP",
		parse: func(c *Config, v string) error { c.TLSCertFile = v; return nil },
		show:  func(c *Config) string { return c.TLSCertFile }},
	{key: "tls_key_file", usage: "PEM private key of tls_cert_file",
		parse: func(c *Config, v string) error { c.TLSKeyFile = v; return nil },
		show:  func(c *Config) string { return c.TLSKeyFile }},
	{key: "tls_ca_file", usage: "PEM CA bundle that verifies peers and requires client certificates (mutual TLS)",
		parse: func(c *Config, v string) error { c.TLSCAFile = v; return nil },
		show:  func(c *Config) string { return c.TLSCAFile }},
	{key: "gossip_keys", list: true, usage: "base64 keys (16, 24 or 32 bytes) encrypting gossip, comma-separated; the first encrypts (default: derived from cluster_secret_file)",
		parse: func(c *Config, v string) error { c.GossipKeys = splitList(v); return nil },
		check: func(c *Config) error {
			_, err := decodeGossipKeys(c.GossipKeys)
			return err
		},
		show: func(c *Config) string { return strings.Repeat("<key>,", len(c.GossipKeys)) }},
	{key: "peer_identities", list: true, usage: "URI or DNS SANs of certificates that may make peer calls and own keys, comma-separated (needs tls_ca_file, and gossip_keys or cluster_secret_file)",
		parse: func(c *Config, v string) error { c.PeerIdentities = splitList(v); return nil },
		check: func(c *Config) error { return checkIdentities(c.PeerIdentities) },
		show:  func(c *Config) string { return strings.Join(c.PeerIdentities, ",") }},
	{key: "cluster_secret_file", usage: "file holding a secret (16 bytes or more) that every peer call proves (default: derived from gossip_keys)",
		parse: func(c *Config, v string) error { c.ClusterSecretFile = v; return nil },
		show:  func(c *Config) string { return c.ClusterSecretFile }},
	{key: "destructive_behaviors", usage: "who may use reset, drain_over_limit and refund (and the admin API's reset): allow, deny, or admins (certificates naming an admin_identities entry; the admin API's inspect is then for admins only too); under deny and admins a live key keeps the strictest rate it was charged under, so a check with another algorithm, a higher limit or a shorter period lowers no count",
		parse: func(c *Config, v string) error {
			switch v {
			case DestructiveAllow, DestructiveDeny, DestructiveAdmins:
				c.Destructive = v
				return nil
			}
			return fmt.Errorf("%q is not allow, deny or admins", v)
		},
		show: func(c *Config) string { return c.Destructive }},
	{key: "admin_identities", list: true, usage: "URI or DNS SANs of certificates that may use reset, drain_over_limit and refund under destructive_behaviors admins",
		parse: func(c *Config, v string) error { c.AdminIdentities = splitList(v); return nil },
		check: func(c *Config) error { return checkIdentities(c.AdminIdentities) },
		show:  func(c *Config) string { return strings.Join(c.AdminIdentities, ",") }},
	boolSetting("envoy_strict_config", "refuse an Envoy configuration file with a known key out of place; by default such a key is ignored with a warning, as envoyproxy/ratelimit ignores it",
		func(c *Config) *bool { return &c.EnvoyStrictConfig }),
	boolSetting("envoy_merge_domains", "merge the Envoy configuration files of one domain (MERGE_DOMAIN_CONFIG) rather than refuse them",
		func(c *Config) *bool { return &c.EnvoyMergeDomains }),
	boolSetting("envoy_shadow_mode", "answer every Envoy rate limit request OK, counting as usual (SHADOW_MODE)",
		func(c *Config) *bool { return &c.EnvoyShadowMode }),
	boolSetting("envoy_quota_mode", "put every Envoy descriptor in quota mode (QUOTA_MODE)",
		func(c *Config) *bool { return &c.EnvoyQuotaMode }),
	boolSetting("envoy_dynamic_metadata", "add envoyproxy/ratelimit's dynamic metadata to Envoy responses (RESPONSE_DYNAMIC_METADATA)",
		func(c *Config) *bool { return &c.EnvoyDynamicMetadata }),
	boolSetting("envoy_stop_increment_over_limit", "charge an Envoy request over on any descriptor only on the descriptors over (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)",
		func(c *Config) *bool { return &c.EnvoyStopIncrementOverLimit }),
	boolSetting("envoy_exact_reset", "give Envoy's duration_until_reset to the nanosecond rather than in whole seconds rounded up",
		func(c *Config) *bool { return &c.EnvoyExactReset }),
	{key: "envoy_xds_addr", usage: "xDS management server, host:port, that configures Envoy's rate limit service (RateLimitConfig resources, state of the world) instead of envoy_config_dir",
		parse: func(c *Config, v string) error { c.EnvoyXDSAddr = v; return nil },
		check: func(c *Config) error {
			if c.EnvoyXDSAddr == "" {
				return nil
			}
			return checkEndpoint(c.EnvoyXDSAddr)
		},
		show: func(c *Config) string { return c.EnvoyXDSAddr }},
	{key: "envoy_xds_node_id", usage: "node id the daemon gives envoy_xds_addr's server",
		parse: func(c *Config, v string) error { c.EnvoyXDSNodeID = v; return nil },
		show:  func(c *Config) string { return c.EnvoyXDSNodeID }},
	{key: "envoy_xds_ca_file", usage: "PEM bundle that verifies envoy_xds_addr's server; turns on TLS to it",
		parse: func(c *Config, v string) error { c.EnvoyXDSCAFile = v; return nil },
		show:  func(c *Config) string { return c.EnvoyXDSCAFile }},
	{key: "envoy_xds_cert_file", usage: "PEM client certificate presented to envoy_xds_addr's server (with envoy_xds_key_file and envoy_xds_ca_file)",
		parse: func(c *Config, v string) error { c.EnvoyXDSCertFile = v; return nil },
		show:  func(c *Config) string { return c.EnvoyXDSCertFile }},
	{key: "envoy_xds_key_file", usage: "PEM key of envoy_xds_cert_file",
		parse: func(c *Config, v string) error { c.EnvoyXDSKeyFile = v; return nil },
		show:  func(c *Config) string { return c.EnvoyXDSKeyFile }},
	{key: "envoy_xds_server_name", usage: "name verified in envoy_xds_addr's certificate; empty: its host",
		parse: func(c *Config, v string) error { c.EnvoyXDSServerName = v; return nil },
		show:  func(c *Config) string { return c.EnvoyXDSServerName }},
	{key: "tracing_endpoint", usage: "OTLP/gRPC collector that receives traces, host:port; empty: no tracing",
		parse: func(c *Config, v string) error { c.TracingEndpoint = v; return nil },
		check: func(c *Config) error {
			if c.TracingEndpoint == "" {
				return nil
			}
			return checkEndpoint(c.TracingEndpoint)
		},
		show: func(c *Config) string { return c.TracingEndpoint }},
	{key: "tracing_insecure", usage: "send traces to tracing_endpoint without TLS",
		parse: func(c *Config, v string) error { return parseBool(&c.TracingInsecure, v) },
		show:  func(c *Config) string { return strconv.FormatBool(c.TracingInsecure) }},
	{key: "tracing_sample_ratio", usage: "share of checks traced when their caller's trace says nothing, in [0, 1]",
		parse: func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", v)
			}
			c.TracingSampleRatio = f
			return nil
		},
		check: func(c *Config) error {
			if !(c.TracingSampleRatio >= 0 && c.TracingSampleRatio <= 1) {
				return fmt.Errorf("%v is outside [0, 1]", c.TracingSampleRatio)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.FormatFloat(c.TracingSampleRatio, 'g', -1, 64) }},
	{key: "tracing_keys", usage: "record client keys in spans (personal data in many deployments)",
		parse: func(c *Config, v string) error { return parseBool(&c.TracingKeys, v) },
		show:  func(c *Config) string { return strconv.FormatBool(c.TracingKeys) }},
	{key: "backend", usage: "where counters live: cluster (sluice nodes that gossip) or redis (a Redis server or Redis Cluster; no gossip)",
		parse: func(c *Config, v string) error { c.Backend = v; return nil },
		check: func(c *Config) error { return oneOf(c.Backend, BackendCluster, BackendRedis) },
		show:  func(c *Config) string { return c.Backend }},
	{key: "redis_addrs", list: true, usage: "with backend redis: host:port of one Redis server, or of several Redis Cluster nodes, comma-separated",
		parse: func(c *Config, v string) error { c.RedisAddrs = splitList(v); return nil },
		check: func(c *Config) error {
			if len(c.RedisAddrs) > maxRedisAddrs {
				return fmt.Errorf("%d addresses, more than %d", len(c.RedisAddrs), maxRedisAddrs)
			}
			for i, a := range c.RedisAddrs {
				if err := checkEndpoint(a); err != nil {
					return fmt.Errorf("address %d: %w", i+1, err)
				}
			}
			return nil
		},
		show: func(c *Config) string { return strings.Join(c.RedisAddrs, ",") }},
	{key: "redis_username", usage: "Redis ACL user to AUTH as; empty: the default user",
		parse: func(c *Config, v string) error { c.RedisUsername = v; return nil },
		check: func(c *Config) error { return checkSecretText(c.RedisUsername) },
		show:  func(c *Config) string { return c.RedisUsername }},
	{key: "redis_password", usage: "Redis password (AUTH); prefer redis_password_file",
		parse: func(c *Config, v string) error { c.RedisPassword = v; return nil },
		check: func(c *Config) error { return checkSecretText(c.RedisPassword) },
		show: func(c *Config) string {
			if c.RedisPassword == "" {
				return ""
			}
			return "<set>"
		}},
	{key: "redis_password_file", usage: "file holding the Redis password (AUTH), read at start",
		parse: func(c *Config, v string) error { c.RedisPasswordFile = v; return nil },
		show:  func(c *Config) string { return c.RedisPasswordFile }},
	{key: "redis_tls", usage: "connect to Redis with TLS",
		parse: func(c *Config, v string) error { return parseBool(&c.RedisTLS, v) },
		show:  func(c *Config) string { return strconv.FormatBool(c.RedisTLS) }},
	{key: "redis_tls_ca_file", usage: "PEM CA bundle verifying Redis's certificate (default: the system's roots)",
		parse: func(c *Config, v string) error { c.RedisTLSCAFile = v; return nil },
		show:  func(c *Config) string { return c.RedisTLSCAFile }},
	{key: "redis_tls_cert_file", usage: "PEM client certificate presented to Redis, with redis_tls_key_file",
		parse: func(c *Config, v string) error { c.RedisTLSCertFile = v; return nil },
		show:  func(c *Config) string { return c.RedisTLSCertFile }},
	{key: "redis_tls_key_file", usage: "PEM private key of redis_tls_cert_file",
		parse: func(c *Config, v string) error { c.RedisTLSKeyFile = v; return nil },
		show:  func(c *Config) string { return c.RedisTLSKeyFile }},
	{key: "redis_tls_server_name", usage: "name Redis's certificate must carry (default: the host of each address)",
		parse: func(c *Config, v string) error { c.RedisTLSServerName = v; return nil },
		check: func(c *Config) error { return checkHost(c.RedisTLSServerName) },
		show:  func(c *Config) string { return c.RedisTLSServerName }},
	{key: "redis_timeout", usage: "deadline of a check (or batch) on Redis, connecting included; the unreachable policy decides after",
		parse: func(c *Config, v string) error { return parseDuration(&c.RedisTimeout, v) },
		check: func(c *Config) error {
			if c.RedisTimeout <= 0 || c.RedisTimeout > time.Minute {
				return fmt.Errorf("%v is outside (0, 1m]", c.RedisTimeout)
			}
			return nil
		},
		show: func(c *Config) string { return c.RedisTimeout.String() }},
	{key: "redis_prefix", usage: "prefix of every key written in Redis (without '{' or '}')",
		parse: func(c *Config, v string) error { c.RedisPrefix = v; return nil },
		check: func(c *Config) error {
			if len(c.RedisPrefix) > redislimit.MaxPrefixLen {
				return fmt.Errorf("is %d bytes, more than %d", len(c.RedisPrefix), redislimit.MaxPrefixLen)
			}
			if strings.ContainsAny(c.RedisPrefix, "{}") {
				return errors.New("holds '{' or '}': a hash tag in the prefix would put every key on one Redis Cluster slot")
			}
			return checkSecretText(c.RedisPrefix)
		},
		show: func(c *Config) string { return c.RedisPrefix }},
	{key: "redis_pool_size", usage: "most connections to each Redis node; 0: 10 per CPU",
		parse: func(c *Config, v string) error { return parseInt(&c.RedisPoolSize, v) },
		check: func(c *Config) error {
			if c.RedisPoolSize < 0 || c.RedisPoolSize > maxRedisPoolSize {
				return fmt.Errorf("%d is outside [0, %d]", c.RedisPoolSize, maxRedisPoolSize)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.RedisPoolSize) }},
	{key: "redis_over_limit_cache", usage: "most keys remembered as over their limit until their retry_after, denied without a call to Redis; 0: off",
		parse: func(c *Config, v string) error { return parseInt(&c.RedisOverLimitCache, v) },
		check: func(c *Config) error {
			if c.RedisOverLimitCache < 0 || c.RedisOverLimitCache > redislimit.MaxOverLimitCache {
				return fmt.Errorf("%d is outside [0, %d]", c.RedisOverLimitCache, redislimit.MaxOverLimitCache)
			}
			return nil
		},
		show: func(c *Config) string { return strconv.Itoa(c.RedisOverLimitCache) }},
}

// Bounds of the Redis settings.
const (
	maxRedisAddrs    = 1000
	maxRedisPoolSize = 10_000
)

// checkSecretText accepts text of at most 1024 bytes of UTF-8 without
// control characters: a username, password or prefix.
func checkSecretText(s string) error {
	if len(s) > 1024 || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return errors.New("must be UTF-8 of at most 1024 bytes without control characters")
	}
	return nil
}

// boolSetting is a setting of the boolean field ptr returns.
func boolSetting(key, usage string, ptr func(*Config) *bool) field {
	return field{key: key, usage: usage,
		parse: func(c *Config, v string) error { return parseBool(ptr(c), v) },
		show:  func(c *Config) string { return strconv.FormatBool(*ptr(c)) }}
}

// The values of Config.EnvoyResponseHeaders and EnvoyWindowAlignment.
const (
	EnvoyHeadersOff    = "off"
	EnvoyHeadersDraft  = "draft"
	EnvoyHeadersX      = "x-ratelimit"
	EnvoyAlignCalendar = "calendar"
	EnvoyAlignEpoch    = "epoch"
)

// The values of data_damaged.
const (
	DataDamagedRefuse   = "refuse"
	DataDamagedSetAside = "set-aside"
)

// oneOf checks that v is one of the options.
func oneOf(v string, options ...string) error {
	if slices.Contains(options, v) {
		return nil
	}
	return fmt.Errorf("%q is not %s or %s", v, strings.Join(options[:len(options)-1], ", "), options[len(options)-1])
}

// checkIdentities checks a list of certificate identities.
func checkIdentities(ids []string) error {
	for i, id := range ids {
		if id == "" || len(id) > 1024 || !utf8.ValidString(id) {
			return fmt.Errorf("identity %d must be non-empty UTF-8 of at most 1024 bytes", i+1)
		}
	}
	return nil
}

// checkLease checks the lease settings as if leases were on, so that a
// bad lease_ttl or lease_share (NaN, say) is refused while
// lease_threshold is 0 too, not only once leases are turned on.
func checkLease(c *Config) error {
	l := c.Lease
	if l.Threshold == 0 {
		l.Threshold = 1
	}
	return l.Validate()
}

// decodeGossipKeys decodes base64 gossip keys and checks their lengths.
func decodeGossipKeys(keys []string) ([][]byte, error) {
	out := make([][]byte, 0, len(keys))
	for i, k := range keys {
		b, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("key %d is not base64", i+1)
		}
		if n := len(b); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("key %d is %d bytes, want 16, 24 or 32", i+1, n)
		}
		out = append(out, b)
	}
	return out, nil
}

// tlsConfig loads the TLS files, or returns nil when TLS is off.
func (c *Config) tlsConfig() (*tls.Config, error) {
	if c.TLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, &ConfigError{Field: "tls_cert_file", Err: err}
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSCAFile != "" {
		pool, err := loadCAs("tls_ca_file", c.TLSCAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs, tc.ClientCAs = pool, pool
	}
	return tc, nil
}

// loadCAs reads the PEM bundle path, the value of the setting field.
func loadCAs(field, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Field: field, Err: err}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &ConfigError{Field: field, Err: fmt.Errorf("%s holds no PEM certificate", path)}
	}
	return pool, nil
}

// xdsCredentials are the transport credentials of the connection to
// EnvoyXDSAddr: TLS verified by EnvoyXDSCAFile when set, with the client
// certificate of EnvoyXDSCertFile; without one, none.
func (c *Config) xdsCredentials() (credentials.TransportCredentials, error) {
	if c.EnvoyXDSCAFile == "" {
		return insecure.NewCredentials(), nil
	}
	pool, err := loadCAs("envoy_xds_ca_file", c.EnvoyXDSCAFile)
	if err != nil {
		return nil, err
	}
	tc := &tls.Config{RootCAs: pool, ServerName: c.EnvoyXDSServerName, MinVersion: tls.VersionTLS12}
	if c.EnvoyXDSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.EnvoyXDSCertFile, c.EnvoyXDSKeyFile)
		if err != nil {
			return nil, &ConfigError{Field: "envoy_xds_cert_file", Err: err}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(tc), nil
}

func fieldByKey(key string) *field {
	for i := range fields {
		if fields[i].key == key {
			return &fields[i]
		}
	}
	return nil
}

// set parses v into c's field f and checks it.
func (f *field) set(c *Config, v string) error {
	if err := f.parse(c, strings.TrimSpace(v)); err != nil {
		return err
	}
	if f.check != nil {
		return f.check(c)
	}
	return nil
}

// Validate checks every field and returns a *ConfigError for the first
// invalid one.
func (c *Config) Validate() error {
	for i := range fields {
		if f := &fields[i]; f.check != nil {
			if err := f.check(c); err != nil {
				return &ConfigError{Field: f.key, Err: err}
			}
		}
	}
	// Settings that go together are checked once all are set.
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return &ConfigError{Field: "tls_cert_file", Err: errors.New("tls_cert_file and tls_key_file go together")}
	}
	if c.TLSCAFile != "" && c.TLSCertFile == "" {
		return &ConfigError{Field: "tls_ca_file", Err: errors.New("needs tls_cert_file and tls_key_file")}
	}
	if c.EnvoyXDSAddr != "" && c.EnvoyConfigDir != "" {
		return &ConfigError{Field: "envoy_xds_addr", Err: errors.New("envoy_xds_addr and envoy_config_dir exclude each other")}
	}
	if c.EnvoyXDSAddr != "" {
		if err := checkName(c.EnvoyXDSNodeID); err != nil {
			return &ConfigError{Field: "envoy_xds_node_id", Err: err}
		}
	}
	if (c.EnvoyXDSCertFile == "") != (c.EnvoyXDSKeyFile == "") || (c.EnvoyXDSCertFile != "" && c.EnvoyXDSCAFile == "") {
		return &ConfigError{Field: "envoy_xds_cert_file", Err: errors.New("envoy_xds_cert_file and envoy_xds_key_file go together, and need envoy_xds_ca_file")}
	}
	if len(c.PeerIdentities) > 0 && c.TLSCAFile == "" {
		return &ConfigError{Field: "peer_identities", Err: errors.New("needs tls_ca_file: identities are read from verified client certificates")}
	}
	if c.PeerAddr != "" {
		for _, other := range []struct{ key, addr string }{{"grpc_addr", c.GRPCAddr}, {"http_addr", c.HTTPAddr}, {"gossip_addr", c.GossipAddr}} {
			if sameListener(c.PeerAddr, other.addr) {
				return &ConfigError{Field: "peer_addr", Err: fmt.Errorf("%q takes the port of %s (%q): peers need a port of their own", c.PeerAddr, other.key, other.addr)}
			}
		}
	}
	if len(c.PeerIdentities) > 0 && len(c.GossipKeys) == 0 && c.ClusterSecretFile == "" {
		// Anyone who reaches the gossip port could join unencrypted gossip.
		return &ConfigError{Field: "peer_identities", Err: fmt.Errorf("%w: set gossip_keys or cluster_secret_file", cluster.ErrPlainGossip)}
	}
	switch c.Destructive {
	case DestructiveAllow, DestructiveDeny:
	case DestructiveAdmins:
		if c.TLSCAFile == "" || len(c.AdminIdentities) == 0 {
			return &ConfigError{Field: "destructive_behaviors", Err: errors.New("admins needs tls_ca_file and admin_identities")}
		}
	default:
		return &ConfigError{Field: "destructive_behaviors", Err: fmt.Errorf("%q is not allow, deny or admins", c.Destructive)}
	}
	if c.GossipProfile > cluster.ProfileFast {
		return &ConfigError{Field: "gossip_profile", Err: fmt.Errorf("profile %d is unknown", c.GossipProfile)}
	}
	return c.validateBackend()
}

// validateBackend checks the settings that go with Backend: Redis's with
// BackendRedis, and none of them with BackendCluster.
func (c *Config) validateBackend() error {
	if c.Backend != BackendRedis {
		for _, s := range redisSettings(c) {
			if s.set {
				return &ConfigError{Field: s.key, Err: errors.New("needs backend redis")}
			}
		}
		return nil
	}
	for _, s := range peerSettings(c) {
		if s.set {
			return &ConfigError{Field: s.key, Err: errors.New("is a setting of backend cluster: backend redis runs no gossip and no peers")}
		}
	}
	switch {
	case len(c.RedisAddrs) == 0:
		return &ConfigError{Field: "redis_addrs", Err: errors.New("backend redis needs the address of a Redis server, or of Redis Cluster nodes")}
	case c.RedisPassword != "" && c.RedisPasswordFile != "":
		return &ConfigError{Field: "redis_password_file", Err: errors.New("redis_password and redis_password_file exclude each other")}
	case (c.RedisTLSCertFile == "") != (c.RedisTLSKeyFile == ""):
		return &ConfigError{Field: "redis_tls_cert_file", Err: errors.New("redis_tls_cert_file and redis_tls_key_file go together")}
	case !c.RedisTLS && (c.RedisTLSCAFile != "" || c.RedisTLSCertFile != "" || c.RedisTLSServerName != ""):
		return &ConfigError{Field: "redis_tls", Err: errors.New("redis_tls_ca_file, redis_tls_cert_file and redis_tls_server_name need redis_tls: true")}
	}
	return nil
}

// setting is whether one setting is set to something other than its
// default.
type setting struct {
	key string
	set bool
}

// redisSettings are the settings of backend redis.
func redisSettings(c *Config) []setting {
	def := DefaultConfig()
	return []setting{
		{"redis_addrs", len(c.RedisAddrs) > 0},
		{"redis_username", c.RedisUsername != ""},
		{"redis_password", c.RedisPassword != ""},
		{"redis_password_file", c.RedisPasswordFile != ""},
		{"redis_tls", c.RedisTLS},
		{"redis_tls_ca_file", c.RedisTLSCAFile != ""},
		{"redis_tls_cert_file", c.RedisTLSCertFile != ""},
		{"redis_tls_key_file", c.RedisTLSKeyFile != ""},
		{"redis_tls_server_name", c.RedisTLSServerName != ""},
		{"redis_timeout", c.RedisTimeout != def.RedisTimeout},
		{"redis_prefix", c.RedisPrefix != def.RedisPrefix},
		{"redis_pool_size", c.RedisPoolSize != 0},
		{"redis_over_limit_cache", c.RedisOverLimitCache != 0},
	}
}

// peerSettings are the settings of backend cluster that name peers or
// need a cluster's nodes, refused with backend redis.
func peerSettings(c *Config) []setting {
	return []setting{
		{"join", len(c.Join) > 0},
		{"peer_addr", c.PeerAddr != ""},
		{"gossip_keys", len(c.GossipKeys) > 0},
		{"peer_identities", len(c.PeerIdentities) > 0},
		{"cluster_secret_file", c.ClusterSecretFile != ""},
		{"tracing_endpoint", c.TracingEndpoint != ""},
	}
}

// ignoredWithRedis names the settings of backend cluster that backend
// redis ignores and that c sets to other than their defaults.
func ignoredWithRedis(c *Config) []string {
	def := DefaultConfig()
	var out []string
	for _, key := range []string{"gossip_addr", "gossip_profile", "retry_join_interval", "advertise_host", "peer_timeout",
		"replicas", "replicate_interval", "leave_timeout", "lease_threshold", "lease_ttl", "lease_share"} {
		if f := fieldByKey(key); f.show(c) != f.show(&def) {
			out = append(out, key)
		}
	}
	return out
}

func (c *Config) clone() Config {
	out := *c
	out.Join = append([]string(nil), c.Join...)
	out.GossipKeys = append([]string(nil), c.GossipKeys...)
	out.PeerIdentities = append([]string(nil), c.PeerIdentities...)
	out.AdminIdentities = append([]string(nil), c.AdminIdentities...)
	out.RedisAddrs = append([]string(nil), c.RedisAddrs...)
	return out
}

func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > maxNameLen:
		return fmt.Errorf("is %d bytes, more than %d", len(s), maxNameLen)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("%q has spaces or control characters", s)
	}
	return nil
}

// checkAddr accepts host:port with a numeric port in [0, 65535].
func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port", a)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (port != "0" && p == 0) {
		return fmt.Errorf("%q: port %q is not a number in [0, 65535]", a, port)
	}
	return checkHost(host)
}

// sameListener reports whether binding a and b, both host:port, would
// take one port twice: the same port other than 0, on the same host or
// on all interfaces for either.
func sameListener(a, b string) bool {
	ha, pa, erra := net.SplitHostPort(a)
	hb, pb, errb := net.SplitHostPort(b)
	if erra != nil || errb != nil || pa != pb || pa == "0" {
		return false
	}
	return ha == hb || allInterfaces(ha) || allInterfaces(hb)
}

// allInterfaces reports whether the bind host h means every interface.
func allInterfaces(h string) bool {
	ip := net.ParseIP(h)
	return h == "" || (ip != nil && ip.IsUnspecified())
}

// checkEndpoint accepts host:port of a server to call: a host, and a
// port in [1, 65535].
func checkEndpoint(a string) error {
	if err := checkAddr(a); err != nil {
		return err
	}
	if host, port, _ := net.SplitHostPort(a); host == "" || port == "0" {
		return fmt.Errorf("%q needs a host and a port other than 0", a)
	}
	return nil
}

func checkHost(h string) error {
	if strings.IndexFunc(h, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == '/' }) >= 0 {
		return fmt.Errorf("%q is not a host name or address", h)
	}
	return nil
}

func splitList(v string) []string {
	if v == "" {
		return nil
	}
	parts := strings.Split(v, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func parseBool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%q is not true or false", v)
	}
	*dst = b
	return nil
}

func parseDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%q is not a duration such as 500ms or 2s", v)
	}
	*dst = d
	return nil
}

func atLeast(d, least time.Duration) error {
	if d < least {
		return fmt.Errorf("%v is below %v", d, least)
	}
	return nil
}

func positive(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%v must be positive", d)
	}
	return nil
}

func nonNegative(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%v is negative", d)
	}
	return nil
}

func parseInt[T int | int64](dst *T, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || int64(T(n)) != n {
		return fmt.Errorf("%q is not an integer", v)
	}
	*dst = T(n)
	return nil
}

// Load builds the configuration of `sluice serve` from its arguments, the
// environment and the YAML file named by --config or SLUICE_CONFIG. Each
// field is taken from the first that sets it: flag, environment variable,
// file, DefaultConfig. A node name set nowhere is the host name. Usage and
// flag errors are written to output; -h returns flag.ErrHelp. Every other
// error is a *ConfigError that names the field and its source.
func Load(args []string, env func(string) string, output io.Writer) (Config, error) {
	fs := flag.NewFlagSet("sluice serve", flag.ContinueOnError)
	fs.SetOutput(output)
	type flagValue struct {
		f      *field
		values []string
	}
	var set []*flagValue // in the order of fields
	byKey := make(map[string]*flagValue)
	def := DefaultConfig()
	for i := range fields {
		f := &fields[i]
		usage := f.usage + " (env " + f.envName() + ")"
		if d := f.show(&def); d != "" {
			usage += " (default " + strconv.Quote(d) + ")"
		}
		fs.Func(f.flagName(), usage, func(v string) error {
			fv := byKey[f.key]
			if fv == nil {
				fv = &flagValue{f: f}
				byKey[f.key] = fv
				set = append(set, fv)
			}
			fv.values = append(fv.values, v)
			return nil
		})
	}
	configPath := fs.String("config", "", "YAML config file (env SLUICE_CONFIG)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice serve [flags]\n\nRuns a sluice node: the cluster member, its gRPC API and the HTTP API.\nEvery flag has an environment variable and a YAML key (the flag name with _ for -);\nflags win over the environment, which wins over the file.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return Config{}, &ConfigError{Source: "arguments", Err: fmt.Errorf("unexpected %q", fs.Arg(0))}
	}

	cfg := DefaultConfig()
	path := *configPath
	if path == "" {
		path = env("SLUICE_CONFIG")
	}
	if path != "" {
		data, err := yamlfile.ReadFile(path, yamlfile.DefaultConfig())
		if err != nil {
			return Config{}, yamlError(path, err)
		}
		if err := applyYAML(&cfg, path, data); err != nil {
			return Config{}, err
		}
	}
	for i := range fields {
		f := &fields[i]
		if v := env(f.envName()); v != "" {
			if err := f.set(&cfg, v); err != nil {
				return Config{}, &ConfigError{Source: "env " + f.envName(), Field: f.key, Err: err}
			}
		}
	}
	for _, fv := range set {
		if err := fv.f.set(&cfg, strings.Join(fv.values, ",")); err != nil {
			return Config{}, &ConfigError{Source: "flag --" + fv.f.flagName(), Field: fv.f.key, Err: err}
		}
	}
	if cfg.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return Config{}, &ConfigError{Field: "node_name", Err: fmt.Errorf("not set, and the host name is unknown: %w", err)}
		}
		cfg.NodeName = host
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// applyYAML sets the fields of the YAML mapping in data; name is the file's
// name for errors. The file is read by the strict YAML reader with its
// default bounds (1 MiB, 100 levels, a million nodes aliases expanded, no
// key twice).
func applyYAML(cfg *Config, name string, data []byte) error {
	fail := func(n *yaml.Node, key string, err error) error {
		return &ConfigError{Source: name, Line: n.Line, Column: n.Column, Field: key, Err: err}
	}
	root, err := yamlfile.Parse(name, data, yamlfile.DefaultConfig())
	if err != nil {
		return yamlError(name, err)
	}
	if root == nil {
		return nil // an empty file sets nothing
	}
	root = yamlfile.Deref(root)
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil // only comments
	}
	if root.Kind != yaml.MappingNode {
		return fail(root, "", errors.New("is not a mapping of settings"))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := yamlfile.Deref(root.Content[i]), yamlfile.Deref(root.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return fail(k, "", errors.New("a setting's name must be text"))
		}
		f := fieldByKey(k.Value)
		if f == nil {
			return fail(k, "", fmt.Errorf("unknown field %q", k.Value))
		}
		text, err := yamlText(f, v)
		if err != nil {
			return fail(v, f.key, err)
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue // "key:" with no value keeps the default
		}
		if err := f.set(cfg, text); err != nil {
			return fail(v, f.key, err)
		}
	}
	return nil
}

// yamlError turns an error of the YAML reader into a *ConfigError at its
// position.
func yamlError(name string, err error) error {
	var ye *yamlfile.Error
	if !errors.As(err, &ye) {
		return &ConfigError{Source: name, Err: err}
	}
	msg := ye.Message
	if errors.Is(err, yamlfile.ErrSyntax) {
		msg = "not valid YAML: " + msg
	}
	return &ConfigError{Source: name, Line: ye.Line, Column: ye.Column, Field: ye.Field, Err: errors.New(msg)}
}

// yamlText returns v as the text its field parses: a scalar's value, or a
// list's items joined by commas.
func yamlText(f *field, v *yaml.Node) (string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		return v.Value, nil
	case yaml.SequenceNode:
		if !f.list {
			return "", errors.New("want a single value, not a list")
		}
		items := make([]string, len(v.Content))
		for i, it := range v.Content {
			it = yamlfile.Deref(it)
			if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
				return "", fmt.Errorf("item %d at line %d is not a single value", i+1, it.Line)
			}
			if strings.Contains(it.Value, ",") {
				return "", fmt.Errorf("item %d at line %d holds a comma", i+1, it.Line)
			}
			items[i] = it.Value
		}
		return strings.Join(items, ","), nil
	}
	return "", errors.New("want a single value, not a mapping")
}

// HTTPBodyBudget returns the bytes of HTTP bodies held at once:
// HTTPBodyBytes, or a quarter of SoftMemoryLimit, or 64 MiB without one;
// at least MaxBodyBytes.
func (c *Config) HTTPBodyBudget() int64 {
	switch {
	case c.HTTPBodyBytes > 0:
		return c.HTTPBodyBytes
	case c.SoftMemoryLimit() > 0:
		return max(c.SoftMemoryLimit()/4, c.MaxBodyBytes)
	}
	return max(64<<20, c.MaxBodyBytes)
}

// GRPCMessageBudget returns the limits of each gRPC server (the node's, and with
// peer_addr the public API's, each with a budget of its own): the defaults with
// MessageBytes GRPCMessageBytes, or a quarter of SoftMemoryLimit (at
// least MinGRPCMessageBytes), or the default without one; a connection's
// share a 64th of it, at least one call's; and MessageTimeout
// GRPCMessageTimeout.
func (c *Config) GRPCMessageBudget() transport.ServerLimits {
	l := transport.DefaultServerLimits()
	switch {
	case c.GRPCMessageBytes > 0:
		l.MessageBytes = c.GRPCMessageBytes
	case c.SoftMemoryLimit() > 0:
		l.MessageBytes = max(c.SoftMemoryLimit()/4, MinGRPCMessageBytes)
	}
	l.ConnMessageBytes = max(l.MessageBytes/64, transport.MessageReservation)
	l.MessageTimeout = c.GRPCMessageTimeout
	return l
}

// SoftMemoryLimit returns the soft memory limit the daemon's process
// should run with: MemoryLimit, or MaxBytes plus MemoryHeadroom when that
// is 0, or 0 for none.
func (c *Config) SoftMemoryLimit() int64 {
	switch {
	case c.MemoryLimit > 0:
		return c.MemoryLimit
	case c.MaxBytes > 0:
		return c.MaxBytes + MemoryHeadroom
	}
	return 0
}
