package envoyrls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// RulesSource gives the rules in force. Current is called once per
// request and must be safe for concurrent use; a nil result is no rules.
// A *Watcher is one.
type RulesSource interface {
	Current() *Rules
}

// Static is a RulesSource that always gives Rules.
type Static struct{ Rules *Rules }

// Current returns s.Rules.
func (s Static) Current() *Rules { return s.Rules }

var _ RulesSource = Static{}

// HeaderNames are the response headers that carry the limit closest to
// being reached: its requests per unit, what remains of it, and the
// seconds until its window resets.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// DraftHeaders are RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset, the names of draft-ietf-httpapi-ratelimit-headers up
// to its revision 03 and envoyproxy/ratelimit's defaults with
// LIMIT_RESPONSE_HEADERS_ENABLED.
func DraftHeaders() *HeaderNames {
	return &HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
}

// XRateLimitHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset.
func XRateLimitHeaders() *HeaderNames {
	return &HeaderNames{Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", Reset: "X-RateLimit-Reset"}
}

// Alignment says where the windows of weeks, months and years begin.
// Seconds, minutes, hours and days are aligned either way to multiples of
// their length since the Unix epoch: UTC's calendar minutes, hours and
// days, as envoyproxy/ratelimit aligns them.
type Alignment uint8

const (
	// AlignCalendar counts weeks (ISO, from Monday), months and years of
	// the UTC calendar.
	AlignCalendar Alignment = iota
	// AlignEpoch counts them as envoyproxy/ratelimit does: blocks of 7,
	// 30 and 365 days since the Unix epoch (weeks from Thursday; months
	// and years drifting from the calendar's).
	AlignEpoch
)

// Hit is what one request descriptor did to its limit, in the terms of
// envoyproxy/ratelimit's statistics.
type Hit struct {
	// Domain is the request's; Key the limit's metric key (Match.MetricKey).
	Domain, Key string
	// TotalHits is the descriptor's hits. As envoyproxy/ratelimit counts
	// them: an admitted request's hits are WithinLimit, those of them
	// above the near-limit threshold (Config.NearLimitRatio of the limit)
	// NearLimit too; a request over counts its hits beyond the limit
	// OverLimit (all of them when the window was full already) and those
	// between the threshold and the limit NearLimit. ShadowMode counts
	// the OverLimit hits of a shadow-mode limit, reported OK.
	TotalHits, WithinLimit, NearLimit, OverLimit, ShadowMode uint64
}

// Config configures a Service. Start from DefaultConfig.
type Config struct {
	// Limiter counts the hits: a cluster.Node counts them exactly across
	// its cluster.
	Limiter sluice.Limiter
	// Rules gives the configuration; a *Watcher keeps a directory's
	// current.
	Rules RulesSource
	// Headers, when set, adds the limit closest to being reached to each
	// response's response_headers_to_add under these names.
	Headers *HeaderNames
	// Alignment places the windows of weeks, months and years.
	Alignment Alignment
	// NearLimitRatio is the share of a limit above which admitted hits
	// count as near the limit, in [0, 1].
	NearLimitRatio float64
	// MaxDescriptors bounds the descriptors of one request, and
	// MaxEntries the entries of one descriptor; a request beyond either
	// is refused with InvalidArgument.
	MaxDescriptors, MaxEntries int
	// ShadowMode answers every request OK overall, as envoyproxy/
	// ratelimit's SHADOW_MODE: the descriptors are counted and their
	// statuses, the response headers and OnHit still say what would have
	// happened; OnGlobalShadow is called for each request so turned OK.
	ShadowMode bool
	// QuotaMode puts every descriptor in quota mode, as QUOTA_MODE: the
	// request is over only when all of its descriptors are, but for the
	// unlimited ones (one that matches no limit is never over).
	QuotaMode bool
	// DynamicMetadata adds envoyproxy/ratelimit's dynamic_metadata to each
	// response (RESPONSE_DYNAMIC_METADATA): the domain, the descriptors'
	// entries, limits and hits_addend, the request's hits_addend, and the
	// metadata of the configured descriptors that were not over.
	DynamicMetadata bool
	// ExactReset gives duration_until_reset to the nanosecond. Otherwise
	// it is whole seconds rounded up, as envoyproxy/ratelimit computes it
	// (the unit's length less the seconds elapsed in its window, never 0):
	// Envoy's X-RateLimit-Reset header reads only the seconds.
	ExactReset bool
	// StopIncrementOverLimit, as STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
	// charges only the descriptors over when a request is over on any
	// (a limit of 0 with hits, or a check of 0 hits on a window a request
	// went past, included): the hits admitted on its other descriptors
	// are given back, and their statuses report the remaining without
	// them, as upstream increments only the counters that go over.
	// Either way a descriptor over leaves its window full and past the
	// limit until it ends (a check of 0 then is OVER_LIMIT), as
	// envoyproxy/ratelimit's counter going past the limit does;
	// otherwise every descriptor is charged on its own.
	StopIncrementOverLimit bool
	// OnHit, when set, is called with each descriptor's Hit, for metrics.
	// It is called on the request's goroutine and must not block. The Hit
	// is the request's: OnHit must not keep it (a copy may be kept).
	OnHit func(*Hit)
	// OnUnknownDomain, when set, is called with the domain of each
	// request that names no configured domain (answered OK); and
	// OnGlobalShadow with the domain of each request that ShadowMode
	// turned OK. Both are called on the request's goroutine and must not
	// block.
	OnUnknownDomain, OnGlobalShadow func(domain string)
	// Now is the clock of duration_until_reset and the reset header; it
	// should be the Limiter's. nil is time.Now.
	Now func() time.Time
}

// DefaultConfig returns a config with the near-limit ratio of
// envoyproxy/ratelimit (0.8), no response headers, calendar alignment,
// and room for 64 descriptors of 32 entries per request. Limiter and
// Rules must be set.
func DefaultConfig() Config {
	return Config{NearLimitRatio: 0.8, MaxDescriptors: 64, MaxEntries: 32}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidServiceConfig}, a...)...)
	}
	switch {
	case c.Limiter == nil:
		return bad("Limiter is nil")
	case c.Rules == nil:
		return bad("Rules is nil")
	case !(c.NearLimitRatio >= 0 && c.NearLimitRatio <= 1):
		return bad("NearLimitRatio %v is outside [0, 1]", c.NearLimitRatio)
	case c.MaxDescriptors < 1 || c.MaxEntries < 1:
		return bad("MaxDescriptors %d and MaxEntries %d must be at least 1", c.MaxDescriptors, c.MaxEntries)
	case c.Alignment > AlignEpoch:
		return bad("Alignment %d is unknown", c.Alignment)
	case c.Headers != nil && (c.Headers.Limit == "" || c.Headers.Remaining == "" || c.Headers.Reset == ""):
		return bad("a header name is empty")
	}
	return nil
}

