package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func Example() {
	node, err := cluster.New(cluster.TestConfig("example"))
	if err != nil {
		panic(err)
	}
	defer node.Close()
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: per_ip
    key: [ip]
    algorithm: token_bucket
    limit: 2
    period: 1h
`))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(node, rules.NewSource(set), httplimit.TrustedProxies("10.0.0.0/8"))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	defer srv.Close()

	for range 3 {
		res, err := srv.Client().Get(srv.URL)
		if err != nil {
			panic(err)
		}
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("X-RateLimit-Remaining"), res.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 1 "per_ip";q=2;w=3600
	// 200 0 "per_ip";q=2;w=3600
	// 429 0 "per_ip";q=2;w=3600
}

// Behind a proxy that sets one header with the client's address, such as
// Cloudflare's CF-Connecting-IP, each address has its own counter. Here
// the test client on 127.0.0.1 plays the proxy.
func ExampleClientIPHeader() {
	node, err := cluster.New(cluster.TestConfig("example-client-ip"))
	if err != nil {
		panic(err)
	}
	defer node.Close()
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: per_ip
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
`))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(node, rules.NewSource(set),
		httplimit.TrustedProxies("127.0.0.1"),
		httplimit.ClientIPHeader("CF-Connecting-IP"))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()

	for _, client := range []string{"203.0.113.7", "203.0.113.7", "2001:db8::8"} {
		req, err := http.NewRequest("GET", srv.URL, nil)
		if err != nil {
			panic(err)
		}
		req.Header.Set("CF-Connecting-IP", client)
		// A header the proxy does not set is ignored.
		req.Header.Set("X-Forwarded-For", "198.51.100.1")
		res, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		res.Body.Close()
		fmt.Println(client, res.StatusCode)
	}
	// Output:
	// 203.0.113.7 200
	// 203.0.113.7 429
	// 2001:db8::8 200
}

// A single process needs no cluster: sluice.NewLocal decides on its own
// store. Here a request costs as many hits as the batch it carries, given
// in X-Batch-Size. A batch larger than the rule could ever admit is
// rejected without consuming anything. The clock is fixed so that the
// output does not depend on when the example runs.
func ExampleCost() {
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	now := func() time.Time { return time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) }
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: items_per_ip
    key: [ip]
    algorithm: token_bucket
    limit: 10
    period: 1h
`))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(sluice.NewLocal(store, now), rules.NewSource(set),
		httplimit.Guard(rules.GuardConfig{Now: now}),
		httplimit.Cost(func(r *http.Request) int64 {
			n, err := strconv.ParseInt(r.Header.Get("X-Batch-Size"), 10, 64)
			if err != nil || n < 1 {
				return 1
			}
			return n
		}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, batch := range []string{"4", "5", "50", "", "1"} {
		req := httptest.NewRequest("POST", "/items", nil)
		req.Header.Set("X-Batch-Size", batch)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("batch %q: %d, remaining %s\n", batch, rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// batch "4": 200, remaining 6
	// batch "5": 200, remaining 1
	// batch "50": 429, remaining 1
	// batch "": 200, remaining 0
	// batch "1": 429, remaining 0
}
