package sluice_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The adapters and the rules depend on the vocabulary, not on the
// cluster: importing them pulls in no gossip, no cluster and, but for
// grpclimit itself, no gRPC.
func TestAdaptersPullInNoCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for pkg, banned := range map[string][]string{
		"./httplimit":  {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./rules":      {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./envoyrls":   {"hashicorp/serf", "hashicorp/memberlist", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./grpclimit":  {"hashicorp/serf", "hashicorp/memberlist", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./redislimit": {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		".":            {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 5 {
			t.Fatalf("go list -deps %s listed only %v", pkg, deps)
		}
		for _, d := range deps {
			for _, b := range banned {
				if strings.Contains(d, b) {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		}
	}
}
