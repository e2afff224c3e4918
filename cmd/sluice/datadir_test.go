package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
)

// TestDaemonDataDirRefusals: `sluice serve` on a data directory another
// daemon holds, or holding a damaged state file, exits with an error that
// says what is wrong and names the directory or the file, without a
// panic; with --data-damaged set-aside it starts and renames the file.
func TestDaemonDataDirRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/sluice and runs it as processes")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// serve runs a daemon that must exit by itself, and returns its
	// error output.
	serve := func(name, dir string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		all := append([]string{"serve", "--gossip-addr", loopbackAddr(t), "--grpc-addr", loopbackAddr(t), "--http-addr", loopbackAddr(t),
			"--bootstrap-expect", "1", "--log-level", "warn", "--data-dir", dir}, args...)
		cmd := exec.CommandContext(ctx, bin, all...)
		cmd.Env = append(os.Environ(), "SLUICE_NODE_NAME="+name)
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("%s did not exit: %s", name, out)
		}
		if err == nil {
			t.Fatalf("%s exited without an error: %s", name, out)
		}
		if strings.Contains(string(out), "panic") {
			t.Fatalf("%s panicked: %s", name, out)
		}
		return string(out)
	}

	dir := t.TempDir()
	holder := startProcess(t, bin, "holder", dir, "", "--bootstrap-expect", "1")
	testwait.ForTimeout(t, 60*time.Second, "the holder to be ready", func() bool { return holder.settled(1) })
	if out := serve("second", dir); !strings.Contains(out, dir) || !strings.Contains(out, "another process") {
		t.Fatalf("a second daemon on a held data_dir said %q, want the directory and that another process holds it", out)
	}
	holder.kill()

	file := filepath.Join(dir, "segment-00000000000000ff.state")
	if err := os.WriteFile(file, []byte("SLUICEST\x01not a state file at all"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := serve("damaged", dir); !strings.Contains(out, file) || !strings.Contains(out, "refused") {
		t.Fatalf("a daemon on a damaged state file said %q, want the file named and refused", out)
	}
	p := startProcess(t, bin, "set-aside", dir, "", "--bootstrap-expect", "1", "--data-damaged", "set-aside")
	testwait.ForTimeout(t, 60*time.Second, "the daemon that set the file aside to be ready", func() bool { return p.settled(1) })
	if _, err := os.Stat(file + ".damaged"); err != nil {
		t.Fatalf("the damaged file was not set aside: %v", err)
	}
}
