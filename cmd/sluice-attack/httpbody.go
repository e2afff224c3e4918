package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// bodyAttack is one kind of hostile HTTP body and the outcomes that refuse
// it.
type bodyAttack struct {
	kind string
	path string // of the HTTP API
	body []byte
	want []string // postStatus outcomes that refuse the body
}

// Sizes of the hostile bodies.
const (
	hugeBody = 4 << 20 // bytes, four times the default max_body_bytes
	deepJSON = 100_000 // levels of nesting
)

// hostileBodies returns the bodies of the http-body attack. A lone UTF-16
// surrogate escape, like invalid UTF-8, decodes to U+FFFD in
// encoding/json: admitted, distinct keys would share one counter.
func hostileBodies() []bodyAttack {
	check := func(key string) []byte {
		return []byte(`{"name":"json","key":"` + key + `","limit":5,"period":"1h","algorithm":"fixed_window"}`)
	}
	nested := strings.Repeat("[", deepJSON) + strings.Repeat("]", deepJSON)
	return []bodyAttack{
		{"invalid UTF-8 key", "/v1/check", check("victim\xff"), []string{"HTTP 400"}},
		{"lone surrogate key", "/v1/check", check(`victim\ud800`), []string{"HTTP 400"}},
		{"lone surrogate key", "/v1/check", check(`victim\udfff`), []string{"HTTP 400"}},
		{"4 MiB body", "/v1/check", check(strings.Repeat("a", hugeBody)), []string{"HTTP 413", "HTTP connection error"}},
		{fmt.Sprintf("JSON nested %s deep", thousands(deepJSON)), "/v1/check/batch", []byte(`{"requests":[` + nested + `]}`), []string{"HTTP 400"}},
		{fmt.Sprintf("JSON nested %s deep", thousands(deepJSON)), "/v1/check", []byte(`{"name":` + nested + `}`), []string{"HTTP 400"}},
	}
}

// httpBody: hostile JSON bodies posted to the HTTP API: keys of invalid
// UTF-8 and of lone surrogates, bodies four times the size bound, and
// deeply nested JSON. Each must be refused with 400 or 413, never decided.
func httpBody(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "http-body", nil, overHTTP, func(t *target, r *row) error {
		bodies := hostileBodies()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.attackers}, Timeout: callTimeout}
		defer client.CloseIdleConnections()
		var outcomes, refused tally
		calls := c.rounds(ctx, c.count(400_000), c.hostile(), func(i, k int) {
			b := bodies[(i+k)%len(bodies)]
			got := postStatus(ctx, client, "http://"+t.d.httpAddr+b.path, b.body)
			outcomes.add(b.kind+": "+got, 1)
			if !slices.Contains(b.want, got) {
				refused.add(b.kind+": "+got, 1)
			}
		})
		r.did = fmt.Sprintf("%d attackers post keys of invalid UTF-8 and of lone surrogates (\\ud800, \\udfff), bodies of %d MiB and JSON nested %s deep",
			c.attackers, hugeBody>>20, thousands(deepJSON))
		r.result = fmt.Sprintf("%s requests: %s", thousands(calls), outcomes.String())
		if n := refused.sum(); n > 0 {
			r.miss("not refused with 400/413: %s", refused.String())
		}
		return nil
	})
}
