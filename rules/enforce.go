package rules

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// Enforcer applies the rules of a set to one request, all or nothing: the
// request is admitted only if every enforcing rule that applies admits it,
// and a rejected request consumes from none of them. The HTTP middleware
// and the gRPC interceptor are built on it. Its fields are read-only once
// in use; it is safe for concurrent use.
//
// With two or more limits, or a leaky bucket, Enforce first peeks at every
// limit in one CheckMany (Hits 0) and rejects without consuming if any
// would reject. Otherwise it consumes from all of them in one CheckMany. If
// a concurrent request made one of them reject in between, it gives back
// what the others consumed, checking them again with limiter.Refund and the
// same Hits, and with the window each consume's decision counted them in
// (limiter.Request.Charged): the limiter gives a window limit's hits back
// to that window only, while the key's state still counts it, never to a
// later window nor to a state the key has since begun under another
// Period or algorithm; a bucket, GCRA or log limit's decision names the
// instant it charged at, and gets back at most what of the hits has not
// drained since, never another request's. Between the consume and the refund, which is one round trip,
// those limits show hits that do not stand: a concurrent request can see
// them and be rejected although, in the end, it would have fitted. The
// window is brief and can only make the limiter stricter, never looser.
type Enforcer struct {
	Limiter sluice.Limiter
	// Shadow makes every rule a shadow rule: decided, reported, never
	// blocking.
	Shadow bool
	// MaxWait is the longest a request waits for a leaky-bucket rule's
	// pacing Delay. A leaky-bucket rule whose delay is longer rejects;
	// with MaxWait 0 a leaky-bucket rule admits only requests that need no
	// delay.
	MaxWait time.Duration
	// After replaces time.After in Wait; nil uses a real timer.
	After func(time.Duration) <-chan time.Time
	// Now is the clock that tells a refund of a window limit (fixed
	// window, sliding window counter) whose consume's decision reported
	// no window (limiter.Decision.Window: a backend that does not report
	// one) whether the window that charged the hits is still the
	// current one; nil uses time.Now.
	Now func() time.Time
	// ClockSkew is the most the clocks of the nodes that own the keys
	// may differ from Now. The hits of a window limit whose consume's
	// decision reported no window are given back only when one window,
	// as Now reads it, holds the instants from ClockSkew before the
	// consume to ClockSkew after the refund; otherwise they stay counted,
	// so that such a refund never lands in a later window than the one
	// that charged them (and gives a hit there that was never taken).
	ClockSkew time.Duration
}

func (e *Enforcer) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Verdict is the outcome of Enforce.
type Verdict struct {
	// Limits has one entry per rule that applied, in set order.
	Limits []Limit
	// Allowed says the request may proceed, after waiting Delay. It is
	// false when a limit rejected it, and when Err is set.
	Allowed bool
	// Delay is the leaky-bucket pacing to wait before proceeding.
	Delay time.Duration
	// RetryAfter is, for a rejected request, how long until it would be
	// admitted if nothing else is consumed meanwhile.
	RetryAfter time.Duration
	// ShadowRejected says a shadow rule rejected the request; it proceeds
	// anyway.
	ShadowRejected bool
	// Refunded says hits were consumed and then given back: a concurrent
	// request got in first, or the wait was abandoned. A window limit's
	// go back to the window that charged them only, while the key's state
	// counts it: its Limit's Decision.Window names that window when they
	// did, and is zero when the window had ended and they stayed there.
	Refunded bool
	// Err is set when the limiter failed for some limit; Allowed is then
	// false and nothing stays consumed (unless giving it back failed too,
	// or the window a hit went into ended before the refund). The caller chooses to let the request through
	// or not.
	Err error

	// charged is when the hits were consumed, as Enforcer.Now read it
	// just before.
	charged time.Time
}

