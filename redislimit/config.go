package redislimit

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// Errors of the package; test with errors.Is.
var (
	// ErrInvalidConfig wraps every error of Config.Validate.
	ErrInvalidConfig = errors.New("redislimit: invalid config")
	// ErrUnsupported wraps a valid limiter.Request that Redis time cannot
	// decide as limiter does: a Period that is not a whole number of
	// microseconds, or a GCRA faster than one hit per microsecond. It
	// also wraps the limiter sentinel the field's error would wrap.
	ErrUnsupported = errors.New("redislimit: unsupported request")
	// ErrBadState wraps a key whose value in Redis is not a state this
	// package wrote (another format version, or another program's key).
	ErrBadState = errors.New("redislimit: bad state in Redis")
	// ErrScript wraps an error the script raised while deciding a key.
	ErrScript = errors.New("redislimit: script failed")
	// ErrClosed is returned by calls on a closed Limiter.
	ErrClosed = errors.New("redislimit: closed")
)

// Config configures a Limiter.
type Config struct {
	// Client is the Redis to decide on: a *redis.Client or a
	// *redis.ClusterClient. When nil, New builds one from Addrs,
	// Username, Password, TLS, Timeout and PoolSize, and Close closes it;
	// a Client given here is the caller's to close, and its own timeouts
	// and retries apply within Timeout.
	Client redis.UniversalClient
	// Addrs are the addresses of one Redis server (one address) or of
	// Redis Cluster nodes (several; the cluster's other nodes are found
	// from them).
	Addrs []string
	// Username and Password authenticate (AUTH); empty: none.
	Username, Password string
	// TLS, when not nil, connects with TLS.
	TLS *tls.Config
	// Prefix begins every key this package writes. It may not hold '{'
	// or '}': a hash tag in it would put every key on one Redis Cluster
	// slot, and so on one shard.
	Prefix string
	// Timeout bounds one Check or CheckMany call on Redis, connecting
	// included; past it the Unreachable policy decides.
	Timeout time.Duration
	// Unreachable decides a check that Redis cannot: unreachable, slower
	// than Timeout, failing over or refusing. PolicyLocal decides on a
	// store in this process (the limit then holds per process until
	// Redis is back). It may not be PolicyDefault.
	Unreachable sluice.Policy
	// DenyRetryAfter is the RetryAfter of a request denied by PolicyDeny.
	DenyRetryAfter time.Duration
	// BreakerThreshold consecutive failed calls to one Redis node (a
	// server, or a master of a cluster) open its breaker: checks of its
	// keys then go straight to the Unreachable policy, costing no
	// timeout, until BreakerCooldown has passed and one call probes the
	// node again.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// Local is the store PolicyLocal decides on.
	Local limiter.StoreConfig
	// OverLimitCache, when positive, is the most keys remembered in this
	// process as admitting nothing: a check of one or no hits that Redis
	// denies with Remaining 0 is remembered until its RetryAfter, and
	// checks of the same key and parameters (of any hits, without
	// Behavior) are denied until then without a call to Redis, with the
	// RetryAfter of one hit, a lower bound for more. A Reset or Refund of
	// the same key and parameters through this Limiter forgets it; one
	// through another process does not. Each key costs about 200 bytes
	// beyond its name and key. 0, the default, is off.
	OverLimitCache int
	// PoolSize is the most connections per Redis node when New builds
	// the client; 0 is go-redis's default (10 per CPU).
	PoolSize int
	// KeepStrictest makes a key's state in Redis keep the strictest rate
	// any request has charged it under since it was fresh, as
	// limiter.StoreConfig.KeepStrictest does in memory (see limiter's
	// package comment): the rate is stored with the state (32 bytes more
	// per key, same key and TTL), and a request of another Algorithm,
	// Limit, Burst, Period or Calendar is decided with the state's
	// algorithm at the stricter of both rates, so that no request without
	// Reset lowers what a key counts. A cut takes effect at once; a raise,
	// a shorter Period or another Algorithm once the key is fresh, or
	// after a Reset. It applies to the Local store as well. For callers
	// that may not reset keys.
	KeepStrictest bool
	// Clock is this process's clock (nil: time.Now): the local store's,
	// the breaker's, the calendar windows' and the one Decision.ResetAt
	// is given on. Redis's clock decides; its times are translated onto
	// this one, so that ResetAt less Clock's now is the time left until
	// the reset Redis counts to.
	Clock func() time.Time
}

