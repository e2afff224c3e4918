package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

// redisConfigFor is testConfig with backend redis on addrs.
func redisConfigFor(name string, addrs ...string) Config {
	c := testConfig(name)
	c.Backend = BackendRedis
	c.RedisAddrs = addrs
	c.RedisTimeout = 5 * time.Second // generous: -race on 2 shared cores
	c.RedisPrefix = name + ":"
	return c
}

// redisStep is one call to a daemon on Redis, through one of its APIs,
// and the outcome it must have: "allowed r=N", "denied", or another
// word the step's call returns.
type redisStep struct {
	name string
	call func(t *testing.T) string
	want string
}

// Every API of a daemon with backend redis decides on Redis, one count
// across them: HTTP checks and batches, the Sluice service, the Rules
// service and POST /v1/rules/check, Envoy's rate limit service. The
// daemon runs no gossip and no Peer service; /readyz follows Redis (503
// once it is killed, 200 once it is back), the unreachable policy decides
// while it is down, and inspect, which reads a node's store, is 501.
func TestRedisBackendServesEveryAPI(t *testing.T) {
	srv := testredis.Start(t)
	cfg := redisConfigFor("redis-apis", srv.Addr())
	cfg.RulesFile = filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, cfg.RulesFile, checkRules)
	cfg.EnvoyConfigDir = envoyDir(t)
	d := start(t, cfg)
	if d.Node() != nil || d.GossipAddr() != "" || d.PeerAddr() != "" {
		t.Fatalf("backend redis runs a node: gossip %q peer %q", d.GossipAddr(), d.PeerAddr())
	}
	base := "http://" + d.HTTPAddr()
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rls := rlsClient(t, d.GRPCAddr())
	rulesGRPC := rulesClient(t, d.GRPCAddr())
	ctx := context.Background()

	req := limiter.Request{Name: "api", Key: "k", Hits: 1, Limit: 4, Period: time.Hour, Algorithm: limiter.FixedWindow}
	body := `{"name":"api","key":"k","limit":4,"period":"1h","algorithm":"fixed_window"}`
	outcome := func(allowed bool, remaining int64, owner string) string {
		if owner != RedisOwner {
			return "owner " + owner
		}
		if !allowed {
			return "denied"
		}
		return fmt.Sprintf("allowed r=%d", remaining)
	}
	httpCheck := func(t *testing.T, body string) string {
		r := do(t, http.MethodPost, base+"/v1/check", body)
		var dec Decision
		if err := json.Unmarshal(r.body, &dec); err != nil || r.status != http.StatusOK {
			return fmt.Sprintf("HTTP %d %s", r.status, r.body)
		}
		return outcome(dec.Allowed, dec.Remaining, dec.Owner)
	}
	grpcCheck := func(t *testing.T) string {
		dec, err := c.Check(ctx, req)
		if err != nil {
			return err.Error()
		}
		return outcome(dec.Allowed, dec.Remaining, dec.Owner)
	}
	rulesBody := `{"user":"ann","descriptors":{"plan":"free"}}`
	rulesOutcome := func(v RulesDecision, err error) string {
		if err != nil {
			return err.Error()
		}
		if len(v.Rules) != 1 {
			return fmt.Sprintf("%d rules", len(v.Rules))
		}
		return outcome(v.Allowed, v.Rules[0].Remaining, v.Rules[0].Owner)
	}
	envoyCheck := func(t *testing.T) string {
		resp, err := rls.ShouldRateLimit(ctx, rlsRequest("api", []string{"user=bob"}))
		if err != nil {
			return err.Error()
		}
		return rlsSummary(resp)
	}
	steps := []redisStep{
		{"HTTP check", func(t *testing.T) string { return httpCheck(t, body) }, "allowed r=3"},
		{"gRPC check", grpcCheck, "allowed r=2"},
		{"HTTP batch", func(t *testing.T) string {
			r := do(t, http.MethodPost, base+"/v1/check/batch", `{"requests":[`+body+`,`+body+`]}`)
			var out BatchResponse
			if err := json.Unmarshal(r.body, &out); err != nil || len(out.Responses) != 2 || out.Responses[1].Decision == nil {
				return fmt.Sprintf("HTTP %d %s", r.status, r.body)
			}
			d := out.Responses[1].Decision
			return outcome(d.Allowed, d.Remaining, d.Owner)
		}, "allowed r=0"},
		{"gRPC check over the limit", grpcCheck, "denied"},
		{"HTTP check over the limit", func(t *testing.T) string { return httpCheck(t, body) }, "denied"},
		{"rules over HTTP", func(t *testing.T) string { return rulesOutcome(postRules(base, rulesBody)) }, "allowed r=2"},
		{"rules over gRPC", func(t *testing.T) string { return rulesOutcome(callRules(rulesGRPC, rulesBody, time.Now())) }, "allowed r=1"},
		{"rules over HTTP again", func(t *testing.T) string { return rulesOutcome(postRules(base, rulesBody)) }, "allowed r=0"},
		{"rules over gRPC, spent", func(t *testing.T) string { return rulesOutcome(callRules(rulesGRPC, rulesBody, time.Now())) }, "denied"},
	}
	for i := 5; i > 0; i-- {
		steps = append(steps, redisStep{"Envoy", envoyCheck, fmt.Sprintf("OK; OK r=%d", i-1)})
	}
	steps = append(steps,
		redisStep{"Envoy over the limit", envoyCheck, "OVER_LIMIT; OVER_LIMIT r=0"},
		redisStep{"inspect", func(t *testing.T) string {
			return fmt.Sprintf("HTTP %d", do(t, http.MethodGet, inspectURL(d, "api", "k", ""), "").status)
		}, "HTTP 501"},
		redisStep{"inspect over gRPC", func(t *testing.T) string {
			_, err := c.Inspect(ctx, "api", "k")
			return status.Code(err).String()
		}, "Unimplemented"},
		redisStep{"readyz", func(t *testing.T) string {
			r := do(t, http.MethodGet, base+"/readyz", "")
			return fmt.Sprintf("HTTP %d", r.status)
		}, "HTTP 200"},
		redisStep{"health over gRPC", func(t *testing.T) string {
			h, err := c.Health(ctx)
			if err != nil {
				return err.Error()
			}
			return h.Status
		}, "serving"},
	)
	for _, s := range steps {
		if got := s.call(t); got != s.want {
			t.Errorf("%s: %s, want %s", s.name, got, s.want)
		}
	}
	m := scrape(t, base)
	// Four checks of api were admitted, two limited; the rules' and
	// Envoy's counters have names of their own.
	for _, series := range []string{
		`sluice_checks_total{algorithm="fixed_window",name="api",result="allowed"}`,
		`sluice_checks_total{algorithm="fixed_window",name="api",result="limited"}`,
	} {
		if want := map[bool]float64{true: 4, false: 2}[strings.Contains(series, "allowed")]; m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}

	// Redis killed: not ready, and the policy decides.
	srv.Kill()
	testwait.For(t, "/readyz 503 with Redis killed", func() bool {
		return do(t, http.MethodGet, base+"/readyz", "").status == http.StatusServiceUnavailable
	})
	r := do(t, http.MethodPost, base+"/v1/check", strings.Replace(body, `}`, `,"unreachable":"deny"}`, 1))
	var dec Decision
	if err := json.Unmarshal(r.body, &dec); err != nil || dec.Allowed || !dec.WithoutOwner || dec.Owner != "redis-apis" {
		t.Errorf("check with Redis killed, policy deny: %d %s", r.status, r.body)
	}
	if got := scrape(t, base)[`sluice_without_owner_total{policy="deny"}`]; got != 1 {
		t.Errorf("sluice_without_owner_total{policy=deny} = %v, want 1", got)
	}
	// Back, empty: ready, and Redis decides again.
	srv.Restart()
	testwait.For(t, "/readyz 200 with Redis back", func() bool {
		return do(t, http.MethodGet, base+"/readyz", "").status == http.StatusOK
	})
	testwait.For(t, "Redis deciding again", func() bool { return grpcCheck(t) == "allowed r=3" })
}

