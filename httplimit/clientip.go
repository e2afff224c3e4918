package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// MaxForwardedHops bounds the hops of a forwarding header that are
// examined for one request, right to left. A chain of proxies is a few
// hops (a CDN, a cloud load balancer, an ingress and a sidecar are four);
// past the bound the walk ends as at a hop that is not an address: the
// client is the nearest address found so far. The header is never split
// as a whole, so a hostile one costs time in proportion to the part
// examined and allocates a bounded amount.
const MaxForwardedHops = 16

// maxHopLen is longer than any address a hop may hold, with brackets, a
// zone, a port and quotes; a longer hop is not an address, whatever it
// holds.
const maxHopLen = 128

// source is the header a client IP is read from.
type source uint8

const (
	fromXForwardedFor source = iota // a list, appended to by each proxy
	fromForwarded                   // a list of RFC 7239 elements
	fromSingle                      // one address, set by the proxy
)

// clientIPs resolves a request's client address: the direct peer, or,
// when the peer is a trusted proxy, the address the one header they set
// names. It is immutable once built.
type clientIPs struct {
	trusted []netip.Prefix
	// from says which header counts. Only the header the trusted proxies
	// write counts, or a client could name itself in another.
	from source
	// single is the canonical name of the header for fromSingle.
	single string
}

func (c *clientIPs) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// resolve returns the client IP of r. The header counts only when the
// direct peer is trusted. A list header (X-Forwarded-For, or Forwarded
// (RFC 7239)) is read right to left, its field lines as one list in order,
// skipping trusted hops: the first untrusted hop is the client. A hop that
// is not an address ("unknown", an obfuscated identifier, garbage), or
// one past MaxForwardedHops, ends the walk at the nearest address found.
// When every hop is trusted, the leftmost is the client. A single-address
// header must be one field line holding one address; otherwise the peer
// is the client.
func (c *clientIPs) resolve(r *http.Request) netip.Addr {
	peer := parseHop(r.RemoteAddr)
	if !peer.IsValid() || !c.isTrusted(peer) {
		return peer
	}
	if c.from == fromSingle {
		if v := r.Header.Values(c.single); len(v) == 1 {
			if a := parseHop(v[0]); a.IsValid() {
				return a
			}
		}
		return peer
	}
	w := hopWalker{forwarded: c.from == fromForwarded}
	if w.forwarded {
		w.lines = r.Header.Values("Forwarded")
	} else {
		w.lines = r.Header.Values("X-Forwarded-For")
	}
	w.line = len(w.lines)
	addr := peer
	for range MaxForwardedHops {
		hop, ok := w.next()
		if !ok {
			break
		}
		if w.forwarded {
			if strings.TrimSpace(hop) == "" {
				continue // an empty list element; it counts toward the bound
			}
			hop = forValue(hop)
		}
		a := parseHop(hop)
		if !a.IsValid() {
			break
		}
		addr = a
		if !c.isTrusted(a) {
			break
		}
	}
	return addr
}

// hopWalker yields the elements of a list header right to left: the last
// field line first, each line from its end. It slices the header's own
// strings and allocates nothing.
type hopWalker struct {
	lines     []string
	forwarded bool   // elements are RFC 7239's, which may hold quoted commas
	line      int    // lines[line] is being walked, or was the last one
	rest      string // the part of lines[line] not yet walked
	open      bool   // rest holds an element not yet yielded
}

// next returns the next element to the left, untrimmed: for Forwarded
// the whole element, for X-Forwarded-For the hop.
func (w *hopWalker) next() (string, bool) {
	if !w.open {
		if w.line == 0 {
			return "", false
		}
		w.line--
		w.rest, w.open = w.lines[w.line], true
	}
	var elem string
	if w.forwarded {
		w.rest, elem, w.open = cutLastElement(w.rest)
	} else {
		i := strings.LastIndexByte(w.rest, ',')
		elem, w.open = w.rest[i+1:], i >= 0
		if w.open {
			w.rest = w.rest[:i]
		}
	}
	return elem, true
}

// cutLastElement splits s at its last comma outside a quoted string: rest
// is what precedes the comma and found is false when there is none. A
// quote preceded by an odd number of backslashes is escaped. The proxies'
// own elements, at the right, are well formed; what a client wrote to
// their left is read only when every hop after it is trusted, and then the
// client could have named any address anyway. Each byte is visited once.
func cutLastElement(s string) (rest, elem string, found bool) {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			j := i
			for j > 0 && s[j-1] == '\\' {
				j--
			}
			if (i-j)%2 == 0 {
				quoted = !quoted
			}
			i = j // the backslashes are content, not separators
		case ',':
			if !quoted {
				return s[:i], s[i+1:], true
			}
		}
	}
	return "", s, false
}

// forValue returns the unquoted for= value of a Forwarded element, or ""
// (an unknown hop) when it has none, more than one, or one too long to be
// an address.
func forValue(elem string) string {
	var hop string
	seen := false
	for rest, more := elem, true; more; {
		var pair string
		pair, rest, more = cutQuoted(rest, ';')
		if k, v, ok := strings.Cut(pair, "="); ok && strings.EqualFold(strings.TrimSpace(k), "for") {
			if seen {
				return ""
			}
			hop, seen = strings.TrimSpace(v), true
		}
	}
	if len(hop) > maxHopLen {
		return ""
	}
	return unquote(hop)
}

// cutQuoted splits s at the first sep outside a quoted string.
func cutQuoted(s string, sep byte) (before, after string, found bool) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// parseHop parses "1.2.3.4", "1.2.3.4:80", "[2001:db8::1]:80",
// "[2001:db8::1]" or "2001:db8::1"; the zero Addr when it is none of them.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if len(s) > maxHopLen {
		return netip.Addr{}
	}
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
