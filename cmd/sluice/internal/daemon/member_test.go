package daemon

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testrogue"
	"github.com/sluicehq/sluice/internal/testwait"
)

// TestPeerIdentitiesNeedGossipEncryption: peer_identities without
// gossip_keys or cluster_secret_file are refused, naming both settings;
// with either one they are accepted.
func TestPeerIdentitiesNeedGossipEncryption(t *testing.T) {
	cfg := testConfig("x")
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile = "node.pem", "node.key", "ca.pem"
	cfg.PeerIdentities = []string{peerID}
	err := cfg.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "peer_identities" || !errors.Is(err, cluster.ErrPlainGossip) ||
		!strings.Contains(err.Error(), "gossip_keys") || !strings.Contains(err.Error(), "cluster_secret_file") {
		t.Fatalf("Validate: %v, want an error of peer_identities wrapping cluster.ErrPlainGossip and naming gossip_keys and cluster_secret_file", err)
	}
	for name, set := range map[string]func(*Config){
		"gossip_keys":         func(c *Config) { c.GossipKeys = []string{"MDEyMzQ1Njc4OWFiY2RlZg=="} },
		"cluster_secret_file": func(c *Config) { c.ClusterSecretFile = "secret" },
	} {
		c := cfg.clone()
		set(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("peer_identities with %s: %v", name, err)
		}
	}
}

// TestReadyzListsRefusedMembers joins a stock serf agent holding the
// gossip key, but not the cluster secret, to a daemon: /readyz names it
// among refused_members, stays 200 (an outsider cannot take a node out),
// and sluice_members_refused counts it.
func TestReadyzListsRefusedMembers(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("a secret the members share\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef")
	cfg := testConfig("a")
	cfg.ClusterSecretFile = secret
	cfg.GossipKeys = []string{base64.StdEncoding.EncodeToString(key)}
	d := start(t, cfg)
	rogue := testrogue.StartPeer(t, true, nil)
	if _, err := testrogue.JoinSerf(t, "rogue", rogue.Addr, key, d.GossipAddr()); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Status  string `json:"status"`
		Members int    `json:"members"`
		Refused []struct {
			Name, GRPC, Reason string
			Attempts           int
		} `json:"refused_members"`
	}
	testwait.For(t, "/readyz to list the rogue", func() bool {
		resp := do(t, "GET", "http://"+d.HTTPAddr()+"/readyz", "")
		body.Refused = nil
		return resp.status == http.StatusOK && json.Unmarshal(resp.body, &body) == nil && len(body.Refused) == 1
	})
	r := body.Refused[0]
	if body.Status != "ready" || body.Members != 1 || r.Name != "rogue" || r.GRPC != rogue.Addr ||
		!strings.Contains(r.Reason, "cluster secret") || r.Attempts < 1 {
		t.Fatalf("/readyz: %+v, want ready, 1 member, the rogue refused for the cluster secret", body)
	}
	resp := do(t, "GET", "http://"+d.HTTPAddr()+"/metrics", "")
	if !strings.Contains(string(resp.body), "\nsluice_members_refused 1\n") {
		t.Fatalf("/metrics has no sluice_members_refused 1:\n%s", resp.body)
	}
	if got := rogue.Checks.Load() + rogue.States.Load(); got != 0 {
		t.Fatalf("the rogue received %d checks and states", got)
	}
}

// TestReadyzListsPeerClocks: of two daemons, the second's clock runs a
// second ahead; with max_clock_skew 250ms the first lists it on /readyz
// about a second ahead and beyond the bound, stays ready, and exports the
// offset on /metrics.
func TestReadyzListsPeerClocks(t *testing.T) {
	var ds []*Daemon
	for i := range 2 {
		cfg := testConfig(fmt.Sprintf("clock-%d", i))
		cfg.MaxClockSkew = 250 * time.Millisecond
		cfg.ClockProbeInterval = 20 * time.Millisecond
		var opts []Option
		if i == 1 {
			cfg.Join = []string{ds[0].GossipAddr()}
			opts = append(opts, WithClock(func() time.Time { return time.Now().Add(time.Second) }))
		}
		ds = append(ds, start(t, cfg, opts...))
	}
	var body struct {
		Status string `json:"status"`
		Clocks []struct {
			Name   string  `json:"name"`
			Offset float64 `json:"offset_seconds"`
			Beyond bool    `json:"beyond_max_skew"`
		} `json:"peer_clocks"`
	}
	// An estimate is off by up to half the round trip it was taken on
	// (over 200 ms on a loaded machine): wait for one near the second.
	testwait.For(t, "/readyz to list the second daemon's clock about 1 s ahead", func() bool {
		resp := do(t, "GET", "http://"+ds[0].HTTPAddr()+"/readyz", "")
		body.Clocks = nil
		return resp.status == http.StatusOK && json.Unmarshal(resp.body, &body) == nil && len(body.Clocks) == 1 && body.Clocks[0].Beyond &&
			body.Clocks[0].Offset >= 0.9 && body.Clocks[0].Offset <= 1.1
	})
	if c := body.Clocks[0]; body.Status != "ready" || c.Name != "clock-1" || c.Offset < 0.9 || c.Offset > 1.1 {
		t.Fatalf("/readyz: %+v, want ready, clock-1 about 1 s ahead", body)
	}
	resp := do(t, "GET", "http://"+ds[0].HTTPAddr()+"/metrics", "")
	if !strings.Contains(string(resp.body), `sluice_peer_clock_offset_seconds{peer="clock-1"} `) ||
		!strings.Contains(string(resp.body), "\nsluice_peer_clocks_beyond_max_skew 1\n") {
		t.Fatalf("/metrics has no offset of clock-1 near 1 s:\n%s", resp.body)
	}
}
