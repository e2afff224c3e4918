package limiter

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var sentinels = []error{
	ErrInvalidName, ErrInvalidKey, ErrInvalidHits, ErrHitsExceedLimit, ErrInvalidLimit,
	ErrInvalidPeriod, ErrInvalidBurst, ErrUnknownAlgorithm, ErrInvalidCalendar, ErrInvalidBehavior, ErrInvalidLocation,
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

func validRequest(a Algorithm) Request {
	return Request{Name: "api", Key: "user:42", Hits: 1, Limit: 10, Period: time.Second, Algorithm: a}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(r *Request)
		want  error  // nil: valid
		field string // the message must name it
	}{
		{"empty name", func(r *Request) { r.Name = "" }, ErrInvalidName, "Name"},
		{"long name", func(r *Request) { r.Name = strings.Repeat("n", MaxNameLen+1) }, ErrInvalidName, "Name"},
		{"longest name", func(r *Request) { r.Name = strings.Repeat("n", MaxNameLen) }, nil, ""},
		{"name not UTF-8", func(r *Request) { r.Name = "a\xffb" }, ErrInvalidName, "Name"},
		{"empty key", func(r *Request) { r.Key = "" }, ErrInvalidKey, "Key"},
		{"long key", func(r *Request) { r.Key = strings.Repeat("k", MaxKeyLen+1) }, ErrInvalidKey, "Key"},
		{"longest key", func(r *Request) { r.Key = strings.Repeat("k", MaxKeyLen) }, nil, ""},
		{"key not UTF-8", func(r *Request) { r.Key = "\xc3\x28" }, ErrInvalidKey, "Key"},
		{"unicode key", func(r *Request) { r.Key = "usér:ß" }, nil, ""},
		{"zero algorithm", func(r *Request) { r.Algorithm = 0 }, ErrUnknownAlgorithm, "Algorithm"},
		{"algorithm past the last", func(r *Request) { r.Algorithm = GCRA + 1 }, ErrUnknownAlgorithm, "Algorithm"},
		{"zero limit", func(r *Request) { r.Limit = 0 }, ErrInvalidLimit, "Limit"},
		{"negative limit", func(r *Request) { r.Limit = -1 }, ErrInvalidLimit, "Limit"},
		{"limit above max", func(r *Request) { r.Limit = MaxLimit + 1 }, ErrInvalidLimit, "Limit"},
		{"max limit", func(r *Request) { r.Limit = MaxLimit }, nil, ""},
		{"zero period", func(r *Request) { r.Period = 0 }, ErrInvalidPeriod, "Period"},
		{"negative period", func(r *Request) { r.Period = -time.Second }, ErrInvalidPeriod, "Period"},
		{"period below min", func(r *Request) { r.Period = MinPeriod - 1 }, ErrInvalidPeriod, "Period"},
		{"period above max", func(r *Request) { r.Period = MaxPeriod + 1 }, ErrInvalidPeriod, "Period"},
		{"min period", func(r *Request) { r.Period = MinPeriod }, nil, ""},
		{"max period", func(r *Request) { r.Period = MaxPeriod }, nil, ""},
		{"negative burst", func(r *Request) { r.Burst = -1 }, ErrInvalidBurst, "Burst"},
		{"burst above max", func(r *Request) { r.Burst = MaxLimit + 1 }, ErrInvalidBurst, "Burst"},
		{"burst draining too long", func(r *Request) { r.Limit, r.Period, r.Burst = 1, MaxPeriod, 11 }, ErrInvalidBurst, "Burst"},
		{"burst draining in MaxDrain", func(r *Request) { r.Limit, r.Period, r.Burst = 1, MaxPeriod, 10 }, nil, ""},
		{"negative hits", func(r *Request) { r.Hits = -1 }, ErrInvalidHits, "Hits"},
		{"peek", func(r *Request) { r.Hits = 0 }, nil, ""},
		{"hits at limit", func(r *Request) { r.Hits = 10 }, nil, ""},
		{"hits above limit", func(r *Request) { r.Hits = 11 }, ErrHitsExceedLimit, "Hits"},
		{"hits at burst", func(r *Request) { r.Burst, r.Hits = 20, 20 }, nil, ""},
		{"hits above burst", func(r *Request) { r.Burst, r.Hits = 20, 21 }, ErrHitsExceedLimit, "Hits"},
		{"unknown behavior bit", func(r *Request) { r.Behavior = allBehaviors + 1 }, ErrInvalidBehavior, "Behavior"},
		{"high behavior bit", func(r *Request) { r.Behavior = 0x80 | Reset }, ErrInvalidBehavior, "Behavior"},
		{"both behaviors", func(r *Request) { r.Behavior = Reset | DrainOverLimit }, nil, ""},
		{"calendar on token bucket", func(r *Request) { r.Calendar = Day }, ErrInvalidCalendar, "Calendar"},
		{"unknown calendar", func(r *Request) { r.Algorithm, r.Calendar = FixedWindow, Year+1 }, ErrInvalidCalendar, "Calendar"},
		{"calendar ignores period", func(r *Request) { r.Algorithm, r.Calendar, r.Period = FixedWindow, Month, 0 }, nil, ""},
		{"gcra faster than 1/ns", func(r *Request) { r.Algorithm, r.Limit, r.Period = GCRA, 1001, time.Microsecond }, ErrInvalidLimit, "Limit"},
		{"gcra at 1/ns", func(r *Request) { r.Algorithm, r.Limit, r.Period = GCRA, 1000, time.Microsecond }, nil, ""},
		{"calendar in UTC", func(r *Request) { r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.UTC }, nil, ""},
		{"calendar in an IANA zone", func(r *Request) { r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, mustZone("Asia/Tokyo") }, nil, ""},
		{"calendar in time.Local", func(r *Request) { r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.Local }, ErrInvalidLocation, "Local"},
		{"zone with no name", func(r *Request) { r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("", 3600) }, ErrInvalidLocation, "no name"},
		{"zone named like no IANA zone", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("my zone", 3600)
		}, ErrInvalidLocation, "my zone"},
		{"zone that does not load", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("UTC+1", 3600)
		}, ErrInvalidLocation, "UTC+1"},
		{"fixed zone under a real zone's name", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("Europe/Paris", 3600)
		}, ErrInvalidLocation, `"Europe/Paris"`},
		{"fixed zone under a real zone's name, in its summer offset", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("Europe/Paris", 7200)
		}, ErrInvalidLocation, `"Europe/Paris"`},
		{"fixed zone under a zone's name, another offset", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("Asia/Tokyo", 0)
		}, ErrInvalidLocation, `"Asia/Tokyo"`},
		{"fixed zone of a zone without daylight saving, under its name and offset", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, time.FixedZone("Asia/Tokyo", 9*3600)
		}, nil, ""},
		{"a zone with daylight saving loaded by the caller", func(r *Request) {
			r.Algorithm, r.Calendar, r.Location = FixedWindow, Day, mustZone("Europe/Paris")
		}, nil, ""},
		{"zone without calendar", func(r *Request) { r.Location = time.Local }, ErrInvalidLocation, "Local"},
		{"windows ignore burst", func(r *Request) { r.Algorithm, r.Burst, r.Hits = SlidingWindowLog, 20, 11 }, ErrHitsExceedLimit, "Hits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRequest(TokenBucket)
			tt.edit(&r)
			err := r.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Validate = %v, want %v", err, tt.want)
			}
			for _, s := range sentinels {
				if !errors.Is(tt.want, s) && errors.Is(err, s) {
					t.Errorf("%v also wraps %v", err, s)
				}
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "limiter: ") || !strings.Contains(msg, tt.field) {
				t.Errorf("message %q does not start with %q and name %s", msg, "limiter: ", tt.field)
			}
			// The store refuses it and keeps nothing.
			s := newTestStore(t)
			if d, err := s.CheckAt(r, t0); !errors.Is(err, tt.want) || d != (Decision{}) {
				t.Errorf("CheckAt = %+v, %v", d, err)
			}
			if s.Len() != 0 {
				t.Errorf("store holds %d keys after an invalid request", s.Len())
			}
		})
	}
}

