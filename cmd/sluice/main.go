// Command sluice is the sluice daemon, a distributed rate limiter for
// services in any language, and its command-line client.
//
//	sluice serve [flags]   run a node: gossip, gRPC API and HTTP/JSON API
//	sluice check [flags]   ask a running node for a decision over gRPC
//	sluice inspect [flags] print a key's state on its owner, over gRPC
//	sluice reset [flags]   reset a key to fresh on its owner, over gRPC
//	sluice ready [flags]   exit 0 when a node is ready (GET /readyz): a health check
//	sluice version         print the version, the commit and the Go version
//
// Run `sluice <command> -h` for the flags. serve also reads
// SLUICE_* environment variables and a YAML file (--config); see the
// internal/daemon package for the HTTP API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	// The zone database inside the binary: the image is the binary alone
	// (FROM scratch), and calendar windows name IANA zones. A host's own
	// database, where there is one, is still read first.
	_ "time/tzdata"

	"github.com/sluicehq/sluice/cmd/sluice/internal/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := &app{env: os.Getenv, stdout: os.Stdout, stderr: os.Stderr, setMemoryLimit: debug.SetMemoryLimit, setGCPercent: debug.SetGCPercent, setRedisLogger: setRedisLogger,
		buildInfo: debug.ReadBuildInfo}
	code := a.exitCode(a.run(ctx, os.Args[1:]))
	stop()
	os.Exit(code)
}

// app is the command with its environment, so that tests run it in-process.
type app struct {
	env    func(string) string
	stdout io.Writer
	stderr io.Writer
	// onReady, when set, is called by serve once the daemon serves (tests
	// read the bound addresses from it).
	onReady func(*daemon.Daemon)
	// setMemoryLimit sets the Go runtime's soft memory limit
	// (debug.SetMemoryLimit); nil leaves it alone (tests, which share
	// their process).
	setMemoryLimit func(int64) int64
	// setGCPercent sets the Go runtime's GOGC (debug.SetGCPercent); nil
	// leaves it alone (tests).
	setGCPercent func(int) int
	// setRedisLogger routes go-redis's logger, a global of the process,
	// into l (setRedisLogger); nil leaves it alone (tests).
	setRedisLogger func(l *slog.Logger)
	// daemonOptions are added to serve's daemon options (tests build the
	// node on cluster.TestConfig, whose gossip tolerates a starved
	// process).
	daemonOptions []daemon.Option
	// buildInfo returns the binary's build information
	// (debug.ReadBuildInfo); nil reports none.
	buildInfo func() (*debug.BuildInfo, bool)
}

// exitError carries a process exit code; err, if set, is printed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageError makes err exit with status 2.
func usageError(err error) error { return &exitError{code: 2, err: err} }

const usage = `Usage: sluice <command> [flags]

Commands:
  serve   run a sluice node (cluster member, gRPC API, HTTP/JSON API)
  check   ask a running node for a decision; exit 0 allowed, 1 limited, 2 error
  inspect print a key's state as its owner holds it; changes nothing
  reset   reset a key to fresh on its owner (destructive_behaviors applies)
  ready   exit 0 when a node is ready (its /readyz): a container health check
  version print the version, the commit it was built from and the Go version

Run "sluice <command> -h" for the flags of a command.
`

// run runs the command line args (without the program name) until ctx
// ends. ctx ending stops serve gracefully.
func (a *app) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return usageError(nil)
	}
	switch args[0] {
	case "serve":
		return a.serve(ctx, args[1:])
	case "check":
		return a.check(ctx, args[1:])
	case "inspect":
		return a.inspect(ctx, args[1:])
	case "reset":
		return a.reset(ctx, args[1:])
	case "ready":
		return a.ready(ctx, args[1:])
	case "version", "-version", "--version":
		fmt.Fprintln(a.stdout, a.version())
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(a.stdout, usage)
		return nil
	}
	fmt.Fprint(a.stderr, usage)
	return usageError(fmt.Errorf("unknown command %q", args[0]))
}

// serveGCPercent is the GOGC of `sluice serve` when it runs under a soft
// memory limit that it set itself.
const serveGCPercent = 400

func (a *app) serve(ctx context.Context, args []string) error {
	cfg, err := daemon.Load(args, a.env, a.stderr)
	var cerr *daemon.ConfigError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil
	case errors.As(err, &cerr):
		return usageError(err)
	case err != nil:
		return usageError(nil) // a flag error, printed by the flag package
	}
	// GOMEMLIMIT in the environment wins, as the Go runtime has read it.
	if limit := cfg.SoftMemoryLimit(); limit > 0 && a.setMemoryLimit != nil && a.env("GOMEMLIMIT") == "" {
		a.setMemoryLimit(limit)
		// Under that limit, the collector may let the heap grow to
		// serveGCPercent more than what is live, instead of Go's default
		// 100%, as long as it stays within the limit: checks allocate
		// short-lived memory, and collecting it four times less often
		// cut the server's CPU per check by a quarter. GOGC in the
		// environment wins.
		if a.setGCPercent != nil && a.env("GOGC") == "" {
			a.setGCPercent(serveGCPercent)
		}
	}
	if cfg.Backend == daemon.BackendRedis && a.setRedisLogger != nil {
		// go-redis logs failed dials on its own, as plain text: they go
		// into the daemon's log, in its format, instead.
		a.setRedisLogger(daemon.NewLogger(a.stderr, cfg.LogFormat, slog.LevelWarn).With("component", "redis"))
	}
	opts := []daemon.Option{daemon.WithLogOutput(a.stderr)}
	if a.onReady != nil {
		opts = append(opts, daemon.WithReady(a.onReady))
	}
	opts = append(opts, a.daemonOptions...)
	return daemon.Run(ctx, cfg, opts...)
}

// exitCode prints err, unless it is only an exit code, and returns the
// process's exit status.
func (a *app) exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(a.stderr, "sluice:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(a.stderr, "sluice:", err)
	return 1
}
