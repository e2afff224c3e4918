package daemon

import (
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
)

// envMap returns an env function reading m.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// writeFile writes a config file in the test's directory and returns its
// path.
func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrecedence(t *testing.T) {
	file := `
node_name: from-file
http_addr: 127.0.0.1:1001
grpc_addr: 127.0.0.1:2001
gossip_addr: 127.0.0.1:3001
unreachable: deny
join:
  - 10.0.0.1:7946
  - 10.0.0.2:7946
shutdown_timeout: 3s
rules_file: file-rules.yaml
envoy_config_dir: /etc/ratelimit
envoy_response_headers: draft
`
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{"defaults", nil, nil, func(t *testing.T, c Config) {
			want := DefaultConfig()
			host, _ := os.Hostname()
			want.NodeName = host
			if c.NodeName != host || c.HTTPAddr != want.HTTPAddr || c.GRPCAddr != ":7947" || c.Unreachable != sluice.PolicyLocal || len(c.Join) != 0 || c.LogFormat != "json" {
				t.Errorf("got %+v, want the defaults with the host name", c)
			}
		}},
		{"file over defaults", []string{"--config", "FILE"}, nil, func(t *testing.T, c Config) {
			if c.NodeName != "from-file" || c.HTTPAddr != "127.0.0.1:1001" || c.Unreachable != sluice.PolicyDeny ||
				!slices.Equal(c.Join, []string{"10.0.0.1:7946", "10.0.0.2:7946"}) || c.ShutdownTimeout != 3*time.Second {
				t.Errorf("got %+v", c)
			}
			if c.RulesFile != "file-rules.yaml" {
				t.Errorf("rules file %q", c.RulesFile)
			}
			if c.EnvoyConfigDir != "/etc/ratelimit" || c.EnvoyResponseHeaders != EnvoyHeadersDraft || c.EnvoyWindowAlignment != EnvoyAlignCalendar {
				t.Errorf("envoy settings %q %q %q", c.EnvoyConfigDir, c.EnvoyResponseHeaders, c.EnvoyWindowAlignment)
			}
			if c.LogLevel != slog.LevelInfo || c.MaxBatchItems != 1000 {
				t.Errorf("fields the file does not set changed: %+v", c)
			}
		}},
		{"file named by the environment", nil, map[string]string{"SLUICE_CONFIG": "FILE"}, func(t *testing.T, c Config) {
			if c.NodeName != "from-file" {
				t.Errorf("node name %q", c.NodeName)
			}
		}},
		{"env over file", []string{"--config", "FILE"}, map[string]string{
			"SLUICE_NODE_NAME": "from-env", "SLUICE_JOIN": "a:1, b:2", "SLUICE_UNREACHABLE": "allow",
			"SLUICE_ADVERTISE_HOST": "10.1.1.1", "SLUICE_LOG_LEVEL": "debug", "SLUICE_GOSSIP_PROFILE": "fast",
			"SLUICE_RULES_FILE": "env-rules.yaml", "SLUICE_ENVOY_WINDOW_ALIGNMENT": "epoch", "SLUICE_ENVOY_RESPONSE_HEADERS": "x-ratelimit",
		}, func(t *testing.T, c Config) {
			if c.EnvoyWindowAlignment != EnvoyAlignEpoch || c.EnvoyResponseHeaders != EnvoyHeadersX || c.EnvoyConfigDir != "/etc/ratelimit" {
				t.Errorf("envoy settings %q %q %q", c.EnvoyConfigDir, c.EnvoyResponseHeaders, c.EnvoyWindowAlignment)
			}
			if c.NodeName != "from-env" || c.RulesFile != "env-rules.yaml" || !slices.Equal(c.Join, []string{"a:1", "b:2"}) || c.Unreachable != sluice.PolicyAllow ||
				c.AdvertiseHost != "10.1.1.1" || c.LogLevel != slog.LevelDebug || c.GossipProfile != cluster.ProfileFast {
				t.Errorf("got %+v", c)
			}
			if c.HTTPAddr != "127.0.0.1:1001" {
				t.Errorf("http addr %q, want the file's", c.HTTPAddr)
			}
		}},
		{"flags over env", []string{"--config", "FILE", "--node-name", "from-flag", "--join", "c:3", "--join=d:4,e:5", "--http-addr=127.0.0.1:0", "--log-format", "text", "--rules-file", "flag-rules.yaml"},
			map[string]string{"SLUICE_NODE_NAME": "from-env", "SLUICE_JOIN": "a:1", "SLUICE_HTTP_ADDR": "127.0.0.1:9", "SLUICE_RULES_FILE": "env-rules.yaml"},
			func(t *testing.T, c Config) {
				if c.NodeName != "from-flag" || c.RulesFile != "flag-rules.yaml" || !slices.Equal(c.Join, []string{"c:3", "d:4", "e:5"}) || c.HTTPAddr != "127.0.0.1:0" || c.LogFormat != "text" {
					t.Errorf("got %+v", c)
				}
				if c.GRPCAddr != "127.0.0.1:2001" {
					t.Errorf("grpc addr %q, want the file's", c.GRPCAddr)
				}
			}},
		{"a flag clears a list", []string{"--config", "FILE", "--join", ""}, nil, func(t *testing.T, c Config) {
			if len(c.Join) != 0 {
				t.Errorf("join %q, want empty", c.Join)
			}
		}},
	}
	path := writeFile(t, file)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := slices.Clone(tt.args)
			for i := range args {
				args[i] = strings.ReplaceAll(args[i], "FILE", path)
			}
			env := make(map[string]string)
			for k, v := range tt.env {
				env[k] = strings.ReplaceAll(v, "FILE", path)
			}
			c, err := Load(args, envMap(env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name      string
		file      string // written and passed with --config when set
		args      []string
		env       map[string]string
		wantField string
		wantLine  int
		wantText  []string // in the message
	}{
		{name: "unknown yaml field", file: "node_name: a\nhttp_adr: :80\n", wantLine: 2, wantText: []string{`sluice.yaml:2`, `unknown field "http_adr"`}},
		{name: "bad policy in yaml", file: "# comment\n\nunreachable: maybe\n", wantField: "unreachable", wantLine: 3, wantText: []string{"sluice.yaml:3:14: unreachable:", `"maybe"`}},
		{name: "bad duration in yaml", file: "shutdown_timeout: soon\n", wantField: "shutdown_timeout", wantLine: 1},
		{name: "zero duration in yaml", file: "peer_timeout: 0s\n", wantField: "peer_timeout", wantLine: 1, wantText: []string{"must be positive"}},
		{name: "bad address in a yaml list", file: "join:\n  - a:1\n  - nope\n", wantField: "join", wantLine: 2, wantText: []string{"address 2", `"nope"`}},
		{name: "list for a scalar", file: "node_name:\n  - a\n", wantField: "node_name", wantLine: 2, wantText: []string{"not a list"}},
		{name: "mapping for a scalar", file: "http_addr:\n  host: a\n", wantField: "http_addr", wantLine: 2},
		{name: "set twice", file: "log_level: info\nlog_level: debug\n", wantField: "log_level", wantLine: 2, wantText: []string{"first at line 1"}},
		{name: "not a mapping", file: "- a\n- b\n", wantLine: 1, wantText: []string{"not a mapping"}},
		{name: "bad yaml", file: "node_name: a\n  http_addr: b\n", wantLine: 2, wantText: []string{"not valid YAML"}},
		{name: "two documents", file: "node_name: a\n---\nnode_name: b\n", wantLine: 2, wantText: []string{"more than one"}},
		{name: "integer out of range", file: "max_batch_items: 5000\n", wantField: "max_batch_items", wantLine: 1, wantText: []string{"[1, 1000]"}},
		{name: "not an integer", file: "max_body_bytes: 1MB\n", wantField: "max_body_bytes", wantLine: 1},
		{name: "body budget below a body", file: "max_body_bytes: 2048\nhttp_body_bytes: 2047\n", wantField: "http_body_bytes", wantLine: 2, wantText: []string{"max_body_bytes 2048"}},
		{name: "no body timeout", file: "http_body_timeout: 0s\n", wantField: "http_body_timeout", wantLine: 1},
		{name: "no connections", args: []string{"--http-max-connections", "0"}, wantField: "http_max_connections"},
		{name: "small grpc budget", env: map[string]string{"SLUICE_GRPC_MESSAGE_BYTES": "1048576"}, wantField: "grpc_message_bytes", wantText: []string{"16777216"}},
		{name: "no grpc message timeout", args: []string{"--grpc-message-timeout", "-1s"}, wantField: "grpc_message_timeout"},
		{name: "missing file", args: []string{"--config", "/nonexistent/sluice.yaml"}, wantText: []string{"/nonexistent/sluice.yaml"}},
		{name: "bad env", env: map[string]string{"SLUICE_UNREACHABLE": "sometimes"}, wantField: "unreachable", wantText: []string{"env SLUICE_UNREACHABLE"}},
		{name: "bad env address", env: map[string]string{"SLUICE_GRPC_ADDR": "localhost"}, wantField: "grpc_addr", wantText: []string{"env SLUICE_GRPC_ADDR", "host:port"}},
		{name: "bad env port", env: map[string]string{"SLUICE_HTTP_ADDR": ":http"}, wantField: "http_addr", wantText: []string{"port"}},
		{name: "bad flag", args: []string{"--log-format", "xml"}, wantField: "log_format", wantText: []string{"flag --log-format", `"xml"`}},
		{name: "bad flag level", args: []string{"--log-level", "loud"}, wantField: "log_level", wantText: []string{"flag --log-level"}},
		{name: "bad profile", args: []string{"--gossip-profile", "wan"}, wantField: "gossip_profile"},
		{name: "small max keys", args: []string{"--max-keys", "10"}, wantField: "max_keys"},
		{name: "small max bytes", args: []string{"--max-bytes", "1048576"}, wantField: "max_bytes", wantText: []string{"below 16777216"}},
		{name: "negative max bytes", file: "max_bytes: -1\n", wantField: "max_bytes", wantLine: 1},
		{name: "max bytes with a unit", env: map[string]string{"SLUICE_MAX_BYTES": "128MiB"}, wantField: "max_bytes", wantText: []string{"not an integer"}},
		{name: "node name with a space", args: []string{"--node-name", "a b"}, wantField: "node_name"},
		{name: "stray argument", args: []string{"extra"}, wantText: []string{`"extra"`}},
		{name: "too many replicas", file: "replicas: 9\n", wantField: "replicas", wantLine: 1, wantText: []string{"[1, 5]"}},
		{name: "zero replicas", args: []string{"--replicas", "0"}, wantField: "replicas"},
		{name: "zero replicate interval", env: map[string]string{"SLUICE_REPLICATE_INTERVAL": "0s"}, wantField: "replicate_interval"},
		{name: "1ns replicate interval", env: map[string]string{"SLUICE_REPLICATE_INTERVAL": "1ns"}, wantField: "replicate_interval"},
		{name: "zero persist interval", file: "data_dir: /var/lib/sluice\npersist_interval: 0s\n", wantField: "persist_interval", wantLine: 2},
		{name: "negative persist interval", args: []string{"--persist-interval", "-1s"}, wantField: "persist_interval"},
		{name: "1ns persist interval", env: map[string]string{"SLUICE_PERSIST_INTERVAL": "1ns"}, wantField: "persist_interval"},
		{name: "unknown data damaged", file: "data_damaged: ignore\n", wantField: "data_damaged", wantLine: 1, wantText: []string{`"ignore"`}},
		{name: "zero breaker threshold", args: []string{"--breaker-threshold", "0"}, wantField: "breaker_threshold"},
		{name: "lease ttl too long", args: []string{"--lease-threshold", "100", "--lease-ttl", "1h"}, wantField: "lease_ttl", wantText: []string{"Lease.TTL"}},
		{name: "lease share above 1", file: "lease_threshold: 10\nlease_share: 2\n", wantField: "lease_share", wantLine: 2, wantText: []string{"Lease.Share"}},
		{name: "lease share not a number", args: []string{"--lease-share", "half"}, wantField: "lease_share"},
		{name: "zero max clock skew", args: []string{"--max-clock-skew", "0s"}, wantField: "max_clock_skew"},
		{name: "max clock skew above an hour", env: map[string]string{"SLUICE_MAX_CLOCK_SKEW": "2h"}, wantField: "max_clock_skew", wantText: []string{"outside (0, 1h0m0s]"}},
		{name: "max clock skew not a duration", file: "max_clock_skew: soon\n", wantField: "max_clock_skew", wantLine: 1},
		{name: "negative lease threshold", args: []string{"--lease-threshold", "-1"}, wantField: "lease_threshold"},
		{name: "unknown envoy headers", args: []string{"--envoy-response-headers", "ietf"}, wantField: "envoy_response_headers",
			wantText: []string{`"ietf" is not off, draft or x-ratelimit`}},
		{name: "unknown envoy alignment", file: "envoy_window_alignment: iso\n", wantField: "envoy_window_alignment", wantLine: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config", writeFile(t, tt.file)}, args...)
			}
			_, err := Load(args, envMap(tt.env), io.Discard)
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Load = %v, want a *ConfigError", err)
			}
			if ce.Field != tt.wantField || ce.Line != tt.wantLine {
				t.Errorf("field %q line %d, want %q line %d (%v)", ce.Field, ce.Line, tt.wantField, tt.wantLine, err)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not contain %q", err, s)
				}
			}
			if tt.wantField != "" && !strings.Contains(err.Error(), tt.wantField+": ") {
				t.Errorf("%q does not name the field %s", err, tt.wantField)
			}
		})
	}
}

