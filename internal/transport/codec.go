package transport

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Bounds on what the codec accepts.
const (
	// MaxTimeZoneLen bounds time_zone, in bytes.
	MaxTimeZoneLen = limiter.MaxZoneNameLen
	// TraceParentLen is the length of a W3C traceparent of version 00,
	// the only one the Peer service carries (RateLimitRequest.traceparent).
	TraceParentLen = 55
	// MaxCachedZones bounds the time zones one Codec keeps loaded. Only
	// names that load are cached, and IANA has about 600.
	MaxCachedZones = 1024
)

// Codec converts requests from their wire form. It caches the time zones it
// has loaded, so that a zone is read from the system's database once, not
// once per request. The zero value is ready to use; a Codec is safe for
// concurrent use and must not be copied after first use. Each server owns
// one unless given one with WithCodec.
type Codec struct {
	zones     sync.Map     // zone name -> *time.Location, only names that loaded
	zoneCount atomic.Int64 // entries in zones, about: a race may add a few more
}

// RequestFromProto converts and validates a request received from the
// wire. Every field is checked: an unknown algorithm or calendar gives an
// error wrapping limiter.ErrUnknownAlgorithm or limiter.ErrInvalidCalendar,
// a time_zone that does not load one wrapping limiter.ErrInvalidCalendar,
// and the result must pass limiter.Request.Validate, whose error is
// returned as is. An absent hits field means 1. A nil m gives an error
// wrapping ErrInvalidArgument. unreachable_policy is not read: see
// PolicyFromProto.
func (c *Codec) RequestFromProto(m *pb.RateLimitRequest) (limiter.Request, error) {
	if m == nil {
		return limiter.Request{}, fmt.Errorf("%w: nil RateLimitRequest", ErrInvalidArgument)
	}
	alg, ok := algorithmFromProto(m.Algorithm)
	if !ok {
		return limiter.Request{}, fmt.Errorf("%w: algorithm %d", limiter.ErrUnknownAlgorithm, int32(m.Algorithm))
	}
	cal, ok := calendarFromProto(m.Calendar)
	if !ok {
		return limiter.Request{}, fmt.Errorf("%w: calendar %d", limiter.ErrInvalidCalendar, int32(m.Calendar))
	}
	if m.PeriodNanos < 0 {
		return limiter.Request{}, fmt.Errorf("%w: period_nanos %d is negative", limiter.ErrInvalidPeriod, m.PeriodNanos)
	}
	hits := int64(1)
	if m.Hits != nil {
		hits = *m.Hits
	}
	var b limiter.Behavior
	if m.Reset_ {
		b |= limiter.Reset
	}
	if m.DrainOverLimit {
		b |= limiter.DrainOverLimit
	}
	if m.Refund {
		b |= limiter.Refund
	}
	if m.Charge {
		// A settlement: counted past the capacity where the algorithm
		// can be, drained (as drain_over_limit asks) where it cannot.
		if b != limiter.DrainOverLimit {
			return limiter.Request{}, fmt.Errorf("%w: charge is sent with drain_over_limit alone", limiter.ErrInvalidBehavior)
		}
		if alg.HasBurst() {
			b = limiter.Charge
		}
	}
	r := limiter.Request{
		Name:      m.Name,
		Key:       m.Key,
		Hits:      hits,
		Limit:     m.Limit,
		Period:    time.Duration(m.PeriodNanos),
		Burst:     m.Burst,
		Algorithm: alg,
		Calendar:  cal,
		Behavior:  b,
		Charged:   limiter.Window{Start: m.ChargedStartUnixNano, End: m.ChargedEndUnixNano},
	}
	if at := m.ChargedAtUnixNano; at != 0 {
		if !r.Charged.IsZero() {
			return limiter.Request{}, fmt.Errorf("%w: charged_at_unix_nano %d beside the charged window [%d, %d)", limiter.ErrInvalidBehavior, at, r.Charged.Start, r.Charged.End)
		}
		r.Charged = limiter.Window{Start: at, End: at}
	}
	if err := r.Validate(); err != nil {
		return limiter.Request{}, err
	}
	loc, err := c.location(m.TimeZone)
	if err != nil {
		return limiter.Request{}, err
	}
	r.Location = loc
	return r, nil
}

