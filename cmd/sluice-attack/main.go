// Command sluice-attack runs hostile workloads against real sluice daemons
// and measures what they cost. Each attack gets a fresh `sluice serve`
// child process (two for frozen-owner, public-flood and the rogue-member
// attacks) and, unless it says otherwise, 16 concurrent attackers;
// meanwhile a legitimate client checks a key of its own, one check at a
// time, each with a deadline. The program prints a
// markdown table for the README's Security section: per attack, what the
// attackers did, what they got, the daemon's peak resident memory (VmHWM of
// /proc/<pid>/status, and the child's rusage) and the legitimate client's
// checks answered and worst latency. It exits 1 when a target is missed:
// a peak RSS of 300 MB or more, a legitimate check not answered within its
// deadline, or an attack that got what it should have been refused.
//
//	go build -o /tmp/sluice ./cmd/sluice
//	go run ./cmd/sluice-attack -sluice /tmp/sluice
//	go run ./cmd/sluice-attack -attacks reset,http-body -scale 0.01 -duration 2s
//
// Without -sluice the daemon is built with `go build` into a temporary
// directory (run from the module). -scale multiplies every count (keys,
// connections, items, calls) and -duration bounds each attack's hostile
// phase; -attacks selects attacks by name (see -h for the list). A daemon
// whose RSS passes -rss-cap is killed, so that one attack cannot take the
// machine; its row then says so.
//
// yaml-alias-bomb also starts three daemons that must refuse to start (a
// YAML alias bomb as each of their three YAML files) and measures them.
// spoofed-forwarded is not a daemon attack: it sends spoofed forwarding
// headers to an httplimit middleware served by this process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is the command line, shared by every attack.
type config struct {
	sluice      string // the daemon's binary
	scale       float64
	duration    time.Duration // each attack's hostile phase
	attackers   int
	deadline    time.Duration // of each legitimate check
	rssTarget   int64         // bytes: a peak at or above it misses the target
	rssCap      int64         // bytes: a process above it is killed
	peerTimeout time.Duration // frozen-owner's --peer-timeout
	tmp         string        // a directory for files the attacks write
	logs        io.Writer     // the daemons' logs
	progress    io.Writer
}

// count scales n, keeping at least 1.
func (c *config) count(n int) int { return max(int(float64(n)*c.scale), 1) }

// attack is one hostile workload. run returns the attack's row; an error
// means the attack could not be run at all (a daemon that did not start).
type attack struct {
	name string
	run  func(ctx context.Context, c *config) (*row, error)
}

// attacks lists every attack, in the order they run.
var attacks = []attack{
	{"peer-transfer", peerTransfer},
	{"rogue-member", rogueMember},
	{"rogue-member-mtls", rogueMemberTLS},
	{"reset", resetAttack},
	{"lower-count", lowerCount},
	{"lower-by-rate", lowerByRate},
	{"decode-amplification", decodeAmplification},
	{"idle-connections", idleConnections},
	{"idle-connection-cap", idleCap},
	{"key-flood", keyFlood},
	{"sliding-log", slidingLog},
	{"http-body", httpBody},
	{"http-partial-body", httpPartial},
	{"grpc-partial-message", grpcPartial},
	{"metric-cardinality", metricCardinality},
	{"slowloris", slowloris},
	{"frozen-owner", frozenOwner},
	{"public-flood", publicFlood},
	{"yaml-alias-bomb", yamlAliasBomb},
	{"spoofed-forwarded", spoofedForwarded},
}

func attackNames() []string {
	names := make([]string, len(attacks))
	for i, a := range attacks {
		names[i] = a.name
	}
	return names
}

