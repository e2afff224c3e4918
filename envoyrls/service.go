package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

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
	// TotalHits is the descriptor's hits; each is also WithinLimit or
	// OverLimit. NearLimit counts the admitted hits above the near-limit
	// threshold (Config.NearLimitRatio of the limit); ShadowMode the hits
	// over a shadow-mode limit, reported OK.
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
	// OnHit, when set, is called with each descriptor's Hit, for metrics.
	// It is called on the request's goroutine and must not block.
	OnHit func(*Hit)
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
func (s *Service) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

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
}

// ShouldRateLimitAt decides a request; now is the time of
// duration_until_reset and of the reset header. Each descriptor is
// matched against the request's domain (see Domain.Match), or takes the
// limit Envoy sent with it, and counted with its hits_addend (or the
// request's, at least 1) in a fixed window of its limit's unit. A domain
// or descriptor with no configured limit is OK with no current_limit.
// A request without a domain or descriptors, or beyond
// Config.MaxDescriptors or MaxEntries, fails with InvalidArgument; a
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
	items := make([]item, len(req.Descriptors))
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		it, err := s.resolve(req, d, domain)
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
		if it.limit != nil && it.limit.Name != "" && replaced[it.limit.Name] {
			it.limit = nil
		}
		if l := it.limit; l != nil && !l.Unlimited && l.RequestsPerUnit > 0 {
			it.counted = len(reqs)
			reqs = append(reqs, s.request(it, l))
		}
	}
	var results []sluice.Result
	if len(reqs) > 0 {
		results = s.cfg.Limiter.CheckMany(ctx, reqs)
		for _, r := range results {
			if r.Err != nil {
				return nil, limiterError(r.Err)
			}
		}
	}
	return s.respond(items, results, req.Domain, now), nil
}

// resolve finds the limit of descriptor d of req.
func (s *Service) resolve(req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor, domain *Domain) (item, error) {
	it := item{counted: -1, hits: uint64(max(req.HitsAddend, 1))}
	if h := d.GetHitsAddend(); h != nil {
		it.hits = h.Value
	}
	if len(d.GetEntries()) > s.cfg.MaxEntries {
		return it, status.Errorf(codes.InvalidArgument, "envoyrls: a descriptor has %d entries, more than %d", len(d.Entries), s.cfg.MaxEntries)
	}
	if domain == nil {
		return it, nil
	}
	entries := make([]Entry, len(d.Entries))
	for j, e := range d.Entries {
		entries[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	if o := d.GetLimit(); o != nil {
		// A limit Envoy sends wins over the configuration, and is never
		// in shadow mode, as with envoyproxy/ratelimit.
		u := Unit(o.Unit)
		if !u.Valid() || u == Week {
			return it, status.Errorf(codes.InvalidArgument, "envoyrls: a descriptor's limit has unit %v", o.Unit)
		}
		it.match = Match{domain: domain.Name, entries: entries}
		it.limit = &RateLimit{Unit: u, RequestsPerUnit: o.RequestsPerUnit}
		return it, nil
	}
	it.match = domain.Match(entries)
	if ds := it.match.Descriptor; ds != nil {
		it.limit, it.shadow, it.quota = ds.RateLimit, ds.ShadowMode, ds.QuotaMode
	}
	return it, nil
}

// request is the limiter.Request that counts it under limit l: a fixed
// window that, like envoyproxy/ratelimit's counter, stays full once a
// request was over (DrainOverLimit). A descriptor's hits beyond the limit
// could never be admitted: they take all of the window.
func (s *Service) request(it *item, l *RateLimit) limiter.Request {
	r := limiter.Request{
		Name:      limitNames[l.Unit],
		Key:       it.match.CounterKey(),
		Hits:      int64(min(it.hits, uint64(l.RequestsPerUnit))),
		Limit:     int64(l.RequestsPerUnit),
		Algorithm: limiter.FixedWindow,
		Behavior:  limiter.DrainOverLimit,
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
func (s *Service) respond(items []item, results []sluice.Result, domain string, now time.Time) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	var closestUnit Unit
	quotas, quotasOver := 0, 0
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		l := it.limit
		switch {
		case l == nil:
			continue
		case l.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		var over bool
		var remaining int64
		if it.counted >= 0 {
			dec := results[it.counted].Decision
			over = !dec.Allowed || it.hits > uint64(l.RequestsPerUnit)
			if !over {
				remaining = dec.Remaining
			}
		} else { // a limit of 0 per unit
			over = it.hits > 0
		}
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
			Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
		}
		st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		st.DurationUntilReset = durationpb.New(s.windowEnd(l.Unit, now).Sub(now))
		if over && !it.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if it.quota {
			quotas++
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				quotasOver++
			}
		} else if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		// The headers show the limit closest to being reached: the last
		// enforced one over, else the first with the least remaining.
		if closest == nil || st.LimitRemaining < closest.LimitRemaining ||
			(st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !it.quota) {
			closest, closestUnit = st, l.Unit
		}
		if s.cfg.OnHit != nil {
			s.cfg.OnHit(s.hit(it, domain, over, uint64(remaining)))
		}
	}
	if quotas > 0 && quotas == quotasOver {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if h := s.cfg.Headers; h != nil && closest != nil {
		reset := s.windowEnd(closestUnit, now).Sub(now)
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: h.Limit, Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: h.Remaining, Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: h.Reset, Value: strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10)},
		}
	}
	return resp
}

// hit returns the statistics of one counted descriptor: over says it was
// over its limit, remaining what an admitted one left.
func (s *Service) hit(it *item, domain string, over bool, remaining uint64) *Hit {
	h := &Hit{Domain: domain, Key: it.match.MetricKey(), TotalHits: it.hits}
	if h.Key == "" { // a limit Envoy sent: envoyproxy/ratelimit names it by the request's entries
		h.Key = it.match.overrideMetricKey()
	}
	if over {
		// The limiter admits all of a descriptor's hits or none.
		h.OverLimit = it.hits
		if it.shadow {
			h.ShadowMode = it.hits
		}
		return h
	}
	h.WithinLimit = it.hits
	limit := uint64(it.limit.RequestsPerUnit)
	near := uint64(math.Floor(float64(limit) * s.cfg.NearLimitRatio))
	after := limit - remaining
	if after > near {
		h.NearLimit = min(it.hits, after-near)
	}
	return h
}
