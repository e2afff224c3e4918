package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Errors of this package. Do's errors wrap one of them, or the context's
// error, together with the last error of the Func; test with errors.Is.
var (
	// ErrExhausted means the Func failed on every one of MaxAttempts calls.
	ErrExhausted = errors.New("retry: attempts exhausted")
	// ErrDeadline means the next wait would end after the context's
	// deadline, so Do returned without waiting.
	ErrDeadline = errors.New("retry: next attempt would pass the deadline")
	// ErrInvalidPolicy wraps every error of Policy.Validate.
	ErrInvalidPolicy = errors.New("retry: invalid policy")
)

// Policy says how long to wait between attempts and how many to make.
type Policy struct {
	// Base is the largest delay before the first retry. Positive.
	Base time.Duration
	// Max caps every backoff delay; at least Base. A Retry-After longer than
	// Max is still honoured.
	Max time.Duration
	// MaxAttempts is the most calls of the Func, the first one included;
	// 0 means no bound (until the context ends).
	MaxAttempts int
	// Multiplier is how much the cap grows per retry; at least 1.
	Multiplier float64
}

// DefaultPolicy returns a policy for callers of a rate limiter: caps of
// 100ms, 200ms, 400ms... up to 10s, at most 5 attempts.
func DefaultPolicy() Policy {
	return Policy{Base: 100 * time.Millisecond, Max: 10 * time.Second, MaxAttempts: 5, Multiplier: 2}
}

// Validate reports the first invalid field.
func (p Policy) Validate() error {
	switch {
	case p.Base <= 0:
		return fmt.Errorf("%w: Base %v must be positive", ErrInvalidPolicy, p.Base)
	case p.Max < p.Base:
		return fmt.Errorf("%w: Max %v is below Base %v", ErrInvalidPolicy, p.Max, p.Base)
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidPolicy, p.MaxAttempts)
	case !(p.Multiplier >= 1) || math.IsInf(p.Multiplier, 0):
		return fmt.Errorf("%w: Multiplier %v must be a finite number of at least 1", ErrInvalidPolicy, p.Multiplier)
	}
	return nil
}

// Cap returns the largest backoff delay before retry n (n >= 1):
// min(Max, Base*Multiplier^(n-1)). It returns Base for n < 1.
func (p Policy) Cap(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	c := float64(p.Base) * math.Pow(p.Multiplier, float64(n-1))
	if c >= float64(p.Max) || math.IsInf(c, 0) || math.IsNaN(c) {
		return p.Max
	}
	return time.Duration(c)
}

// Backoff returns the delay before retry n drawn from r: uniform in
// [0, Cap(n)].
func (p Policy) Backoff(n int, r Rand) time.Duration {
	c := p.Cap(n)
	if c <= 0 {
		return 0
	}
	if c == math.MaxInt64 {
		return time.Duration(r.Int64N(int64(c)))
	}
	return time.Duration(r.Int64N(int64(c) + 1))
}

// Func is one attempt. It returns nil when done. Otherwise it may return
// how long the server asked it to wait (0 when it did not say): the next
// attempt is then made no earlier. Wrap an error with Permanent to stop
// retrying.
type Func func(ctx context.Context) (retryAfter time.Duration, err error)

// Rand is a source of random delays; *math/rand/v2.Rand is one. Int64N
// returns a number in [0, n) for n > 0. It must be safe for concurrent use
// if the same one is given to concurrent calls of Do.
type Rand interface {
	Int64N(n int64) int64
}

// Sleep waits d or until ctx ends, returning ctx's error in that case.
type Sleep func(ctx context.Context, d time.Duration) error

// Option changes how Do waits.
type Option func(*options)

type options struct {
	rand  Rand
	sleep Sleep
	now   func() time.Time
}

// WithRand draws the jitter from r instead of math/rand/v2's global
// source.
func WithRand(r Rand) Option { return func(o *options) { o.rand = r } }

// WithSleep makes Do wait with s instead of a timer; a test's s can record
// d and return at once.
func WithSleep(s Sleep) Option { return func(o *options) { o.sleep = s } }

// WithClock makes Do read the time, to compare a wait with the context's
// deadline, from now instead of time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// globalRand draws from math/rand/v2's global source, which is safe for
// concurrent use.
type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// sleepTimer waits on a timer.
func sleepTimer(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do calls fn until it returns nil, returns a Permanent error, has been
// called p.MaxAttempts times or ctx ends; see the package comment for the
// waits. It returns nil on success, the unwrapped error of a Permanent
// one, or an error wrapping both the reason it stopped (ErrExhausted,
// ErrDeadline, ctx.Err()) and fn's last error. An invalid p returns an
// error wrapping ErrInvalidPolicy without calling fn.
func Do(ctx context.Context, p Policy, fn Func, opts ...Option) error {
	if err := p.Validate(); err != nil {
		return err
	}
	o := options{rand: globalRand{}, sleep: sleepTimer, now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	var last error // fn's last error
	for attempt := 1; ; attempt++ {
		if cerr := ctx.Err(); cerr != nil {
			if last == nil {
				return fmt.Errorf("retry: %w before the first attempt", cerr)
			}
			return fmt.Errorf("retry: %w after %d attempts: %w", cerr, attempt-1, last)
		}
		retryAfter, err := fn(ctx)
		if err == nil {
			return nil
		}
		var perm *permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		last = err
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("retry: %w after %d attempts: %w", cerr, attempt, err)
		}
		if p.MaxAttempts > 0 && attempt >= p.MaxAttempts {
			return fmt.Errorf("%w after %d attempts: %w", ErrExhausted, attempt, err)
		}
		wait := max(p.Backoff(attempt, o.rand), retryAfter)
		if deadline, ok := ctx.Deadline(); ok && o.now().Add(wait).After(deadline) {
			return fmt.Errorf("%w (wait %v) after %d attempts: %w", ErrDeadline, wait, attempt, err)
		}
		if serr := o.sleep(ctx, wait); serr != nil {
			cerr := ctx.Err()
			if cerr == nil {
				cerr = serr
			}
			return fmt.Errorf("retry: %w after %d attempts: %w", cerr, attempt, err)
		}
	}
}

// Permanent wraps err so that Do returns it (unwrapped) without retrying.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
