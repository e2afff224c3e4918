// Package egtest runs the sluice daemon against the real Envoy Gateway
// control plane and holds only tests; it has no API.
//
// The test runs the envoy-gateway binary named by SLUICE_ENVOY_GATEWAY
// (or found on PATH; it skips without one) in its standalone mode: the
// file resource provider and the host infrastructure, with global rate
// limiting on. It writes a Gateway, an HTTPRoute and a
// BackendTrafficPolicy with a global rate limit to Envoy Gateway's
// directory, and starts `sluice serve` with envoy_xds_addr at Envoy
// Gateway's rate limit xDS server (port 18001, mutual TLS with the
// certificates `envoy-gateway certgen --local` makes, node id
// envoy-ratelimit). Through Envoy's rate limit API on the daemon's gRPC
// port it checks the descriptors Envoy would send for the policy's rules
// (a Distinct header; method, path and a Distinct source CIDR in shadow
// mode; a shared rule; a rule for every request), that the last
// configuration stays in force once Envoy Gateway is killed, that Envoy
// Gateway started again with the policy deleted (its versions count from
// 1 again) leaves the daemon no domain, and that a policy written in the
// directory changes the limit.
//
// Envoy Gateway's host infrastructure would start an Envoy proxy with
// func-e, which downloads one; the test puts a stand-in that only waits
// where func-e looks first, so nothing is downloaded. Envoy Gateway binds
// fixed ports (18000, 18001, 18002, 19000, 19001): one run at a time.
package egtest
