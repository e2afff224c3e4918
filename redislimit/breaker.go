package redislimit

import (
	"sync"
	"time"
)

// breaker stops calls to a Redis that keeps failing. After threshold
// consecutive failed calls it opens: checks go straight to the
// Unreachable policy until the cooldown has passed; then one call probes,
// and its outcome closes the breaker or opens it for another cooldown.
type breaker struct {
	mu        sync.Mutex // guards the fields below
	failures  int
	openUntil time.Time // zero when closed
	probing   bool      // the probe is out
}

// allow reports whether a call may be made at now, and whether it is the
// probe.
func (b *breaker) allow(now time.Time) (probe, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.openUntil.IsZero():
		return false, true
	case now.Before(b.openUntil) || b.probing:
		return false, false
	}
	b.probing = true
	return true, true
}

// done records a call's outcome at now.
func (b *breaker) done(probe, ok bool, now time.Time, threshold int, cooldown time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if ok {
		b.failures, b.openUntil = 0, time.Time{}
		return
	}
	b.failures++
	if b.failures >= threshold || probe {
		b.openUntil = now.Add(cooldown)
	}
}

// giveBack ends a call without an outcome: a probe lets the next call
// probe.
func (b *breaker) giveBack(probe bool) {
	if probe {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}

// isOpen reports whether the breaker is open (or half-open).
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.openUntil.IsZero()
}