// The cluster settings reach the node's config.
func TestClusterSettings(t *testing.T) {
	cfg, err := Load([]string{"--replicas", "3", "--replicate-interval", "10ms", "--leave-timeout", "2s",
		"--breaker-threshold", "7", "--breaker-cooldown", "3s", "--lease-threshold", "500", "--lease-ttl", "50ms", "--lease-share", "0.25", "--max-bytes", "33554432"},
		envMap(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeName = "settings"
	d := &Daemon{cfg: cfg, logger: slog.New(slog.DiscardHandler), opts: options{now: time.Now}}
	c := d.clusterConfig()
	want := cluster.LeaseConfig{Threshold: 500, TTL: 50 * time.Millisecond, Share: 0.25}
	if c.Replicas != 3 || c.ReplicateInterval != 10*time.Millisecond || c.LeaveTimeout != 2*time.Second ||
		c.BreakerThreshold != 7 || c.BreakerCooldown != 3*time.Second || c.Lease != want || c.Store.MaxBytes != 32<<20 {
		t.Errorf("cluster config %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the node's config is invalid: %v", err)
	}
}

// The budgets of HTTP bodies and gRPC messages are their settings, or a
// quarter of the soft memory limit, or fixed defaults without one; the
// node's gRPC server gets the gRPC one, with a connection's share a 64th
// of it, at least one call's.
func TestBodyAndMessageBudgets(t *testing.T) {
	def := transport.DefaultServerLimits()
	for _, tt := range []struct {
		args          []string
		body, message int64
	}{
		{nil, (DefaultConfig().MaxBytes + MemoryHeadroom) / 4, (DefaultConfig().MaxBytes + MemoryHeadroom) / 4},
		{[]string{"--memory-limit", "1073741824"}, 256 << 20, 256 << 20},
		{[]string{"--max-bytes", "0"}, 64 << 20, def.MessageBytes},
		{[]string{"--memory-limit", "67108864"}, 16 << 20, MinGRPCMessageBytes},
		{[]string{"--memory-limit", "67108864", "--max-body-bytes", "33554432"}, 32 << 20, MinGRPCMessageBytes},
		{[]string{"--http-body-bytes", "5000000", "--grpc-message-bytes", "20000000", "--grpc-message-timeout", "3s"}, 5000000, 20000000},
	} {
		c, err := Load(append([]string{"--node-name", "n"}, tt.args...), envMap(nil), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := c.HTTPBodyBudget(); got != tt.body {
			t.Errorf("%v: body budget %d, want %d", tt.args, got, tt.body)
		}
		d := &Daemon{cfg: c, logger: slog.New(slog.DiscardHandler), opts: options{now: time.Now}}
		l := d.clusterConfig().ServerLimits
		if l.MessageBytes != tt.message || l.ConnMessageBytes != max(tt.message/64, transport.MessageReservation) || l.MessageTimeout != c.GRPCMessageTimeout {
			t.Errorf("%v: server limits %+v, want a budget of %d", tt.args, l, tt.message)
		}
		if err := l.Validate(); err != nil {
			t.Errorf("%v: %v", tt.args, err)
		}
	}
}

// max_bytes defaults to the store's budget and is set like max_keys; 0
// turns the budget off.
func TestMaxBytes(t *testing.T) {
	if got, want := DefaultConfig().MaxBytes, cluster.DefaultConfig().Store.MaxBytes; got != want || got == 0 {
		t.Errorf("default max_bytes %d, want the store's %d", got, want)
	}
	for _, tt := range []struct {
		args []string
		file string
		want int64
	}{
		{args: []string{"--max-bytes", "0"}, want: 0},
		{args: []string{"--max-bytes", "16777216"}, want: MinStoreBytes},
		{file: "max_bytes: 1073741824\n", want: 1 << 30},
	} {
		args := append([]string{"--node-name", "n"}, tt.args...)
		if tt.file != "" {
			args = append(args, "--config", writeFile(t, tt.file))
		}
		c, err := Load(args, envMap(nil), io.Discard)
		if err != nil || c.MaxBytes != tt.want {
			t.Errorf("%q %q: max_bytes %d, %v; want %d", tt.args, tt.file, c.MaxBytes, err, tt.want)
		}
	}
}

func TestYAMLNullsAndEmptyFiles(t *testing.T) {
	for _, text := range []string{"", "# only a comment\n", "node_name:\njoin: []\n"} {
		c, err := Load([]string{"--config", writeFile(t, text), "--node-name", "n"}, envMap(nil), io.Discard)
		if err != nil {
			t.Errorf("%q: %v", text, err)
			continue
		}
		if c.NodeName != "n" || len(c.Join) != 0 {
			t.Errorf("%q: %+v", text, c)
		}
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	_, err := Load([]string{"-h"}, envMap(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Load(-h) = %v", err)
	}
	for _, s := range []string{"-join", "SLUICE_JOIN", "-config", "SLUICE_UNREACHABLE", `default ":8080"`} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("usage does not mention %s:\n%s", s, out.String())
		}
	}
}

func TestValidate(t *testing.T) {
	if def := DefaultConfig(); def.Validate() == nil {
		t.Error("DefaultConfig without a node name is valid")
	}
	c := DefaultConfig()
	c.NodeName = "n"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(c *Config){
		func(c *Config) { c.Unreachable = sluice.PolicyDefault },
		func(c *Config) { c.GossipProfile = 9 },
		func(c *Config) { c.MaxBodyBytes = 1 },
		func(c *Config) { c.ShutdownDelay = -1 },
		func(c *Config) { c.Join = []string{""} },
	} {
		cc := c.clone()
		bad(&cc)
		var ce *ConfigError
		if err := cc.Validate(); !errors.As(err, &ce) || ce.Field == "" {
			t.Errorf("Validate = %v, want a *ConfigError naming a field", err)
		}
	}
}

// The soft memory limit is memory_limit, or max_bytes plus the headroom,
// or none without a store budget; below the minimum is refused.
func TestSoftMemoryLimit(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int64
	}{
		{nil, DefaultConfig().MaxBytes + MemoryHeadroom},
		{[]string{"--max-bytes", "33554432"}, 32<<20 + MemoryHeadroom},
		{[]string{"--max-bytes", "0"}, 0},
		{[]string{"--memory-limit", "536870912"}, 512 << 20},
	} {
		c, err := Load(append([]string{"--node-name", "n"}, tt.args...), envMap(nil), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := c.SoftMemoryLimit(); got != tt.want {
			t.Errorf("%v: soft memory limit %d, want %d", tt.args, got, tt.want)
		}
	}
	if _, err := Load([]string{"--node-name", "n", "--memory-limit", "1000"}, envMap(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "memory_limit") {
		t.Errorf("memory_limit 1000: %v, want an error naming memory_limit", err)
	}
}
