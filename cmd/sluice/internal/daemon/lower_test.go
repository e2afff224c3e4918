package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// lowerRules has one rule per algorithm, "r_<algorithm>", of 3 hits an
// hour per user, matched by the descriptor alg.
func lowerRules() string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, a := range limiter.Algorithms {
		fmt.Fprintf(&b, "  - name: r_%s\n    match: {descriptors: {alg: %s}}\n    key: [user]\n    algorithm: %s\n    limit: 3\n    period: 1h\n", a, a, a)
	}
	return b.String()
}

// publicAPI sends one check to a daemon's public API and names the outcome:
// "allowed", "denied", or the refusal ("refused": HTTP 403 or gRPC
// PermissionDenied; "invalid": HTTP 400 or gRPC InvalidArgument).
type publicAPI struct {
	name  string
	check func(t *testing.T, r limiter.Request) string
	// inspect reads (name, key), over HTTP with a peek of a's limit.
	inspect func(t *testing.T, name, key string, a limiter.Algorithm) string
}

func publicAPIs(t *testing.T, d *Daemon) []publicAPI {
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return []publicAPI{
		{"http", func(t *testing.T, r limiter.Request) string {
			body := map[string]any{"name": r.Name, "key": r.Key, "hits": r.Hits, "limit": r.Limit,
				"period": r.Period.String(), "algorithm": r.Algorithm.String()}
			if r.Burst != 0 {
				body["burst"] = r.Burst
			}
			if r.Behavior&limiter.Reset != 0 {
				body["reset"] = true
			}
			if r.Behavior&limiter.DrainOverLimit != 0 {
				body["drain_over_limit"] = true
			}
			if r.Behavior&limiter.Refund != 0 {
				body["refund"] = true // the HTTP API has no refund
			}
			b, _ := json.Marshal(body)
			resp := do(t, "POST", "http://"+d.HTTPAddr()+"/v1/check", string(b))
			return httpOutcome(t, resp)
		}, func(t *testing.T, name, key string, a limiter.Algorithm) string {
			resp := do(t, "GET", inspectURL(d, name, key, "algorithm="+a.String()+"&limit=3&period=1h"), "")
			return fmt.Sprintf("HTTP %d", resp.status)
		}},
		{"grpc", func(t *testing.T, r limiter.Request) string {
			dec, err := c.Check(context.Background(), r)
			switch status.Convert(err).Code().String() {
			case "OK":
				if dec.Allowed {
					return "allowed"
				}
				return "denied"
			case "PermissionDenied":
				return "refused"
			case "InvalidArgument":
				return "invalid"
			}
			if errors.Is(err, limiter.ErrInvalidLimit) || errors.Is(err, limiter.ErrInvalidPeriod) {
				return "invalid" // the item's own error: a request the backend cannot decide
			}
			t.Fatalf("gRPC check %+v: %v", r, err)
			return ""
		}, func(t *testing.T, name, key string, _ limiter.Algorithm) string {
			_, err := c.Inspect(context.Background(), name, key)
			return "gRPC " + status.Convert(err).Code().String()
		}},
	}
}

func httpOutcome(t *testing.T, resp response) string {
	t.Helper()
	switch resp.status {
	case http.StatusOK:
		var dec Decision
		if err := json.Unmarshal(resp.body, &dec); err != nil {
			t.Fatal(err)
		}
		if dec.Allowed {
			return "allowed"
		}
		return "denied"
	case http.StatusForbidden:
		return "refused"
	case http.StatusBadRequest:
		return "invalid"
	}
	t.Fatalf("HTTP check: %d %s", resp.status, resp.body)
	return ""
}

// lowerAttempt is one way a caller might try to give a spent key hits
// back: edit makes it from the check that spent the key.
type lowerAttempt struct {
	name string
	edit func(r *limiter.Request)
	// want is the outcome over HTTP and over gRPC.
	wantHTTP, wantGRPC string
}

