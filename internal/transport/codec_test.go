package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/leakcheck"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

// validRequests covers every field and every enum value.
func validRequests(t testing.TB) []limiter.Request {
	paris := mustZone(t, "Europe/Paris")
	reqs := []limiter.Request{
		{Name: "api", Key: "user:1", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket},
		{Name: "api", Key: "user:2", Hits: 0, Limit: 10, Period: time.Minute, Burst: 20, Algorithm: limiter.TokenBucket},
		{Name: "api", Key: "user:3", Hits: 7, Limit: 10, Period: time.Hour, Burst: 8, Algorithm: limiter.LeakyBucket, Behavior: limiter.Reset},
		{Name: "n", Key: "k", Hits: 3, Limit: 100, Period: time.Millisecond, Algorithm: limiter.SlidingWindowLog, Behavior: limiter.DrainOverLimit},
		{Name: "n", Key: "k", Hits: 2, Limit: 5, Period: 3 * time.Second, Algorithm: limiter.SlidingWindowCounter, Behavior: limiter.Reset | limiter.DrainOverLimit},
		{Name: "n", Key: "k", Hits: 2, Limit: 5, Period: time.Second, Algorithm: limiter.TokenBucket, Behavior: limiter.Refund},
		{Name: "n", Key: "k", Hits: 2, Limit: 5, Period: time.Second, Algorithm: limiter.FixedWindow, Behavior: limiter.Refund,
			Charged: limiter.Window{Start: 1_700_000_000 * int64(time.Second), End: 1_700_000_001 * int64(time.Second)}},
		{Name: "n", Key: "k", Hits: 2, Limit: 5, Period: time.Second, Algorithm: limiter.GCRA, Behavior: limiter.Refund,
			Charged: limiter.Window{Start: 1_700_000_000_123_456_789, End: 1_700_000_000_123_456_789}},
		{Name: "n", Key: "é/ü", Hits: 1, Limit: 1000, Period: time.Second, Burst: 50, Algorithm: limiter.GCRA},
		{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.FixedWindow},
		{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: 0, Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: time.UTC},
	}
	for _, cal := range []limiter.Calendar{limiter.Minute, limiter.Hour, limiter.Day, limiter.Week, limiter.Month, limiter.Year} {
		reqs = append(reqs, limiter.Request{Name: "cal", Key: cal.String(), Hits: 1, Limit: 3, Algorithm: limiter.FixedWindow, Calendar: cal, Location: paris})
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			t.Fatalf("validRequests[%d]: %v", i, err)
		}
	}
	return reqs
}

// sameRequest fails unless a and b are equal, comparing Locations by name
// (nil is UTC).
func sameRequest(t *testing.T, a, b limiter.Request) {
	t.Helper()
	if a.Location.String() != b.Location.String() {
		t.Fatalf("Location %v, want %v", b.Location, a.Location)
	}
	a.Location, b.Location = nil, nil
	if a != b {
		t.Fatalf("got %+v, want %+v", b, a)
	}
}

func TestRequestRoundTrip(t *testing.T) {
	var c Codec
	for i, want := range validRequests(t) {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			b, err := proto.Marshal(RequestToProto(want))
			if err != nil {
				t.Fatal(err)
			}
			m := new(pb.RateLimitRequest)
			if err := proto.Unmarshal(b, m); err != nil {
				t.Fatal(err)
			}
			got, err := c.RequestFromProto(m)
			if err != nil {
				t.Fatal(err)
			}
			sameRequest(t, want, got)
		})
	}
}

func TestEncodeRequestOverwritesEveryField(t *testing.T) {
	reqs := validRequests(t)
	var c Codec
	m := new(pb.RateLimitRequest)
	for i := range reqs {
		// Encode every request into the same message, after a different one.
		EncodeRequest(m, &reqs[(i+3)%len(reqs)])
		m.UnreachablePolicy = pb.UnreachablePolicy_UNREACHABLE_POLICY_DENY
		EncodeRequest(m, &reqs[i])
		if !proto.Equal(m, RequestToProto(reqs[i])) {
			t.Fatalf("reused message %v differs from a fresh one %v", m, RequestToProto(reqs[i]))
		}
		got, err := c.RequestFromProto(m)
		if err != nil {
			t.Fatal(err)
		}
		sameRequest(t, reqs[i], got)
	}
}

