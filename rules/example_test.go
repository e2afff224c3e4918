package rules_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func ExampleParse() {
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: api_per_user
    match: {routes: ["/api/*"]}
    key: [user]
    algorithm: token_bucket
    limit: 100
    period: 1m
  - name: login_per_ip
    match: {routes: [/login], methods: [POST]}
    key: [ip]
    algorithm: gcra
    limit: 5
    period: 1m
`))
	if err != nil {
		panic(err)
	}
	d := &rules.Descriptor{Route: "/api/items", Method: "GET", User: "alice", IP: netip.MustParseAddr("192.0.2.1")}
	for _, r := range set.Match(d) {
		req, ok := r.Request(d, 1)
		fmt.Println(r.Name, req.Key, ok)
	}
	// Output:
	// api_per_user user=alice true
}

func ExampleParse_error() {
	_, err := rules.Parse("limits.yaml", []byte(`rules:
  - name: api
    algorithm: token_bucket
    limit: -5
    period: 1m
`))
	fmt.Println(err)
	// Output:
	// rules: limits.yaml:4:12: rules[0].limit: invalid Limit: Limit -5 is outside [1, 1000000000000]
}

func ExampleEnforcer() {
	node, err := cluster.New(cluster.TestConfig("example"))
	if err != nil {
		panic(err)
	}
	defer node.Close()
	src, err := rules.NewStatic(
		rules.Rule{Name: "per_user", Key: []string{"user"}, Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Hour},
		rules.Rule{Name: "writes", Match: rules.Match{Methods: []string{"POST"}}, Key: []string{"user"},
			Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Hour},
	)
	if err != nil {
		panic(err)
	}
	e := &rules.Enforcer{Limiter: node}
	post := &rules.Descriptor{Method: "POST", User: "alice"}
	for range 2 {
		v := e.Enforce(context.Background(), src.Current(), post, 1)
		fmt.Println("POST allowed:", v.Allowed)
	}
	// The rejected POST consumed nothing from per_user: 2 of 3 remain.
	v := e.Enforce(context.Background(), src.Current(), &rules.Descriptor{Method: "GET", User: "alice"}, 1)
	fmt.Println("GET allowed:", v.Allowed, "remaining:", v.Limits[0].Decision.Remaining)
	// Output:
	// POST allowed: true
	// POST allowed: false
	// GET allowed: true remaining: 1
}

func ExampleWatch() {
	w, err := rules.Watch("/etc/myservice/limits.yaml", rules.DefaultWatchConfig())
	if err != nil {
		fmt.Println("no rules:", err)
		return
	}
	defer w.Close()
	fmt.Println(w.Current().Len(), "rules")
}