// location returns the zone named name: nil for "", from the cache when it
// has loaded before.
func (c *Codec) location(name string) (*time.Location, error) {
	if name == "" {
		return nil, nil
	}
	if v, ok := c.zones.Load(name); ok {
		return v.(*time.Location), nil
	}
	if err := limiter.CheckZoneName(name); err != nil {
		return nil, fmt.Errorf("time_zone: %w", err)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: time_zone %q does not load: %v", limiter.ErrInvalidLocation, name, err)
	}
	if c.zoneCount.Load() < MaxCachedZones {
		if _, loaded := c.zones.LoadOrStore(name, loc); !loaded {
			c.zoneCount.Add(1)
		}
	}
	return loc, nil
}

// RequestToProto returns r in wire form; see EncodeRequest.
func RequestToProto(r limiter.Request) *pb.RateLimitRequest {
	m := new(pb.RateLimitRequest)
	EncodeRequest(m, &r)
	return m
}

// EncodeRequest overwrites every field of dst with r, so that callers may
// reuse dst. Hits of 1 is sent as an absent field. The Location is sent by
// name (nil as ""); unreachable_policy is set to UNSPECIFIED. Invalid
// values are sent as they are and rejected by the receiver.
func EncodeRequest(dst *pb.RateLimitRequest, r *limiter.Request) {
	dst.Name = r.Name
	dst.Key = r.Key
	if r.Hits == 1 {
		dst.Hits = nil
	} else {
		h := r.Hits
		dst.Hits = &h
	}
	dst.Limit = r.Limit
	dst.PeriodNanos = int64(r.Period)
	dst.Burst = r.Burst
	dst.Algorithm = algorithmToProto(r.Algorithm)
	dst.Calendar = calendarToProto(r.Calendar)
	dst.TimeZone = ""
	if r.Location != nil {
		dst.TimeZone = r.Location.String()
	}
	dst.Reset_ = r.Behavior&limiter.Reset != 0
	dst.DrainOverLimit = r.Behavior&limiter.DrainOverLimit != 0
	dst.Refund = r.Behavior&limiter.Refund != 0
	// A charge goes with drain_over_limit, which an owner that does not
	// know charge applies instead.
	dst.Charge = r.Behavior&limiter.Charge != 0
	dst.DrainOverLimit = dst.DrainOverLimit || dst.Charge
	dst.ChargedStartUnixNano, dst.ChargedEndUnixNano, dst.ChargedAtUnixNano = chargedToProto(r.Charged)
	dst.UnreachablePolicy = pb.UnreachablePolicy_UNREACHABLE_POLICY_UNSPECIFIED
}

// DecisionToProto returns d in wire form, with no owner and no error.
func DecisionToProto(d limiter.Decision) *pb.RateLimitResponse {
	m := new(pb.RateLimitResponse)
	EncodeResult(m, &Result{Decision: sluice.Decision{Decision: d}})
	return m
}

// EncodeResult overwrites every field of dst with r: the decision, or, when
// r.Err is set, zero decision fields and the error (see ErrorToProto). The
// owner is made valid UTF-8, which proto3 requires.
func EncodeResult(dst *pb.RateLimitResponse, r *Result) {
	d := &r.Decision.Decision
	if r.Err != nil {
		d = &limiter.Decision{}
	}
	dst.Allowed = d.Allowed
	dst.Limit = d.Limit
	dst.Remaining = d.Remaining
	dst.ResetAtUnixNano = unixNano(d.ResetAt)
	dst.RetryAfterNanos = int64(d.RetryAfter)
	dst.DelayNanos = int64(d.Delay)
	dst.WindowStartUnixNano, dst.WindowEndUnixNano, dst.ChargedAtUnixNano = chargedToProto(d.Window)
	dst.Owner = cleanText(r.Owner, math.MaxInt)
	dst.WithoutOwner = r.WithoutOwner
	dst.ErrorCode, dst.ErrorMessage = ErrorToProto(r.Err)
}

// chargedToProto is w in wire form: a window as its start and end, an
// instant (Start == End) as charged_at, which a build that reads only the
// window ignores, where an empty window would fail its checks.
func chargedToProto(w limiter.Window) (start, end, at int64) {
	if w.Start == w.End {
		return 0, 0, w.Start
	}
	return w.Start, w.End, 0
}

// unixNano returns t in nanoseconds since the epoch, 0 for the zero time,
// clamped to the int64 range.
func unixNano(t time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case t.Unix() >= math.MaxInt64/int64(time.Second):
		return math.MaxInt64
	case t.Unix() <= math.MinInt64/int64(time.Second):
		return math.MinInt64
	}
	return t.UnixNano()
}

