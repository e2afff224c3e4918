package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// daemon is a `sluice serve` child process on loopback ports it chose.
type daemon struct {
	*proc
	name                       string
	httpAddr, grpcAddr, gossip string
	log                        *logTail
	// tls is the client side of its TLS, nil when it serves in the clear;
	// web reaches its HTTP port.
	tls *tls.Config
	web *http.Client
}

// url is path on the daemon's HTTP port.
func (d *daemon) url(path string) string {
	if d.tls != nil {
		return "https://" + d.httpAddr + path
	}
	return "http://" + d.httpAddr + path
}

// Bounds on a daemon's start and stop.
const (
	startTimeout = 30 * time.Second
	stopGrace    = 15 * time.Second
)

// startDaemon starts the daemon named name with the flags args added to
// those that bind every port on 127.0.0.1, and waits until it reports
// ready. The daemon reads no SLUICE_* variable of this environment.
func startDaemon(ctx context.Context, c *config, name string, args ...string) (*daemon, error) {
	return startDaemonTLS(ctx, c, name, nil, args...)
}

// startDaemonTLS is startDaemon for a daemon whose args turn TLS on:
// clientTLS is the client side, for this program's calls to its ports.
func startDaemonTLS(ctx context.Context, c *config, name string, clientTLS *tls.Config, args ...string) (*daemon, error) {
	argv := append([]string{"serve",
		"--node-name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--log-format", "json", "--shutdown-timeout", "2s", "--leave-timeout", "2s",
		"--bootstrap-expect", "1",
	}, args...)
	cmd := exec.Command(c.sluice, argv...)
	cmd.Env = daemonEnv()
	tail := &logTail{copy: c.logs, started: make(chan startedLine, 1)}
	cmd.Stdout, cmd.Stderr = tail, tail
	p, err := startProc(cmd, "daemon", c.rssCap)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c.sluice, err)
	}
	d := &daemon{proc: p, name: name, log: tail, tls: clientTLS,
		web: &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS}}}
	fail := func(format string, a ...any) (*daemon, error) {
		d.stop(stopGrace)
		return nil, fmt.Errorf("daemon %s: %s; its log ends:\n%s", name, fmt.Sprintf(format, a...), tail.last())
	}
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case s := <-tail.started:
		d.httpAddr, d.grpcAddr, d.gossip = s.HTTP, s.GRPC, s.Gossip
	case <-p.exited:
		return fail("exited at start (%v)", p.cmd.ProcessState)
	case <-t.C:
		return fail("did not start within %v", startTimeout)
	case <-ctx.Done():
		return fail("%v", ctx.Err())
	}
	if err := d.waitReady(ctx, time.Now().Add(startTimeout), 1); err != nil {
		return fail("%v", err)
	}
	return d, nil
}

// daemonEnv is this program's environment without its SLUICE_* variables,
// for a daemon that must read only its flags.
func daemonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

// startJoined starts a second daemon, named name, with args, that joins
// first, and waits until both are ready with two members.
func startJoined(ctx context.Context, c *config, first *daemon, name string, args ...string) (*daemon, error) {
	second, err := startDaemonTLS(ctx, c, name, first.tls, append(slices.Clone(args), "--join", first.gossip)...)
	if err != nil {
		return nil, err
	}
	for _, d := range []*daemon{first, second} {
		if err := d.waitReady(ctx, time.Now().Add(startTimeout), 2); err != nil {
			second.stop(stopGrace)
			return nil, fmt.Errorf("daemon %s: %w", d.name, err)
		}
	}
	return second, nil
}

// startPair starts two daemons with args (clientTLS as in startDaemonTLS), named prefix-a and prefix-b, the
// second joined to the first, and waits until both are ready with two
// members.
func startPair(ctx context.Context, c *config, prefix string, clientTLS *tls.Config, args ...string) (a, b *daemon, err error) {
	if a, err = startDaemonTLS(ctx, c, prefix+"-a", clientTLS, args...); err != nil {
		return nil, nil, err
	}
	if b, err = startJoined(ctx, c, a, prefix+"-b", args...); err != nil {
		a.stop(stopGrace)
		return nil, nil, err
	}
	return a, b, nil
}

// waitReady polls /readyz until the daemon is ready with at least members
// cluster members, or fails at until.
func (d *daemon) waitReady(ctx context.Context, until time.Time, members int) error {
	var last string
	for time.Now().Before(until) && ctx.Err() == nil {
		res, err := d.web.Get(d.url("/readyz"))
		if err == nil {
			var body struct {
				Members int `json:"members"`
			}
			err = json.NewDecoder(io.LimitReader(res.Body, 1<<16)).Decode(&body)
			res.Body.Close()
			if err == nil && res.StatusCode == http.StatusOK && body.Members >= members {
				return nil
			}
			last = fmt.Sprintf("HTTP %d with %d members", res.StatusCode, body.Members)
		} else {
			last = err.Error()
		}
		select {
		case <-d.exited:
			return fmt.Errorf("exited while starting (%v)", d.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready with %d members in time: %s", members, last)
}

// dial returns a client connection to the daemon's gRPC port.
func (d *daemon) dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if d.tls != nil {
		return grpc.NewClient(d.grpcAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(d.tls))}, opts...)...)
	}
	return dial(d.grpcAddr, opts...)
}

func dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient(addr, opts...)
}

// startedLine is the daemon's log line that says where it listens.
type startedLine struct {
	Msg    string `json:"msg"`
	HTTP   string `json:"http"`
	GRPC   string `json:"grpc"`
	Gossip string `json:"gossip"`
}

// logTail takes a daemon's log: it copies it, keeps its last lines, and
// sends the line that says where the daemon listens on started.
type logTail struct {
	copy    io.Writer
	started chan startedLine // buffered, of one

	mu      sync.Mutex // guards partial, lines and sent
	partial []byte
	lines   []string
	sent    bool
}

const tailLines = 20

func (l *logTail) Write(b []byte) (int, error) {
	l.copy.Write(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	rest := l.partial
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		l.line(rest[:i])
		rest = rest[i+1:]
	}
	if len(rest) > 1<<20 { // a line this long is no log line
		rest = nil
	}
	l.partial = append(l.partial[:0], rest...)
	return len(b), nil
}

// line takes one complete line; l.mu must be held.
func (l *logTail) line(b []byte) {
	if len(l.lines) == tailLines {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, string(b))
	if l.sent || !bytes.Contains(b, []byte(`"sluice: daemon started"`)) {
		return
	}
	var s startedLine
	if json.Unmarshal(b, &s) == nil && s.HTTP != "" && s.GRPC != "" {
		l.sent = true
		l.started <- s
	}
}

// last returns the last lines of the log.
func (l *logTail) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