// DefaultConfig returns a Config for one Redis at localhost:6379: keys
// under "sluice:", a 100 ms timeout, PolicyLocal, a breaker opening after 5
// consecutive failures for 1 s, and a local store of at most 100,000 keys.
func DefaultConfig() Config {
	local := limiter.DefaultStoreConfig()
	local.MaxEntries = 100_000
	local.MaxBytes = 16 << 20
	return Config{
		Addrs:            []string{"localhost:6379"},
		Prefix:           "sluice:",
		Timeout:          100 * time.Millisecond,
		Unreachable:      sluice.PolicyLocal,
		DenyRetryAfter:   time.Second,
		BreakerThreshold: 5,
		BreakerCooldown:  time.Second,
		Local:            local,
	}
}

// Bounds of Config's fields.
const (
	// MaxPrefixLen bounds Config.Prefix, in bytes.
	MaxPrefixLen = 64
	// MaxOverLimitCache bounds Config.OverLimitCache, in keys.
	MaxOverLimitCache = 1 << 22
)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Client == nil && len(c.Addrs) == 0:
		return bad("neither Client nor Addrs is set")
	case len(c.Prefix) > MaxPrefixLen:
		return bad("Prefix is %d bytes, more than %d", len(c.Prefix), MaxPrefixLen)
	case strings.ContainsAny(c.Prefix, "{}"):
		return bad("Prefix %q holds '{' or '}': a hash tag in it would put every key on one cluster slot", c.Prefix)
	case c.Timeout <= 0 || c.Timeout > time.Minute:
		return bad("Timeout %v is outside (0, 1m]", c.Timeout)
	case !c.Unreachable.Valid() || c.Unreachable == sluice.PolicyDefault:
		return bad("Unreachable %v is not local, allow or deny", c.Unreachable)
	case c.DenyRetryAfter < 0:
		return bad("DenyRetryAfter %v is negative", c.DenyRetryAfter)
	case c.BreakerThreshold < 1 || c.BreakerThreshold > 1<<20:
		return bad("BreakerThreshold %d is outside [1, %d]", c.BreakerThreshold, 1<<20)
	case c.BreakerCooldown <= 0:
		return bad("BreakerCooldown %v is not positive", c.BreakerCooldown)
	case c.OverLimitCache < 0 || c.OverLimitCache > MaxOverLimitCache:
		return bad("OverLimitCache %d is outside [0, %d]", c.OverLimitCache, MaxOverLimitCache)
	case c.PoolSize < 0:
		return bad("PoolSize %d is negative", c.PoolSize)
	}
	for i, a := range c.Addrs {
		if a == "" {
			return bad("Addrs[%d] is empty", i)
		}
	}
	if err := c.Local.Validate(); err != nil {
		return bad("Local: %v", err)
	}
	return nil
}

// client builds the client Addrs name.
func (c *Config) client() redis.UniversalClient {
	if len(c.Addrs) == 1 {
		return redis.NewClient(&redis.Options{
			Addr: c.Addrs[0], Username: c.Username, Password: c.Password, TLSConfig: c.TLS,
			DialTimeout: c.Timeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout,
			MaxRetries: -1, DialerRetries: 1, PoolSize: c.PoolSize, ContextTimeoutEnabled: true,
		})
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs, Username: c.Username, Password: c.Password, TLSConfig: c.TLS,
		DialTimeout: c.Timeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout,
		MaxRetries: -1, DialerRetries: 1, PoolSize: c.PoolSize, ContextTimeoutEnabled: true,
	})
}
