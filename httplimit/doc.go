// Package httplimit is net/http middleware that rate-limits requests with
// the rules of a [rules.Set], decided by a sluice cluster node.
//
// For each request the middleware builds a [rules.Descriptor]: the route
// (the path, or what a RouteFunc says, such as the ServeMux pattern), the
// method, the client IP, the user (UserFunc), the headers and the
// application's descriptors (DescriptorFunc). The client IP is described
// below.
//
// Every rule that matches applies, all or nothing ([rules.Enforcer]): the
// request passes only if all enforced rules admit it, and a rejected
// request consumes from none of them. Every response to a request a rule
// applied to carries X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds) of the most restrictive limit, and the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-
// headers listing every limit:
//
//	X-RateLimit-Limit: 100
//	X-RateLimit-Remaining: 42
//	X-RateLimit-Reset: 17
//	RateLimit-Policy: "api_per_user";q=100;w=60
//	RateLimit: "api_per_user";r=42;t=17
//
// A rejected request gets 429 Too Many Requests, Retry-After in whole
// seconds, and an RFC 9457 application/problem+json body with type
// [QuotaExceeded], retry_after and violated-policies; the next handler is
// not called.
//
// The decision itself is [rules.Guard]'s, which the gRPC interceptor shares;
// the [Guard] option sets its [rules.GuardConfig]. Shadow mode (for all
// rules, or per rule in the set) decides, counts and sets the headers but
// never blocks. With MaxWait a request waits for a leaky-bucket rule's
// pacing delay instead of being rejected. When the limiter fails the
// request goes through and is counted, or gets 503 with FailClosed. A
// request costs one hit unless [Cost] says otherwise; a cost more than a
// rule can ever admit gets 429. OnDecision reports every decision, for
// metrics and logs.
//
// # Client IP
//
// The client IP is the connection's peer, unless that peer is one of the
// TrustedProxies. Then one header counts, the one the proxies set:
// X-Forwarded-For by default, Forwarded (RFC 7239) with ForwardedHeader,
// or a single-address header with ClientIPHeader. Every other header is
// ignored, whatever it says: behind a proxy that appends to only one, a
// client could name itself in another.
//
// A list header is read right to left, as nginx's real_ip_recursive reads
// it: its field lines count as one list in order, each proxy's entry is to
// the right of what it received, and trusted hops are skipped, so the
// first untrusted hop is the client, and what the client wrote to the left
// of it is never reached. A hop that is not an address ("unknown", an
// obfuscated Forwarded identifier, an empty X-Forwarded-For entry,
// garbage) ends the walk
// at the nearest address found; so does the hop past [MaxForwardedHops]
// (16), so that a hostile header of a megabyte costs the walk of 16 hops,
// not a split of the whole header. When every hop is trusted, the leftmost
// is the client. List in TrustedProxies every proxy that appends to the
// header, not only the nearest.
//
// The settings for common proxies (10.0.0.0/8 stands for the addresses
// the proxy connects from):
//
//   - nginx: proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
//     appends the peer nginx saw to the client's header.
//     TrustedProxies("10.0.0.0/8").
//   - HAProxy: option forwardfor adds a field line with the peer it saw
//     (the lines count as one list). TrustedProxies("10.0.0.0/8"). Not
//     "option forwardfor if-none", which passes a client's own header on
//     unchanged.
//   - AWS Application Load Balancer: appends the client to X-Forwarded-For
//     (routing.http.xff_header_processing.mode append, the default; leave
//     routing.http.xff_client_port.enabled off, since an IPv6 address
//     followed by a port without brackets reads as another address).
//     TrustedProxies with the
//     subnets of the load balancer, such as the VPC's "10.0.0.0/16".
//   - Google Cloud external Application Load Balancer: appends two
//     addresses, "<client>,<load balancer>", and connects from Google's
//     front ends. TrustedProxies("35.191.0.0/16", "130.211.0.0/22",
//     "<the load balancer's address>"): the load balancer's own entry is
//     skipped as trusted. A regional load balancer connects from its
//     proxy-only subnet instead.
//   - Cloudflare: CF-Connecting-IP is one address, which Cloudflare sets on
//     every request; ClientIPHeader("CF-Connecting-IP") reads it, with
//     TrustedProxies listing Cloudflare's ranges
//     (https://www.cloudflare.com/ips/) and nothing else that passes a
//     client's own header on. Cloudflare also appends the client to
//     X-Forwarded-For, which the default reads with the same
//     TrustedProxies; prefer it when another proxy stands between
//     Cloudflare and the application (list that proxy too).
//   - Envoy: use_remote_address: true appends the peer Envoy saw to
//     X-Forwarded-For. TrustedProxies with Envoy's addresses, and those of
//     the proxies in front of it, which xff_num_trusted_hops counts: sluice
//     skips trusted addresses rather than counting hops. With
//     use_remote_address false Envoy appends nothing, and the rightmost
//     entry is whatever reached Envoy.
//   - Traefik: appends the peer it saw to X-Forwarded-For, dropping a
//     client's X-Forwarded-* unless the entry point's
//     forwardedHeaders.trustedIPs (or insecure) says to keep them.
//     TrustedProxies with Traefik's addresses; behind a load balancer, the
//     load balancer's too, also in forwardedHeaders.trustedIPs.
//   - A proxy that writes Forwarded, such as HAProxy 2.8 with "option
//     forwarded for": ForwardedHeader("Forwarded") and
//     TrustedProxies("10.0.0.0/8"). Each element's for= counts, quoted or
//     not, with a port or not.
//   - nginx with proxy_set_header X-Real-IP $remote_addr: the header holds
//     one address nginx sets; ClientIPHeader("X-Real-IP") reads it, with
//     TrustedProxies("10.0.0.0/8").
//
// For example, behind a Google Cloud load balancer:
//
//	mw, err := httplimit.New(node, src,
//		httplimit.TrustedProxies("35.191.0.0/16", "130.211.0.0/22", "203.0.113.10"))
package httplimit
