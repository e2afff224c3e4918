// Package breaker holds the circuit breaker that the cluster keeps per
// peer and the Redis backend per Redis node: one breaker, so that both
// open, probe and close alike, and both bound a clock that steps back.
//
// It imports only the standard library.
package breaker

import (
	"sync/atomic"
	"time"
)

// Breaker is the circuit breaker of one destination (a peer, a Redis
// node). After threshold consecutive failed calls it opens: calls to the
// destination go straight to the unreachable policy, costing no timeout
// each, until cooldown has passed; then one call is let through as a
// probe, and its outcome closes the breaker or opens it for another
// cooldown. Its zero value is closed. All fields are atomics: it sits on
// the hot path. Safe for concurrent use.
type Breaker struct {
	failures  atomic.Int32
	openUntil atomic.Int64 // Unix ns; 0 when closed
	probing   atomic.Bool  // a probe call is in flight
}

// Closed reports whether the breaker is closed: calls are allowed, at any
// time.
func (b *Breaker) Closed() bool { return b.openUntil.Load() == 0 }

// Allow reports whether a call may be made at now. A breaker open for
// longer than cooldown from now, which only a clock that stepped back
// finds, is open until cooldown from now: a step back holds no peer's keys
// longer than a cooldown.
func (b *Breaker) Allow(now int64, cooldown time.Duration) bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	if late := now + int64(cooldown); until > late {
		b.openUntil.CompareAndSwap(until, late)
		return false
	}
	if now < until {
		return false
	}
	return b.probing.CompareAndSwap(false, true) // half-open: one probe
}

// Done records a call's outcome; probe says whether the call was the
// half-open probe, which only its own outcome gives back (a call let
// through before the breaker opened may end while the probe is out). now
// is read only when the call failed. A field is written only when it
// changes: while every call succeeds, the callers on every CPU only read
// the breaker. The probe is given back last, so that no other call probes
// before its outcome is in.
func (b *Breaker) Done(probe, ok bool, now int64, threshold int32, cooldown time.Duration) {
	switch {
	case ok:
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		if b.openUntil.Load() != 0 {
			b.openUntil.Store(0)
		}
	case b.failures.Add(1) >= threshold || probe:
		b.openUntil.Store(now + int64(cooldown))
	}
	if probe {
		b.probing.Store(false)
	}
}

// GiveBack ends the probe without an outcome: the next call after the
// cooldown probes.
func (b *Breaker) GiveBack() { b.probing.Store(false) }

// Failures is the count of consecutive failed calls recorded.
func (b *Breaker) Failures() int32 { return b.failures.Load() }

// Open reports whether b is open at now: it opened and its cooldown has
// not passed.
func (b *Breaker) Open(now int64) bool { return b.openUntil.Load() > now }
