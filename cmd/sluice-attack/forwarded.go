package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/rules"
)

// Requests of the spoofed-forwarded attack: more than the limit, so that
// every one admitted past it shows.
const (
	spoofRequests = 50
	spoofLimit    = 5
	spoofXFF      = "198.51.100.7"
)

// spoofedForwarded: an httplimit middleware on a loopback HTTP server of
// this process, trusting 127.0.0.0/8 as its proxy, limits each client IP
// to 5 requests an hour. The attackers' requests each name a random client
// in Forwarded and one fixed address in X-Forwarded-For, the header the
// middleware reads by default: exactly 5 must be admitted.
func spoofedForwarded(ctx context.Context, c *config) (*row, error) {
	node, err := cluster.New(cluster.TestConfig("sluice-attack"))
	if err != nil {
		return nil, err
	}
	defer node.Close()
	set, err := rules.Parse("limits.yaml", fmt.Appendf(nil, `
rules:
  - name: per_ip
    key: [ip]
    algorithm: fixed_window
    limit: %d
    period: 1h
`, spoofLimit))
	if err != nil {
		return nil, err
	}
	mw, err := httplimit.New(node, rules.NewSource(set), httplimit.TrustedProxies("127.0.0.0/8"))
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Close()
		<-served
	}()

	client := &http.Client{Timeout: callTimeout}
	defer client.CloseIdleConnections()
	var outcomes tally
	var next atomic.Int64
	swarm(c.attackers, func(i int) {
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		for next.Add(1) <= spoofRequests && ctx.Err() == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lis.Addr().String()+"/", nil)
			if err != nil {
				outcomes.add("request error", 1)
				continue
			}
			req.Header.Set("Forwarded", "for="+randomAddr(rng))
			req.Header.Set("X-Forwarded-For", spoofXFF)
			res, err := client.Do(req)
			if err != nil {
				outcomes.add("connection error", 1)
				continue
			}
			res.Body.Close()
			outcomes.add(fmt.Sprintf("HTTP %d", res.StatusCode), 1)
		}
	})
	r := &row{
		did: fmt.Sprintf("%d attackers send %d requests, each with Forwarded: for=<a random address> and X-Forwarded-For: %s, through an httplimit middleware trusting 127.0.0.0/8, %d per client IP an hour",
			c.attackers, spoofRequests, spoofXFF, spoofLimit),
		result: fmt.Sprintf("%d admitted: %s", outcomes.get("HTTP 200"), outcomes.String()),
	}
	if n := outcomes.get("HTTP 200"); n != spoofLimit {
		r.miss("%d admitted, want %d", n, spoofLimit)
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(errors.New("interrupted"), err)
	}
	return r, nil
}

// randomAddr returns a random IPv4 address.
func randomAddr(rng *rand.Rand) string {
	var a [4]byte
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	return netip.AddrFrom4(a).String()
}
