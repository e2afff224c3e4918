package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/limiter"
)

const (
	peerID  = "spiffe://sluice.test/peer"
	adminID = "spiffe://sluice.test/admin"
)

// TestDestructiveBehaviorsForAdmins runs two daemons under mutual TLS
// whose peers carry a peer identity and that allow reset and
// drain_over_limit to admins only: an ordinary client is refused them on
// HTTP (single and batch) and gRPC, and so are the admin API's inspect
// and reset; an admin is served, and checks without them are served to
// both.
func TestDestructiveBehaviorsForAdmins(t *testing.T) {
	ca, ds := peerTLSDaemons(t, "adm", func(c *Config) {
		c.Destructive = DestructiveAdmins
		c.AdminIdentities = []string{adminID}
	})

	as := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}
	}
	user, admin := as(ca.Issue(t, "user")), as(ca.IssueWith(t, "admin", adminID))
	post := func(tc *tls.Config, path, body string) int {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		method := "POST"
		if body == "" {
			method = "GET"
		}
		req, err := http.NewRequest(method, "https://"+ds[1].HTTPAddr()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	check := `{"name":"api","key":"k","limit":3,"period":"1h","algorithm":"token_bucket"`
	for _, tc := range []struct {
		who        string
		tls        *tls.Config
		path, body string
		want       int
	}{
		{"user", user, "/v1/check", check + `}`, 200},
		{"user", user, "/v1/check", check + `,"reset":true}`, 403},
		{"user", user, "/v1/check", check + `,"drain_over_limit":true}`, 403},
		{"user", user, "/v1/check/batch", `{"requests":[` + check + `},` + check + `,"reset":true}]}`, 403},
		{"admin", admin, "/v1/check", check + `,"reset":true}`, 200},
		{"admin", admin, "/v1/check/batch", `{"requests":[` + check + `,"drain_over_limit":true}]}`, 200},
		// Inspecting (GET, no body) is for admins too under admins.
		{"user", user, "/v1/admin/keys?name=api&key=k", "", 403},
		{"user", user, "/v1/admin/keys/reset", `{"name":"api","key":"k"}`, 403},
		{"admin", admin, "/v1/admin/keys?name=api&key=k", "", 200},
		{"admin", admin, "/v1/admin/keys/reset", `{"name":"api","key":"k"}`, 200},
	} {
		if got := post(tc.tls, tc.path, tc.body); got != tc.want {
			t.Errorf("%s: POST %s %s: %d, want %d", tc.who, tc.path, tc.body, got, tc.want)
		}
	}

	req := limiter.Request{Name: "api", Key: "grpc", Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for _, tc := range []struct {
		who      string
		tls      *tls.Config
		behavior limiter.Behavior
		want     codes.Code
	}{
		{"user", user, 0, codes.OK},
		{"user", user, limiter.Reset, codes.PermissionDenied},
		{"admin", admin, limiter.Reset, codes.OK},
	} {
		c, err := client.New(ds[0].GRPCAddr(), client.WithTLS(tc.tls))
		if err != nil {
			t.Fatal(err)
		}
		r := req
		r.Behavior = tc.behavior
		_, err = c.Check(context.Background(), r)
		c.Close()
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: gRPC check with behavior %v: %v, want %v", tc.who, tc.behavior, err, tc.want)
		}
	}
	for _, tc := range []struct {
		who  string
		tls  *tls.Config
		want codes.Code
	}{
		{"user", user, codes.PermissionDenied},
		{"admin", admin, codes.OK},
	} {
		c, err := client.New(ds[0].GRPCAddr(), client.WithTLS(tc.tls))
		if err != nil {
			t.Fatal(err)
		}
		_, ierr := c.Inspect(context.Background(), "api", "grpc")
		_, rerr := c.Reset(context.Background(), "api", "grpc")
		c.Close()
		if status.Code(ierr) != tc.want || status.Code(rerr) != tc.want {
			t.Errorf("%s: gRPC inspect: %v, reset: %v; want %v", tc.who, ierr, rerr, tc.want)
		}
	}
}

// TestDestructiveBehaviorsDenied: with deny, reset is refused to every
// caller, with a problem that names the setting.
// peerTLSDaemons starts two daemons, prefix-a and prefix-b, under mutual
// TLS with node certificates that carry peerID and peer_identities set to
// it, each with testConfig changed by mod, joined into one cluster, and
// returns the CA and the daemons once both are ready with two members.
func peerTLSDaemons(t *testing.T, prefix string, mod func(*Config)) (*testpki.CA, []*Daemon) {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "sluice test CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	var ds []*Daemon
	for _, name := range []string{prefix + "-a", prefix + "-b"} {
		cfg := testConfig(name)
		cfg.TLSCertFile, cfg.TLSKeyFile = testpki.WriteCert(t, dir, name, ca.IssueWith(t, name, peerID))
		cfg.TLSCAFile = caFile
		cfg.PeerIdentities = []string{peerID}
		cfg.GossipKeys = []string{"MDEyMzQ1Njc4OWFiY2RlZg=="} // identities need encrypted gossip
		mod(&cfg)
		if len(ds) > 0 {
			cfg.Join = []string{ds[0].GossipAddr()}
		}
		ds = append(ds, start(t, cfg))
	}
	waitSettled(t, ds)
	return ca, ds
}

func TestDestructiveBehaviorsDenied(t *testing.T) {
	cfg := testConfig("deny")
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg)
	resp := do(t, "POST", "http://"+d.HTTPAddr()+"/v1/check", `{"name":"api","key":"k","limit":3,"period":"1h","algorithm":"fixed_window","reset":true}`)
	if resp.status != http.StatusForbidden || !strings.Contains(string(resp.body), "destructive_behaviors") {
		t.Fatalf("reset under deny: %d %s, want 403 naming destructive_behaviors", resp.status, resp.body)
	}
}

func TestPeerSettingsRefused(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tooshort\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		set   func(*Config)
		field string
	}{
		"identities without a CA": {func(c *Config) { c.PeerIdentities = []string{peerID} }, "peer_identities"},
		"admins without a CA":     {func(c *Config) { c.Destructive = DestructiveAdmins; c.AdminIdentities = []string{adminID} }, "destructive_behaviors"},
		"unknown destructive":     {func(c *Config) { c.Destructive = "sometimes" }, "destructive_behaviors"},
	} {
		cfg := testConfig("x")
		tc.set(&cfg)
		err := cfg.Validate()
		if ce, ok := err.(*ConfigError); !ok || ce.Field != tc.field {
			t.Errorf("%s: Validate: %v, want an error of %s", name, err, tc.field)
		}
	}
	cfg := testConfig("x")
	cfg.ClusterSecretFile = short
	if d, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "cluster_secret_file") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("New with an 8-byte secret: %v, want an error of cluster_secret_file", err)
	}
}

// serverName joins the prefix to any name, and keeps at most
// maxServerNames of them, however many names it is given.
func TestServerNameKeepsABoundedSet(t *testing.T) {
	for i := range maxServerNames + 100 {
		name := fmt.Sprintf("bounded-%d", i)
		for range 2 { // joined, then kept (or not, beyond the bound)
			if got := serverName(name); got != serverNamePrefix+name {
				t.Fatalf("serverName(%q) = %q", name, got)
			}
		}
	}
	if m := serverNames.m.Load(); m == nil || len(*m) != maxServerNames {
		t.Fatalf("kept %d names, want %d", lenOf(m), maxServerNames)
	}
	if got := serverName("envoy/second"); got != "@envoy/second" {
		t.Fatalf(`serverName("envoy/second") = %q`, got)
	}
}