// Service is Envoy's rate limit service, envoy.service.ratelimit.v3.
// RateLimitService, over a sluice.Limiter. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg Config
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New validates cfg and returns a Service with its own copy.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Headers != nil {
		h := *cfg.Headers
		cfg.Headers = &h
	}
	return &Service{cfg: cfg}, nil
}

// Register adds the service to a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) { r.RegisterService(&serviceDesc, s) }

// ShouldRateLimit decides a request at the time Config.Now gives.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.ShouldRateLimitAt(ctx, req, s.cfg.Now())
}

// names of the limiter.Requests, by unit.
var limitNames = func() map[Unit]string {
	m := make(map[Unit]string)
	for u := Second; u <= Week; u++ {
		m[u] = "envoy/" + u.String()
	}
	return m
}()

// item is one request descriptor on its way to a status.
type item struct {
	match   Match
	limit   *RateLimit // nil: OK with no limit
	hits    uint64
	shadow  bool
	quota   bool
	counted int // index of its limiter.Request, or -1
	// mark is the index of the request reading its window's over mark
	// (see overMarkKey), or -1
	mark int
	// over: its hits went past the limit, or, of 0 hits, the window is
	// full (of a limit of 0: empty) and marked; refunded: they were given back
	// (Config.StopIncrementOverLimit)
	over, refunded bool
}