func TestHitsOnTheWire(t *testing.T) {
	var c Codec
	m := RequestToProto(limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 5, Period: time.Second, Algorithm: limiter.GCRA})
	if m.Hits != nil {
		t.Fatalf("hits of 1 sent as %d, want absent", *m.Hits)
	}
	r, err := c.RequestFromProto(m)
	if err != nil || r.Hits != 1 {
		t.Fatalf("absent hits: %d, %v; want 1", r.Hits, err)
	}
	zero := int64(0)
	m.Hits = &zero
	r, err = c.RequestFromProto(m)
	if err != nil || r.Hits != 0 {
		t.Fatalf("hits 0: %d, %v; want 0 (peek)", r.Hits, err)
	}
}

func base() *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Name: "n", Key: "k", Limit: 10, PeriodNanos: int64(time.Second), Algorithm: pb.Algorithm_ALGORITHM_TOKEN_BUCKET}
}

func TestRequestFromProtoErrors(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	tests := []struct {
		name   string
		edit   func(m *pb.RateLimitRequest)
		want   error
		inText string
	}{
		{"empty name", func(m *pb.RateLimitRequest) { m.Name = "" }, limiter.ErrInvalidName, "Name"},
		{"long name", func(m *pb.RateLimitRequest) { m.Name = strings.Repeat("n", limiter.MaxNameLen+1) }, limiter.ErrInvalidName, "Name"},
		{"empty key", func(m *pb.RateLimitRequest) { m.Key = "" }, limiter.ErrInvalidKey, "Key"},
		{"negative hits", func(m *pb.RateLimitRequest) { m.Hits = i64(-1) }, limiter.ErrInvalidHits, "Hits"},
		{"hits over burst", func(m *pb.RateLimitRequest) { m.Hits = i64(11) }, limiter.ErrHitsExceedLimit, "Hits"},
		{"zero limit", func(m *pb.RateLimitRequest) { m.Limit = 0 }, limiter.ErrInvalidLimit, "Limit"},
		{"huge limit", func(m *pb.RateLimitRequest) { m.Limit = math.MaxInt64 }, limiter.ErrInvalidLimit, "Limit"},
		{"zero period", func(m *pb.RateLimitRequest) { m.PeriodNanos = 0 }, limiter.ErrInvalidPeriod, "Period"},
		{"negative period", func(m *pb.RateLimitRequest) { m.PeriodNanos = -1 }, limiter.ErrInvalidPeriod, "period_nanos"},
		{"negative period with calendar", func(m *pb.RateLimitRequest) {
			m.PeriodNanos, m.Algorithm, m.Calendar = math.MinInt64, pb.Algorithm_ALGORITHM_FIXED_WINDOW, pb.Calendar_CALENDAR_DAY
		}, limiter.ErrInvalidPeriod, "period_nanos"},
		{"negative burst", func(m *pb.RateLimitRequest) { m.Burst = -1 }, limiter.ErrInvalidBurst, "Burst"},
		{"unspecified algorithm", func(m *pb.RateLimitRequest) { m.Algorithm = 0 }, limiter.ErrUnknownAlgorithm, "algorithm 0"},
		{"unknown algorithm", func(m *pb.RateLimitRequest) { m.Algorithm = 7 }, limiter.ErrUnknownAlgorithm, "algorithm 7"},
		{"negative algorithm", func(m *pb.RateLimitRequest) { m.Algorithm = -3 }, limiter.ErrUnknownAlgorithm, "algorithm -3"},
		{"unknown calendar", func(m *pb.RateLimitRequest) { m.Calendar = 99 }, limiter.ErrInvalidCalendar, "calendar 99"},
		{"negative calendar", func(m *pb.RateLimitRequest) { m.Calendar = -1 }, limiter.ErrInvalidCalendar, "calendar -1"},
		{"calendar needs fixed window", func(m *pb.RateLimitRequest) { m.Calendar = pb.Calendar_CALENDAR_DAY }, limiter.ErrInvalidCalendar, "Calendar"},
		{"unknown zone", func(m *pb.RateLimitRequest) { m.TimeZone = "Mars/Olympus_Mons" }, limiter.ErrInvalidCalendar, "time_zone"},
		{"path zone", func(m *pb.RateLimitRequest) { m.TimeZone = "../../etc/passwd" }, limiter.ErrInvalidCalendar, "time_zone"},
		{"absolute zone", func(m *pb.RateLimitRequest) { m.TimeZone = "/etc/localtime" }, limiter.ErrInvalidCalendar, "time_zone"},
		{"local zone", func(m *pb.RateLimitRequest) { m.TimeZone = "Local" }, limiter.ErrInvalidCalendar, "time_zone"},
		{"long zone", func(m *pb.RateLimitRequest) { m.TimeZone = strings.Repeat("A", MaxTimeZoneLen+1) }, limiter.ErrInvalidCalendar, "time_zone"},
		{"empty zone component", func(m *pb.RateLimitRequest) { m.TimeZone = "Europe//Paris" }, limiter.ErrInvalidCalendar, "time_zone"},
		{"charged instant beside a window", func(m *pb.RateLimitRequest) {
			m.Refund, m.ChargedStartUnixNano, m.ChargedEndUnixNano, m.ChargedAtUnixNano = true, 1, 2, 1
		}, limiter.ErrInvalidBehavior, "charged_at_unix_nano"},
		{"charged instant of a window algorithm", func(m *pb.RateLimitRequest) {
			m.Refund, m.Algorithm, m.ChargedAtUnixNano = true, pb.Algorithm_ALGORITHM_FIXED_WINDOW, 1
		}, limiter.ErrInvalidBehavior, "Charged"},
		{"charged instant without a refund", func(m *pb.RateLimitRequest) { m.ChargedAtUnixNano = 1 }, limiter.ErrInvalidBehavior, "Charged"},
	}
	var c Codec
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := base()
			tt.edit(m)
			r, err := c.RequestFromProto(m)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.inText) {
				t.Fatalf("err %q does not name %q", err, tt.inText)
			}
			if r != (limiter.Request{}) {
				t.Fatalf("request %+v returned with an error", r)
			}
		})
	}
	if _, err := c.RequestFromProto(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil message: err = %v, want ErrInvalidArgument", err)
	}
	if n := c.zoneCount.Load(); n != 0 {
		t.Fatalf("%d zones cached after only invalid ones", n)
	}
}

