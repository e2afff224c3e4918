// Package daemon is the sluice daemon behind `sluice serve`: a
// cluster.Node, the public gRPC API, and an HTTP server for services that
// speak JSON, with health, readiness and Prometheus metrics.
//
// With Config.Backend BackendRedis the daemon builds no node: its
// counters live in a Redis server or Redis Cluster (package redislimit,
// behind the sluice.Limiter every adapter takes, in redisBackend), it
// runs no gossip and no Peer service, and the public gRPC API always has
// a server of its own on grpc_addr; /readyz is Redis answering PING, and
// the admin API's inspect answers 501. The settings of a cluster that name
// peers are refused with it, the cluster's other settings ignored with a
// warning (Config.Backend).
//
// Peers and API clients are separate principals, and with
// Config.PeerAddr they reach separate ports: the node's gRPC server on
// peer_addr serves the Peer service alone, and is what the node
// advertises to its peers; a server of the daemon's own on grpc_addr
// serves the public API (the Sluice service, the Rules service and
// Envoy's rate limit service, registered by one function). Each listener
// has its own transport.ServerLimits, connection cap included, so that
// API clients that fill grpc_addr never keep peers out. Without
// peer_addr, the node's server on grpc_addr serves both, under one cap,
// and the daemon warns at start.
//
// [Load] builds a [Config] from flags, the environment (SLUICE_*) and a YAML
// file, in that order of precedence, over [DefaultConfig]; every invalid
// value is a [ConfigError] naming the field and where it came from (file,
// line and column for YAML). The YAML file is read by the strict reader of
// every sluice YAML file: at most 1 MiB, 100 levels of nesting, a million
// nodes with its aliases expanded, no key given twice. [New] starts the node and the HTTP server; [Daemon.Run]
// serves until its context ends and then shuts down gracefully
// ([Daemon.Shutdown]): /readyz fails at once, the HTTP server drains its
// in-flight requests, and the node leaves the cluster, so that the other
// members see it leave rather than fail.
//
// The HTTP API ([Daemon.Handler]):
//
//	POST /v1/check        a CheckRequest; 200 with a Decision, or 400/413/503
//	                      with an application/problem+json body naming the field
//	POST /v1/check/batch  {"requests": [CheckRequest...]}; 200 with one item
//	                      per request, each a Decision or {"error": {code,
//	                      field, message}}
//	POST /v1/rules/check  a request described as the rules see it (route,
//	                      method, ip, user, headers, descriptors) and its
//	                      hits; 200 with a RulesDecision: allowed, and each
//	                      applied rule's decision; 404 without rules_file
//	GET  /healthz         200 while the process serves
//	GET  /readyz          200 once the node is ready (cluster.Node.Ready):
//	                      up and, when given addresses to join, joined; 503
//	                      while joining, once serf stopped, or while
//	                      shutting down; refused_members lists gossip
//	                      members that have not proved the peer credential
//	                      (cluster.Node.RefusedMembers), peer_clocks each
//	                      member's estimated clock offset
//	                      (cluster.Node.PeerClocks), neither making the
//	                      node unready; unconfirmed counts the members whose
//	                      hand-over it waits for (cluster.Node.Unconfirmed),
//	                      0 once settled
//	GET  /metrics         Prometheus, from the daemon's own registry
//
// Checks are validated like the gRPC API validates them (through transport's
// codec) and decided by the node, which routes each to its key's owner. A
// body whose text JSON decoding would turn into U+FFFD (bytes of invalid
// UTF-8, or a \u escape of a lone UTF-16 surrogate such as "\ud800") is
// refused with 400 naming the field that holds it, so that distinct keys
// never share a counter.
//
// With Config.RulesFile the daemon holds a rule set (package rules), loaded
// at start, where an invalid file fails New with its file and line, and
// kept current by a rules.Watcher, which keeps the last good set when an
// edit is invalid. POST /v1/rules/check maps its body onto a
// rules.Descriptor, bounded before anything is built from it
// (MaxRulesDescriptors, MaxRulesHeaders, limiter.MaxNameLen and
// limiter.MaxKeyLen), and enforces every rule that applies through a
// rules.Enforcer over the node, all or nothing: a rejected request
// consumes from none of them. The public gRPC API serves the same check
// as sluice.v1.Rules/Check (transport.RegisterRules): both adapters decode their input into
// a rulesInput and go through descriptorOf and enforceRules, so that the
// bounds, errors and decisions are one.
//
// The counters of the server-side limits (the rules and Envoy's rate limit
// service) are named serverNamePrefix ("@") and the limit's name, through
// serverLimits; permit refuses that prefix to every check that carries its
// own limit (POST /v1/check, its batch, the Sluice service), and refuses
// reset, drain_over_limit and refund as Config.Destructive says, so that
// no caller lowers a count it may not reset.
//
// With Config.EnvoyConfigDir the public gRPC API also serves Envoy's rate
// limit service (package envoyrls): envoyproxy/ratelimit's configuration
// files, loaded at start (an invalid file fails New with its file and
// line) and kept current by an envoyrls.Watcher, and each descriptor
// counted through the node, exactly across the cluster. /metrics counts
// its hits by envoyproxy/ratelimit's metric keys (sluice_envoy_hits_total).
//
// Everything a Daemon owns hangs off it: several run in one process, as the
// tests do.
package daemon
