// Package rules turns requests into limiter requests: named rules say what
// they match (routes, methods, headers, client IPs, users, application
// descriptors) and what they impose (an algorithm, a limit per period, a
// burst, a policy for an unreachable owner, shadow mode), and an
// [Enforcer] applies every rule that matches a request, all or nothing.
//
// Rules come from code ([NewStatic], [NewSet]) or from a YAML file
// ([Load], [Parse]); a [Watcher] keeps a file's rules current as it
// changes, keeping the last good [Set] when a new version is invalid. A Set
// is immutable: a reload builds a new one and swaps it in atomically, so
// readers never lock. Loading validates everything and reports every
// problem, up to 20, as an [*Error] naming the file, line and column. A
// file is bounded before its rules are read: at most [MaxFileBytes],
// [MaxRules] rules, 100 levels of nesting, a million nodes with its
// aliases expanded, and no key given twice in a mapping at any depth (the
// reader every sluice YAML file goes through refuses the rest of the file
// at the first of these).
//
// # File format
//
//	rules:
//	  - name: api_per_user            # the limiter Name: unique, [A-Za-z0-9_.:-]+
//	    description: every user's API calls   # free text, ignored
//	    match:                        # all given conditions must hold; none = every request
//	      routes: ["/api/*"]          # exact routes, or prefixes ending in *; "*" = any
//	      methods: [GET, POST]        # case-insensitive
//	      headers: {X-Tenant: acme}   # header equals value; "*" = present
//	      ips: ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]   # client IP in any
//	      users: ["alice", "bob"]     # authenticated user; "*" = any authenticated user
//	      descriptors: {plan: free}   # application descriptor equals value; "*" = present
//	    key: [user]                   # counter per: ip, user, route, method, header:<Name>, descriptor:<name>
//	    algorithm: token_bucket       # token_bucket, leaky_bucket, fixed_window, sliding_window_log,
//	                                  # sliding_window_counter, gcra
//	    limit: 100                    # hits per period
//	    period: 1m                    # a Go duration
//	    burst: 150                    # optional; 0 or absent = limit
//	    unreachable: local            # optional: local, allow or deny; absent = the node's policy
//	    shadow: false                 # optional: decide and report, never block
//	    missing: skip                 # optional: a request that lacks a key part (no user):
//	                                  # skip (default), deny, or shared (one counter for all of them)
//
//	  - name: exports_per_day
//	    match: {routes: ["/api/export"], descriptors: {plan: "*"}}
//	    key: [descriptor:org]
//	    algorithm: fixed_window
//	    limit: 20
//	    calendar: day                 # instead of period, fixed_window only:
//	    zone: Europe/Paris            # minute, hour, day, week, month, year in zone (default UTC)
//
//	  - name: login_per_ip
//	    match: {routes: ["/login"], methods: [POST]}
//	    key: [ip]
//	    algorithm: gcra
//	    limit: 5
//	    period: 1m
//
// name, algorithm, limit and period (or calendar) are required. A key of
// several parts is joined as "ip=10.1.2.3|user=alice", values escaped so
// that no two descriptors share a key; no key means one counter for every
// request the rule matches. A request that lacks a part of a rule's key
// (key [user] and no user: anonymous traffic) is what the rule's missing
// setting says: skip (the default) lets it through that rule unlimited,
// deny rejects it counting nothing, and shared counts every such request
// on one counter of the rule ("user" where a present user is "user=42";
// with key [user, ip], one per address). An empty file is
// an error, not an empty set, so that a file caught half written never
// lifts every limit: write "rules: []" for none.
//
// # Enforcing
//
// Several rules can apply to one request. The [Enforcer] admits it only if
// every enforced rule admits it, and a rejected request consumes from none
// of them: it peeks at all the limits in one call, consumes from all of
// them in a second, and refunds (limiter.Refund) if a concurrent request
// got in between. A refund never lands in another window than the one
// that charged the hits: it carries the window the consume's decision
// names (limiter.Request.Charged), and the limiter gives a fixed window or
// sliding window counter rule's hits back to that window only, while the
// key's state still counts it; a token bucket, leaky bucket, GCRA or
// sliding window log rule's decision names the instant it charged at, and
// the limiter gives back at most what of the hits has not drained since,
// never another request's. (Where a decision names no window, a rule
// whose window may have ended since the consume, as [Enforcer].Now reads
// it widened by [Enforcer].ClockSkew, keeps them counted.) Shadow rules
// are decided and reported but never block. A leaky-bucket rule's pacing
// delay is waited for up to a maximum, and
// rejects beyond it. [Verdict.Fields] gives the X-RateLimit-* values and
// the RateLimit-Policy and RateLimit fields of the IETF draft.
package rules
