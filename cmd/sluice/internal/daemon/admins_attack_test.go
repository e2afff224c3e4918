package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limiter"
)

// TestNoUserLowersACountUnderAdmins runs two daemons under
// destructive_behaviors admins. For every algorithm, a user (a
// certificate naming no admin identity) spends a key over HTTP, then
// tries to lower it: a gRPC refund naming the charge's window, forged
// windows (the epoch a reset would start, one ending an hour later) and
// no window; an HTTP check with refund; a gRPC reset; peeks with every
// other algorithm at 3,000,000 a second over both APIs; and inspects of
// the key with another algorithm, the user's refused and an admin's
// allowed. The key stays spent for its own rate after each.
func TestNoUserLowersACountUnderAdmins(t *testing.T) {
	ca, ds := peerTLSDaemons(t, "ua", func(c *Config) {
		c.Destructive = DestructiveAdmins
		c.AdminIdentities = []string{adminID}
	})
	as := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}
	}
	user, admin := as(ca.Issue(t, "user")), as(ca.IssueWith(t, "admin", adminID))
	send := func(tc *tls.Config, d *Daemon, method, path, body string) (int, []byte) {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		req, err := http.NewRequest(method, "https://"+d.HTTPAddr()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	uc, err := client.New(ds[0].GRPCAddr(), client.WithTLS(user))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	ctx := context.Background()
	for _, a := range limiter.Algorithms {
		spend := limiter.Request{Name: "api", Key: "spent-" + a.String(), Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
		httpCheck := func(r limiter.Request, extra string) (int, Decision) {
			t.Helper()
			body := fmt.Sprintf(`{"name":%q,"key":%q,"hits":%d,"limit":%d,"burst":%d,"period":%q,"algorithm":%q%s}`,
				r.Name, r.Key, r.Hits, r.Limit, r.Burst, r.Period, r.Algorithm, extra)
			code, b := send(user, ds[1], "POST", "/v1/check", body)
			var d Decision
			if code == http.StatusOK {
				if err := json.Unmarshal(b, &d); err != nil {
					t.Fatal(err)
				}
			}
			return code, d
		}
		code, first := httpCheck(spend, "")
		if code != http.StatusOK || !first.Allowed {
			t.Fatalf("%v: spending the key: %d %+v", a, code, first)
		}
		stillSpent := func(after string) {
			t.Helper()
			r := spend
			r.Hits = 1
			if code, d := httpCheck(r, ""); code != http.StatusOK || d.Allowed {
				t.Errorf("%v: after %s, a check of the spent key: %d %+v, want denied", a, after, code, d)
			}
			if d, err := uc.Check(ctx, r); err != nil || d.Allowed {
				t.Errorf("%v: after %s, a gRPC check of the spent key: %+v %v, want denied", a, after, d, err)
			}
		}
		// The charge's window or instant, as the key's algorithm names
		// it: the hour that holds now, or now.
		now := time.Now()
		named := limiter.Window{Start: now.UnixNano(), End: now.UnixNano()}
		if a == limiter.FixedWindow || a == limiter.SlidingWindowCounter {
			start := now.Truncate(time.Hour)
			named = limiter.Window{Start: start.UnixNano(), End: start.Add(time.Hour).UnixNano()}
		}
		for _, w := range []struct {
			name string
			w    limiter.Window
		}{
			{"no window", limiter.Window{}},
			{"the key's window", named},
			{"a forged epoch", limiter.Window{Start: named.Start + int64(time.Microsecond), End: max(named.End, named.Start+int64(time.Microsecond))}},
			{"a forged instant", limiter.Window{Start: now.UnixNano(), End: now.UnixNano()}},
			{"a forged window ending an hour later", limiter.Window{Start: now.UnixNano(), End: now.Add(time.Hour).UnixNano()}},
		} {
			r := spend
			r.Behavior, r.Charged = limiter.Refund, w.w
			// Refused by the daemon, or, for a window the algorithm
			// cannot have charged, by the client's validation.
			if _, err := uc.Check(ctx, r); status.Code(err) != codes.PermissionDenied && !errors.Is(err, limiter.ErrInvalidBehavior) {
				t.Errorf("%v: a user's gRPC refund naming %s: %v, want PermissionDenied", a, w.name, err)
			}
			stillSpent("a refund naming " + w.name)
		}
		if code, _ := httpCheck(spend, `,"refund":true`); code == http.StatusOK {
			t.Errorf("%v: a user's HTTP refund: %d, want refused", a, code)
		}
		stillSpent("an HTTP refund")
		reset := spend
		reset.Hits, reset.Behavior = 0, limiter.Reset
		if _, err := uc.Check(ctx, reset); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%v: a user's gRPC reset: %v, want PermissionDenied", a, err)
		}
		stillSpent("a reset")
		for _, b := range limiter.Algorithms {
			p := limiter.Request{Name: spend.Name, Key: spend.Key, Limit: 3_000_000, Burst: 3_000_000, Period: time.Second, Algorithm: b}
			if code, d := httpCheck(p, ""); code != http.StatusOK {
				t.Errorf("%v: a user's HTTP peek with %v: %d %+v", a, b, code, d)
			}
			if _, err := uc.Check(ctx, p); err != nil {
				t.Errorf("%v: a user's gRPC peek with %v: %v", a, b, err)
			}
			stillSpent("peeks with " + b.String())
		}
		other := limiter.GCRA
		if a == other {
			other = limiter.TokenBucket
		}
		q := "/v1/admin/keys?name=" + url.QueryEscape(spend.Name) + "&key=" + url.QueryEscape(spend.Key) + "&algorithm=" + other.String() + "&limit=3000000&period=1s"
		if code, b := send(user, ds[1], "GET", q, ""); code != http.StatusForbidden {
			t.Errorf("%v: a user's inspect: %d %s, want 403", a, code, b)
		}
		if _, err := uc.Inspect(ctx, spend.Name, spend.Key); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%v: a user's gRPC inspect: %v, want PermissionDenied", a, err)
		}
		if code, b := send(admin, ds[0], "GET", q, ""); code != http.StatusOK {
			t.Errorf("%v: an admin's inspect with %v: %d %s", a, other, code, b)
		}
		stillSpent("inspects")
	}
}
