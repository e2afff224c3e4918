package testcluster

import (
	"time"

	"github.com/sluicehq/sluice/cluster"
)

// WithClockOffsets runs node i's clock offsets[i] ahead of the clock its
// config has (cluster.Config.Clock, or the system clock), negative for
// behind; nodes past the end of offsets, and nodes added later, get the
// offset of their index modulo len(offsets). It lets tests see what clock
// skew between hosts does: leases, hand-overs and replicas all cross
// nodes whose clocks disagree.
func WithClockOffsets(offsets ...time.Duration) Option {
	offsets = append([]time.Duration(nil), offsets...)
	return func(o *options) { o.offsets = offsets }
}

// ClockOffset returns the offset WithClockOffsets gave node i (0 without).
func (c *Cluster) ClockOffset(i int) time.Duration {
	if len(c.opts.offsets) == 0 {
		return 0
	}
	return c.opts.offsets[i%len(c.opts.offsets)]
}

// skewClock wraps cfg's clock with node i's offset.
func (c *Cluster) skewClock(i int, cfg *cluster.Config) {
	off := c.ClockOffset(i)
	if off == 0 {
		return
	}
	base := cfg.Clock
	if base == nil {
		base = cluster.SystemClock()
	}
	cfg.Clock = offsetClock{base, off}
}

// offsetClock reads base's time moved by off; its waits are base's, as a
// duration is the same on every host.
type offsetClock struct {
	base cluster.Clock
	off  time.Duration
}

func (c offsetClock) Now() time.Time { return c.base.Now().Add(c.off) }

func (c offsetClock) AfterFunc(d time.Duration, f func()) func() bool {
	return c.base.AfterFunc(d, f)
}
