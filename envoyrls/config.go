package envoyrls

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Unit is the time unit of a rate limit, numbered as Envoy's
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
type Unit int32

// The units. UnitUnknown is no unit: an unlimited rate limit has none.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = map[Unit]string{
	UnitUnknown: "unknown", Second: "second", Minute: "minute", Hour: "hour",
	Day: "day", Week: "week", Month: "month", Year: "year",
}

// String returns the unit's name in lower case, as configuration files
// write it.
func (u Unit) String() string {
	if s, ok := unitNames[u]; ok {
		return s
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// Valid reports whether u is a unit a limit can have: not UnitUnknown.
func (u Unit) Valid() bool { return u >= Second && u <= Week }

// ParseUnit returns the unit named s, in any case ("second", "MINUTE"),
// and false for any other name, "unknown" included.
func ParseUnit(s string) (Unit, bool) {
	for u, name := range unitNames {
		if u != UnitUnknown && strings.EqualFold(s, name) {
			return u, true
		}
	}
	return UnitUnknown, false
}

// RateLimit is the rate_limit block of a descriptor.
type RateLimit struct {
	// Name names the limit for Replaces of other limits; may be empty.
	Name string
	// Unit and RequestsPerUnit are the limit; RequestsPerUnit 0 refuses
	// every hit. An Unlimited limit has no Unit.
	Unit            Unit
	RequestsPerUnit uint32
	// Unlimited makes a matching descriptor OK with no counting at all.
	Unlimited bool
	// Replaces names the limits this one replaces: when a request's
	// descriptors match both, those are neither counted nor reported.
	Replaces []string
}

// Descriptor is one entry of a domain's descriptor tree: it matches a
// descriptor entry with its Key and, when Value is set, its value (a
// value with '*' is a pattern, each '*' matching any run of characters).
type Descriptor struct {
	Key, Value string
	// RateLimit, when set, applies to request descriptors whose entries
	// end here.
	RateLimit *RateLimit
	// ShadowMode reports an over-limit result as OK, counting it in the
	// metrics. QuotaMode makes the result count towards the overall code
	// only when every quota-mode descriptor of the request is over.
	ShadowMode, QuotaMode bool
	// DetailedMetric names the metric of a limit after the request's
	// values rather than the configuration's; ValueToMetric does so for
	// this entry alone.
	DetailedMetric, ValueToMetric bool
	// ShareThreshold, on a pattern Value, makes every value the pattern
	// matches share one counter.
	ShareThreshold bool
	// Metadata is returned in a response's dynamic metadata
	// (Config.DynamicMetadata) when the descriptor's limit applies and
	// is not over; nil for none.
	Metadata *structpb.Struct
	// Descriptors are the entries that match the next entry of a
	// request descriptor.
	Descriptors []*Descriptor
	// Line is where the descriptor starts in its file; 0 for one built
	// in code.
	Line int

	level // how Descriptors are found; built by NewDomain
	// parts is Value split at '*', when Value holds one.
	parts []string
	// path is the limit's metric key: the domain, then each entry's key
	// and configured value from the root to here, joined by '.'.
	path string
}

// entryKey is a key and a value.
type entryKey struct{ key, value string }

// level indexes the descriptors of one level of the tree for matching.
type level struct {
	exact    map[entryKey]*Descriptor // by key and value, patterns included
	byKey    map[string]*Descriptor   // those without a value
	patterns []*Descriptor            // those with a pattern, in file order
}

// Domain is the configuration of one domain: what one file holds.
type Domain struct {
	Name        string
	Descriptors []*Descriptor
	// File is the file the domain was read from ("" when built in code).
	File string

	root level
}

// NewDomain validates a domain built in code and indexes it for
// matching; ParseDomain calls it for what it reads. The descriptors are
// kept, not copied: do not change them afterwards. Errors are
// [*ConfigError] values naming file and each descriptor's Line.
func NewDomain(file, name string, descriptors []*Descriptor) (*Domain, error) {
	d := &Domain{Name: name, Descriptors: descriptors, File: file}
	if name == "" {
		return nil, &ConfigError{File: file, Err: ErrInvalidConfig, Message: "the domain is empty"}
	}
	if err := d.index(&d.root, descriptors, name); err != nil {
		return nil, err
	}
	return d, nil
}

// index validates descriptors, one level of the tree under parent (the
// metric key so far), and builds lv for them and their children.
func (d *Domain) index(lv *level, descriptors []*Descriptor, parent string) error {
	fail := func(ds *Descriptor, format string, a ...any) error {
		return &ConfigError{File: d.File, Line: ds.Line, Err: ErrInvalidConfig, Message: fmt.Sprintf(format, a...)}
	}
	lv.exact = make(map[entryKey]*Descriptor)
	lv.byKey = make(map[string]*Descriptor)
	for _, ds := range descriptors {
		if ds == nil {
			return &ConfigError{File: d.File, Err: ErrInvalidConfig, Message: "a descriptor is nil"}
		}
		if ds.Key == "" {
			return fail(ds, "descriptor has an empty key")
		}
		ds.path = parent + "." + compositeKey(ds.Key, ds.Value)
		if ds.Value == "" {
			if _, dup := lv.byKey[ds.Key]; dup {
				return fail(ds, "duplicate descriptor %q", ds.path)
			}
			lv.byKey[ds.Key] = ds
		} else {
			k := entryKey{ds.Key, ds.Value}
			if _, dup := lv.exact[k]; dup {
				return fail(ds, "duplicate descriptor %q", ds.path)
			}
			lv.exact[k] = ds
		}
		ds.parts = nil
		if strings.Contains(ds.Value, "*") {
			ds.parts = strings.Split(ds.Value, "*")
			lv.patterns = append(lv.patterns, ds)
		} else if ds.ShareThreshold {
			return fail(ds, "share_threshold needs a wildcard value (one holding '*'), not %q", ds.Value)
		}
		if rl := ds.RateLimit; rl != nil {
			switch {
			case rl.Unlimited && rl.Unit != UnitUnknown:
				return fail(ds, "an unlimited rate_limit takes no unit (it has %s)", rl.Unit)
			case !rl.Unlimited && !rl.Unit.Valid():
				return fail(ds, "rate_limit has no unit: want second, minute, hour, day, week, month or year, or unlimited: true")
			}
			for _, r := range rl.Replaces {
				switch r {
				case "":
					return fail(ds, "a replaces entry has an empty name")
				case rl.Name:
					return fail(ds, "rate_limit %q replaces itself", r)
				}
			}
		}
		if err := d.index(&ds.level, ds.Descriptors, ds.path); err != nil {
			return err
		}
	}
	return nil
}

// compositeKey is envoyproxy/ratelimit's name of a descriptor entry in
// metric keys: key, or key_value.
func compositeKey(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// wildcardMatch reports whether value matches the pattern split at '*'
// into parts: it starts with the first, ends with the last, and holds the
// others in order between them.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Rules are the domains of one configuration, each configured once. A
// Rules is immutable and safe for concurrent use.
type Rules struct {
	domains map[string]*Domain
}

// MergeRules returns the rules of domains where a domain given more than
// once is one domain with the descriptors of each, in order, as
// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG has it: a descriptor that
// two of them configure at the top level is an error naming the file of
// the later one. The merged domain is indexed anew: the domains given
// must not be used afterwards.
func MergeRules(domains ...*Domain) (*Rules, error) {
	var order []string
	byName := make(map[string][]*Domain)
	for _, d := range domains {
		if _, ok := byName[d.Name]; !ok {
			order = append(order, d.Name)
		}
		byName[d.Name] = append(byName[d.Name], d)
	}
	merged := make([]*Domain, 0, len(order))
	for _, name := range order {
		parts := byName[name]
		if len(parts) == 1 {
			merged = append(merged, parts[0])
			continue
		}
		var all []*Descriptor
		for _, p := range parts {
			all = append(all, p.Descriptors...)
			// A duplicate names the file that brings it.
			if _, err := NewDomain(p.File, name, all); err != nil {
				return nil, err
			}
		}
		d, err := NewDomain(parts[0].File, name, all)
		if err != nil {
			return nil, err
		}
		merged = append(merged, d)
	}
	return NewRules(merged...)
}

// NewRules returns the rules of domains; a domain given twice is an error
// wrapping ErrDuplicateDomain that names both files.
func NewRules(domains ...*Domain) (*Rules, error) {
	r := &Rules{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		if prev, dup := r.domains[d.Name]; dup {
			return nil, &ConfigError{File: d.File, Err: ErrDuplicateDomain,
				Message: fmt.Sprintf("domain %q is configured in %s already", d.Name, prev.File)}
		}
		r.domains[d.Name] = d
	}
	return r, nil
}

// Domain returns the configuration of the named domain.
func (r *Rules) Domain(name string) (*Domain, bool) {
	if r == nil {
		return nil, false
	}
	d, ok := r.domains[name]
	return d, ok
}

// Len returns the number of domains.
func (r *Rules) Len() int {
	if r == nil {
		return 0
	}
	return len(r.domains)
}