func TestCodecCachesZones(t *testing.T) {
	var c Codec
	m := base()
	m.Algorithm, m.Calendar, m.TimeZone = pb.Algorithm_ALGORITHM_FIXED_WINDOW, pb.Calendar_CALENDAR_DAY, "America/New_York"
	a, err := c.RequestFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.RequestFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	if a.Location != b.Location || a.Location.String() != "America/New_York" {
		t.Fatalf("locations %p %v and %p %v, want one cached America/New_York", a.Location, a.Location, b.Location, b.Location)
	}
	if n := c.zoneCount.Load(); n != 1 {
		t.Fatalf("%d zones cached, want 1", n)
	}
	// A zone with no calendar is still checked.
	m.Calendar, m.TimeZone = pb.Calendar_CALENDAR_NONE, "Nowhere/Else"
	if _, err := c.RequestFromProto(m); !errors.Is(err, limiter.ErrInvalidCalendar) {
		t.Fatalf("bad zone without calendar: %v", err)
	}
}

func TestEnumMappings(t *testing.T) {
	for _, a := range limiter.Algorithms {
		p := algorithmToProto(a)
		if got, ok := algorithmFromProto(p); !ok || got != a {
			t.Errorf("algorithm %v -> %v -> %v, %v", a, p, got, ok)
		}
		if want := "ALGORITHM_" + strings.ToUpper(a.String()); p.String() != want {
			t.Errorf("algorithm %v maps to %v, want %s", a, p, want)
		}
	}
	if n := len(pb.Algorithm_name) - 1; n != len(limiter.Algorithms) {
		t.Errorf("%d wire algorithms, %d limiter algorithms", n, len(limiter.Algorithms))
	}
	for c := limiter.NoCalendar; c <= limiter.Year; c++ {
		p := calendarToProto(c)
		if got, ok := calendarFromProto(p); !ok || got != c {
			t.Errorf("calendar %v -> %v -> %v, %v", c, p, got, ok)
		}
		want := "CALENDAR_" + strings.ToUpper(c.String())
		if c == limiter.NoCalendar {
			want = "CALENDAR_NONE"
		}
		if p.String() != want {
			t.Errorf("calendar %v maps to %v, want %s", c, p, want)
		}
	}
	if n := len(pb.Calendar_name); n != int(limiter.Year)+1 {
		t.Errorf("%d wire calendars", n)
	}
	for p := sluice.PolicyDefault; p <= sluice.PolicyDeny; p++ {
		got, err := PolicyFromProto(PolicyToProto(p))
		if err != nil || got != p {
			t.Errorf("policy %v -> %v, %v", p, got, err)
		}
	}
	if _, err := PolicyFromProto(4); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("policy 4: %v", err)
	}
}

