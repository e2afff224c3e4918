package envoyrls_test

import (
	"context"
	"fmt"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/limiter"
)

// A Service over a local limiter answers Envoy's requests from a
// configuration file in envoyproxy/ratelimit's format. A daemon, or any
// program with a cluster.Node, gives it the node instead, and registers
// it on a gRPC server with Register.
func Example() {
	domain, err := envoyrls.ParseDomain("edge.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 2
`))
	if err != nil {
		panic(err)
	}
	rules, err := envoyrls.NewRules(domain)
	if err != nil {
		panic(err)
	}
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	now := func() time.Time { return time.Unix(1_700_000_000, 0) }
	cfg := envoyrls.DefaultConfig()
	cfg.Limiter = sluice.NewLocal(store, now)
	cfg.Rules = envoyrls.Static{Rules: rules}
	cfg.Now = now
	svc, err := envoyrls.New(cfg)
	if err != nil {
		panic(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}},
	}}}
	for range 3 {
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		st := resp.Statuses[0]
		fmt.Println(resp.OverallCode, st.LimitRemaining, st.CurrentLimit.RequestsPerUnit, st.CurrentLimit.Unit)
	}
	// Output:
	// OK 1 2 SECOND
	// OK 0 2 SECOND
	// OVER_LIMIT 0 2 SECOND
}