// lowerAttempts are every attempt on a key of algorithm a: refund, reset
// and drain_over_limit, which destructive_behaviors deny refuses; peeks
// with every other algorithm, a far higher or lower limit, a far shorter
// or longer period; and checks with every other algorithm, which find the
// key spent.
func lowerAttempts(a limiter.Algorithm) []lowerAttempt {
	out := []lowerAttempt{
		{"refund", func(r *limiter.Request) { r.Hits, r.Behavior = 3, limiter.Refund }, "invalid", "refused"},
		{"reset", func(r *limiter.Request) { r.Hits, r.Behavior = 0, limiter.Reset }, "refused", "refused"},
		{"drain_over_limit", func(r *limiter.Request) { r.Hits, r.Behavior = 1, limiter.DrainOverLimit }, "refused", "refused"},
		{"peek at limit 3,000,000", func(r *limiter.Request) { r.Hits, r.Limit = 0, 3_000_000 }, "denied", "denied"},
		{"peek at limit 1", func(r *limiter.Request) { r.Hits, r.Limit = 0, 1 }, "denied", "denied"},
		{"peek at period 1µs", func(r *limiter.Request) { r.Hits, r.Period = 0, time.Microsecond }, "denied", "denied"},
		{"peek at period 1000h", func(r *limiter.Request) { r.Hits, r.Period = 0, 1000*time.Hour }, "denied", "denied"},
		// Checks that would charge the key at a laxer rate are decided at
		// the strictest rate it was charged under (limiter.StoreConfig
		// KeepStrictest), which finds it spent.
		{"check at limit 3,000,000", func(r *limiter.Request) { r.Hits, r.Limit = 1, 3_000_000 }, "denied", "denied"},
		{"check at period 1ms", func(r *limiter.Request) { r.Hits, r.Period = 1, time.Millisecond }, "denied", "denied"},
		{"check at limit 3,000 per 1ms", func(r *limiter.Request) { r.Hits, r.Limit, r.Period = 1, 3000, time.Millisecond }, "denied", "denied"},
	}
	for _, b := range limiter.Algorithms {
		if b == a {
			continue
		}
		out = append(out,
			lowerAttempt{"peek with " + b.String(), func(r *limiter.Request) { r.Hits, r.Algorithm = 0, b }, "denied", "denied"},
			lowerAttempt{"check with " + b.String(), func(r *limiter.Request) { r.Hits, r.Algorithm = 1, b }, "denied", "denied"},
			lowerAttempt{"check with " + b.String() + " at 3,000 per 1ms", func(r *limiter.Request) {
				r.Hits, r.Algorithm, r.Limit, r.Period = 1, b, 3000, time.Millisecond
			}, "denied", "denied"})
	}
	return out
}

