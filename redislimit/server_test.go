package redislimit

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testwait"
)

// redisServer is a redis-server process this test started on a loopback
// port: standalone, or one node of a cluster.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	args []string

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd
}

// needBinaries skips t unless the named programs are on PATH.
func needBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not found on PATH (Debian: apt-get install redis-server redis-tools)", n)
		}
	}
}

// freePort returns a loopback port nothing listens on, below 55536 so that
// a cluster node's bus port (port+10000) exists too.
func freePort(t testing.TB) int {
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

// startRedis starts a redis-server with no persistence on a free loopback
// port, stopped when t ends; extra are more of its arguments.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	needBinaries(t, "redis-server")
	s := &redisServer{t: t, port: freePort(t), dir: t.TempDir()}
	s.args = append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", "redis.log"}, extra...)
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// start runs the process and waits until it answers PING.
func (s *redisServer) start() {
	s.t.Helper()
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redis-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	testwait.For(s.t, "redis-server on "+s.addr()+" answering PING", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

// kill ends the process at once (SIGKILL) and waits for it; a server
// already killed is left alone.
func (s *redisServer) kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// restart starts a killed server again on its port, empty.
func (s *redisServer) restart() {
	s.t.Helper()
	s.start()
}

// redisCluster is a Redis Cluster of masters (and replicas) started by
// redis-cli --cluster create.
type redisCluster struct {
	nodes []*redisServer
}

// startCluster starts masters*(1+replicasEach) nodes and creates the
// cluster, waiting until every node reports cluster_state:ok.
func startCluster(t testing.TB, masters, replicasEach int) *redisCluster {
	t.Helper()
	needBinaries(t, "redis-server", "redis-cli")
	rc := &redisCluster{}
	var addrs []string
	for range masters * (1 + replicasEach) {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
			"--cluster-require-full-coverage", "no")
		rc.nodes = append(rc.nodes, s)
		addrs = append(addrs, s.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasEach), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, s := range rc.nodes {
		c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
		testwait.For(t, "cluster_state:ok on "+s.addr(), func() bool {
			info, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
		c.Close()
	}
	return rc
}

func (rc *redisCluster) addrs() []string {
	var a []string
	for _, s := range rc.nodes {
		a = append(a, s.addr())
	}
	return a
}
