package ring

import (
	"errors"
	"math"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	withDefault := func(f func(*Config)) Config {
		c := DefaultConfig()
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"default", DefaultConfig(), true},
		{"one partition", withDefault(func(c *Config) { c.PartitionCount = 1 }), true},
		{"max partitions", withDefault(func(c *Config) { c.PartitionCount = MaxPartitionCount }), true},
		{"min replication", withDefault(func(c *Config) { c.ReplicationFactor = MinReplicationFactor }), true},
		{"max replication", withDefault(func(c *Config) { c.ReplicationFactor = MaxReplicationFactor }), true},
		{"load just above 1", withDefault(func(c *Config) { c.Load = 1.000001 }), true},
		{"large load", withDefault(func(c *Config) { c.Load = 1e6 }), true},

		{"zero value", Config{}, false},
		{"zero partitions", withDefault(func(c *Config) { c.PartitionCount = 0 }), false},
		{"negative partitions", withDefault(func(c *Config) { c.PartitionCount = -7 }), false},
		{"too many partitions", withDefault(func(c *Config) { c.PartitionCount = MaxPartitionCount + 1 }), false},
		{"zero replication", withDefault(func(c *Config) { c.ReplicationFactor = 0 }), false},
		{"replication 1", withDefault(func(c *Config) { c.ReplicationFactor = 1 }), false},
		{"too much replication", withDefault(func(c *Config) { c.ReplicationFactor = MaxReplicationFactor + 1 }), false},
		{"load 1", withDefault(func(c *Config) { c.Load = 1 }), false},
		{"load below 1", withDefault(func(c *Config) { c.Load = 0.5 }), false},
		{"zero load", withDefault(func(c *Config) { c.Load = 0 }), false},
		{"NaN load", withDefault(func(c *Config) { c.Load = math.NaN() }), false},
		{"infinite load", withDefault(func(c *Config) { c.Load = math.Inf(1) }), false},
		{"negative infinite load", withDefault(func(c *Config) { c.Load = math.Inf(-1) }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.ok {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tt.cfg, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalidConfig", tt.cfg, err)
			}
			r, err := New(tt.cfg)
			if r != nil || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New(%+v) = %v, %v, want nil, ErrInvalidConfig", tt.cfg, r, err)
			}
		})
	}
}

func TestNewCopiesConfig(t *testing.T) {
	cfg := DefaultConfig()
	r := mustNew(t, cfg)
	cfg.PartitionCount = 7
	if got := r.Config(); got != DefaultConfig() {
		t.Fatalf("Config() = %+v after the caller changed its copy, want %+v", got, DefaultConfig())
	}
}