// run runs the command line args and returns the exit status: 0 when every
// target is met, 1 when one is missed or an attack could not run, 2 for a
// usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice-attack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{logs: io.Discard, progress: stderr}
	fs.StringVar(&c.sluice, "sluice", "", "the sluice daemon's binary (default: go build ./cmd/sluice into a temporary directory)")
	only := fs.String("attacks", "", "comma-separated attacks to run (default all): "+strings.Join(attackNames(), ", "))
	fs.Float64Var(&c.scale, "scale", 1, "multiplies every count (keys, connections, items, calls), in (0, 1]")
	fs.DurationVar(&c.duration, "duration", 15*time.Second, "bound on each attack's hostile phase")
	fs.IntVar(&c.attackers, "attackers", 16, "concurrent attackers per attack")
	fs.DurationVar(&c.deadline, "deadline", 2*time.Second, "deadline of each legitimate check (frozen-owner: twice -peer-timeout)")
	fs.DurationVar(&c.peerTimeout, "peer-timeout", 500*time.Millisecond, "frozen-owner: the daemons' --peer-timeout")
	targetMB := fs.Int64("rss-target", 300, "target: every daemon's peak RSS below this many MB")
	capMB := fs.Int64("rss-cap", 2048, "kill a daemon (or child) whose RSS passes this many MB")
	verbose := fs.Bool("v", false, "copy the daemons' logs to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	selected, err := selectAttacks(*only)
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "sluice-attack:", err)
		return 2
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "sluice-attack: unexpected argument %q\n", fs.Arg(0))
		return 2
	case c.scale <= 0 || c.scale > 1 || c.duration <= 0 || c.attackers < 1 || c.deadline <= 0 || c.peerTimeout <= 0 || *targetMB < 1 || *capMB <= *targetMB:
		fmt.Fprintln(stderr, "sluice-attack: -scale must be in (0, 1], -duration, -attackers, -deadline, -peer-timeout and -rss-target positive, -rss-cap above -rss-target")
		return 2
	}
	c.rssTarget, c.rssCap = *targetMB*megabyte, *capMB*megabyte
	if *verbose {
		c.logs = stderr
	}
	if c.tmp, err = os.MkdirTemp("", "sluice-attack-"); err != nil {
		fmt.Fprintln(stderr, "sluice-attack:", err)
		return 1
	}
	defer os.RemoveAll(c.tmp)
	if c.sluice == "" {
		if c.sluice, err = buildDaemon(ctx, c.tmp); err != nil {
			fmt.Fprintln(stderr, "sluice-attack:", err)
			return 1
		}
	}

	fmt.Fprintf(stdout, "%d attackers per attack, hostile phases of at most %v, scale %g, GOMAXPROCS %d; targets: peak RSS below %d MB, every legitimate check answered within %v (frozen-owner: %v).\n\n",
		c.attackers, c.duration, c.scale, runtime.GOMAXPROCS(0), *targetMB, c.deadline, 2*c.peerTimeout)
	var rows []*row
	for _, a := range selected {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(c.progress, "sluice-attack: %s...\n", a.name)
		began := time.Now()
		r, err := a.run(ctx, c)
		if err != nil {
			r = &row{result: "could not run: " + err.Error()}
			r.miss("the attack did not run")
		}
		r.attack = a.name
		rows = append(rows, r)
		fmt.Fprintf(c.progress, "sluice-attack: %s done in %v: %s\n", a.name, time.Since(began).Round(time.Millisecond), r.verdict())
	}
	writeTable(stdout, rows, c)
	missed := 0
	for _, r := range rows {
		if len(r.misses) > 0 {
			missed++
		}
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(stdout, "\nInterrupted.")
		return 1
	case missed > 0:
		fmt.Fprintf(stdout, "\n%d of %d attacks missed a target.\n", missed, len(rows))
		return 1
	}
	fmt.Fprintf(stdout, "\nEvery target met (%d attacks).\n", len(rows))
	return 0
}

// selectAttacks returns the attacks named in the comma-separated list, in
// their running order; an empty list selects all.
func selectAttacks(list string) ([]attack, error) {
	if list == "" {
		return attacks, nil
	}
	want := strings.Split(list, ",")
	for i, w := range want {
		want[i] = strings.TrimSpace(w)
		if !slices.Contains(attackNames(), want[i]) {
			return nil, fmt.Errorf("unknown attack %q: want %s", want[i], strings.Join(attackNames(), ", "))
		}
	}
	var out []attack
	for _, a := range attacks {
		if slices.Contains(want, a.name) {
			out = append(out, a)
		}
	}
	return out, nil
}

// buildDaemon builds ./cmd/sluice of the module the working directory is
// in, into dir, and returns the binary's path.
func buildDaemon(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "sluice")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of the daemon (or pass -sluice): %v\n%s", err, out)
	}
	return bin, nil
}