// A daemon whose Redis refuses its AUTH is not ready and says why; with
// the password, from redis_password_file, it is.
func TestRedisBackendAuth(t *testing.T) {
	srv := testredis.StartWithPassword(t, "s3cret")
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		password   string
		file       string
		wantStatus int
		wantReason string
	}{
		{"no password", "", "", http.StatusServiceUnavailable, "NOAUTH"},
		{"wrong password", "nope", "", http.StatusServiceUnavailable, "WRONGPASS"},
		{"password file", "", pw, http.StatusOK, ""},
		{"password", "s3cret", "", http.StatusOK, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := redisConfigFor("redis-auth", srv.Addr())
			cfg.RedisPassword, cfg.RedisPasswordFile = tt.password, tt.file
			d := start(t, cfg)
			r := do(t, http.MethodGet, "http://"+d.HTTPAddr()+"/readyz", "")
			if r.status != tt.wantStatus || !strings.Contains(string(r.body), tt.wantReason) {
				t.Fatalf("/readyz: %d %s, want %d with %q", r.status, r.body, tt.wantStatus, tt.wantReason)
			}
			dec, err := d.Limiter().Check(context.Background(), limiter.Request{Name: "a", Key: "k", Hits: 1, Limit: 1, Period: time.Hour, Algorithm: limiter.FixedWindow}, sluice.OnUnreachable(sluice.PolicyDeny))
			if err != nil || dec.WithoutOwner != (tt.wantStatus != http.StatusOK) {
				t.Fatalf("check: %+v, %v", dec, err)
			}
		})
	}
}

