package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limiter"
)

// TestRefundAfterAnAdminResetTakesNoOnesHits runs two daemons under
// destructive_behaviors admins. For every algorithm, an admin's client
// charges a key 3 hits over gRPC, an admin resets the key through the
// HTTP admin API, a user spends 4 through POST /v1/check, and the admin's
// refund of its 3, naming its charge's window or instant, arrives: the
// reset cleared those hits, so it gives nothing back, and the user's
// next check finds the 4 still counted.
func TestRefundAfterAnAdminResetTakesNoOnesHits(t *testing.T) {
	ca, ds := peerTLSDaemons(t, "rr", func(c *Config) {
		c.Destructive = DestructiveAdmins
		c.AdminIdentities = []string{adminID}
	})
	as := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}
	}
	user, admin := as(ca.Issue(t, "user")), as(ca.IssueWith(t, "admin", adminID))
	post := func(tc *tls.Config, path, body string) (int, []byte) {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := c.Post("https://"+ds[1].HTTPAddr()+path, "application/json", strings.NewReader(body))
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
	c, err := client.New(ds[0].GRPCAddr(), client.WithTLS(admin))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, a := range limiter.Algorithms {
		req := limiter.Request{Name: "api", Key: "reset-" + a.String(), Hits: 3, Limit: 10, Period: time.Hour, Algorithm: a}
		mine, err := c.Check(ctx, req)
		if err != nil || !mine.Allowed || mine.Window.IsZero() {
			t.Fatalf("%v: the admin's charge: %+v %v", a, mine, err)
		}
		if code, body := post(admin, "/v1/admin/keys/reset", fmt.Sprintf(`{"name":%q,"key":%q}`, req.Name, req.Key)); code != http.StatusOK {
			t.Fatalf("%v: reset: %d %s", a, code, body)
		}
		check := func(hits int) Decision {
			t.Helper()
			code, body := post(user, "/v1/check", fmt.Sprintf(`{"name":%q,"key":%q,"hits":%d,"limit":10,"period":"1h","algorithm":%q}`, req.Name, req.Key, hits, a))
			var d Decision
			if code != http.StatusOK || json.Unmarshal(body, &d) != nil {
				t.Fatalf("%v: the user's check: %d %s", a, code, body)
			}
			return d
		}
		if d := check(4); !d.Allowed || d.Remaining != 6 {
			t.Fatalf("%v: the user's 4 after the reset: %+v", a, d)
		}
		refund := req
		refund.Behavior, refund.Charged = limiter.Refund, mine.Window
		if d, err := c.Check(ctx, refund); err != nil || !d.Window.IsZero() {
			t.Errorf("%v: the admin's refund of a charge the reset cleared: %+v %v, want nothing given back", a, d, err)
		}
		if d := check(0); d.Remaining != 6 {
			t.Errorf("%v: after the refund the user's key has %d left, want 6: the refund took the user's hits", a, d.Remaining)
		}
	}
}
