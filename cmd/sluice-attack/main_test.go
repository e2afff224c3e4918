package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// TestMain fails the run when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The program runs a few attacks, scaled down, against a daemon it built,
// and prints a row for each with what it measured. Whether the daemon met
// the targets is what the program reports, not what this test checks.
func TestRunScaledDown(t *testing.T) {
	ctx := context.Background()
	bin, err := buildDaemon(ctx, t.TempDir())
	if err != nil {
		t.Skipf("cannot build the daemon: %v", err)
	}
	selected := []string{"reset", "lower-count", "lower-by-rate", "idle-connections", "idle-connection-cap", "public-flood", "yaml-alias-bomb", "spoofed-forwarded", "grpc-partial-message", "http-partial-body", "metric-cardinality", "rogue-member", "rogue-member-mtls"}
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-sluice", bin, "-attacks", strings.Join(selected, ","),
		"-scale", "0.005", "-duration", "500ms", "-attackers", "4"}, &stdout, &stderr)
	out := stdout.String()
	t.Logf("exit %d\n%s\n%s", code, out, stderr.String())
	if code != 0 && code != 1 {
		t.Fatalf("exit status %d", code)
	}
	for _, tt := range []struct {
		attack string
		want   []string // in the attack's row
	}{
		{"reset", []string{"canary remaining", " MB |", ", worst "}},
		{"lower-count", []string{"canaries still spent: 12 of 12", " MB |", ", worst "}},
		{"lower-by-rate", []string{"canaries still spent: 6 of 6", "lax rate: denied", " MB |", ", worst "}},
		{"idle-connections", []string{"connections opened", " MB |"}},
		{"idle-connection-cap", []string{"connections opened", "New clients: ", " MB |", ", worst "}},
		{"public-flood", []string{"connections opened", "through its peer_addr", " MB |", ", worst "}},
		{"yaml-alias-bomb", []string{"--config: exit 2, bomb.yaml:3:125: a2[23]: the alias *a1 expands the document beyond 1000000 nodes",
			"--rules-file: exit 1, bomb.yaml:3:125: a2[23]: the alias *a1 expands",
			"--envoy-config-dir: exit 1, bomb-envoy/bomb.yaml:3:125: a2[23]: the alias *a1 expands",
			"made current: rules 0, envoy 0; in force: 1 rule, 1 domain", " MB |"}},
		{"spoofed-forwarded", []string{"admitted", "in this process"}},
		{"grpc-partial-message", []string{"MB sent; ", " MB |"}},
		{"http-partial-body", []string{"connections opened", " MB |"}},
		{"metric-cardinality", []string{"sluice_envoy_hits_total has", " MB |"}},
		{"rogue-member", []string{"joined gossip: 0 of 2 without the key, 2 of 2 insiders; entered a ring: 0 (ring members at most 2); refused_members 2/2 (",
			"does not prove the cluster secret", "sluice_members_refused 2/2; checks, states, leases at rogue servers: 0, 0, 0", " MB |", ", worst "}},
		{"rogue-member-mtls", []string{"joined gossip: 0 of 2 without the key, 2 of 2 insiders; entered a ring: 0 (ring members at most 2); refused_members 2/2 (",
			`server certificate \"api-client\" names no peer identity`, "sluice_members_refused 2/2; checks, states, leases at rogue servers: 0, 0, 0", " MB |", ", worst "}},
	} {
		row := tableRow(out, tt.attack)
		if row == "" {
			t.Errorf("no row for %s", tt.attack)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(row, w) {
				t.Errorf("%s row lacks %q: %s", tt.attack, w, row)
			}
		}
		if strings.Contains(row, "could not run") {
			t.Errorf("%s did not run: %s", tt.attack, row)
		}
	}
	// Every check on the rogue-member attacks' keys was decided by their
	// owners, exactly.
	for _, attack := range []string{"rogue-member", "rogue-member-mtls"} {
		if m := admittedRE.FindStringSubmatch(tableRow(out, attack)); m == nil || m[1] != m[2] || m[1] == "0" {
			t.Errorf("%s admitted %q, want as many as an exact limit, and some", attack, m)
		}
	}
}

var admittedRE = regexp.MustCompile(`admitted on the legitimate keys: (\d+), exact (\d+)`)

// tableRow returns the markdown row of attack in out.
func tableRow(out, attack string) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "| "+attack+" |") {
			return line
		}
	}
	return ""
}

// The hand-built batches decode to as many empty items as asked, on both
// services.
func TestEmptyItems(t *testing.T) {
	for _, n := range []int{0, 1, 1001, 100_000} {
		var public pb.BatchCheckRequest
		if err := proto.Unmarshal(emptyItems(1, n), &public); err != nil || len(public.Requests) != n {
			t.Errorf("public batch of %d: %d items, %v", n, len(public.Requests), err)
		}
		var peer pb.PeerCheckRequest
		if err := proto.Unmarshal(emptyItems(2, n), &peer); err != nil || len(peer.Items) != n {
			t.Errorf("peer batch of %d: %d items, %v", n, len(peer.Items), err)
		}
	}
	if n := len(emptyItems(1, 1_000_000)); n != 2_000_000 {
		t.Errorf("a million empty items take %d bytes, want 2,000,000", n)
	}
}

// The alias bomb is valid YAML of about 50 KB whose rules alias its
// deepest level.
func TestAliasBomb(t *testing.T) {
	data := aliasBomb(aliasWidth, aliasDepth)
	if n := len(data); n < 40_000 || n > 60_000 {
		t.Errorf("the bomb is %d bytes, want about 50 KB", n)
	}
	var small map[string]any
	if err := yaml.Unmarshal(aliasBomb(3, 4), &small); err != nil {
		t.Fatal(err)
	}
	rules, ok := small["rules"].([]any)
	if !ok || len(rules) != 3 {
		t.Fatalf("rules of the 3-wide bomb: %v", small["rules"])
	}
}

func TestFormats(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{thousands(0), "0"},
		{thousands(999), "999"},
		{thousands(1000), "1,000"},
		{thousands(1_500_000), "1,500,000"},
		{thousands(-12345), "-12,345"},
		{size(20_000), "20 KB"},
		{size(2_000_000), "2.0 MB"},
		{slowHeaderPrefix(45), "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nX-Slow"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func slowHeaderPrefix(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = slowHeader(i)
	}
	return string(b)
}
