package httplimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"testing"
)

// chain returns n distinct trusted hops, "10.0.0.1, 10.0.0.2, ...".
func chain(n int) string {
	hops := make([]string, n)
	for i := range hops {
		hops[i] = fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
	}
	return strings.Join(hops, ", ")
}

// lines returns one header field line per trusted hop of chain(n).
func lines(name string, n int) []string {
	var out []string
	for _, h := range strings.Split(chain(n), ", ") {
		out = append(out, name, h)
	}
	return out
}

func TestClientIP(t *testing.T) {
	xff := clientIPs{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}}
	rfc := xff
	rfc.from = fromForwarded
	cf := xff
	cf.from, cf.single = fromSingle, "Cf-Connecting-Ip"
	const bound = MaxForwardedHops
	tests := []struct {
		name   string
		ips    clientIPs
		remote string
		hdr    []string
		want   string
	}{
		{"no proxies configured", clientIPs{}, "10.0.0.1:5000", []string{"X-Forwarded-For", "1.2.3.4"}, "10.0.0.1"},
		{"untrusted peer", xff, "192.0.2.1:5000", []string{"X-Forwarded-For", "1.2.3.4"}, "192.0.2.1"},
		{"unparseable peer", xff, "@", []string{"X-Forwarded-For", "1.2.3.4"}, "invalid IP"},
		{"ipv6 peer", xff, "[2001:db8:ffff::1]:443", []string{"X-Forwarded-For", "2001:db8::2"}, "2001:db8::2"},
		{"mapped peer", xff, "[::ffff:10.0.0.1]:443", []string{"X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},

		// X-Forwarded-For, right to left.
		{"xff one hop", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},
		{"xff client's own entries ignored", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "6.6.6.6, 7.7.7.7, 1.2.3.4"}, "1.2.3.4"},
		{"xff trusted hops skipped", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "6.6.6.6, 1.2.3.4, 10.9.9.9, 2001:db8:ffff::3"}, "1.2.3.4"},
		{"xff ports, brackets, zone, mapped", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "5.6.7.8, [2001:db8::9]:80"}, "2001:db8::9"},
		{"xff ipv4 with port", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.2.3.4:5678"}, "1.2.3.4"},
		{"xff ipv6 and port without brackets: another address", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "2001:db8::1:443"}, "2001:db8::1:443"},
		{"xff zone dropped", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "fe80::1%eth0"}, "fe80::1"},
		{"xff mapped address", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "::ffff:1.2.3.4"}, "1.2.3.4"},
		{"xff spaces and tabs", xff, "10.0.0.1:1", []string{"X-Forwarded-For", " 1.1.1.1 ,\t10.2.2.2 "}, "1.1.1.1"},
		{"xff no spaces", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1,10.2.2.2"}, "1.1.1.1"},
		{"xff all trusted: the leftmost", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "10.9.9.9, 10.8.8.8"}, "10.9.9.9"},
		{"xff garbage hop ends the walk", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, garbage, 10.2.2.2"}, "10.2.2.2"},
		{"xff unknown hop ends the walk", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, unknown"}, "10.0.0.1"},
		{"xff empty entry ends the walk", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, , 10.2.2.2"}, "10.2.2.2"},
		{"xff trailing comma", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1,"}, "10.0.0.1"},
		{"empty xff", xff, "10.0.0.1:1", []string{"X-Forwarded-For", ""}, "10.0.0.1"},
		{"no header", xff, "10.0.0.1:1", nil, "10.0.0.1"},
		{"xff hop too long", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, 1" + strings.Repeat("0", maxHopLen)}, "10.0.0.1"},
		{"xff lines are one list", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "6.6.6.6, 1.1.1.1", "X-Forwarded-For", "10.0.0.5, 10.0.0.6"}, "1.1.1.1"},
		{"xff last line first", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "2.2.2.2"}, "2.2.2.2"},
		{"xff empty last line", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", ""}, "10.0.0.1"},
		{"xff one hop under the bound", xff, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, " + chain(bound-1)}, "1.1.1.1"},
		{"xff at the bound: the nearest", xff, "10.255.255.1:1", []string{"X-Forwarded-For", "1.1.1.1, " + chain(bound)}, "10.0.0.1"},
		{"xff far past the bound", xff, "10.255.255.1:1", []string{"X-Forwarded-For", "1.1.1.1, " + chain(10*bound)}, fmt.Sprintf("10.0.%d.%d", (9*bound)/250, (9*bound)%250+1)},
		{"xff bound across lines", xff, "10.255.255.1:1", append([]string{"X-Forwarded-For", "1.1.1.1"}, lines("X-Forwarded-For", bound)...), "10.0.0.1"},
		{"xff under the bound across lines", xff, "10.0.0.1:1", append([]string{"X-Forwarded-For", "1.1.1.1"}, lines("X-Forwarded-For", bound-1)...), "1.1.1.1"},
		{"xff read, forwarded ignored", xff, "10.0.0.1:1", []string{"Forwarded", "for=6.6.6.6", "X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},
		{"forwarded alone, xff read", xff, "10.0.0.1:1", []string{"Forwarded", "for=3.3.3.3"}, "10.0.0.1"},
		{"xff read, single header ignored", xff, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "6.6.6.6", "X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},

		// Forwarded (RFC 7239), right to left.
		{"forwarded one element", rfc, "10.0.0.1:1", []string{"Forwarded", "for=192.0.2.43"}, "192.0.2.43"},
		{"forwarded quoted ipv6 and port", rfc, "10.0.0.1:1", []string{"Forwarded", `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"forwarded quoted comma", rfc, "10.0.0.1:1", []string{"Forwarded", `for=1.1.1.1;by="a,b", for=2.2.2.2`}, "2.2.2.2"},
		{"forwarded quoted comma to the left", rfc, "10.0.0.1:1", []string{"Forwarded", `for=1.1.1.1;by="a,b", for=10.0.0.9`}, "1.1.1.1"},
		{"forwarded escaped quote", rfc, "10.0.0.1:1", []string{"Forwarded", `for=1.1.1.1;by="x\",y", for=10.0.0.9`}, "1.1.1.1"},
		{"forwarded escaped backslash", rfc, "10.0.0.1:1", []string{"Forwarded", `for=8.8.8.8, for=7.7.7.7;x="\\", for=10.0.0.9`}, "7.7.7.7"},
		{"forwarded client's open quote", rfc, "10.0.0.1:1", []string{"Forwarded", `for="6.6.6.6, for=1.2.3.4`}, "1.2.3.4"},
		{"forwarded case and spaces", rfc, "10.0.0.1:1", []string{"Forwarded", `For = "192.0.2.60:8080" ; proto=http`}, "192.0.2.60"},
		{"forwarded other parameters", rfc, "10.0.0.1:1", []string{"Forwarded", "proto=https;for=192.0.2.7;by=10.0.0.1;host=example.com"}, "192.0.2.7"},
		{"forwarded for twice in an element", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, for=2.2.2.2;for=10.0.0.3"}, "10.0.0.1"},
		{"forwarded unknown", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, for=unknown"}, "10.0.0.1"},
		{"forwarded obfuscated", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, for=_hidden, for=10.3.3.3"}, "10.3.3.3"},
		{"forwarded without for", rfc, "10.0.0.1:1", []string{"Forwarded", "proto=https"}, "10.0.0.1"},
		{"forwarded empty elements skipped", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, ,, for=10.0.0.9,"}, "1.1.1.1"},
		{"forwarded empty elements count toward the bound", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1" + strings.Repeat(",", bound)}, "10.0.0.1"},
		{"forwarded value too long", rfc, "10.0.0.1:1", []string{"Forwarded", `for="` + strings.Repeat(`\1`, maxHopLen) + `"`}, "10.0.0.1"},
		{"forwarded lines in order", rfc, "10.0.0.1:1", []string{"Forwarded", "for=3.3.3.3", "Forwarded", "for=10.1.1.1"}, "3.3.3.3"},
		{"forwarded at the bound", rfc, "10.255.255.1:1", []string{"Forwarded", "for=1.1.1.1, for=" + strings.ReplaceAll(chain(bound), ", ", ", for=")}, "10.0.0.1"},
		{"forwarded under the bound", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, for=" + strings.ReplaceAll(chain(bound-1), ", ", ", for=")}, "1.1.1.1"},
		{"forwarded read, xff ignored", rfc, "10.0.0.1:1", []string{"Forwarded", "for=6.6.6.6", "X-Forwarded-For", "1.2.3.4"}, "6.6.6.6"},
		{"xff alone, forwarded read", rfc, "10.0.0.1:1", []string{"X-Forwarded-For", "1.2.3.4"}, "10.0.0.1"},

		// A single-address header.
		{"single", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "203.0.113.7"}, "203.0.113.7"},
		{"single ipv6", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", " 2001:db8::7 "}, "2001:db8::7"},
		{"single from an untrusted peer", cf, "192.0.2.1:1", []string{"Cf-Connecting-Ip", "203.0.113.7"}, "192.0.2.1"},
		{"single trusted address", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "10.0.0.8"}, "10.0.0.8"},
		{"single absent", cf, "10.0.0.1:1", nil, "10.0.0.1"},
		{"single twice", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "203.0.113.7", "Cf-Connecting-Ip", "203.0.113.8"}, "10.0.0.1"},
		{"single list", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "203.0.113.7, 203.0.113.8"}, "10.0.0.1"},
		{"single garbage", cf, "10.0.0.1:1", []string{"Cf-Connecting-Ip", "unknown"}, "10.0.0.1"},
		{"single, xff and forwarded ignored", cf, "10.0.0.1:1", []string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.7"}, "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(tt.remote, tt.hdr...)
			if got := tt.ips.resolve(r).String(); got != tt.want {
				t.Errorf("client IP %s, want %s", got, tt.want)
			}
		})
	}
}

func request(remote string, hdr ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

// A hostile header of a megabyte costs a bounded number of allocations
// and bytes, whatever its shape: the walk slices the header and stops
// after MaxForwardedHops hops.
func TestClientIPHostileHeaderAllocates(t *testing.T) {
	const mb = 1 << 20
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	xff := clientIPs{trusted: trusted}
	rfc := clientIPs{trusted: trusted, from: fromForwarded}
	single := clientIPs{trusted: trusted, from: fromSingle, single: "X-Real-Ip"}
	fill := func(unit string) string { return strings.Repeat(unit, mb/len(unit)) }
	manyLines := func(name, unit string) []string {
		var hdr []string
		for range mb / len(unit) {
			hdr = append(hdr, name, unit)
		}
		return hdr
	}
	tests := []struct {
		name string
		ips  clientIPs
		hdr  []string
	}{
		{"xff commas", xff, []string{"X-Forwarded-For", fill(",")}},
		{"xff trusted hops", xff, []string{"X-Forwarded-For", fill("10.0.0.1,")}},
		{"xff trusted hops with spaces", xff, []string{"X-Forwarded-For", fill("10.1.2.3 , ")}},
		{"xff one huge hop", xff, []string{"X-Forwarded-For", fill("1")}},
		{"xff spaces", xff, []string{"X-Forwarded-For", fill(" ")}},
		{"xff lines", xff, manyLines("X-Forwarded-For", "10.0.0.1")},
		{"forwarded commas", rfc, []string{"Forwarded", fill(",")}},
		{"forwarded trusted hops", rfc, []string{"Forwarded", fill("for=10.0.0.1,")}},
		{"forwarded quotes", rfc, []string{"Forwarded", fill(`"`)}},
		{"forwarded escaped quotes", rfc, []string{"Forwarded", fill(`\"`)}},
		{"forwarded backslashes", rfc, []string{"Forwarded", `for="` + fill(`\`)}},
		{"forwarded quoted commas", rfc, []string{"Forwarded", `for="` + fill(",")}},
		{"forwarded parameters", rfc, []string{"Forwarded", fill("a=b;")}},
		{"forwarded semicolons", rfc, []string{"Forwarded", fill(";")}},
		{"forwarded huge for", rfc, []string{"Forwarded", "for=" + fill("1")}},
		{"forwarded huge quoted for", rfc, []string{"Forwarded", `for="` + fill(`\1`) + `"`}},
		{"forwarded lines", rfc, manyLines("Forwarded", "for=10.0.0.1")},
		{"single huge", single, []string{"X-Real-Ip", fill("1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request("10.0.0.1:1", tt.hdr...)
			run := func() { tt.ips.resolve(r) }
			if n := testing.AllocsPerRun(20, run); n > 4 {
				t.Errorf("%v allocations per request, want at most 4", n)
			}
			if b := bytesPerRun(20, run); b > 1024 {
				t.Errorf("%d bytes allocated per request of a %d-byte header, want at most 1024", b, mb)
			}
		})
	}
}

// bytesPerRun returns the bytes f allocates, on average over runs calls.
func bytesPerRun(runs int, f func()) uint64 {
	f() // warm up, as testing.AllocsPerRun does
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// go test -run '^$' -bench ClientIPHostile ./httplimit: the cost of a
// megabyte of trusted X-Forwarded-For hops.
func BenchmarkClientIPHostile(b *testing.B) {
	ips := clientIPs{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	r := request("10.0.0.1:1", "X-Forwarded-For", strings.Repeat("10.0.0.1,", 1<<20/9))
	b.ReportAllocs()
	for b.Loop() {
		ips.resolve(r)
	}
}
