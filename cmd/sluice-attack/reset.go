package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// resetAttack: callers send checks with reset on a daemon started with
// --destructive-behaviors deny, over gRPC and HTTP, on the legitimate key
// and on a canary key whose only hit was spent before the attack. Every
// check must be refused (PermissionDenied, HTTP 403) and the canary stay
// spent.
func resetAttack(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "reset", []string{"--destructive-behaviors", "deny"}, overGRPC, func(t *target, r *row) error {
		client := t.client
		canary := &pb.RateLimitRequest{Name: "canary", Key: "canary", Limit: 1, PeriodNanos: int64(time.Hour), Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW}
		if res, err := client.Check(ctx, &pb.CheckRequest{Request: canary}); err != nil || !res.GetResponse().GetAllowed() {
			return fmt.Errorf("spending the canary's hit: %v, %v", res, err)
		}
		// Resets that peek: one that went through would leave the canary
		// fresh, with its hit to spend again.
		resets := make([]*pb.RateLimitRequest, 2)
		bodies := make([][]byte, 2)
		for i, key := range []*pb.RateLimitRequest{canary, t.legit} {
			resets[i] = proto.Clone(key).(*pb.RateLimitRequest)
			resets[i].Hits, resets[i].Reset_ = proto.Int64(0), true
			bodies[i] = checkJSON(resets[i])
		}
		httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.attackers}, Timeout: callTimeout}
		defer httpClient.CloseIdleConnections()

		var outcomes tally
		calls := c.rounds(ctx, c.count(400_000), c.hostile(), func(i, k int) {
			which := (i + k) % 2
			if k%2 == 1 {
				outcomes.add(postStatus(ctx, httpClient, "http://"+t.d.httpAddr+"/v1/check", bodies[which]), 1)
				return
			}
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			_, err := client.Check(cctx, &pb.CheckRequest{Request: resets[which]})
			outcomes.add("gRPC "+codeOf(err), 1)
		})
		peek := proto.Clone(canary).(*pb.RateLimitRequest)
		peek.Hits = proto.Int64(0)
		res, err := client.Check(ctx, &pb.CheckRequest{Request: peek})
		if err != nil {
			return fmt.Errorf("peeking at the canary: %w", err)
		}
		r.did = fmt.Sprintf("%d callers send checks with reset (hits 0) over gRPC and HTTP, on the legitimate key and a spent canary key, to --destructive-behaviors deny", c.attackers)
		r.result = fmt.Sprintf("%s checks: %s; canary remaining %d", thousands(calls), outcomes.String(), res.GetResponse().GetRemaining())
		if n := outcomes.others("gRPC PermissionDenied", "HTTP 403"); n > 0 {
			r.miss("%d resets not refused", n)
		}
		if res.GetResponse().GetRemaining() != 0 {
			r.miss("the canary was reset")
		}
		return nil
	})
}

// postStatus posts body to url and names the outcome: "HTTP <status>", or
// "HTTP connection error".
func postStatus(ctx context.Context, client *http.Client, url string, body []byte) string {
	return httpStatus(ctx, client, http.MethodPost, url, body)
}

// httpStatus sends body (nil: none) to url with method and names the
// outcome as postStatus does.
func httpStatus(ctx context.Context, client *http.Client, method, url string, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return "HTTP request error"
	}
	res, err := client.Do(req)
	if err != nil {
		return "HTTP connection error"
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	res.Body.Close()
	return fmt.Sprintf("HTTP %d", res.StatusCode)
}