// allSentinels are the errors with an error code, and their codes.
var allSentinels = []struct {
	err  error
	code pb.ErrorCode
}{
	{limiter.ErrInvalidName, pb.ErrorCode_ERROR_CODE_INVALID_NAME},
	{limiter.ErrInvalidKey, pb.ErrorCode_ERROR_CODE_INVALID_KEY},
	{limiter.ErrInvalidHits, pb.ErrorCode_ERROR_CODE_INVALID_HITS},
	{limiter.ErrHitsExceedLimit, pb.ErrorCode_ERROR_CODE_HITS_EXCEED_LIMIT},
	{limiter.ErrInvalidLimit, pb.ErrorCode_ERROR_CODE_INVALID_LIMIT},
	{limiter.ErrInvalidPeriod, pb.ErrorCode_ERROR_CODE_INVALID_PERIOD},
	{limiter.ErrInvalidBurst, pb.ErrorCode_ERROR_CODE_INVALID_BURST},
	{limiter.ErrUnknownAlgorithm, pb.ErrorCode_ERROR_CODE_UNKNOWN_ALGORITHM},
	{limiter.ErrInvalidCalendar, pb.ErrorCode_ERROR_CODE_INVALID_CALENDAR},
	{limiter.ErrInvalidBehavior, pb.ErrorCode_ERROR_CODE_INVALID_BEHAVIOR},
	{ErrInvalidArgument, pb.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
	{ErrInternal, pb.ErrorCode_ERROR_CODE_INTERNAL},
	{ErrUnavailable, pb.ErrorCode_ERROR_CODE_UNAVAILABLE},
	{context.DeadlineExceeded, pb.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED},
	{context.Canceled, pb.ErrorCode_ERROR_CODE_CANCELED},
	{ErrNotOwner, pb.ErrorCode_ERROR_CODE_NOT_OWNER},
}

func TestErrorRoundTrip(t *testing.T) {
	if len(allSentinels) != len(pb.ErrorCode_name)-1 {
		t.Fatalf("%d sentinels for %d codes", len(allSentinels), len(pb.ErrorCode_name)-1)
	}
	for _, s := range allSentinels {
		err := fmt.Errorf("%w: Field 42 is wrong", s.err)
		code, msg := ErrorToProto(err)
		if code != s.code {
			t.Errorf("%v: code %v, want %v", s.err, code, s.code)
		}
		back := ErrorFromProto(code, msg)
		if !errors.Is(back, s.err) {
			t.Errorf("%v: %v does not match after the round trip", s.err, back)
		}
		if want := "transport: remote: " + err.Error(); back.Error() != want {
			t.Errorf("text %q, want %q", back.Error(), want)
		}
		// A second hop keeps the code and does not stack prefixes.
		code2, msg2 := ErrorToProto(back)
		if code2 != code || msg2 != msg {
			t.Errorf("second hop: %v %q, want %v %q", code2, msg2, code, msg)
		}
	}
	if code, msg := ErrorToProto(nil); code != pb.ErrorCode_ERROR_CODE_NONE || msg != "" {
		t.Errorf("nil: %v %q", code, msg)
	}
	if err := ErrorFromProto(pb.ErrorCode_ERROR_CODE_NONE, "ignored"); err != nil {
		t.Errorf("NONE: %v", err)
	}
	if code, _ := ErrorToProto(errors.New("disk on fire")); code != pb.ErrorCode_ERROR_CODE_INTERNAL {
		t.Errorf("unknown error: code %v", code)
	}
	unknown := ErrorFromProto(999, "")
	if !errors.Is(unknown, ErrInternal) || !strings.Contains(unknown.Error(), "999") {
		t.Errorf("unknown code: %v", unknown)
	}
	var re *RemoteError
	if !errors.As(ErrorFromProto(pb.ErrorCode_ERROR_CODE_INVALID_KEY, "x"), &re) || re.Code != pb.ErrorCode_ERROR_CODE_INVALID_KEY {
		t.Errorf("not a *RemoteError with its code: %v", re)
	}
}

func TestErrorTextIsBoundedUTF8(t *testing.T) {
	long := errors.New(strings.Repeat("é", MaxErrorMessageLen)) // 2 bytes each
	_, msg := ErrorToProto(long)
	if len(msg) > MaxErrorMessageLen || !utf8.ValidString(msg) {
		t.Fatalf("message of %d bytes, valid UTF-8 %v", len(msg), utf8.ValidString(msg))
	}
	_, msg = ErrorToProto(errors.New("bad \xff byte"))
	if !utf8.ValidString(msg) {
		t.Fatalf("message %q is not valid UTF-8", msg)
	}
	got := ErrorFromProto(pb.ErrorCode_ERROR_CODE_INTERNAL, strings.Repeat("x", 10*MaxErrorMessageLen)).(*RemoteError)
	if len(got.Message) != MaxErrorMessageLen {
		t.Fatalf("received message of %d bytes kept", len(got.Message))
	}
}

func TestDecisionRoundTrip(t *testing.T) {
	reset := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, d := range []limiter.Decision{
		{},
		{Allowed: true, Limit: 10, Remaining: 9, ResetAt: reset, Delay: 3 * time.Millisecond},
		{Allowed: false, Limit: limiter.MaxLimit, Remaining: 0, ResetAt: reset.Add(-time.Hour), RetryAfter: time.Hour},
		{Allowed: true, Limit: 1, Remaining: limiter.MaxLimit, ResetAt: time.Unix(0, 1).UTC()},
		{Allowed: true, Limit: 3, Remaining: 2, ResetAt: reset, Window: limiter.Window{Start: reset.Add(-time.Minute).UnixNano(), End: reset.UnixNano()}},
		{Allowed: true, Limit: 3, Remaining: 2, ResetAt: reset, Window: limiter.Window{Start: reset.UnixNano(), End: reset.UnixNano()}},
	} {
		b, err := proto.Marshal(DecisionToProto(d))
		if err != nil {
			t.Fatal(err)
		}
		m := new(pb.RateLimitResponse)
		if err := proto.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		got, err := DecisionFromProto(m)
		if err != nil {
			t.Fatal(err)
		}
		if !got.ResetAt.Equal(d.ResetAt) || got.ResetAt.IsZero() != d.ResetAt.IsZero() {
			t.Fatalf("ResetAt %v, want %v", got.ResetAt, d.ResetAt)
		}
		got.ResetAt, d.ResetAt = time.Time{}, time.Time{}
		if got != d {
			t.Fatalf("got %+v, want %+v", got, d)
		}
	}
}

func TestResultRoundTrip(t *testing.T) {
	m := new(pb.RateLimitResponse)
	in := Result{Decision: sluice.Decision{Decision: limiter.Decision{Allowed: true, Limit: 5, Remaining: 4}, Owner: "node-a", WithoutOwner: true}}
	EncodeResult(m, &in)
	if got := ResultFromProto(m); got.Err != nil || got.Owner != "node-a" || !got.WithoutOwner || got.Decision != in.Decision {
		t.Fatalf("got %+v, want %+v", got, in)
	}
	// An error result reuses the message: the decision fields are zeroed.
	EncodeResult(m, &Result{Decision: sluice.Decision{Decision: in.Decision.Decision, Owner: "node-b"}, Err: fmt.Errorf("%w: Burst -1", limiter.ErrInvalidBurst)})
	if m.Allowed || m.Limit != 0 || m.Remaining != 0 || m.Owner != "node-b" || m.WithoutOwner {
		t.Fatalf("error response keeps decision fields: %v", m)
	}
	if got := ResultFromProto(m); !errors.Is(got.Err, limiter.ErrInvalidBurst) || got.Owner != "node-b" {
		t.Fatalf("got %+v", got)
	}
	EncodeResult(m, &Result{Decision: sluice.Decision{Owner: "bad\xffname"}})
	if _, err := proto.Marshal(m); err != nil {
		t.Fatalf("invalid UTF-8 owner made the message unencodable: %v", err)
	}
}

func TestDecisionFromProtoMalformed(t *testing.T) {
	for _, m := range []*pb.RateLimitResponse{
		nil,
		{Limit: -1},
		{Limit: limiter.MaxLimit + 1},
		{Remaining: -1},
		{Remaining: math.MaxInt64},
		{RetryAfterNanos: -1},
		{DelayNanos: math.MinInt64},
		{WindowStartUnixNano: 5, WindowEndUnixNano: 5},
		{WindowStartUnixNano: 5, WindowEndUnixNano: 6, ChargedAtUnixNano: 5},
		{WindowEndUnixNano: -1},
	} {
		if _, err := DecisionFromProto(m); !errors.Is(err, ErrMalformedResponse) {
			t.Errorf("%v: err = %v, want ErrMalformedResponse", m, err)
		}
	}
	if r := ResultFromProto(nil); !errors.Is(r.Err, ErrMalformedResponse) {
		t.Errorf("nil result: %v", r.Err)
	}
}

func TestUnixNanoClamps(t *testing.T) {
	if got := unixNano(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)); got != math.MaxInt64 {
		t.Errorf("year 3000: %d", got)
	}
	if got := unixNano(time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)); got != math.MinInt64 {
		t.Errorf("year 1000: %d", got)
	}
	if got := unixNano(time.Time{}); got != 0 {
		t.Errorf("zero time: %d", got)
	}
}
