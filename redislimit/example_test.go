package redislimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/rules"
)

// TestHTTPMiddlewareOnRedis is the README's use: net/http middleware
// driven by a rules file, over a Limiter on a real redis-server. Two
// requests pass, the third is limited; with Redis killed, the policy
// (allow, here) lets requests through.
func TestHTTPMiddlewareOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	cfg := DefaultConfig()
	cfg.Addrs = []string{srv.Addr()}
	cfg.Unreachable = sluice.PolicyAllow
	lim, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: per_ip
    key: [ip]
    algorithm: sliding_window_counter
    limit: 2
    period: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(lim, rules.NewSource(set))
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	defer web.Close()
	get := func() (int, string) {
		t.Helper()
		res, err := web.Client().Get(web.URL)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header.Get("X-RateLimit-Remaining")
	}
	for i, want := range []struct {
		code      int
		remaining string
	}{{200, "1"}, {200, "0"}, {429, "0"}} {
		if code, remaining := get(); code != want.code || remaining != want.remaining {
			t.Errorf("request %d: %d with %s remaining, want %d with %s", i, code, remaining, want.code, want.remaining)
		}
	}
	srv.Kill()
	if code, _ := get(); code != 200 {
		t.Errorf("with Redis down and PolicyAllow: %d, want 200", code)
	}
	if lim.WithoutOwner() == 0 {
		t.Error("no decision counted as made without Redis")
	}
}
