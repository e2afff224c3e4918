package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientIPs resolves a request's client address: the direct peer, or,
// when the peer is a trusted proxy, the address its forwarding headers
// name. It is immutable once built.
type clientIPs struct {
	trusted []netip.Prefix
	// forwarded reads the Forwarded header (RFC 7239) instead of
	// X-Forwarded-For: only the header the trusted proxies write counts,
	// or a client could name itself in the other.
	forwarded bool
}

func (c *clientIPs) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// resolve returns the client IP of r. Forwarding headers count only when
// the direct peer is trusted; they are read right to left, skipping
// trusted hops, and the first untrusted hop is the client. A hop that is
// not an address ("unknown", an obfuscated identifier, garbage) ends the
// walk at the nearest known address. When every hop is trusted, the
// leftmost is the client. Only one header is read: X-Forwarded-For, or
// Forwarded (RFC 7239) when c.forwarded is set.
func (c *clientIPs) resolve(r *http.Request) netip.Addr {
	peer := parseHop(r.RemoteAddr)
	if !peer.IsValid() || len(c.trusted) == 0 || !c.isTrusted(peer) {
		return peer
	}
	var hops []string
	if c.forwarded {
		hops = forwardedFor(r.Header.Values("Forwarded"))
	} else {
		for _, v := range r.Header.Values("X-Forwarded-For") {
			for _, h := range strings.Split(v, ",") {
				hops = append(hops, strings.TrimSpace(h))
			}
		}
	}
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHop(hops[i])
		if !a.IsValid() {
			return addr
		}
		addr = a
		if !c.isTrusted(a) {
			return a
		}
	}
	return addr
}

// parseHop parses "1.2.3.4", "1.2.3.4:80", "[2001:db8::1]:80",
// "[2001:db8::1]" or "2001:db8::1"; the zero Addr when it is none of them.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	} else {
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

// forwardedFor returns the for= value of each element of the Forwarded
// field lines, in order; nil when there are none. An element without
// for= yields "" (an unknown hop).
func forwardedFor(lines []string) []string {
	var out []string
	for _, line := range lines {
		for _, elem := range splitQuoted(line, ',') {
			if strings.TrimSpace(elem) == "" {
				continue
			}
			var hop string
			for _, pair := range splitQuoted(elem, ';') {
				k, v, ok := strings.Cut(pair, "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					hop = unquote(strings.TrimSpace(v))
				}
			}
			out = append(out, hop)
		}
	}
	return out
}

// splitQuoted splits s at sep outside quoted strings.
func splitQuoted(s string, sep byte) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unquote removes the quotes and escapes of a quoted-string, and returns
// a token unchanged.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
