package rules_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/sluicehq/sluice"
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

// A Guard is the core of an adapter: here one for a job queue, which
// describes each job to the rules and runs it or puts it back by the
// Outcome. The limiter is a single process's (sluice.NewLocal), on a fixed
// clock so that the output does not depend on when the example runs.
func ExampleGuard_Decide() {
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	now := func() time.Time { return time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) }
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: jobs_per_tenant
    key: [descriptor:tenant]
    algorithm: token_bucket
    limit: 3
    period: 1h
  - name: exports_per_tenant    # trying out a tighter limit on exports
    match: {descriptors: {kind: export}}
    key: [descriptor:tenant]
    algorithm: token_bucket
    limit: 1
    period: 1h
    shadow: true
`))
	if err != nil {
		panic(err)
	}
	g, err := rules.NewGuard(sluice.NewLocal(store, now), rules.NewSource(set), rules.GuardConfig{Now: now})
	if err != nil {
		panic(err)
	}
	jobs := []struct{ tenant, kind string }{
		{"acme", "report"}, {"acme", "export"}, {"acme", "export"}, {"acme", "report"}, {"globex", "export"},
	}
	for _, job := range jobs {
		ru := g.Decide(context.Background(), func() (*rules.Descriptor, int64) {
			d := &rules.Descriptor{Route: "jobs/" + job.kind, Method: "job",
				Values: map[string]string{"tenant": job.tenant, "kind": job.kind}}
			return d, 1
		})
		switch ru.Outcome {
		case rules.Rejected, rules.FailedClosed: // put the job back for later
			fmt.Printf("%s %s %v: retry in %ds\n", job.tenant, job.kind, ru.Outcome, ru.Fields.RetryAfter)
		default: // run it
			fmt.Println(job.tenant, job.kind, ru.Outcome)
		}
	}
	fmt.Printf("%+v\n", g.Stats())
	// Output:
	// acme report allowed
	// acme export allowed
	// acme export shadowed
	// acme report rejected: retry in 1200s
	// globex export allowed
	// {Allowed:3 Rejected:1 Shadowed:1 FailedOpen:0 FailedClosed:0 Abandoned:0 Waited:0}
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
