package dockertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/cmd/sluice/internal/daemon"
)

// deployDockerfile is the image deploy/README.md builds.
const deployDockerfile = "../../../deploy/Dockerfile"

// instruction is one Dockerfile instruction: its keyword, upper case, and
// the rest of its line, continuation lines joined.
type instruction struct {
	keyword string
	args    string
}

func (in instruction) String() string { return in.keyword + " " + in.args }

// stages parses a Dockerfile into its build stages, each starting with its
// FROM. Comments and blank lines are dropped.
func stages(text string) ([][]instruction, error) {
	var out [][]instruction
	var pending strings.Builder
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if pending.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending.WriteString(cont + " ")
			continue
		}
		pending.WriteString(line)
		keyword, args, _ := strings.Cut(pending.String(), " ")
		pending.Reset()
		in := instruction{strings.ToUpper(keyword), strings.TrimSpace(args)}
		switch {
		case in.keyword == "FROM":
			out = append(out, []instruction{in})
		case len(out) == 0:
			if in.keyword != "ARG" {
				return nil, fmt.Errorf("%s before the first FROM", in)
			}
		default:
			out[len(out)-1] = append(out[len(out)-1], in)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no FROM")
	}
	return out, nil
}

// testImage returns the Dockerfile of the test image: deploy/Dockerfile's
// final stage, whose copy of the binary from the build stage becomes a
// copy of the binary the tests built (no golang image can be pulled
// here). The final stage must start FROM scratch and hold no RUN and no
// other copy from another stage, so that the test image is the one
// deployed but for how its binary was built.
func testImage(dockerfile string) (string, error) {
	all, err := stages(dockerfile)
	if err != nil {
		return "", fmt.Errorf("dockertest: %s: %w", deployDockerfile, err)
	}
	final := all[len(all)-1]
	if base, _, _ := strings.Cut(final[0].args, " "); base != "scratch" {
		return "", fmt.Errorf("dockertest: %s: the final stage is FROM %s, not scratch", deployDockerfile, final[0].args)
	}
	var b strings.Builder
	copied := 0
	for _, in := range final {
		switch {
		case in.keyword == "RUN":
			return "", fmt.Errorf("dockertest: %s: %s in the final stage, which has no shell", deployDockerfile, in)
		case in.keyword == "COPY" && strings.HasPrefix(in.args, "--from="):
			f := strings.Fields(in.args)
			if len(f) != 3 || f[2] != "/sluice" {
				return "", fmt.Errorf("dockertest: %s: %s: the final stage copies only the binary to /sluice", deployDockerfile, in)
			}
			in.args = "sluice /sluice"
			copied++
		}
		b.WriteString(in.String() + "\n")
	}
	if copied != 1 {
		return "", fmt.Errorf("dockertest: %s: the final stage copies the binary %d times, want once", deployDockerfile, copied)
	}
	return b.String(), nil
}

// imageDockerfile reads deploy/Dockerfile and returns testImage's
// Dockerfile.
func imageDockerfile() (string, error) {
	b, err := os.ReadFile(deployDockerfile)
	if err != nil {
		return "", fmt.Errorf("dockertest: %w", err)
	}
	return testImage(string(b))
}

// TestDeployDockerfile checks deploy/Dockerfile without Docker: a static
// build of ./cmd/sluice, then FROM scratch with the binary, a non-root
// user, the daemon's default ports, and `sluice serve` as entrypoint; and
// that the test image is its final stage.
func TestDeployDockerfile(t *testing.T) {
	b, err := os.ReadFile(deployDockerfile)
	if err != nil {
		t.Fatal(err)
	}
	all, err := stages(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("%d stages, want a build stage and the image", len(all))
	}
	build := fmt.Sprint(all[0])
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-ldflags='-s -w'", "./cmd/sluice", "AS build"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage lacks %s: %s", want, build)
		}
	}

	image, err := testImage(string(b))
	if err != nil {
		t.Fatal(err)
	}
	final, err := stages(image)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, in := range final[0] {
		got[in.keyword] = append(got[in.keyword], in.args)
	}
	if fmt.Sprint(got["FROM"]) != "[scratch]" || fmt.Sprint(got["COPY"]) != "[sluice /sluice]" {
		t.Errorf("test image %q: want FROM scratch and one COPY of the binary", image)
	}
	if len(got["ENTRYPOINT"]) != 1 {
		t.Fatalf("ENTRYPOINT %q, want one", got["ENTRYPOINT"])
	}
	var entry []string
	if err := json.Unmarshal([]byte(got["ENTRYPOINT"][0]), &entry); err != nil || !slices.Equal(entry, []string{"/sluice", "serve"}) {
		t.Errorf("ENTRYPOINT %s (%v), want the exec form [\"/sluice\", \"serve\"]", got["ENTRYPOINT"][0], err)
	}
	if fmt.Sprint(got["USER"]) != "[65532:65532]" {
		t.Errorf("USER %q, want 65532:65532 (non-root, as the Kubernetes manifests run)", got["USER"])
	}

	cfg := daemon.DefaultConfig()
	var want []string
	for _, p := range []struct{ addr, proto string }{
		{cfg.GossipAddr, "tcp"}, {cfg.GossipAddr, "udp"}, {cfg.GRPCAddr, "tcp"}, {cfg.HTTPAddr, "tcp"},
	} {
		_, port, err := net.SplitHostPort(p.addr)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, port+"/"+p.proto)
	}
	want = append(want, peerPort+"/tcp") // peer_addr has no default
	if exposed := strings.Fields(strings.Join(got["EXPOSE"], " ")); !slices.Equal(exposed, want) {
		t.Errorf("EXPOSE %q, want the daemon's default ports and the peer port %q", exposed, want)
	}
}