// The settings of backend redis are refused without it, the peers' with
// it, and each Redis setting is checked, naming the field.
func TestRedisConfigErrors(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	redis := []string{"--backend", "redis", "--redis-addrs", "127.0.0.1:6379"}
	for _, tt := range []struct {
		args      []string
		wantField string
		wantText  string
	}{
		{[]string{"--backend", "memcached"}, "backend", `"memcached" is not cluster or redis`},
		{[]string{"--backend", "redis"}, "redis_addrs", "needs the address"},
		{[]string{"--redis-addrs", "127.0.0.1:6379"}, "redis_addrs", "needs backend redis"},
		{[]string{"--redis-tls=true"}, "redis_tls", "needs backend redis"},
		{append(redis, "--join", "127.0.0.1:7946"), "join", "backend redis runs no gossip"},
		{append(redis, "--peer-addr", "127.0.0.1:7948"), "peer_addr", "backend redis runs no gossip"},
		{append(redis, "--tracing-endpoint", "127.0.0.1:4317"), "tracing_endpoint", "backend redis"},
		{[]string{"--backend", "redis", "--redis-addrs", "127.0.0.1"}, "redis_addrs", "not host:port"},
		{[]string{"--backend", "redis", "--redis-addrs", "127.0.0.1:0"}, "redis_addrs", "port other than 0"},
		{append(redis, "--redis-timeout", "0s"), "redis_timeout", "outside (0, 1m]"},
		{append(redis, "--redis-timeout", "2m"), "redis_timeout", "outside (0, 1m]"},
		{append(redis, "--redis-password", "a", "--redis-password-file", pw), "redis_password_file", "exclude each other"},
		{append(redis, "--redis-tls-ca-file", pw), "redis_tls", "need redis_tls: true"},
		{append(redis, "--redis-tls=true", "--redis-tls-cert-file", pw), "redis_tls_cert_file", "go together"},
		{append(redis, "--redis-prefix", strings.Repeat("p", 65)), "redis_prefix", "more than 64"},
		{append(redis, "--redis-prefix", "{sluice}:"), "redis_prefix", "one Redis Cluster slot"},
		{append(redis, "--redis-pool-size", "-1"), "redis_pool_size", "outside"},
		{append(redis, "--redis-over-limit-cache", "-1"), "redis_over_limit_cache", "outside"},
		{append(redis, "--redis-password", "a\nb"), "redis_password", "control characters"},
	} {
		_, err := Load(tt.args, envMap(nil), new(strings.Builder))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.wantField || !strings.Contains(err.Error(), tt.wantText) {
			t.Errorf("Load %q: %v, want field %s with %q", tt.args, err, tt.wantField, tt.wantText)
		}
	}
	// A password file that is missing, or empty, fails New, naming it.
	for _, content := range []string{"", "  \n"} {
		empty := filepath.Join(t.TempDir(), "empty")
		os.WriteFile(empty, []byte(content), 0o600)
		cfg := redisConfigFor("redis-cfg", "127.0.0.1:1")
		cfg.RedisPasswordFile = empty
		if _, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "redis_password_file") {
			t.Errorf("New with an empty password file: %v", err)
		}
	}
	cfg := redisConfigFor("redis-cfg", "127.0.0.1:1")
	cfg.RedisPasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "redis_password_file") {
		t.Errorf("New with a missing password file: %v", err)
	}
	// The password never shows in the usage text.
	if got := fieldByKey("redis_password").show(&Config{RedisPassword: "s3cret"}); got != "<set>" {
		t.Errorf("redis_password shows as %q", got)
	}
}