// Limit is one rule's part in a verdict.
type Limit struct {
	Rule     *Rule
	Request  limiter.Request // as consumed: Hits is the request's cost
	Decision sluice.Decision
	// OverCapacity says the request's cost is more than this limit can
	// ever admit (its burst, or Limit for the windows): the limit rejects
	// it without counting it, and Request.Hits is 0 (a peek, for the
	// fields).
	OverCapacity bool
	// MissingKey says the request lacks a part of the rule's key and the
	// rule's Missing is MissingDeny: the limit rejects it without counting
	// it, and Request.Hits is 0 (a peek at the counter those requests
	// would share, for the fields).
	MissingKey bool
	// Rejected says this limit does not admit the request: its decision
	// did not, or a leaky bucket's delay is longer than MaxWait.
	Rejected bool
	// Enforced is false for shadow rules.
	Enforced bool
	// RetryAfter is, when Rejected, how long until this limit would admit
	// the request.
	RetryAfter time.Duration
	// Consumed says the request's hits are counted in this limit.
	Consumed bool
	Err      error
}

// Enforce applies the rules of set that match d to a request costing hits.
func (e *Enforcer) Enforce(ctx context.Context, set *Set, d *Descriptor, hits int64) *Verdict {
	var buf [8]*Rule
	matched := set.AppendMatch(buf[:0], d)
	v := &Verdict{Allowed: true}
	for _, r := range matched {
		req, missing, ok := r.requestFor(d, hits)
		if !ok || missing && r.Missing == MissingSkip {
			continue
		}
		l := Limit{Rule: r, Request: req, Enforced: !e.Shadow && !r.Shadow}
		if missing && r.Missing == MissingDeny {
			l.MissingKey, l.Request.Hits = true, 0
		}
		v.Limits = append(v.Limits, l)
	}
	if len(v.Limits) == 0 {
		return v
	}
	for i := range v.Limits {
		if l := &v.Limits[i]; l.Request.Hits > l.Request.Capacity() {
			l.OverCapacity, l.Request.Hits = true, 0
		}
	}
	// One limit that cannot delay needs no peek: a rejection consumes
	// nothing by itself.
	if len(v.Limits) > 1 || v.Limits[0].Request.Algorithm == limiter.LeakyBucket {
		peek := make([]limiter.Request, len(v.Limits))
		for i := range v.Limits {
			peek[i] = v.Limits[i].Request
			peek[i].Hits = 0
		}
		if !e.decide(ctx, v, peek, false) {
			return v
		}
	}
	reqs := make([]limiter.Request, len(v.Limits))
	for i := range v.Limits {
		reqs[i] = v.Limits[i].Request
	}
	v.charged = e.now()
	if !e.decide(ctx, v, reqs, true) {
		e.refund(ctx, v, false)
		return v
	}
	// A shadow leaky bucket past MaxWait would not have kept its hits.
	e.refund(ctx, v, true)
	for i := range v.Limits {
		if l := &v.Limits[i]; l.Enforced && l.Consumed && l.Decision.Delay > v.Delay {
			v.Delay = l.Decision.Delay
		}
	}
	return v
}

// decide checks reqs and records the decisions in v. It returns whether
// the request can go on: no error and no enforced limit rejected.
func (e *Enforcer) decide(ctx context.Context, v *Verdict, reqs []limiter.Request, consume bool) bool {
	res := e.checkMany(ctx, v, nil, reqs)
	v.ShadowRejected = false
	for i := range res {
		l := &v.Limits[i]
		l.Decision, l.Err, l.Rejected, l.RetryAfter = res[i].Decision, res[i].Err, false, 0
		if l.Err != nil {
			v.Err = errors.Join(v.Err, l.Err)
			continue
		}
		dec := &l.Decision.Decision
		l.Consumed = consume && dec.Allowed && l.Request.Hits > 0
		switch {
		case l.OverCapacity || l.MissingKey:
			l.Rejected, l.RetryAfter = true, 0
		case !dec.Allowed:
			l.Rejected, l.RetryAfter = true, dec.RetryAfter
		case l.Request.Algorithm == limiter.LeakyBucket && dec.Delay > e.MaxWait:
			l.Rejected, l.RetryAfter = true, dec.Delay-e.MaxWait
		}
		if !l.Rejected {
			continue
		}
		if !l.Enforced {
			v.ShadowRejected = true
			continue
		}
		v.Allowed = false
		v.RetryAfter = max(v.RetryAfter, l.RetryAfter)
	}
	if v.Err != nil {
		v.Allowed = false
	}
	return v.Allowed
}

