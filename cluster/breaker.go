package cluster

import (
	"sync"
	"sync/atomic"
	"time"
)

// breaker is one peer's circuit breaker. After Threshold consecutive failed
// calls it opens: checks for that peer's keys go straight to the unreachable
// policy, costing no timeout each, until Cooldown has passed; then one call
// is let through as a probe, and its outcome closes the breaker or opens it
// for another Cooldown. All fields are atomics: it sits on the hot path.
type breaker struct {
	failures  atomic.Int32
	openUntil atomic.Int64 // Unix ns; 0 when closed
	probing   atomic.Bool  // a probe call is in flight
}

// closed reports whether the breaker is closed: calls are allowed, at any
// time.
func (b *breaker) closed() bool { return b.openUntil.Load() == 0 }

// allow reports whether a call may be made at now. A breaker open for
// longer than cooldown from now, which only a clock that stepped back
// finds, is open until cooldown from now: a step back holds no peer's keys
// longer than a cooldown.
func (b *breaker) allow(now int64, cooldown time.Duration) bool {
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

// done records a call's outcome; probe says whether the call was the
// half-open probe, which only its own outcome gives back (a call let
// through before the breaker opened may end while the probe is out). now
// is read only when the call failed. A field is written only when it
// changes: while every call succeeds, the callers on every CPU only read
// the breaker. The probe is given back last, so that no other call probes
// before its outcome is in.
func (b *breaker) done(probe, ok bool, now int64, threshold int32, cooldown time.Duration) {
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

// giveBack ends the probe without an outcome: the next call after the
// cooldown probes.
func (b *breaker) giveBack() { b.probing.Store(false) }

// breakers holds one breaker per peer name.
type breakers struct {
	m sync.Map // peer name -> *breaker
}

func (bs *breakers) get(peer string) *breaker {
	if b, ok := bs.m.Load(peer); ok {
		return b.(*breaker)
	}
	b, _ := bs.m.LoadOrStore(peer, new(breaker))
	return b.(*breaker)
}

// forget drops the breakers of peers no longer in the cluster.
func (bs *breakers) forget(keep map[string]string) {
	bs.m.Range(func(k, _ any) bool {
		if _, ok := keep[k.(string)]; !ok {
			bs.m.Delete(k)
		}
		return true
	})
}