// A daemon reaches a Redis that speaks TLS alone and requires client
// certificates only with redis_tls, the CA that signed the server's
// certificate and a client certificate: without any of them, or with a
// server name the certificate does not carry, it is not ready and says
// why, and a missing CA file fails New naming the setting.
func TestRedisBackendTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "redis-ca")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	other := testpki.NewCA(t, "other-ca").WriteCA(t, dir, "other.pem")
	srvCert, srvKey := testpki.WriteCert(t, dir, "redis", ca.Issue(t, "redis"))
	cli := ca.Issue(t, "sluice")
	cliCert, cliKey := testpki.WriteCert(t, dir, "sluice", cli)
	srv := testredis.StartTLS(t, srvCert, srvKey, caFile, true, ca.Config(cli))
	for _, tt := range []struct {
		name                      string
		tls                       bool
		caFile, cert, key, server string
		wantStatus                int
		wantReason                string
	}{
		{"plain text", false, "", "", "", "", http.StatusServiceUnavailable, "redis does not answer"},
		{"system roots", true, "", cliCert, cliKey, "", http.StatusServiceUnavailable, "certificate"},
		{"another CA", true, other, cliCert, cliKey, "", http.StatusServiceUnavailable, "certificate"},
		{"no client certificate", true, caFile, "", "", "", http.StatusServiceUnavailable, "redis does not answer"},
		{"wrong server name", true, caFile, cliCert, cliKey, "redis.example", http.StatusServiceUnavailable, "redis.example"},
		{"verified both ways", true, caFile, cliCert, cliKey, "", http.StatusOK, ""},
		{"verified, server name", true, caFile, cliCert, cliKey, "localhost", http.StatusOK, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := redisConfigFor("redis-tls", srv.Addr())
			cfg.RedisTimeout = time.Second
			cfg.RedisTLS, cfg.RedisTLSCAFile, cfg.RedisTLSCertFile, cfg.RedisTLSKeyFile, cfg.RedisTLSServerName = tt.tls, tt.caFile, tt.cert, tt.key, tt.server
			d := start(t, cfg)
			r := do(t, http.MethodGet, "http://"+d.HTTPAddr()+"/readyz", "")
			if r.status != tt.wantStatus || !strings.Contains(string(r.body), tt.wantReason) {
				t.Fatalf("/readyz: %d %s, want %d with %q", r.status, r.body, tt.wantStatus, tt.wantReason)
			}
		})
	}
	cfg := redisConfigFor("redis-tls", srv.Addr())
	cfg.RedisTLS, cfg.RedisTLSCAFile = true, filepath.Join(dir, "missing.pem")
	if _, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "redis_tls_ca_file") {
		t.Errorf("New with a missing CA file: %v", err)
	}
}

// The cluster's settings that backend redis ignores are named in a
// warning at start when they differ from their defaults, and only then.
func TestRedisBackendWarnsOfIgnoredSettings(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"defaults", func(c *Config) {
			*c = DefaultConfig()
			c.NodeName = "w"
			c.HTTPAddr, c.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
		}, nil},
		{"replicas and leases", func(c *Config) { c.Replicas = 3; c.Lease.Threshold = 100 }, []string{"replicas", "lease_threshold", "gossip_addr"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig("w")
			tt.edit(&cfg)
			cfg.Backend, cfg.RedisAddrs = BackendRedis, []string{"127.0.0.1:1"}
			logs := new(lockedBuffer)
			d, err := New(cfg, WithLogOutput(logs))
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			warned := strings.Contains(logs.String(), "these settings are ignored")
			if warned != (tt.want != nil) {
				t.Fatalf("warned %v, want %v: %s", warned, tt.want != nil, logs)
			}
			for _, key := range tt.want {
				if !strings.Contains(logs.String(), `"`+key+`"`) {
					t.Errorf("the warning does not name %s: %s", key, logs)
				}
			}
		})
	}
}

// The Redis settings come from the file, the environment and flags like
// every other: a YAML list of addresses, the password from the
// environment, a flag over both.
func TestRedisSettingsFromEverySource(t *testing.T) {
	file := writeFile(t, `backend: redis
redis_addrs: [r1:6379, r2:6379, r3:6379]
redis_timeout: 250ms
redis_tls: true
redis_tls_server_name: redis.internal
unreachable: deny
redis_prefix: file
`)
	cfg, err := Load([]string{"--config", file, "--redis-prefix", "flag:"},
		envMap(map[string]string{"SLUICE_REDIS_PASSWORD": "from-env", "SLUICE_REDIS_POOL_SIZE": "32", "SLUICE_NODE_NAME": "n"}), new(strings.Builder))
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%s %v %v %v %s %v %s %s %d", cfg.Backend, cfg.RedisAddrs, cfg.RedisTimeout, cfg.RedisTLS, cfg.RedisTLSServerName,
		cfg.Unreachable, cfg.RedisPassword, cfg.RedisPrefix, cfg.RedisPoolSize)
	if want := "redis [r1:6379 r2:6379 r3:6379] 250ms true redis.internal deny from-env flag: 32"; got != want {
		t.Errorf("loaded %s, want %s", got, want)
	}
	rc, err := redisConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rc.TLS == nil || rc.TLS.ServerName != "redis.internal" || rc.Timeout != 250*time.Millisecond || rc.Unreachable != sluice.PolicyDeny || len(rc.Addrs) != 3 {
		t.Errorf("redislimit config %+v", rc)
	}
}
