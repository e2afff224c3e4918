package httplimit

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted := clientIPs{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}}
	rfc := trusted
	rfc.forwarded = true
	tests := []struct {
		name   string
		ips    clientIPs
		remote string
		hdr    []string
		want   string
	}{
		{"no proxies configured", clientIPs{}, "10.0.0.1:5000", []string{"X-Forwarded-For", "1.2.3.4"}, "10.0.0.1"},
		{"untrusted peer", trusted, "192.0.2.1:5000", []string{"X-Forwarded-For", "1.2.3.4"}, "192.0.2.1"},
		{"trusted peer, xff", trusted, "10.0.0.1:5000", []string{"X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},
		{"ipv6 peer", trusted, "[2001:db8:ffff::1]:443", []string{"X-Forwarded-For", "2001:db8::2"}, "2001:db8::2"},
		{"mapped peer", trusted, "[::ffff:10.0.0.1]:443", []string{"X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},
		{"xff with ports and brackets", trusted, "10.0.0.1:1", []string{"X-Forwarded-For", "5.6.7.8, [2001:db8::9]:80"}, "2001:db8::9"},
		{"xff all trusted", trusted, "10.0.0.1:1", []string{"X-Forwarded-For", "10.9.9.9, 10.8.8.8"}, "10.9.9.9"},
		{"xff garbage hop", trusted, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, garbage, 10.2.2.2"}, "10.2.2.2"},
		{"empty xff", trusted, "10.0.0.1:1", []string{"X-Forwarded-For", ""}, "10.0.0.1"},
		{"forwarded quoted comma", rfc, "10.0.0.1:1", []string{"Forwarded", `for=1.1.1.1;by="a,b", for=2.2.2.2`}, "2.2.2.2"},
		{"forwarded case and spaces", rfc, "10.0.0.1:1", []string{"Forwarded", `For = "192.0.2.60:8080" ; proto=http`}, "192.0.2.60"},
		{"forwarded unknown", rfc, "10.0.0.1:1", []string{"Forwarded", "for=1.1.1.1, for=unknown"}, "10.0.0.1"},
		{"forwarded without for", rfc, "10.0.0.1:1", []string{"Forwarded", "proto=https"}, "10.0.0.1"},
		{"forwarded lines in order", rfc, "10.0.0.1:1", []string{"Forwarded", "for=3.3.3.3", "Forwarded", "for=10.1.1.1"}, "3.3.3.3"},
		{"xff read, forwarded ignored", trusted, "10.0.0.1:1", []string{"Forwarded", "for=6.6.6.6", "X-Forwarded-For", "1.2.3.4"}, "1.2.3.4"},
		{"forwarded read, xff ignored", rfc, "10.0.0.1:1", []string{"Forwarded", "for=6.6.6.6", "X-Forwarded-For", "1.2.3.4"}, "6.6.6.6"},
		{"forwarded alone, xff read", trusted, "10.0.0.1:1", []string{"Forwarded", "for=3.3.3.3"}, "10.0.0.1"},
		{"unparseable peer", trusted, "@", []string{"X-Forwarded-For", "1.2.3.4"}, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				r.Header.Add(tt.hdr[i], tt.hdr[i+1])
			}
			if got := tt.ips.resolve(r).String(); got != tt.want {
				t.Errorf("client IP %s, want %s", got, tt.want)
			}
		})
	}
}