func TestValidateAllocs(t *testing.T) {
	for _, a := range Algorithms {
		r := validRequest(a)
		if a == FixedWindow {
			r.Calendar, r.Location = Week, time.UTC
		}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = r.Validate() }); n != 0 {
			t.Errorf("%v: Validate allocates %v times", a, n)
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range Algorithms {
		if !a.Valid() {
			t.Errorf("%v is not Valid", a)
		}
		for _, s := range []string{a.String(), strings.ToUpper(a.String()), " " + strings.ReplaceAll(a.String(), "_", "-") + " "} {
			if got, err := ParseAlgorithm(s); err != nil || got != a {
				t.Errorf("ParseAlgorithm(%q) = %v, %v", s, got, err)
			}
		}
	}
	if len(Algorithms) != 6 {
		t.Errorf("Algorithms has %d entries", len(Algorithms))
	}
	for _, s := range []string{"", "token", "algorithm(0)", "gcra2"} {
		if _, err := ParseAlgorithm(s); !errors.Is(err, ErrUnknownAlgorithm) {
			t.Errorf("ParseAlgorithm(%q): %v", s, err)
		}
	}
	if s := Algorithm(0).String(); s != "algorithm(0)" {
		t.Errorf("Algorithm(0) = %q", s)
	}
	if s := (GCRA + 1).String(); s != "algorithm(7)" {
		t.Errorf("Algorithm(7) = %q", s)
	}
	if Algorithm(0).Valid() || (GCRA + 1).Valid() {
		t.Error("invalid algorithms are Valid")
	}
	for a, want := range map[Algorithm]bool{TokenBucket: true, LeakyBucket: true, GCRA: true, FixedWindow: false, SlidingWindowLog: false, SlidingWindowCounter: false} {
		if a.HasBurst() != want {
			t.Errorf("%v.HasBurst() = %v", a, !want)
		}
		r := Request{Limit: 10, Burst: 20, Algorithm: a}
		if c := r.Capacity(); (c == 20) != want {
			t.Errorf("%v: Capacity %d", a, c)
		}
	}
}

func TestParseCalendar(t *testing.T) {
	for c := NoCalendar; c <= Year; c++ {
		if got, err := ParseCalendar(" " + strings.ToUpper(c.String())); err != nil || got != c {
			t.Errorf("ParseCalendar(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ParseCalendar("fortnight"); !errors.Is(err, ErrInvalidCalendar) {
		t.Errorf("ParseCalendar(fortnight): %v", err)
	}
	if s := (Year + 1).String(); s != "calendar(7)" {
		t.Errorf("Calendar(7) = %q", s)
	}
}
