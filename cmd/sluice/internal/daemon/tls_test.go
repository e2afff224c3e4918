package daemon

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/limiter"
)

// tlsDaemons starts two daemons with mutual TLS and gossip encryption from
// files, joined into one cluster, and returns them with the CA.
func tlsDaemons(t *testing.T) (*testpki.CA, string, []*Daemon) {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "sluice test CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	var ds []*Daemon
	for _, name := range []string{"tls-a", "tls-b"} {
		cfg := testConfig(name)
		cfg.TLSCertFile, cfg.TLSKeyFile = testpki.WriteCert(t, dir, name, ca.Issue(t, name))
		cfg.TLSCAFile = caFile
		cfg.GossipKeys = []string{key}
		if len(ds) > 0 {
			cfg.Join = []string{ds[0].GossipAddr()}
		}
		ds = append(ds, start(t, cfg))
	}
	waitSettled(t, ds)
	return ca, dir, ds
}

func TestMutualTLS(t *testing.T) {
	ca, _, ds := tlsDaemons(t)
	withCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, "caller")}},
	}}
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool},
	}}
	body := `{"name":"api","key":"k","limit":3,"period":"1h","algorithm":"fixed_window"}`
	// post returns the status, or 429 for a decision not allowed.
	post := func(c *http.Client, d *Daemon) (int, error) {
		resp, err := c.Post("https://"+d.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var dec struct {
			Allowed bool   `json:"allowed"`
			Owner   string `json:"owner"`
		}
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode == http.StatusOK && json.Unmarshal(b, &dec) == nil && !dec.Allowed {
			return http.StatusTooManyRequests, nil // limited
		}
		return resp.StatusCode, nil
	}
	// Three admitted across both daemons, whichever owns the key: the
	// forwarded check crossed the nodes' mutual TLS.
	codes := []int{}
	for i := range 4 {
		code, err := post(withCert, ds[i%2])
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	if want := []int{200, 200, 200, 429}; !equalInts(codes, want) {
		t.Errorf("checks with a client certificate: %v, want %v", codes, want)
	}
	if code, err := post(noCert, ds[0]); err != nil || code != http.StatusUnauthorized {
		t.Errorf("check without a client certificate: %d, %v; want 401", code, err)
	}
	resp, err := noCert.Post("https://"+ds[0].HTTPAddr()+"/v1/rules/check", "application/json", strings.NewReader(`{"user":"u"}`))
	if err != nil {
		t.Fatalf("rules check without a client certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("rules check without a client certificate: %d, want 401", resp.StatusCode)
	}
	resp, err = noCert.Get("https://" + ds[0].HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatalf("healthz without a client certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz without a client certificate: %d", resp.StatusCode)
	}
	// Plain HTTP gets net/http's 400 for a TLS port, or a broken
	// connection: never an answer from the daemon.
	if resp, err := probe.Get("http://" + ds[0].HTTPAddr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP got %d", resp.StatusCode)
		}
	}

	// gRPC clients: with a certificate they are served, without they are
	// refused.
	req := limiter.Request{Name: "api", Key: "grpc", Hits: 1, Limit: 5, Period: time.Hour, Algorithm: limiter.TokenBucket}
	good, err := client.New(ds[1].GRPCAddr(), client.WithTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, "caller")}}))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if d, err := good.Check(context.Background(), req); err != nil || !d.Allowed {
		t.Errorf("gRPC check with a certificate: %+v, %v", d, err)
	}
	bad, err := client.New(ds[1].GRPCAddr(), client.WithTLS(&tls.Config{RootCAs: ca.Pool}), client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Check(context.Background(), req); err == nil {
		t.Error("gRPC check without a client certificate was served")
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	certFile, keyFile := testpki.WriteCert(t, dir, "n", ca.Issue(t, "n"))
	tests := []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"cert without key", func(c *Config) { c.TLSCertFile = certFile }, "tls_cert_file"},
		{"ca without cert", func(c *Config) { c.TLSCAFile = certFile }, "tls_ca_file"},
		{"missing cert file", func(c *Config) { c.TLSCertFile, c.TLSKeyFile = dir+"/none.crt", keyFile }, "tls_cert_file"},
		{"key is not a key", func(c *Config) { c.TLSCertFile, c.TLSKeyFile = certFile, certFile }, "tls_cert_file"},
		{"ca is not PEM", func(c *Config) { c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile = certFile, keyFile, keyFile+".none" }, "tls_ca_file"},
		{"gossip key not base64", func(c *Config) { c.GossipKeys = []string{"!!"} }, "gossip_keys"},
		{"gossip key too short", func(c *Config) { c.GossipKeys = []string{base64.StdEncoding.EncodeToString([]byte("short"))} }, "gossip_keys"},
	}
	for _, tt := range tests {
		cfg := testConfig("bad")
		tt.mut(&cfg)
		_, err := New(cfg, WithLogOutput(discard{}))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field {
			t.Errorf("%s: New = %v, want a ConfigError on %s", tt.name, err, tt.field)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
