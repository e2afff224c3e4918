package ring

import (
	"fmt"
	"math"
)

// Bounds checked by [Config.Validate].
const (
	// MaxPartitionCount bounds PartitionCount so a typo cannot allocate a
	// huge table.
	MaxPartitionCount = 1 << 20
	// MinReplicationFactor is the fewest points a member may have on the
	// hash circle. With a single point the bounded-load assignment can fail
	// to place a partition even when there is room.
	MinReplicationFactor = 2
	// MaxReplicationFactor bounds ReplicationFactor.
	MaxReplicationFactor = 1024
)

// Config shapes a [Ring]. All nodes of a cluster must use the same Config:
// a different value routes keys differently.
type Config struct {
	// PartitionCount is the number of partitions the key space is cut into;
	// a prime spreads keys best. It bounds the number of members. In
	// [1, MaxPartitionCount].
	PartitionCount int
	// ReplicationFactor is the number of points each member has on the
	// hash circle. More points spread partitions more evenly and cost more
	// per rebuild. In [MinReplicationFactor, MaxReplicationFactor].
	ReplicationFactor int
	// Load bounds each member's share of partitions to about Load times the
	// average. It must be finite and greater than 1: at exactly 1 there is
	// no slack and the assignment cannot always be completed.
	Load float64
}

// DefaultConfig returns the configuration sluice uses: 1021 partitions (a
// prime), 20 points per member and a load bound of 1.25.
func DefaultConfig() Config {
	return Config{
		PartitionCount:    1021,
		ReplicationFactor: 20,
		Load:              1.25,
	}
}

// Validate reports whether c can build a ring for any number of members up
// to PartitionCount. The error wraps [ErrInvalidConfig].
func (c Config) Validate() error {
	if c.PartitionCount < 1 || c.PartitionCount > MaxPartitionCount {
		return fmt.Errorf("%w: PartitionCount %d is outside [1, %d]", ErrInvalidConfig, c.PartitionCount, MaxPartitionCount)
	}
	if c.ReplicationFactor < MinReplicationFactor || c.ReplicationFactor > MaxReplicationFactor {
		return fmt.Errorf("%w: ReplicationFactor %d is outside [%d, %d]", ErrInvalidConfig, c.ReplicationFactor, MinReplicationFactor, MaxReplicationFactor)
	}
	if !(c.Load > 1) || math.IsInf(c.Load, 0) {
		return fmt.Errorf("%w: Load %v must be finite and greater than 1", ErrInvalidConfig, c.Load)
	}
	return nil
}
