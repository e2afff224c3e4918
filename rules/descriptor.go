package rules

import (
	"net/http"
	"net/netip"
)

// Descriptor is what a request looks like to the rules: the facts a rule
// can match on and key its counter by. The HTTP middleware and the gRPC
// interceptor build one per request; applications with other transports
// build their own.
type Descriptor struct {
	// Route is the path ("/api/items/7"), a router pattern, or a gRPC full
	// method name ("/pkg.Service/Method").
	Route string
	// Method is the HTTP method, or "grpc".
	Method string
	// IP is the client's address; the zero Addr when unknown.
	IP netip.Addr
	// User is the authenticated user; "" when anonymous.
	User string
	// Header looks up request headers (HTTP headers, gRPC metadata); nil
	// when there are none.
	Header HeaderLookup
	// Values are application-defined descriptors ("plan": "free").
	Values map[string]string
}

// HeaderLookup returns the first value of the header named name, and
// whether the header is present. name is in canonical form
// ("X-Tenant"); lookups are case-insensitive.
type HeaderLookup func(name string) (string, bool)

// HTTPHeader returns a HeaderLookup over h.
func HTTPHeader(h http.Header) HeaderLookup {
	return func(name string) (string, bool) {
		v := h[name] // names from rules are already canonical
		if v == nil {
			v = h.Values(name)
		}
		if len(v) == 0 {
			return "", false
		}
		return v[0], true
	}
}

func (d *Descriptor) header(name string) (string, bool) {
	if d.Header == nil {
		return "", false
	}
	return d.Header(name)
}