// DecisionFromProto returns the decision m carries, or the per-item error
// it carries (see ErrorFromProto), or an error wrapping
// ErrMalformedResponse when a field is out of range: limit or remaining
// outside [0, limiter.MaxLimit], a negative retry_after_nanos or
// delay_nanos, an empty window, a window beside charged_at_unix_nano, or a nil m. A reset_at_unix_nano of 0 gives the zero time;
// other instants are in UTC.
func DecisionFromProto(m *pb.RateLimitResponse) (limiter.Decision, error) {
	if m == nil {
		return limiter.Decision{}, fmt.Errorf("%w: nil RateLimitResponse", ErrMalformedResponse)
	}
	if err := ErrorFromProto(m.ErrorCode, m.ErrorMessage); err != nil {
		return limiter.Decision{}, err
	}
	switch {
	case m.Limit < 0 || m.Limit > limiter.MaxLimit:
		return limiter.Decision{}, fmt.Errorf("%w: limit %d is outside [0, %d]", ErrMalformedResponse, m.Limit, int64(limiter.MaxLimit))
	case m.Remaining < 0 || m.Remaining > limiter.MaxLimit:
		return limiter.Decision{}, fmt.Errorf("%w: remaining %d is outside [0, %d]", ErrMalformedResponse, m.Remaining, int64(limiter.MaxLimit))
	case m.RetryAfterNanos < 0:
		return limiter.Decision{}, fmt.Errorf("%w: retry_after_nanos %d is negative", ErrMalformedResponse, m.RetryAfterNanos)
	case m.DelayNanos < 0:
		return limiter.Decision{}, fmt.Errorf("%w: delay_nanos %d is negative", ErrMalformedResponse, m.DelayNanos)
	case m.WindowStartUnixNano != 0 || m.WindowEndUnixNano != 0:
		if m.WindowStartUnixNano >= m.WindowEndUnixNano {
			return limiter.Decision{}, fmt.Errorf("%w: window [%d, %d) is empty", ErrMalformedResponse, m.WindowStartUnixNano, m.WindowEndUnixNano)
		}
		if m.ChargedAtUnixNano != 0 {
			return limiter.Decision{}, fmt.Errorf("%w: charged_at_unix_nano %d beside the window [%d, %d)", ErrMalformedResponse, m.ChargedAtUnixNano, m.WindowStartUnixNano, m.WindowEndUnixNano)
		}
	}
	d := limiter.Decision{
		Allowed:    m.Allowed,
		Limit:      m.Limit,
		Remaining:  m.Remaining,
		RetryAfter: time.Duration(m.RetryAfterNanos),
		Delay:      time.Duration(m.DelayNanos),
		Window:     limiter.Window{Start: m.WindowStartUnixNano, End: m.WindowEndUnixNano},
	}
	if at := m.ChargedAtUnixNano; at != 0 {
		d.Window = limiter.Window{Start: at, End: at}
	}
	if m.ResetAtUnixNano != 0 {
		d.ResetAt = time.Unix(0, m.ResetAtUnixNano).UTC()
	}
	return d, nil
}

// ResultFromProto returns the result m carries: Owner and WithoutOwner, and
// the decision or error as DecisionFromProto returns them.
func ResultFromProto(m *pb.RateLimitResponse) Result {
	d, err := DecisionFromProto(m)
	if m == nil {
		return Result{Err: err}
	}
	return Result{Decision: sluice.Decision{Decision: d, Owner: m.Owner, WithoutOwner: m.WithoutOwner}, Err: err}
}

