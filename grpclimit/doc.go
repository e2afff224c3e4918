// Package grpclimit rate-limits gRPC calls with the rules of a
// [rules.Set], decided by a sluice cluster node: unary and stream server
// interceptors built on [rules.Enforcer], the same all-or-nothing
// enforcement as package httplimit.
//
// A call's [rules.Descriptor] has the full method name as its route
// ("/pkg.Service/Method"), [Method] ("grpc") as its method, the peer's
// address as its IP, the incoming metadata as its headers, and the user
// and descriptors that UserFunc and DescriptorFunc give. A stream counts
// as one hit, when it starts.
//
// A rejected call fails with codes.ResourceExhausted carrying a
// google.rpc.RetryInfo (the exact delay) and a google.rpc.QuotaFailure
// naming the violated limits, and the rate-limit values in its trailers:
// x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset,
// ratelimit-policy, ratelimit and retry-after (see [rules.Fields]). An
// admitted call gets the same values, but retry-after, in its header
// metadata, since the draft's fields must not be sent as trailers of a
// response with a body (a rejected call's trailers-only response is one
// header block).
//
// The decision is [rules.Guard]'s, as in package httplimit: shadow mode,
// waiting for leaky-bucket delays (MaxWait), failing open (the default) or
// closed (codes.Unavailable) are set with [Guard], a cost per call with
// [Cost], and OnDecision reports every decision.
package grpclimit