// ShouldRateLimitAt decides a request; now is the time of
// duration_until_reset and of the reset header. Each descriptor is
// matched against the request's domain (see Domain.Match), or takes the
// limit Envoy sent with it, and counted with its hits_addend (or the
// request's, at least 1) in a fixed window of its limit's unit. A domain
// or descriptor with no configured limit is OK with no current_limit.
// A request without a domain or descriptors, with a nil descriptor, or
// beyond Config.MaxDescriptors or MaxEntries, fails with InvalidArgument; a
// limiter failure with Unavailable (or the context's code).
func (s *Service) ShouldRateLimitAt(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time) (*rlsv3.RateLimitResponse, error) {
	switch {
	case req.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "envoyrls: the rate limit domain is empty")
	case len(req.Descriptors) == 0:
		return nil, status.Error(codes.InvalidArgument, "envoyrls: the request has no descriptors")
	case len(req.Descriptors) > s.cfg.MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "envoyrls: %d descriptors, more than %d", len(req.Descriptors), s.cfg.MaxDescriptors)
	}
	domain, _ := s.cfg.Rules.Current().Domain(req.Domain)
	if domain == nil && s.cfg.OnUnknownDomain != nil {
		s.cfg.OnUnknownDomain(req.Domain)
	}
	// The items, entries and paths of a request of a few descriptors of
	// a few entries each, the usual, take no allocation.
	sc := scratchPool.Get().(*scratch)
	defer sc.free()
	items := sc.items[:0]
	if n := len(req.Descriptors); n <= len(sc.items) {
		items = sc.items[:n]
	} else {
		items = make([]item, n)
	}
	entries, hops := sc.entries[:], sc.hops[:]
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		var es []Entry
		var hs []hop
		if n := len(d.GetEntries()); n <= len(entries) {
			es, entries = entries[:n:n], entries[n:]
			hs, hops = hops[:n:n], hops[n:]
		}
		it, err := s.resolve(req, d, domain, es, hs)
		if err != nil {
			return nil, err
		}
		if it.limit != nil {
			for _, r := range it.limit.Replaces {
				if replaced == nil {
					replaced = make(map[string]bool)
				}
				replaced[r] = true
			}
		}
		items[i] = it
	}
	var reqs []limiter.Request
	for i := range items {
		it := &items[i]
		// An unlimited limit stays unlimited, replaced or not, as
		// upstream sets unlimited descriptors aside before replacing.
		if it.limit != nil && !it.limit.Unlimited && it.limit.Name != "" && replaced[it.limit.Name] {
			it.limit = nil
		}
		if l := it.limit; l != nil && !l.Unlimited && l.RequestsPerUnit > 0 {
			it.counted = len(reqs)
			reqs = append(reqs, s.request(it, l))
		}
	}
	// A check of 0 hits reads its window's over mark too, in either
	// mode: upstream's counter past the limit answers it OVER_LIMIT, and
	// with StopIncrementOverLimit stops the other descriptors' charges.
	// A limit of 0 has no counter, only its mark.
	zeroCharged := false // a limit of 0 with hits: its mark is charged
	for i := range items {
		it := &items[i]
		if it.hits == 0 && (it.counted >= 0 || it.zeroLimit()) {
			it.mark = len(reqs)
			reqs = append(reqs, s.markRequest(it, 0))
		}
		zeroCharged = zeroCharged || (it.hits > 0 && it.zeroLimit())
	}
	var results []sluice.Result
	if len(reqs) > 0 || zeroCharged {
		var err error
		if results, err = s.check(ctx, items, reqs); err != nil {
			return nil, err
		}
	}
	return s.respond(req, items, results, now, &sc.hit), nil
}

