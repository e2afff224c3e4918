package envoyrls

import (
	"errors"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzParseDomain feeds the parser arbitrary files: it never panics, every
// error is a *ConfigError naming the file, and what it accepts matches
// descriptors and builds counter keys within the limiter's bounds.
func FuzzParseDomain(f *testing.F) {
	for _, seed := range []string{
		hitsConfig, unitsConfig, headersConfig, quotaConfig, matchConfig,
		"domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: yes}\n    descriptors: [{key: s, rate_limit: {name: n, replaces: [{name: m}], unit: hour}}]\n",
		"domain: &a d\ndescriptors: [{key: *a, metadata: {x: [1, 2]}}]\n",
		"", "- x", "domain: [", "domain: d\n---\n",
	} {
		f.Add(seed, "k", "abc", "s", "x")
	}
	f.Fuzz(func(t *testing.T, text, k1, v1, k2, v2 string) {
		// A lenient read accepts all a strict one does, and fails only
		// with a *ConfigError too.
		warned := 0
		_, lerr := ParseDomainWith("f.yaml", []byte(text), LoadConfig{Warn: func(*ConfigError) { warned++ }})
		d, err := ParseDomain("f.yaml", []byte(text))
		if err == nil && (lerr != nil || warned > 0) {
			t.Fatalf("strict accepts, lenient says %v with %d warnings", lerr, warned)
		}
		var lce *ConfigError
		if lerr != nil && !errors.As(lerr, &lce) {
			t.Fatalf("lenient error %v (%T) is not a *ConfigError", lerr, lerr)
		}
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.File != "f.yaml" || !strings.HasPrefix(err.Error(), "envoyrls: f.yaml") {
				t.Fatalf("error %v (%T) is not a *ConfigError of f.yaml", err, err)
			}
			return
		}
		if _, err := NewRules(d); err != nil {
			t.Fatal(err)
		}
		for _, entries := range [][]Entry{{{k1, v1}}, {{k1, v1}, {k2, v2}}} {
			m := d.Match(entries)
			if m.Descriptor == nil {
				continue
			}
			if key := m.CounterKey(); key == "" || len(key) > MaxCounterKeyLen {
				t.Fatalf("counter key %q", key)
			}
			if !strings.HasPrefix(m.MetricKey(), d.Name+".") {
				t.Fatalf("metric key %q outside domain %q", m.MetricKey(), d.Name)
			}
			if got, want := m.MetricKey(), m.buildMetricKey(m.Descriptor.DetailedMetric); got != want {
				t.Fatalf("metric key %q, written out %q", got, want)
			}
		}
	})
}

// FuzzRulesFromXDS feeds arbitrary RateLimitConfig bytes: it never
// panics, and every error wraps ErrInvalidConfig.
func FuzzRulesFromXDS(f *testing.F) {
	for _, c := range []*rlconfv3.RateLimitConfig{
		{Name: "a", Domain: "a", Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "k", Value: "v*", RateLimit: &rlconfv3.RateLimitPolicy{Unit: 2, RequestsPerUnit: 3, Name: "n", Replaces: []*rlconfv3.RateLimitReplace{{Name: "m"}}}}}},
		{Name: "b", Domain: "b", Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "s", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}}}}}},
	} {
		b, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res := []*anypb.Any{{TypeUrl: RateLimitConfigType, Value: data}}
		if _, err := RulesFromXDS(res, LoadConfig{}); err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("error %v (%T) does not wrap ErrInvalidConfig", err, err)
		}
	})
}

// FuzzWireRequest: whatever the bytes, UnmarshalWire does not panic; on
// bytes the protobuf runtime decodes, its field-by-field decoding reads
// the same request, fields it does not know aside.
func FuzzWireRequest(f *testing.F) {
	seed, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}, HitsAddend: wrapperspb.UInt64(2)},
		{Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_DAY}},
	}})
	f.Add(seed)
	f.Add([]byte{0x0a, 0x01, 0xff})
	f.Add([]byte{0x12, 0x05, 0x0a, 0x03, 0x12, 0x01, 0xfe})
	f.Fuzz(func(t *testing.T, b []byte) {
		var w wireRequest
		_ = w.UnmarshalWire(b)
		var strict rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &strict) != nil {
			return
		}
		var lenient wireRequest
		if err := decodeLenient(b, &lenient); err != nil {
			t.Fatalf("the runtime decodes %x, field by field: %v", b, err)
		}
		discardUnknown(strict.ProtoReflect())
		discardUnknown(lenient.ProtoReflect())
		if !proto.Equal(&strict, &lenient.RateLimitRequest) {
			t.Fatalf("%x: runtime %v, field by field %v", b, &strict, &lenient.RateLimitRequest)
		}
	})
}

// discardUnknown drops the unknown fields of m and of the messages in it.
func discardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			for i := range v.List().Len() {
				discardUnknown(v.List().Get(i).Message())
			}
		default:
			discardUnknown(v.Message())
		}
		return true
	})
}
