// Package httplimit is net/http middleware that rate-limits requests with
// the rules of a [rules.Set], decided by a sluice cluster node.
//
// For each request the middleware builds a [rules.Descriptor]: the route
// (the path, or what a RouteFunc says, such as the ServeMux pattern), the
// method, the client IP, the user (UserFunc), the headers and the
// application's descriptors (DescriptorFunc). The client IP is the
// connection's peer; the forwarding header the proxies set
// (X-Forwarded-For, or Forwarded (RFC 7239) with ForwardedHeader) is
// believed only when that peer is one of the TrustedProxies, and is then
// read right to left, skipping trusted hops, so that a client cannot choose
// its own address by sending the header itself. The other header is never
// read: behind a proxy that appends only one, a client could name itself
// in the other.
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
// Shadow mode (for all rules, or per rule in the set) decides, counts and
// sets the headers but never blocks. With MaxWait a request waits for a
// leaky-bucket rule's pacing delay instead of being rejected. When the
// limiter fails the request goes through and is counted, or gets 503 with
// FailClosed. OnDecision reports every decision, for metrics and logs.
package httplimit
