package limiter

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Algorithm selects how a limit is enforced. The zero value is invalid.
type Algorithm uint8

// The algorithms. See the package comment for their semantics.
const (
	TokenBucket Algorithm = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	GCRA
	numAlgorithms // one past the last; implicitly iota + 1
)

// Algorithms lists every algorithm, in declaration order.
var Algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, GCRA}

var algorithmNames = [...]string{
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	GCRA:                 "gcra",
}

// String returns the algorithm's snake_case name, as used in config files.
func (a Algorithm) String() string {
	if a == 0 || int(a) >= len(algorithmNames) {
		return fmt.Sprintf("algorithm(%d)", uint8(a))
	}
	return algorithmNames[a]
}

// ParseAlgorithm returns the algorithm named s (as printed by String; case and
// '-' versus '_' do not matter).
func ParseAlgorithm(s string) (Algorithm, error) {
	n := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	for a := TokenBucket; a < numAlgorithms; a++ {
		if algorithmNames[a] == n {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownAlgorithm, s)
}

// Valid reports whether a names a known algorithm.
func (a Algorithm) Valid() bool { return a >= TokenBucket && a < numAlgorithms }

// HasBurst reports whether Burst means something for a: the token bucket's
// capacity, the leaky bucket's queue size and GCRA's burst tolerance. The
// window algorithms admit at most Limit per window and ignore Burst.
func (a Algorithm) HasBurst() bool { return a == TokenBucket || a == LeakyBucket || a == GCRA }

// Calendar aligns fixed windows to calendar units in a time zone instead of
// to multiples of Period. The zero value, NoCalendar, uses Period.
type Calendar uint8

// The calendar units.
const (
	NoCalendar Calendar = iota
	Minute
	Hour
	Day
	Week // ISO week, starting Monday 00:00
	Month
	Year
	numCalendars = iota
)

var calendarNames = [...]string{NoCalendar: "", Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns the unit's name ("" for NoCalendar).
func (c Calendar) String() string {
	if int(c) >= len(calendarNames) {
		return fmt.Sprintf("calendar(%d)", uint8(c))
	}
	return calendarNames[c]
}

// ParseCalendar returns the unit named s ("" is NoCalendar).
func ParseCalendar(s string) (Calendar, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	for c := NoCalendar; c < numCalendars; c++ {
		if calendarNames[c] == n {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown calendar unit %q", ErrInvalidCalendar, s)
}

// Behavior modifies how one request is decided. Values combine with |.
type Behavior uint8

const (
	// Reset forgets the key's state before deciding, as if it were new.
	Reset Behavior = 1 << iota
	// DrainOverLimit consumes everything that remains when the request is
	// rejected, so that the key stays limited until it refills. A peek
	// (Hits 0) consumes nothing even with DrainOverLimit.
	DrainOverLimit
	// Refund gives Hits back to the key: hits that an earlier request
	// consumed and that the caller did not use (a multi-limit request that
	// another limit rejected, say). It never leaves the key with more than
	// a fresh key has, and the decision reports the state after the refund
	// as a peek would. With Charged (the charge's Decision.Window), the
	// hits go back to that window only, and only while the key's state
	// still counts it, or, for the algorithms without windows, at most
	// what of the hits charged at that instant the key still counts;
	// otherwise nothing is given back (see Request.Charged).
	Refund
	// Charge consumes Hits whatever the key's state: hits admitted
	// elsewhere (a lease's, say) that must count here even past the
	// capacity. A token or leaky bucket's level and a GCRA TAT then go
	// beyond the burst and drain at the request's rate; nothing is
	// dropped. Only those three algorithms accept it, and the decision
	// reports Allowed.
	Charge

	allBehaviors = Reset | DrainOverLimit | Refund | Charge
)

// Bounds on request fields. They keep every computation inside int64 and
// bound the memory one request can make a node spend.
const (
	MaxNameLen = 128  // bytes
	MaxKeyLen  = 1024 // bytes
	MaxLimit   = 1_000_000_000_000
	MinPeriod  = time.Microsecond
	MaxPeriod  = 10 * 366 * 24 * time.Hour
	// MaxDrain bounds how long a burst may take to drain:
	// Burst*Period/Limit (and Limit*Period/Limit for the windows).
	MaxDrain = 100 * 366 * 24 * time.Hour
)

// Validation errors. Every error Validate returns wraps exactly one of these
// and names the offending field; test with errors.Is.
var (
	ErrInvalidName      = errors.New("limiter: invalid Name")
	ErrInvalidKey       = errors.New("limiter: invalid Key")
	ErrInvalidHits      = errors.New("limiter: invalid Hits")
	ErrHitsExceedLimit  = errors.New("limiter: Hits exceed what the limit can ever admit")
	ErrInvalidLimit     = errors.New("limiter: invalid Limit")
	ErrInvalidPeriod    = errors.New("limiter: invalid Period")
	ErrInvalidBurst     = errors.New("limiter: invalid Burst")
	ErrUnknownAlgorithm = errors.New("limiter: unknown Algorithm")
	ErrInvalidCalendar  = errors.New("limiter: invalid Calendar")
	ErrInvalidBehavior  = errors.New("limiter: invalid Behavior")
	// ErrInvalidLocation is a Location that another node could not load
	// as the same zone. It wraps ErrInvalidCalendar.
	ErrInvalidLocation error = &childError{"limiter: invalid Location", ErrInvalidCalendar}
)

// childError is a sentinel that wraps a broader one.
type childError struct {
	msg    string
	parent error
}

func (e *childError) Error() string { return e.msg }
func (e *childError) Unwrap() error { return e.parent }

// MaxZoneNameLen bounds a Location's name, in bytes. The longest IANA
// name is about 32 bytes.
const MaxZoneNameLen = 64

// loadedZones holds the zones that LoadZone has loaded, by name, at most
// maxLoadedZones of them (IANA has about 600), so that the zone database
// is read once per name, not once per request or state.
var (
	loadedZones    sync.Map // name -> *time.Location
	numLoaded      atomic.Int64
	maxLoadedZones = int64(1024)
	// sameZones holds the callers' Locations found to be the zones their
	// names load (checkLocation), up to maxLoadedZones of them.
	sameZones sync.Map // *time.Location -> struct{}
	numSame   atomic.Int64
)

// checkLocation reports whether loc travels between nodes as the same
// zone: its name loads (LoadZone), and loc keeps the offsets of the zone
// of that name (sameOffsets), which every other node loads for it. A zone
// built with time.FixedZone under a real zone's name
// (time.FixedZone("Europe/Paris", 3600)) is refused: this node would
// align its windows to one offset and a node it forwards to, or a node
// that takes the key over, to Paris's, so that one key's windows would
// differ from node to node.
func checkLocation(loc *time.Location) error {
	name := loc.String()
	if name == "" {
		return CheckZoneName(name) // a zone without a name: refused
	}
	zone, err := LoadZone(name)
	if err != nil || zone == loc {
		return err
	}
	if _, ok := sameZones.Load(loc); ok {
		return nil
	}
	if !sameOffsets(loc, zone) {
		return fmt.Errorf("%w: the zone named %q is not the zone every node loads under that name (one built with time.FixedZone?); use time.LoadLocation(%q)", ErrInvalidLocation, name, name)
	}
	if numSame.Load() < maxLoadedZones {
		if _, had := sameZones.LoadOrStore(loc, struct{}{}); !had {
			numSame.Add(1)
		}
	}
	return nil
}

// sameOffsets reports whether a and b give the same UTC offset on the
// 1st and the 15th of every month from two years before the year of the
// system's clock to three years after it: a zone with daylight saving
// time and a fixed zone differ within that span, and zones of different
// offsets differ everywhere.
func sameOffsets(a, b *time.Location) bool {
	y := time.Now().Year()
	for m := time.Date(y-2, time.January, 1, 12, 0, 0, 0, time.UTC); m.Year() <= y+3; m = m.AddDate(0, 1, 0) {
		for _, t := range [2]time.Time{m, m.AddDate(0, 0, 14)} {
			_, oa := t.In(a).Zone()
			if _, ob := t.In(b).Zone(); oa != ob {
				return false
			}
		}
	}
	return true
}

// LoadZone returns the zone named name as every node loads it: nil (UTC)
// for "", else time.LoadLocation's zone once CheckZoneName has accepted the
// name, so that no name from another node reaches the zone database
// unchecked. Zones that load are cached. Errors wrap ErrInvalidLocation.
func LoadZone(name string) (*time.Location, error) {
	if name == "" {
		return nil, nil
	}
	if v, ok := loadedZones.Load(name); ok {
		return v.(*time.Location), nil
	}
	if err := CheckZoneName(name); err != nil {
		return nil, err
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: zone %q does not load, so no other node could read it: %v", ErrInvalidLocation, name, err)
	}
	if numLoaded.Load() < maxLoadedZones {
		if _, loaded := loadedZones.LoadOrStore(name, loc); !loaded {
			numLoaded.Add(1)
		}
	}
	return loc, nil
}

// CheckZoneName reports whether name can be an IANA time zone name, which
// every node loads as the same zone, without loading it: at most
// MaxZoneNameLen bytes of letters, digits, '_', '-', '+' and inner single
// '/'. "Local" (the zone of each process, which differs from node to node)
// and "" are refused. Errors wrap ErrInvalidLocation.
func CheckZoneName(name string) error {
	switch {
	case len(name) > MaxZoneNameLen:
		return fmt.Errorf("%w: zone name is %d bytes, more than the maximum %d", ErrInvalidLocation, len(name), MaxZoneNameLen)
	case name == "":
		return fmt.Errorf("%w: the zone has no name; use time.LoadLocation or time.UTC", ErrInvalidLocation)
	case name == "Local":
		return fmt.Errorf("%w: %q is the zone of each process, which differs from node to node; name an IANA zone", ErrInvalidLocation, name)
	}
	for i := 0; i < len(name); i++ {
		switch ch := name[i]; {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9',
			ch == '_', ch == '-', ch == '+':
		case ch == '/' && i > 0 && i < len(name)-1 && name[i-1] != '/':
		default:
			return fmt.Errorf("%w: %q is not an IANA zone name", ErrInvalidLocation, name)
		}
	}
	return nil
}

// Request asks for a decision on one key.
type Request struct {
	// Name names the limit ("api_per_user"); Key is the client it applies to
	// ("user:42"). Together they identify the counter. Both are non-empty
	// valid UTF-8 of at most MaxNameLen and MaxKeyLen bytes.
	Name string
	Key  string
	// Hits is the cost of this request. Set it to 1 for one request. 0 peeks:
	// the decision reports the state and whether one hit would be admitted,
	// and consumes nothing. (Over the wire, an absent hits field means 1.)
	Hits int64
	// Limit hits per Period. Limit is in [1, MaxLimit], Period in
	// [MinPeriod, MaxPeriod]. With a Calendar, Period is ignored and may be 0.
	Limit  int64
	Period time.Duration
	// Burst is the token bucket's capacity, the leaky bucket's queue size
	// and GCRA's burst tolerance; 0 means Limit. Ignored by the windows.
	Burst     int64
	Algorithm Algorithm
	// Calendar aligns FixedWindow windows to calendar units in Location
	// (nil means UTC). Only FixedWindow accepts a Calendar. Location
	// travels between nodes by name, so it must be time.UTC or a zone
	// from time.LoadLocation with an IANA name (see CheckZoneName), never
	// time.Local.
	Calendar Calendar
	Location *time.Location
	Behavior Behavior
	// Charged is, for a Refund, the window the refunded hits were counted
	// in: the Decision.Window of the request that charged them. The
	// refund then gives them back only to that window, while the key's
	// state counts it (a fixed window or sliding window counter state
	// whose current or, for the counter, previous window it is);
	// otherwise it gives nothing back, and its decision's Window is zero:
	// the window has ended, or the key has since been reset, gone fresh
	// or been charged under another algorithm or Period, and the hits of
	// the key's window now are other requests'.
	//
	// For a token bucket, leaky bucket, GCRA or sliding window log,
	// Charged is the instant the hits were charged at (Start == End). A
	// bucket or GCRA state of the request's algorithm and rate then gets
	// back at most the part of the hits that has not drained since:
	// Hits - rate×(now - Start), floor 0, and no more than it holds
	// (rate is Limit per Period, one hit per emission interval for
	// GCRA). A sliding window log gets back at most Hits of its entry at
	// that instant, while the entry is in the window and has not been
	// merged into a later one. Neither ever takes another request's hits
	// off the key. Otherwise the refund gives nothing back, as above.
	//
	// A Reset of a live key clears the hits of every charge made before
	// it: until the key's state as it stood would have gone fresh (its
	// windows ended, its level or TAT drained), a refund naming a charge
	// at an instant, or in a window begun, no later than the reset gives
	// nothing back, whatever the key has been charged since (the Store
	// keeps a mark of the reset that long, ResetMarkOverhead bytes). A
	// window that holds the reset is named, by the charges made in it
	// after the reset, with Start one microsecond after the reset, an
	// epoch of the window that refunds of earlier charges do not reach;
	// a charge at the reset's own instant made after it (a Reset with
	// Hits) names the instant one microsecond after the reset alike. A
	// charge made after a reset at an instant before it (the reset was
	// made with the clock ahead) names [instant, reset+1µs), and one in a
	// window that ended by the reset names that window ending at
	// reset+1µs: charges before the reset name neither. A
	// decision that finds the key's state written after its now (the
	// clock stepped back) reads it as written at now, and marks the key
	// as a reset at now does: what the state counts then are charges a
	// refund cannot tell by their instant or window from earlier ones the
	// state no longer counts (it went fresh on the clock ahead, or a
	// reset cleared them); the mark lasts as long as a refund of a charge
	// made before now could find hits at the request's rate. Until then
	// a refund of a charge made before such a step (but of a sliding
	// window log, whose entries keep their instants) gives nothing back,
	// even where the charge still counts: it counts too much rather than
	// take others' hits.
	// The mark travels with the key's state (Snapshot.ResetAt and
	// ResetUntil): to a new owner, to replicas and to the state file,
	// and a store that merges it keeps the later of its own and the
	// received one.
	//
	// A zero Charged refunds as the key's state reads now (see Refund),
	// and only Refund takes one.
	Charged Window
}

// Window is one window of a fixed window or sliding window counter, the
// instants [Start, End) in nanoseconds since the Unix epoch, or, with
// Start == End, the instant a token bucket, leaky bucket, GCRA or sliding
// window log charged hits at. The zero Window is none.
type Window struct{ Start, End int64 }

// IsZero reports whether w is the zero Window.
func (w Window) IsZero() bool { return w == Window{} }

// burst returns the effective burst: Burst, or Limit when Burst is 0 or the
// algorithm has none.
func (r *Request) burst() int64 {
	if r.Burst == 0 || !r.Algorithm.HasBurst() {
		return r.Limit
	}
	return r.Burst
}

// reads reports whether r only reads its key's state: a peek (Hits 0)
// that does not reset it. DrainOverLimit and Refund of 0 hits change
// nothing.
func (r *Request) reads() bool { return r.Hits == 0 && r.Behavior&Reset == 0 }

// Capacity is the most hits one request can ever be admitted with: the burst
// for the bucket algorithms and GCRA, Limit for the windows.
func (r *Request) Capacity() int64 { return r.burst() }

// ValidateKey checks a limit's name and a client key as Validate does,
// returning nil or an error wrapping ErrInvalidName or ErrInvalidKey.
func ValidateKey(name, key string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: Name is empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: Name is %d bytes, more than the maximum %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: Name is not valid UTF-8", ErrInvalidName)
	case key == "":
		return fmt.Errorf("%w: Key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: Key is %d bytes, more than the maximum %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: Key is not valid UTF-8", ErrInvalidKey)
	}
	return nil
}

// Validate checks every field and returns nil or an error wrapping one of the
// Err* sentinels. It does not allocate when the request is valid.
func (r *Request) Validate() error {
	if err := ValidateKey(r.Name, r.Key); err != nil {
		return err
	}
	switch {
	case !r.Algorithm.Valid():
		return fmt.Errorf("%w: Algorithm %d", ErrUnknownAlgorithm, uint8(r.Algorithm))
	case r.Limit < 1 || r.Limit > MaxLimit:
		return fmt.Errorf("%w: Limit %d is outside [1, %d]", ErrInvalidLimit, r.Limit, int64(MaxLimit))
	case r.Burst < 0 || r.Burst > MaxLimit:
		return fmt.Errorf("%w: Burst %d is outside [0, %d] (0 means Limit)", ErrInvalidBurst, r.Burst, int64(MaxLimit))
	case r.Behavior&^allBehaviors != 0:
		return fmt.Errorf("%w: Behavior %#x has unknown bits", ErrInvalidBehavior, uint8(r.Behavior))
	case r.Hits < 0:
		return fmt.Errorf("%w: Hits %d is negative", ErrInvalidHits, r.Hits)
	}
	if r.Behavior != 0 || !r.Charged.IsZero() {
		if err := r.validateBehavior(); err != nil {
			return err
		}
	}
	if r.Calendar != NoCalendar {
		if r.Calendar >= numCalendars {
			return fmt.Errorf("%w: Calendar %d", ErrInvalidCalendar, uint8(r.Calendar))
		}
		if r.Algorithm != FixedWindow {
			return fmt.Errorf("%w: Calendar %s needs Algorithm fixed_window, not %s", ErrInvalidCalendar, r.Calendar, r.Algorithm)
		}
	} else {
		if r.Period < MinPeriod || r.Period > MaxPeriod {
			return fmt.Errorf("%w: Period %v is outside [%v, %v]", ErrInvalidPeriod, r.Period, MinPeriod, MaxPeriod)
		}
		// Draining a full burst must take at most MaxDrain, which keeps
		// Burst*T inside int64 for GCRA and the buckets.
		if b := r.burst(); float64(b)/float64(r.Limit)*float64(r.Period) > float64(MaxDrain) {
			return fmt.Errorf("%w: Burst %d at Limit %d per %v takes more than %v to drain", ErrInvalidBurst, b, r.Limit, r.Period, MaxDrain)
		}
		if r.Algorithm == GCRA && r.Limit > int64(r.Period) {
			return fmt.Errorf("%w: GCRA admits at most one hit per nanosecond, Limit %d per %v is faster", ErrInvalidLimit, r.Limit, r.Period)
		}
	}
	if c := r.burst(); r.Hits > c {
		return fmt.Errorf("%w: Hits %d, but %s with Limit %d and Burst %d admits at most %d at once", ErrHitsExceedLimit, r.Hits, r.Algorithm, r.Limit, r.Burst, c)
	}
	if r.Location != nil && r.Location != time.UTC {
		return checkLocation(r.Location)
	}
	return nil
}

// validateBehavior is Validate's part for a request with a Behavior or a
// Charged window, which most requests have not.
func (r *Request) validateBehavior() error {
	switch {
	case r.Behavior&Charge != 0 && (r.Behavior&^Charge != 0 || !r.Algorithm.HasBurst()):
		return fmt.Errorf("%w: Charge combines with no other behavior and needs token_bucket, leaky_bucket or gcra, not %s", ErrInvalidBehavior, r.Algorithm)
	case r.Charged.IsZero():
		return nil
	case r.Behavior&Refund == 0:
		return fmt.Errorf("%w: Charged is the window of a Refund, and Behavior %#x has no Refund", ErrInvalidBehavior, uint8(r.Behavior))
	case r.Charged.Start > r.Charged.End:
		return fmt.Errorf("%w: Charged window [%d, %d) ends before it starts", ErrInvalidBehavior, r.Charged.Start, r.Charged.End)
	case r.Charged.Start == r.Charged.End && !r.Algorithm.instantAlgorithm():
		return fmt.Errorf("%w: Charged window [%d, %d) is empty: an instant is a charge of token_bucket, leaky_bucket, gcra or sliding_window_log, not %s", ErrInvalidBehavior, r.Charged.Start, r.Charged.End, r.Algorithm)
	}
	return nil
}

// Decision is the answer to a Request.
type Decision struct {
	// Allowed is true when the request was admitted (its hits consumed).
	// For a peek (Hits 0) it says whether one hit would be admitted.
	Allowed bool
	// Limit echoes the request's Limit.
	Limit int64
	// Remaining is how many hits a request could still be admitted with
	// right now, after this decision. Never negative.
	Remaining int64
	// ResetAt is when the key's state returns to fresh if nothing more is
	// consumed: the bucket full again, the window over, the log empty. It
	// is never after the horizon (see the package comment).
	ResetAt time.Time
	// RetryAfter is how long until this same request would be admitted if
	// nothing else is consumed meanwhile (after DrainOverLimit has drained);
	// zero when it was admitted. now+RetryAfter is never after the horizon.
	RetryAfter time.Duration
	// Delay is, for an admitted leaky-bucket request, how long the caller
	// should wait before proceeding so that outflow is smooth. Zero
	// otherwise.
	Delay time.Duration
	// Window is the window of a fixed window or sliding window counter
	// (the algorithm and rate the key's state was decided with) that this
	// decision counted hits in (from its epoch since a reset within it:
	// see Request.Charged), or for the other algorithms the instant
	// it counted them at (Start == End: for the sliding window log, that
	// of the log's entry they went into): for an admitted request of
	// Hits > 0, the window they went into, which a Refund of them carries
	// (Request.Charged); for a Refund with Charged, the Charged it gave
	// hits back to. Zero otherwise: a peek, a rejection, or a refund that
	// gave nothing back.
	Window Window
}