// The enums of limiter and of the wire are mapped field by field, so that
// renumbering either side cannot go unnoticed.
var (
	algorithmsToProto = [...]pb.Algorithm{
		limiter.TokenBucket:          pb.Algorithm_ALGORITHM_TOKEN_BUCKET,
		limiter.LeakyBucket:          pb.Algorithm_ALGORITHM_LEAKY_BUCKET,
		limiter.FixedWindow:          pb.Algorithm_ALGORITHM_FIXED_WINDOW,
		limiter.SlidingWindowLog:     pb.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG,
		limiter.SlidingWindowCounter: pb.Algorithm_ALGORITHM_SLIDING_WINDOW_COUNTER,
		limiter.GCRA:                 pb.Algorithm_ALGORITHM_GCRA,
	}
	algorithmsFromProto = [...]limiter.Algorithm{
		pb.Algorithm_ALGORITHM_TOKEN_BUCKET:           limiter.TokenBucket,
		pb.Algorithm_ALGORITHM_LEAKY_BUCKET:           limiter.LeakyBucket,
		pb.Algorithm_ALGORITHM_FIXED_WINDOW:           limiter.FixedWindow,
		pb.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG:     limiter.SlidingWindowLog,
		pb.Algorithm_ALGORITHM_SLIDING_WINDOW_COUNTER: limiter.SlidingWindowCounter,
		pb.Algorithm_ALGORITHM_GCRA:                   limiter.GCRA,
	}
	calendarsToProto = [...]pb.Calendar{
		limiter.NoCalendar: pb.Calendar_CALENDAR_NONE,
		limiter.Minute:     pb.Calendar_CALENDAR_MINUTE,
		limiter.Hour:       pb.Calendar_CALENDAR_HOUR,
		limiter.Day:        pb.Calendar_CALENDAR_DAY,
		limiter.Week:       pb.Calendar_CALENDAR_WEEK,
		limiter.Month:      pb.Calendar_CALENDAR_MONTH,
		limiter.Year:       pb.Calendar_CALENDAR_YEAR,
	}
	calendarsFromProto = [...]limiter.Calendar{
		pb.Calendar_CALENDAR_NONE:   limiter.NoCalendar,
		pb.Calendar_CALENDAR_MINUTE: limiter.Minute,
		pb.Calendar_CALENDAR_HOUR:   limiter.Hour,
		pb.Calendar_CALENDAR_DAY:    limiter.Day,
		pb.Calendar_CALENDAR_WEEK:   limiter.Week,
		pb.Calendar_CALENDAR_MONTH:  limiter.Month,
		pb.Calendar_CALENDAR_YEAR:   limiter.Year,
	}
)

func algorithmFromProto(a pb.Algorithm) (limiter.Algorithm, bool) {
	if a <= 0 || int(a) >= len(algorithmsFromProto) {
		return 0, false
	}
	return algorithmsFromProto[a], true
}

// algorithmToProto maps a; an invalid a is sent as its number, which no
// wire value uses, so that the receiver rejects it.
func algorithmToProto(a limiter.Algorithm) pb.Algorithm {
	if a == 0 || int(a) >= len(algorithmsToProto) {
		return pb.Algorithm(a)
	}
	return algorithmsToProto[a]
}

func calendarFromProto(c pb.Calendar) (limiter.Calendar, bool) {
	if c < 0 || int(c) >= len(calendarsFromProto) {
		return 0, false
	}
	return calendarsFromProto[c], true
}

func calendarToProto(c limiter.Calendar) pb.Calendar {
	if int(c) >= len(calendarsToProto) {
		return pb.Calendar(c)
	}
	return calendarsToProto[c]
}

// PolicyFromProto converts p; an unknown value gives an error wrapping
// ErrInvalidArgument.
func PolicyFromProto(p pb.UnreachablePolicy) (sluice.Policy, error) {
	switch p {
	case pb.UnreachablePolicy_UNREACHABLE_POLICY_UNSPECIFIED:
		return sluice.PolicyDefault, nil
	case pb.UnreachablePolicy_UNREACHABLE_POLICY_LOCAL:
		return sluice.PolicyLocal, nil
	case pb.UnreachablePolicy_UNREACHABLE_POLICY_ALLOW:
		return sluice.PolicyAllow, nil
	case pb.UnreachablePolicy_UNREACHABLE_POLICY_DENY:
		return sluice.PolicyDeny, nil
	}
	return 0, fmt.Errorf("%w: unreachable_policy %d", ErrInvalidArgument, int32(p))
}

// PolicyToProto converts p; an unknown p is sent as its number, which the
// receiver rejects.
func PolicyToProto(p sluice.Policy) pb.UnreachablePolicy {
	switch p {
	case sluice.PolicyDefault:
		return pb.UnreachablePolicy_UNREACHABLE_POLICY_UNSPECIFIED
	case sluice.PolicyLocal:
		return pb.UnreachablePolicy_UNREACHABLE_POLICY_LOCAL
	case sluice.PolicyAllow:
		return pb.UnreachablePolicy_UNREACHABLE_POLICY_ALLOW
	case sluice.PolicyDeny:
		return pb.UnreachablePolicy_UNREACHABLE_POLICY_DENY
	}
	return pb.UnreachablePolicy(p)
}
