package dockertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// composeFile is the repository's compose file, from this package.
const composeFile = "../../../deploy/compose.yaml"

// composeCommand returns the compose command: docker-compose when it is on
// PATH, else the docker compose plugin; nil when neither runs.
func composeCommand() []string {
	if path, err := exec.LookPath("docker-compose"); err == nil {
		return []string{path}
	}
	if _, err := docker(20*time.Second, "compose", "version"); err == nil {
		return []string{"docker", "compose"}
	}
	return nil
}

// project is deploy/compose.yaml brought up under a project name of its own.
type project struct {
	t    *testing.T
	cmd  []string
	name string
	env  []string
}

// compose runs the compose command with args on the project and returns
// its standard output trimmed.
func (p *project) compose(timeout time.Duration, args ...string) (string, error) {
	all := append(append(p.cmd[1:], "--file", composeFile, "--project-name", p.name), args...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.cmd[0], all...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("dockertest: %s %s: %w: %s", filepath.Base(p.cmd[len(p.cmd)-1]), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// TestComposeCluster brings up deploy/compose.yaml with the test image: its
// three services become healthy through their health checks (`sluice
// ready`), form one cluster that holds a limit exactly across them, and a
// service stopped by compose leaves gracefully, the other two routing
// without it.
func TestComposeCluster(t *testing.T) {
	e := setup(t)
	cmd := composeCommand()
	if cmd == nil {
		t.Skip("compose tests skipped: neither docker-compose nor docker compose runs")
	}
	p := &project{t: t, cmd: cmd, name: "sluicetest" + e.run, env: []string{"SLUICE_IMAGE=" + e.image}}
	services := []string{"sluice-1", "sluice-2", "sluice-3"}
	for i := range services {
		// Empty host ports: Docker picks free ones.
		p.env = append(p.env, fmt.Sprintf("SLUICE_HTTP_%d=", i+1), fmt.Sprintf("SLUICE_GRPC_%d=", i+1))
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, err := p.compose(dockerTimeout, "logs", "--no-color", "--tail", "40")
			t.Logf("compose logs (%v):\n%s", err, logs)
		}
		if _, err := p.compose(2*time.Minute, "down", "--volumes", "--remove-orphans", "--timeout", "20"); err != nil {
			t.Error(err)
		}
	})
	if _, err := p.compose(5*time.Minute, "up", "--detach", "--no-build"); err != nil {
		t.Fatal(err)
	}

	c := &cluster{t: t, env: e, client: newHTTPClient()}
	ids := map[string]string{}
	for _, svc := range services {
		id, err := p.compose(dockerTimeout, "ps", "-q", svc)
		if err != nil || id == "" {
			t.Fatalf("container of %s: %q, %v", svc, id, err)
		}
		ids[svc] = id
		nd := &node{name: svc}
		c.waitFor(svc+" to publish its HTTP port", func() error {
			out, err := p.compose(dockerTimeout, "port", svc, "8080")
			if err != nil {
				return err
			}
			nd.base, err = loopbackURL(out)
			return err
		})
		c.nodes = append(c.nodes, nd)
	}
	// Docker runs the health check, `sluice ready`, inside the image.
	c.waitFor("every service healthy", func() error {
		var errs []error
		for _, svc := range services {
			health, err := docker(dockerTimeout, "inspect", "--format", "{{.State.Health.Status}}", ids[svc])
			if err != nil {
				return err
			}
			if health != "healthy" {
				errs = append(errs, fmt.Errorf("%s is %s", svc, health))
			}
		}
		return errors.Join(errs...)
	})
	c.waitMembers(c.nodes, 3)
	req := checkRequest{Name: "compose", Key: "exact", Limit: 30, Period: longPeriod, Algorithm: "fixed_window"}
	c.checkExact(req, 90, 6)

	// compose stop sends SIGTERM: sluice-3 leaves, and the others see it
	// leave rather than fail.
	if _, err := p.compose(2*time.Minute, "stop", "--timeout", "20", "sluice-3"); err != nil {
		t.Fatal(err)
	}
	c.waitMembers(c.nodes[:2], 2)
	if code, err := docker(dockerTimeout, "inspect", "--format", "{{.State.ExitCode}}", ids["sluice-3"]); err != nil || code != "0" {
		t.Errorf("sluice-3 exited with %q (%v), want 0 after a graceful leave", code, err)
	}
}