// TestNoCallerLowersACount spends a key of every algorithm on a daemon
// with destructive_behaviors deny, through HTTP and gRPC, and tries every
// lowerAttempt on it, each followed by an inspect with another algorithm;
// after each, a check with the key's own algorithm must still be denied.
// The same attempts on a key of a rules_file rule, spent through POST
// /v1/rules/check, are refused by name ("@" + the rule's name) or reach
// another counter (the rule's bare name), and the rule stays spent.
func TestNoCallerLowersACount(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	cfg := rulesConfig(t, "lower", lowerRules())
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg, WithClock(clk.Now))
	base := "http://" + d.HTTPAddr()
	for _, a := range limiter.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			other := limiter.GCRA
			if a == other {
				other = limiter.TokenBucket
			}
			for _, api := range publicAPIs(t, d) {
				spend := limiter.Request{Name: "api_" + a.String(), Key: api.name, Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
				if got := api.check(t, spend); got != "allowed" {
					t.Fatalf("%s: spending the key: %s", api.name, got)
				}
				spent := spend
				spent.Hits = 1
				for _, at := range lowerAttempts(a) {
					r := spend
					at.edit(&r)
					want := at.wantHTTP
					if api.name == "grpc" {
						want = at.wantGRPC
					}
					if got := api.check(t, r); got != want {
						t.Errorf("%s, %s: %s, want %s", api.name, at.name, got, want)
					}
					if got := api.inspect(t, spend.Name, spend.Key, other); !strings.HasSuffix(got, "200") && !strings.HasSuffix(got, "OK") {
						t.Errorf("%s: inspect after %s: %s", api.name, at.name, got)
					}
					// Time for a laxer rate to have drained or ended what
					// the key counts, and far less than one hit's share
					// of 3 an hour.
					clk.Advance(100 * time.Millisecond)
					if got := api.check(t, spent); got != "denied" {
						t.Fatalf("%s: after %s, a check of the spent key: %s", api.name, at.name, got)
					}
				}

				// A rule's key, spent through the rules.
				user := "u-" + api.name
				body := func(hits int) string {
					return fmt.Sprintf(`{"user":%q,"descriptors":{"alg":%q},"hits":%d}`, user, a.String(), hits)
				}
				if v := mustPostRules(t, base, body(3)); !v.Allowed {
					t.Fatalf("%s: spending the rule: %+v", api.name, v)
				}
				rule := limiter.Request{Name: "r_" + a.String(), Key: "user=" + user, Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
				for _, name := range []string{rule.Name, serverNamePrefix + rule.Name} {
					for _, at := range lowerAttempts(a) {
						r := rule
						r.Name = name
						at.edit(&r)
						got := api.check(t, r)
						switch {
						case name == rule.Name:
							// Another counter: fresh, so the peeks and
							// checks are allowed; refusals stay refusals.
						case got != "refused" && (api.name == "grpc" || at.name != "refund"):
							t.Errorf("%s, %s on %s: %s, want refused", api.name, at.name, name, got)
						}
						if got := api.inspect(t, name, rule.Key, other); !strings.HasSuffix(got, "200") && !strings.HasSuffix(got, "OK") {
							t.Errorf("%s: inspect of %s: %s", api.name, name, got)
						}
						if v := mustPostRules(t, base, body(1)); v.Allowed {
							t.Fatalf("%s: after %s on %s, the rule admitted its spent key: %+v", api.name, at.name, name, v)
						}
					}
				}
			}
		})
	}
}

