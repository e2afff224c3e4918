// Package testredis starts real redis-server processes for tests: a
// standalone server on a loopback port, with AUTH or TLS when asked, or a
// Redis Cluster of masters (and replicas) made by redis-cli --cluster
// create. Every process is killed when its test ends. Tests that need the
// binaries skip cleanly where they are absent.
package testredis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testwait"
)

// Server is a redis-server process a test started on a loopback port:
// standalone, or one node of a cluster.
type Server struct {
	t     testing.TB
	port  int
	dir   string
	extra []string // arguments after those every server gets
	tls   bool     // port is the TLS port; the plain one is off
	// opts are how the readiness probe connects: its password and TLS.
	opts redis.Options

	mu     sync.Mutex    // guards cmd and exited
	cmd    *exec.Cmd     // the running process, nil once killed
	exited chan struct{} // closed once cmd has exited
}

// NeedBinaries skips t unless the named programs are on PATH.
func NeedBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not found on PATH (Debian: apt-get install redis-server redis-tools)", n)
		}
	}
}

// FreePort returns a loopback port nothing listens on, below 55536 so that
// a cluster node's bus port (port+10000) exists too.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if port > 55535 {
			continue
		}
		if bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000)); err == nil {
			bus.Close()
			return port
		}
	}
	t.Fatal("no free loopback port pair found")
	return 0
}

// Start starts a redis-server with no persistence on a free loopback
// port, killed when t ends; extra are more of its arguments.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, redis.Options{}, extra...)
}

// StartWithPassword starts a redis-server as Start does that requires
// AUTH with password (requirepass, the default user's).
func StartWithPassword(t testing.TB, password string, extra ...string) *Server {
	t.Helper()
	return start(t, redis.Options{Password: password}, append([]string{"--requirepass", password}, extra...)...)
}

// StartTLS starts a redis-server as Start does that speaks TLS alone (no
// plain port), with the certificate and key files given, and verifies
// its clients' certificates against caFile when clientCerts is set. probe
// is how the readiness probe connects. It skips t when redis-server was
// built without TLS.
func StartTLS(t testing.TB, certFile, keyFile, caFile string, clientCerts bool, probe *tls.Config, extra ...string) *Server {
	t.Helper()
	NeedBinaries(t, "redis-server")
	// A build with TLS fails this on the missing key file; one without
	// fails it on the directive.
	out, _ := exec.Command("redis-server", "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent").CombinedOutput()
	if !strings.Contains(string(out), "tls-key-file") {
		t.Skipf("redis-server was built without TLS support: %s", out)
	}
	auth := "no"
	if clientCerts {
		auth = "yes"
	}
	args := append([]string{"--tls-port", "", "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", auth}, extra...)
	return start(t, redis.Options{TLSConfig: probe}, args...)
}

func start(t testing.TB, probe redis.Options, extra ...string) *Server {
	t.Helper()
	return startOn(t, FreePort, probe, extra...)
}

// startOn starts a server on a port ports returns. A port FreePort found
// free may be taken before redis-server binds it, by a server another test
// binary of the machine started there: then ours exits, and a probe that
// only pinged the port would take the other for ours (a test then counted
// on a stranger's keys). startOn knows its server by its process id and,
// when its port was taken, tries another.
func startOn(t testing.TB, ports func(testing.TB) int, probe redis.Options, extra ...string) *Server {
	t.Helper()
	NeedBinaries(t, "redis-server")
	s := &Server{t: t, dir: t.TempDir(), opts: probe, extra: extra, tls: probe.TLSConfig != nil}
	t.Cleanup(s.Kill)
	const attempts = 5
	for i := 1; ; i++ {
		s.port = ports(t)
		err := s.start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortTaken) || i == attempts {
			t.Fatal(err)
		}
		t.Logf("%v; trying another port", err)
	}
}

// errPortTaken is start's error when the server could not bind its port.
var errPortTaken = errors.New("testredis: port taken")

// args are the server's command line on its port.
func (s *Server) args() []string {
	port := strconv.Itoa(s.port)
	extra := slices.Clone(s.extra)
	if s.tls {
		for i := range extra {
			if extra[i] == "--tls-port" && i+1 < len(extra) && extra[i+1] == "" {
				extra[i+1] = port
			}
		}
		port = "0"
	}
	return append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", "redis.log"}, extra...)
}

// Addr is the server's address, 127.0.0.1:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// Dir is the server's working directory, which holds redis.log.
func (s *Server) Dir() string { return s.dir }

// start runs the process and waits until it answers PING.
func (s *Server) start() error {
	s.t.Helper()
	cmd := exec.Command("redis-server", s.args()...)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { // ends when the process does: Kill, or a failed start
		cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	o := s.opts
	o.Addr, o.MaxRetries, o.DialTimeout = s.Addr(), -1, time.Second
	c := redis.NewClient(&o)
	defer c.Close()
	pid := "process_id:" + strconv.Itoa(cmd.Process.Pid) + "\r\n"
	var exitedEarly bool
	err := testwait.Until(testwait.Timeout, func() error {
		select {
		case <-exited:
			exitedEarly = true
			return nil
		default:
		}
		info, err := c.Info(context.Background(), "server").Result()
		switch {
		case err != nil:
			return err
		case !strings.Contains(info, pid):
			return fmt.Errorf("another process answers on %s", s.Addr())
		}
		return nil
	})
	switch {
	case exitedEarly:
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.Kill()
		if strings.Contains(string(log), "Address already in use") {
			return fmt.Errorf("%w: %s", errPortTaken, s.Addr())
		}
		return fmt.Errorf("redis-server on %s exited:\n%s", s.Addr(), log)
	case err != nil:
		s.Kill()
		return fmt.Errorf("redis-server on %s: %w", s.Addr(), err)
	}
	return nil
}

// Kill ends the process at once (SIGKILL) and waits for it; a server
// already killed is left alone.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts a killed server again on its port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Cluster is a Redis Cluster of masters (and replicas) started by
// redis-cli --cluster create.
type Cluster struct {
	// Nodes are its servers, the masters first.
	Nodes []*Server
}

// StartCluster starts masters*(1+replicasEach) nodes and creates the
// cluster, waiting until every node reports cluster_state:ok.
func StartCluster(t testing.TB, masters, replicasEach int) *Cluster {
	t.Helper()
	NeedBinaries(t, "redis-server", "redis-cli")
	rc := &Cluster{}
	var addrs []string
	for range masters * (1 + replicasEach) {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
			"--cluster-require-full-coverage", "no")
		rc.Nodes = append(rc.Nodes, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasEach), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, s := range rc.Nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		testwait.For(t, "cluster_state:ok on "+s.Addr(), func() bool {
			info, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
		c.Close()
	}
	return rc
}

// Addrs are the addresses of the cluster's nodes.
func (rc *Cluster) Addrs() []string {
	var a []string
	for _, s := range rc.Nodes {
		a = append(a, s.Addr())
	}
	return a
}