// scratch is the space of the items of one request, and of the Hit
// given to Config.OnHit.
type scratch struct {
	items   [2]item
	entries [8]Entry
	hops    [8]hop
	hit     Hit
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// free clears sc, which keeps no request's memory, and pools it.
func (sc *scratch) free() {
	*sc = scratch{}
	scratchPool.Put(sc)
}

// check counts reqs, the requests of the counted items, and returns their
// results. A descriptor over its limit leaves its window full, as
// envoyproxy/ratelimit's counter going past the limit does: the requests
// are decided without DrainOverLimit, so that a rejected one reports what
// was left before it (the statistics of a request that straddles the
// limit need it), and those rejected with room left are drained after.
// With StopIncrementOverLimit, when a descriptor is over, the hits of the
// others are given back, as upstream increments only the counters that
// go over.
func (s *Service) check(ctx context.Context, items []item, reqs []limiter.Request) ([]sluice.Result, error) {
	var results []sluice.Result
	if len(reqs) > 0 {
		results = s.cfg.Limiter.CheckMany(ctx, reqs)
	}
	var again, marks []limiter.Request
	anyOver := false
	for i := range items {
		it := &items[i]
		if it.zeroLimit() {
			// Any hit is over; 0 hits are over once a hit was in the
			// window, as upstream's counter of a limit of 0 is then past
			// it. An unread mark decides on the hits alone.
			it.over = it.hits > 0
			if it.mark >= 0 {
				m := results[it.mark]
				it.over = m.Err == nil && m.Decision.Remaining == 0
			}
			if it.hits > 0 {
				marks = append(marks, s.markRequest(it, 1))
			}
			anyOver = anyOver || it.over
			continue
		}
		if it.counted < 0 {
			continue
		}
		r := results[it.counted]
		if r.Err != nil {
			return nil, limiterError(r.Err)
		}
		_, after := it.counts(r.Decision.Decision)
		it.over = after > uint64(it.limit.RequestsPerUnit)
		if it.mark >= 0 {
			// Full and marked: a request went past the limit in this
			// window (a reset of the key empties the window). The mark
			// is best effort: unread, the check is decided on the window.
			m := results[it.mark]
			it.over = m.Err == nil && m.Decision.Remaining == 0 && r.Decision.Remaining == 0
		}
		if it.over && it.hits > 0 {
			marks = append(marks, s.markRequest(it, 1))
		}
		anyOver = anyOver || it.over
		if it.over && !r.Decision.Allowed && r.Decision.Remaining > 0 {
			drain := reqs[it.counted]
			drain.Hits, drain.Behavior = r.Decision.Remaining, limiter.DrainOverLimit
			again = append(again, drain)
		}
	}
	if s.cfg.StopIncrementOverLimit && anyOver {
		for i := range items {
			it := &items[i]
			if it.counted >= 0 && !it.over && results[it.counted].Decision.Allowed && reqs[it.counted].Hits > 0 {
				it.refunded = true
				refund := reqs[it.counted]
				refund.Behavior = limiter.Refund
				refund.Charged = results[it.counted].Decision.Window
				again = append(again, refund)
			}
		}
	}
	if len(again)+len(marks) > 0 {
		// What the first decisions said stands: a failure here leaves a
		// window less full than envoyproxy/ratelimit's would be, and
		// fails the request as the first would; a mark not charged only
		// lets a later check of 0 see the window as exactly full.
		n := len(again)
		for i, r := range s.cfg.Limiter.CheckMany(ctx, append(again, marks...)) {
			if r.Err != nil && i < n {
				return nil, limiterError(r.Err)
			}
		}
	}
	return results, nil
}

// overMarkKey is the key of the over mark of the counter key: a fixed
// window of 1 charged, beside the counter's window, by each request that
// goes past the limit (of a limit of 0, by each request of any hits). A
// check of 0 hits on a full window is OVER_LIMIT when the mark is set, OK
// otherwise, as envoyproxy/ratelimit's counter is past the limit, or
// exactly at it: the window itself never holds more than the limit, and
// a limit of 0 has no window. No counter key ends in "|over" (an entry has '='
// or '~').
func overMarkKey(key string) string {
	const suffix = "|over"
	if len(key)+len(suffix) <= MaxCounterKeyLen {
		return key + suffix
	}
	sum := sha256.Sum256([]byte(key + suffix))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// zeroLimit reports whether it has a limit of 0 per unit: no counter,
// every hit over.
func (it *item) zeroLimit() bool {
	return it.limit != nil && !it.limit.Unlimited && it.limit.RequestsPerUnit == 0
}

// markRequest is the request of hits (0 reads, 1 charges) on the over
// mark of it's counter, in its limit's window.
func (s *Service) markRequest(it *item, hits int64) limiter.Request {
	r := s.request(it, it.limit)
	r.Key, r.Hits, r.Limit = overMarkKey(r.Key), hits, 1
	return r
}

// counts returns the hits the window of it held before and after its
// request, as envoyproxy/ratelimit's counter would: after is before plus
// the descriptor's hits, whether admitted or not, at most MaxUint64 (a
// hits_addend is Envoy's uint64: the sum must not wrap to a figure under
// the limit).
func (it *item) counts(d limiter.Decision) (before, after uint64) {
	limit := uint64(it.limit.RequestsPerUnit)
	left := uint64(max(d.Remaining, 0))
	used := limit - min(left, limit)
	if d.Allowed && it.hits > 0 {
		// The request's hits (at most the limit) are in used.
		used -= min(it.hits, limit, used)
	}
	if it.hits > math.MaxUint64-used {
		return used, math.MaxUint64
	}
	return used, used + it.hits
}

// resolve finds the limit of descriptor d of req, its entries in
// entrySpace and its match's path in hopSpace when they have room.
func (s *Service) resolve(req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor, domain *Domain, entrySpace []Entry, hopSpace []hop) (item, error) {
	it := item{counted: -1, mark: -1, hits: uint64(max(req.HitsAddend, 1))}
	if d == nil { // only a caller in this process can send one
		return it, status.Error(codes.InvalidArgument, "envoyrls: a descriptor is null")
	}
	if h := d.GetHitsAddend(); h != nil {
		it.hits = h.Value
	}
	if len(d.GetEntries()) > s.cfg.MaxEntries {
		return it, status.Errorf(codes.InvalidArgument, "envoyrls: a descriptor has %d entries, more than %d", len(d.Entries), s.cfg.MaxEntries)
	}
	if domain == nil {
		return it, nil
	}
	entries := entrySpace
	if len(entries) < len(d.Entries) {
		entries = make([]Entry, len(d.Entries))
	}
	entries = entries[:len(d.Entries)]
	for j, e := range d.Entries {
		entries[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	if o := d.GetLimit(); o != nil {
		// A limit Envoy sends wins over the configuration, and is never
		// in shadow mode, as with envoyproxy/ratelimit. Its unit of 7
		// is a week, as upstream casts it to RateLimitResponse's units.
		u := Unit(o.Unit)
		if !u.Valid() {
			return it, status.Errorf(codes.InvalidArgument, "envoyrls: a descriptor's limit has unit %v", o.Unit)
		}
		it.match = Match{domain: domain.Name, entries: entries}
		it.limit = &RateLimit{Unit: u, RequestsPerUnit: o.RequestsPerUnit}
		return it, nil
	}
	it.match = domain.match(entries, hopSpace)
	if ds := it.match.Descriptor; ds != nil {
		it.limit, it.shadow, it.quota = ds.RateLimit, ds.ShadowMode, ds.QuotaMode
	}
	return it, nil
}

// request is the limiter.Request that counts it under limit l, in a
// fixed window (check drains it when the request is over). A
// descriptor's hits beyond the limit could never be admitted: they take
// all of the window.
func (s *Service) request(it *item, l *RateLimit) limiter.Request {
	r := limiter.Request{
		Name:      limitNames[l.Unit],
		Key:       it.match.CounterKey(),
		Hits:      int64(min(it.hits, uint64(l.RequestsPerUnit))),
		Limit:     int64(l.RequestsPerUnit),
		Algorithm: limiter.FixedWindow,
	}
	r.Period, r.Calendar = s.window(l.Unit)
	return r
}

// window returns the window of unit u: a period aligned to the epoch, or
// a calendar unit of UTC.
func (s *Service) window(u Unit) (time.Duration, limiter.Calendar) {
	const day = 24 * time.Hour
	switch u {
	case Second:
		return time.Second, limiter.NoCalendar
	case Minute:
		return time.Minute, limiter.NoCalendar
	case Hour:
		return time.Hour, limiter.NoCalendar
	case Day:
		return day, limiter.NoCalendar
	}
	if s.cfg.Alignment == AlignEpoch {
		switch u {
		case Week:
			return 7 * day, limiter.NoCalendar
		case Month:
			return 30 * day, limiter.NoCalendar
		}
		return 365 * day, limiter.NoCalendar
	}
	switch u {
	case Week:
		return 0, limiter.Week
	case Month:
		return 0, limiter.Month
	}
	return 0, limiter.Year
}

// windowEnd returns when the window of unit u that holds now ends.
func (s *Service) windowEnd(u Unit, now time.Time) time.Time {
	p, cal := s.window(u)
	if cal == limiter.NoCalendar {
		ns := now.UnixNano()
		start := ns - ((ns%int64(p))+int64(p))%int64(p)
		return time.Unix(0, start+int64(p))
	}
	t := now.UTC()
	y, m, d := t.Date()
	switch cal {
	case limiter.Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		return time.Date(y, m, d-back+7, 0, 0, 0, 0, time.UTC)
	case limiter.Month:
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(y+1, 1, 1, 0, 0, 0, 0, time.UTC)
}

// limiterError is the gRPC status of a limiter failure.
func limiterError(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Errorf(codes.Unavailable, "envoyrls: %v", err)
}

// respond builds the response from the items and the limiter's results.
// hit is the space of the Hit given to Config.OnHit.
func (s *Service) respond(req *rlsv3.RateLimitRequest, items []item, results []sluice.Result, now time.Time, hit *Hit) *rlsv3.RateLimitResponse {
	// The messages of the response, allocated together: one allocation
	// for a request of one descriptor.
	var resp *rlsv3.RateLimitResponse
	var space []statusSpace
	if len(items) == 1 {
		one := new(oneResponse)
		resp, space = &one.resp, one.space[:]
		resp.Statuses = one.statuses[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
		space = make([]statusSpace, len(items))
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	var closestReset time.Time
	quotas, quotasOver := 0, 0
	for i := range items {
		it := &items[i]
		sp := &space[i]
		st := &sp.status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		l := it.limit
		switch {
		case l == nil:
			// Global quota mode counts a descriptor without a limit
			// among the quota descriptors, never over, as upstream's
			// QUOTA_MODE does: a request with one is never over on
			// quotas. An unlimited one is not counted.
			if s.cfg.QuotaMode {
				quotas++
			}
			continue
		case l.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		var before, after uint64
		if it.counted >= 0 {
			before, after = it.counts(results[it.counted].Decision.Decision)
			if it.refunded {
				// Reported uncharged, as upstream's counter incremented by
				// 0: its hits end at the count and are within the limit.
				before, after = before-min(it.hits, before), before
			}
		} else { // a limit of 0 per unit
			after = it.hits
		}
		limit := uint64(l.RequestsPerUnit)
		over := after > limit || it.over
		sp.limit.Name, sp.limit.RequestsPerUnit, sp.limit.Unit = l.Name, l.RequestsPerUnit, rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)
		st.CurrentLimit = &sp.limit
		if !over {
			st.LimitRemaining = uint32(limit - after)
		}
		reset := s.windowEnd(l.Unit, now)
		if it.counted >= 0 {
			reset = s.resetOf(l.Unit, results[it.counted].Decision.Decision, now)
		}
		until := s.untilReset(reset, now)
		sp.reset.Seconds, sp.reset.Nanos = int64(until/time.Second), int32(until%time.Second) // as durationpb.New
		st.DurationUntilReset = &sp.reset
		if over && !it.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if it.quota || s.cfg.QuotaMode {
			quotas++
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				quotasOver++
			}
		} else if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		// The headers show the limit closest to being reached: the last
		// enforced one over, else the first with the least remaining
		// below MaxUint32, as upstream starts its minimum there.
		if (closest == nil && st.LimitRemaining < math.MaxUint32) || (closest != nil && st.LimitRemaining < closest.LimitRemaining) ||
			(st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !it.quota && !s.cfg.QuotaMode) {
			closest, closestReset = st, reset
		}
		if s.cfg.OnHit != nil {
			s.hit(hit, it, req.Domain, before, after)
			s.cfg.OnHit(hit)
		}
	}
	if quotas > 0 && quotas == quotasOver {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if h := s.cfg.Headers; h != nil && closest != nil {
		reset := closestReset.Sub(now)
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: h.Limit, Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: h.Remaining, Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: h.Reset, Value: strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10)},
		}
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.cfg.ShadowMode {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		if s.cfg.OnGlobalShadow != nil {
			s.cfg.OnGlobalShadow(req.Domain)
		}
	}
	if s.cfg.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, items, resp.Statuses)
	}
	return resp
}

// statusSpace holds the messages of one descriptor's status.
type statusSpace struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// oneResponse holds the messages of the response to a request of one
// descriptor.
type oneResponse struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	space    [1]statusSpace
}

// resetOf is the end of the window of unit u that decision d counted in:
// d's ResetAt while the window holds a count (the limiter's clock placed
// the window: Redis's, with backend redis, translated onto this
// process's clock), or the end of the window holding now on this
// process's clock when the window is empty and d's ResetAt is now.
func (s *Service) resetOf(u Unit, d limiter.Decision, now time.Time) time.Time {
	if d.ResetAt.After(now) {
		return d.ResetAt
	}
	return s.windowEnd(u, now)
}

// untilReset is duration_until_reset of a window ending at reset, at
// now: whole seconds rounded up, or exact with Config.ExactReset.
func (s *Service) untilReset(reset, now time.Time) time.Duration {
	d := reset.Sub(now)
	if s.cfg.ExactReset {
		return d
	}
	return (d + time.Second - 1) / time.Second * time.Second
}

// hit sets h to the statistics of one counted descriptor whose window held
// before hits, and after with the descriptor's, as envoyproxy/ratelimit
// counts them: a request that goes over counts the hits beyond the limit
// over (all of them when the window was full already) and those between
// the near-limit threshold and the limit near; one within the limit
// counts its hits within and those above the threshold near.
func (s *Service) hit(h *Hit, it *item, domain string, before, after uint64) {
	*h = Hit{Domain: domain, Key: it.match.MetricKey(), TotalHits: it.hits}
	if h.Key == "" { // a limit Envoy sent: envoyproxy/ratelimit names it by the request's entries
		h.Key = it.match.overrideMetricKey()
	}
	limit := uint64(it.limit.RequestsPerUnit)
	// envoyproxy/ratelimit multiplies in single precision.
	near := uint64(math.Floor(float64(float32(limit) * float32(s.cfg.NearLimitRatio))))
	switch {
	case after > limit && before >= limit:
		h.OverLimit = it.hits
	case after > limit: // before < limit: the hits beyond it, without after's bound
		h.OverLimit = it.hits - (limit - before)
		h.NearLimit = limit - max(near, before)
	default:
		h.WithinLimit = it.hits
		if after > near {
			h.NearLimit = after - max(near, before)
		}
	}
	if it.shadow {
		h.ShadowMode = h.OverLimit
	}
}

// dynamicMetadata is envoyproxy/ratelimit's dynamic metadata of a
// response: the domain, each descriptor's entries ("key=value"), limit
// and hits_addend, the request's hits_addend when set, and the metadata
// of the configured descriptors whose status is OK, merged (the first
// value of a key wins, structures merge).
func dynamicMetadata(req *rlsv3.RateLimitRequest, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	// The request's strings may not be UTF-8 (wireRequest): a response
	// holding them could not be marshalled.
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(strings.ToValidUTF8(req.Domain, "\uFFFD"))}
	ds := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		entries := make([]*structpb.Value, len(d.Entries))
		for i, e := range d.Entries {
			entries[i] = structpb.NewStringValue(strings.ToValidUTF8(e.GetKey()+"="+e.GetValue(), "\uFFFD"))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if o := d.GetLimit(); o != nil {
			f["limit"] = structpb.NewStringValue(fmt.Sprintf("requests_per_unit:%d unit:%s", o.RequestsPerUnit, o.Unit))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.Value))
		}
		ds = append(ds, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: ds})
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range items {
		it := &items[i]
		if statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT || it.limit == nil || it.limit.Unlimited ||
			it.match.Descriptor == nil || it.match.Descriptor.Metadata == nil {
			continue
		}
		mergeStruct(passed, it.match.Descriptor.Metadata)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeStruct adds src's fields to dst: a field dst lacks is copied, two
// structures merge, and otherwise dst's value stays.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeStruct(hs, vs)
		}
	}
}
