package ring

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// routeBytes is the byte string RouteHash is specified to hash.
func routeBytes(name, key string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(name)))
	b = append(b, name...)
	return append(b, key...)
}

func TestRouteHashUnambiguous(t *testing.T) {
	pairs := []struct{ n1, k1, n2, k2 string }{
		{"a", "bc", "ab", "c"},
		{"", "abc", "abc", ""},
		{"a", "", "", "a"},
		{"api", "user:1", "api:user", "1"},
		{"x\x00", "y", "x", "\x00y"},
	}
	for _, p := range pairs {
		h1, h2 := RouteHash(p.n1, p.k1), RouteHash(p.n2, p.k2)
		if h1 == h2 {
			t.Errorf("RouteHash(%q, %q) == RouteHash(%q, %q) == %#x", p.n1, p.k1, p.n2, p.k2, h1)
		}
	}
}

// TestRouteHashEncoding pins the encoding: every node of a cluster must
// compute the same hash, across releases too.
func TestRouteHashEncoding(t *testing.T) {
	tests := []struct{ name, key string }{
		{"", ""},
		{"a", "bc"},
		{"ab", "c"},
		{"api", "user-42"},
		{"a-limit-name-longer-than-thirty-two-bytes", "and-a-key-that-is-also-rather-long-0123456789"},
		// Around the switch from the stack buffer to streaming.
		{"name", strings.Repeat("k", routeBufLen-8-4-1)},
		{"name", strings.Repeat("k", routeBufLen-8-4)},
		{"name", strings.Repeat("k", routeBufLen-8-4+1)},
		{strings.Repeat("n", routeBufLen), ""},
		{strings.Repeat("n", 1000), strings.Repeat("k", 1000)},
	}
	for _, tt := range tests {
		want := xxhash.Sum64(routeBytes(tt.name, tt.key))
		if got := RouteHash(tt.name, tt.key); got != want {
			t.Errorf("RouteHash(%q, %q) = %#x, want %#x", tt.name, tt.key, got, want)
		}
	}
	// Fixed values guard against a change of hash function or seed.
	golden := []struct {
		name, key string
		want      uint64
	}{
		{"", "", 0x34c96acdcadb1bbb},
		{"api", "user-42", 0xaee3a285ab3bafce},
	}
	for _, g := range golden {
		if got := RouteHash(g.name, g.key); got != g.want {
			t.Errorf("RouteHash(%q, %q) = %#x, want %#x", g.name, g.key, got, g.want)
		}
	}
}

func TestRouteHashAllocs(t *testing.T) {
	for _, key := range []string{"user-42", strings.Repeat("k", 2*routeBufLen)} {
		if n := testing.AllocsPerRun(100, func() { RouteHash("api", key) }); n != 0 {
			t.Fatalf("RouteHash with a %d-byte key allocates %v times per call, want 0", len(key), n)
		}
	}
}
