// Package envoyrls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over a
// sluice.Limiter, with envoyproxy/ratelimit's configuration format read as
// it is, so that any Envoy-based gateway can use a sluice cluster as its
// global rate limit service.
//
// The configuration is a directory of YAML files, one domain each
// ([LoadDir], [ParseDomain]): a domain and a tree of descriptors, each
// with a key, an optional value (with '*' a pattern), an optional
// rate_limit (unit, requests_per_unit, unlimited, name, replaces),
// shadow_mode, quota_mode, detailed_metric, value_to_metric,
// share_threshold and nested descriptors. Every problem of a file is a
// [*ConfigError] naming the file, line and column (YAML syntax errors,
// the line only). A file is at most [MaxFileBytes], 100 levels of nesting
// and a million nodes with its aliases expanded, with no key given twice
// in a mapping: the strict YAML reader refuses the rest before any
// descriptor is read. A known key out of place (unit on a descriptor) is
// ignored with a warning under a lenient [LoadConfig], as
// envoyproxy/ratelimit ignores it, and refused under a strict one
// ([ParseDomain] and [LoadDir] are strict); MergeDomains makes the files
// of one domain one configuration ([MergeRules]). A [Watcher] keeps a
// directory's [Rules] current, keeping the last good version while an
// edit is invalid; an [XDSWatcher] keeps those an xDS management server
// sends (state of the world, RateLimitConfig resources, as Envoy Gateway
// serves them), NACKing an invalid response and keeping the last good
// version while the server is away.
//
// A request names a domain and lists descriptors, each a list of key/value
// entries. Each descriptor is matched against the domain's tree as
// envoyproxy/ratelimit matches it ([Domain.Match]): one entry per level,
// the exact value first, then the first pattern that matches, then the key
// alone; the limit of the descriptor where the entries end applies. Its
// hits (the descriptor's hits_addend, or the request's, at least 1) are
// counted by the Limiter in a fixed window of the limit's unit, under a
// key made of the domain and the request's entries
// ([Match.CounterKey]): through a cluster.Node the count is exact across
// the cluster. [Service] answers with a status per descriptor (its code,
// current_limit, limit_remaining and duration_until_reset), OVER_LIMIT
// overall when any enforced descriptor is over, and, when configured, the
// limit closest to being reached in response headers. duration_until_reset
// is whole seconds rounded up, as envoyproxy/ratelimit computes it, unless
// Config.ExactReset; a hits_addend of 0 on a window exactly full is OK
// with 0 remaining, and OVER_LIMIT once a request went past the limit
// in the window (a limit of 0: once a hit reached it), as upstream's
// counter answers; the near, over and shadow statistics ([Hit]) split a
// request that straddles the limit as envoyproxy/ratelimit's do. Config
// has envoyproxy/ratelimit's global switches: ShadowMode, QuotaMode,
// DynamicMetadata and StopIncrementOverLimit. [Service.Register] decodes
// requests with the server's codec; sluice's own keeps the bytes of
// descriptor values that are not UTF-8 (request headers' bytes, which
// Envoy sends as they are), which the protobuf runtime refuses.
//
// The package depends on the limiter vocabulary (packages sluice and
// limiter) and on Envoy's generated types, not on the cluster: the daemon
// wires a Service to its node.
package envoyrls