// checkMany runs reqs, those of v.Limits[idx[j]] for each j (every limit
// when idx is nil), through the limiter: one call per unreachable policy,
// and all limits share one in the usual case.
func (e *Enforcer) checkMany(ctx context.Context, v *Verdict, idx []int, reqs []limiter.Request) []sluice.Result {
	policy := func(j int) sluice.Policy {
		if idx != nil {
			j = idx[j]
		}
		return v.Limits[j].Rule.Unreachable
	}
	same := true
	for j := range reqs {
		same = same && policy(j) == policy(0)
	}
	if same {
		return e.Limiter.CheckMany(ctx, reqs, policyOpts(policy(0))...)
	}
	groups := map[sluice.Policy][]int{}
	for j := range reqs {
		groups[policy(j)] = append(groups[policy(j)], j)
	}
	out := make([]sluice.Result, len(reqs))
	var wg sync.WaitGroup
	for p, js := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := make([]limiter.Request, len(js))
			for k, j := range js {
				sub[k] = reqs[j]
			}
			res := e.Limiter.CheckMany(ctx, sub, policyOpts(p)...)
			for k, j := range js {
				out[j] = res[k]
			}
		}()
	}
	wg.Wait()
	return out
}

func policyOpts(p sluice.Policy) []sluice.CheckOption {
	if p == sluice.PolicyDefault {
		return nil
	}
	return []sluice.CheckOption{sluice.OnUnreachable(p)}
}

// Wait waits for v.Delay, the leaky-bucket pacing, or until ctx ends. In
// the second case it gives back what v consumed, marks v not allowed and
// returns ctx's error.
func (e *Enforcer) Wait(ctx context.Context, v *Verdict) error {
	if !v.Allowed || v.Delay <= 0 {
		return nil
	}
	err := limiter.Wait(ctx, limiter.Decision{Allowed: true, Delay: v.Delay}, e.After)
	if err != nil {
		v.Allowed = false
		e.refund(ctx, v, false)
	}
	return err
}

// refund gives back the hits of the consumed limits of v (only of those
// that rejected, with rejectedOnly), even when ctx is already cancelled,
// to the windows their consumes counted them in, and records the
// decisions after the refund. The hits of a window limit whose consume
// reported no window, and whose window may have ended since, stay counted
// (see ClockSkew).
func (e *Enforcer) refund(ctx context.Context, v *Verdict, rejectedOnly bool) {
	var idx []int
	var reqs []limiter.Request
	now := e.now()
	for i := range v.Limits {
		if l := &v.Limits[i]; l.Consumed && (l.Rejected || !rejectedOnly) && e.sameWindow(l, v.charged, now) {
			r := l.Request
			r.Behavior |= limiter.Refund
			r.Charged = l.Decision.Window
			idx = append(idx, i)
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		return
	}
	v.Refunded = true
	// The refund must happen although the caller may have gone away.
	res := e.checkMany(context.WithoutCancel(ctx), v, idx, reqs)
	for j, i := range idx {
		l := &v.Limits[i]
		if res[j].Err != nil {
			if !rejectedOnly { // a failed shadow refund does not fail an admitted request
				v.Err = errors.Join(v.Err, res[j].Err)
			}
			continue
		}
		l.Consumed = false
		retry := l.RetryAfter
		l.Decision = res[j].Decision
		l.Decision.RetryAfter = retry
	}
}

// sameWindow reports whether a refund of l's hits at now, consumed at
// charged, gives them back to the window that counted them: always when
// the consume's decision names that window (the limiter then checks it)
// and for the algorithms without windows; for the windows otherwise, when
// one window holds [charged-ClockSkew, now+ClockSkew].
func (e *Enforcer) sameWindow(l *Limit, charged, now time.Time) bool {
	req := &l.Request
	if !l.Decision.Window.IsZero() || req.Algorithm != limiter.FixedWindow && req.Algorithm != limiter.SlidingWindowCounter {
		return true
	}
	start, end := req.Window(charged.Add(-e.ClockSkew))
	last := now.Add(e.ClockSkew)
	return !last.Before(start) && last.Before(end)
}
