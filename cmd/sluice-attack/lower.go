package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// lowerCount: callers try every way to give hits back to spent keys of
// all six algorithms, on a daemon started with --destructive-behaviors
// deny and a rules file of one rule per algorithm: gRPC refunds, peeks
// (hits 0) with another algorithm or a limit a million times higher,
// checks with another algorithm, inspects with another algorithm's
// limit, and checks of the rules' counters ("@" + the rule's name) and of
// the rules' bare names. Refunds and checks of the rules' counters must
// be refused (PermissionDenied, HTTP 403), no check of a spent key
// admitted, and afterwards every canary, the rules' included, spent.
func lowerCount(ctx context.Context, c *config) (*row, error) {
	var rulesText strings.Builder
	rulesText.WriteString("rules:\n")
	for _, a := range limiter.Algorithms {
		fmt.Fprintf(&rulesText, "  - name: r_%s\n    match: {descriptors: {alg: %s}}\n    key: [user]\n    algorithm: %s\n    limit: 3\n    period: 1h\n", a, a, a)
	}
	rulesFile := filepath.Join(c.tmp, "lower-rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(rulesText.String()), 0o600); err != nil {
		return nil, err
	}
	args := []string{"--destructive-behaviors", "deny", "--rules-file", rulesFile}
	return onDaemon(ctx, c, "lower-count", args, overGRPC, func(t *target, r *row) error {
		httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.attackers}, Timeout: callTimeout}
		defer httpClient.CloseIdleConnections()
		base := "http://" + t.d.httpAddr
		canary := func(a limiter.Algorithm) limiter.Request {
			return limiter.Request{Name: "canary-" + a.String(), Key: "k", Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
		}
		ruleCheck := func(a limiter.Algorithm, hits int) (bool, error) {
			body := fmt.Sprintf(`{"user":"canary","descriptors":{"alg":%q},"hits":%d}`, a, hits)
			return postAllowed(ctx, httpClient, base+"/v1/rules/check", body)
		}
		for _, a := range limiter.Algorithms {
			if ok, err := t.admits(ctx, canary(a)); err != nil || !ok {
				return fmt.Errorf("spending the %v canary: %v, %v", a, ok, err)
			}
			if ok, err := ruleCheck(a, 3); err != nil || !ok {
				return fmt.Errorf("spending the %v rule's canary: %v, %v", a, ok, err)
			}
		}

		var outcomes tally
		n := len(limiter.Algorithms)
		calls := c.rounds(ctx, c.count(400_000), c.hostile(), func(i, k int) {
			a := limiter.Algorithms[(i+k)%n]
			b := limiter.Algorithms[(i+k+1+k/n%(n-1))%n] // another algorithm
			req := canary(a)
			grpcCall := func(kind string, req limiter.Request) {
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				res, err := t.client.Check(cctx, &pb.CheckRequest{Request: transport.RequestToProto(req)})
				switch {
				case err != nil:
					outcomes.addErr(kind+": gRPC "+codeOf(err), err)
				case res.GetResponse().GetAllowed() && req.Hits > 0:
					outcomes.add(kind+": admitted", 1)
				default:
					outcomes.add(kind+": answered", 1)
				}
			}
			switch k % 6 {
			case 0:
				req.Behavior = limiter.Refund
				grpcCall("refund", req)
			case 1:
				req.Hits, req.Algorithm = 0, b
				grpcCall("peek", req)
			case 2:
				req.Hits, req.Algorithm = 1, b
				grpcCall("switch", req)
			case 3:
				req.Hits, req.Algorithm, req.Limit = 0, b, 3_000_000
				outcomes.add("peek x1e6: "+postStatus(ctx, httpClient, base+"/v1/check", checkJSON(transport.RequestToProto(req))), 1)
			case 4:
				q := url.Values{"name": {req.Name}, "key": {req.Key}, "algorithm": {b.String()}, "limit": {"3"}, "period": {"1h"}}
				outcomes.add("inspect: "+httpStatus(ctx, httpClient, http.MethodGet, base+"/v1/admin/keys?"+q.Encode(), nil), 1)
			default:
				rule := limiter.Request{Name: "@r_" + a.String(), Key: "user=canary", Hits: 1, Limit: 3, Period: time.Hour, Algorithm: b}
				if k%2 == 0 {
					rule.Hits, rule.Behavior = 3, limiter.Refund
				}
				grpcCall("rule counter", rule)
				rule.Name = rule.Name[1:]
				grpcCall("rule name", rule)
			}
		})

		stillSpent := 0
		for _, a := range limiter.Algorithms {
			req := canary(a)
			req.Hits = 1
			ok, err := t.admits(ctx, req)
			if err != nil {
				return fmt.Errorf("checking the %v canary: %w", a, err)
			}
			if !ok {
				stillSpent++
			}
			ok, err = ruleCheck(a, 1)
			if err != nil {
				return fmt.Errorf("checking the %v rule's canary: %w", a, err)
			}
			if !ok {
				stillSpent++
			}
		}
		r.did = fmt.Sprintf("%d callers try to give hits back to spent keys of all six algorithms and of a rule per algorithm, on --destructive-behaviors deny: gRPC refunds, peeks with another algorithm or a limit 1,000,000 times higher, checks with another algorithm, inspects, checks of the rules' counters", c.attackers)
		r.result = fmt.Sprintf("%s calls: %s; canaries still spent: %d of %d", thousands(calls), outcomes.String(), stillSpent, 2*n)
		if n := outcomes.get("switch: admitted"); n > 0 {
			r.miss("%d checks with another algorithm admitted on spent keys", n)
		}
		if n := outcomes.others("refund: gRPC PermissionDenied", "peek: answered", "switch: answered", "switch: admitted", "peek x1e6: HTTP 200",
			"inspect: HTTP 200", "rule counter: gRPC PermissionDenied", "rule name: answered", "rule name: admitted", "rule name: gRPC PermissionDenied"); n > 0 {
			r.miss("%d calls answered otherwise than expected", n)
		}
		if stillSpent != 2*n {
			r.miss("%d canaries got hits back", 2*n-stillSpent)
		}
		return nil
	})
}

// postAllowed posts body to url and reads "allowed" from a 200 answer.
func postAllowed(ctx context.Context, client *http.Client, url, body string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return false, err
	}
	res, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return false, err
	}
	if res.StatusCode != http.StatusOK {
		return false, fmt.Errorf("HTTP %d: %s", res.StatusCode, b)
	}
	var out struct {
		Allowed bool `json:"allowed"`
	}
	return out.Allowed, json.Unmarshal(b, &out)
}