// TestServerCountersOutOfReach runs a daemon with destructive_behaviors
// allow, where every caller may reset: a check that carries its own limit
// with a rule's name and key, even with reset, touches another counter
// than the rule's; one with the rule's counter name ("@" + the rule's
// name) is refused, single or in a batch, over HTTP and gRPC, with a
// message naming the prefix, unless it is a bare reset, which allow lets
// every caller make.
func TestServerCountersOutOfReach(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	d := start(t, rulesConfig(t, "reach", lowerRules()), WithClock(clk.Now))
	base := "http://" + d.HTTPAddr()
	body := func(hits int) string { return fmt.Sprintf(`{"user":"u","descriptors":{"alg":"gcra"},"hits":%d}`, hits) }
	if v := mustPostRules(t, base, body(3)); !v.Allowed {
		t.Fatalf("spending the rule: %+v", v)
	}
	check := `{"name":"r_gcra","key":"user=u","limit":3,"period":"1h","algorithm":"gcra"`
	for _, b := range []string{check + `,"hits":0,"reset":true}`, check + `,"hits":3}`, check + `,"hits":3,"drain_over_limit":true}`} {
		if resp := do(t, "POST", base+"/v1/check", b); resp.status != http.StatusOK {
			t.Fatalf("%s: %d %s", b, resp.status, resp.body)
		}
		if v := mustPostRules(t, base, body(1)); v.Allowed {
			t.Fatalf("after %s, the rule admitted its spent key: %+v", b, v)
		}
	}
	resp := do(t, "POST", base+"/v1/check", `{"name":"@r_gcra","key":"user=u","limit":3,"period":"1h","algorithm":"gcra","hits":0}`)
	if resp.status != http.StatusForbidden || !strings.Contains(string(resp.body), `beginning with \"@\"`) {
		t.Fatalf("a peek of the rule's counter: %d %s, want 403 naming the prefix", resp.status, resp.body)
	}
	resp = do(t, "POST", base+"/v1/check/batch", `{"requests":[`+check+`,"hits":1},{"name":"@r_gcra","key":"user=u","limit":3,"period":"1h","algorithm":"gcra"}]}`)
	if resp.status != http.StatusForbidden {
		t.Fatalf("a batch with the rule's counter: %d %s, want 403", resp.status, resp.body)
	}
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counter := limiter.Request{Name: "@r_gcra", Key: "user=u", Hits: 1, Limit: 3, Period: time.Hour, Algorithm: limiter.GCRA}
	for i, res := range c.CheckMany(context.Background(), []limiter.Request{counter, counter}) {
		if status.Convert(res.Err).Code().String() != "PermissionDenied" {
			t.Fatalf("a gRPC batch with the rule's counter, item %d: %+v, want PermissionDenied", i, res)
		}
	}
	if ins := inspectHTTP(t, d, "@r_gcra", "user=u", ""); ins.State == nil || ins.State.Algorithm != "gcra" {
		t.Fatalf("inspecting the rule's counter: %+v", ins)
	}
	resp = do(t, "POST", base+"/v1/admin/keys/reset", `{"name":"@r_gcra","key":"user=u"}`)
	if resp.status != http.StatusOK {
		t.Fatalf("the admin reset of the rule's counter under allow: %d %s", resp.status, resp.body)
	}
	if v := mustPostRules(t, base, body(1)); !v.Allowed {
		t.Fatalf("after the admin reset, the rule denied: %+v", v)
	}
}

// TestEnvoyCountersOutOfReach spends a descriptor of Envoy's rate limit
// service (5 a minute per user) on a daemon with destructive_behaviors
// allow: POST /v1/check with the counter's unprefixed name and key, reset
// or not, reaches another counter, and the descriptor stays over its
// limit; the counter's own name ("@envoy/minute") is refused.
func TestEnvoyCountersOutOfReach(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	cfg := testConfig("envoy-reach")
	cfg.EnvoyConfigDir = envoyDir(t)
	d := start(t, cfg, WithClock(clk.Now))
	rls := rlsClient(t, d.GRPCAddr())
	req := rlsRequest("api", []string{"user=u"})
	over := func() string {
		resp, err := rls.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode.String()
	}
	for range 5 {
		if got := over(); got != "OK" {
			t.Fatalf("spending the descriptor: %s", got)
		}
	}
	if got := over(); got != "OVER_LIMIT" {
		t.Fatalf("the sixth request: %s", got)
	}
	base := "http://" + d.HTTPAddr()
	check := `{"name":"envoy/minute","key":"api|user=u","limit":5,"period":"1m","hits":0,`
	for _, b := range []string{check + `"algorithm":"fixed_window","reset":true}`, check + `"algorithm":"gcra"}`} {
		if resp := do(t, "POST", base+"/v1/check", b); resp.status != http.StatusOK {
			t.Fatalf("%s: %d %s", b, resp.status, resp.body)
		}
		if got := over(); got != "OVER_LIMIT" {
			t.Fatalf("after %s, the descriptor: %s", b, got)
		}
	}
	resp := do(t, "POST", base+"/v1/check", `{"name":"@envoy/minute","key":"api|user=u","limit":5,"period":"1m","algorithm":"fixed_window","hits":0}`)
	if resp.status != http.StatusForbidden {
		t.Fatalf("a peek of the descriptor's counter: %d %s, want 403", resp.status, resp.body)
	}
}
