package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cmd/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/leakcheck"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// served is a `sluice serve` running in this process.
type served struct {
	*daemon.Daemon
	cancel context.CancelFunc // stops it gracefully
	done   chan error         // receives run's result
	logs   *syncBuffer
	base   string // http://host:port
}

// serve runs `sluice serve` with args after the loopback defaults, and
// stops it when the test ends. Part of the configuration comes from the
// environment, to run that path too.
func serve(t *testing.T, name string, args ...string) *served {
	t.Helper()
	env := map[string]string{
		"SLUICE_NODE_NAME":      name,
		"SLUICE_GOSSIP_PROFILE": "fast",
		"SLUICE_LOG_FORMAT":     "text",
		// Flags override these (a flag given twice is a list).
		"SLUICE_GOSSIP_ADDR":      "127.0.0.1:0",
		"SLUICE_BOOTSTRAP_EXPECT": "1", // ready alone when it joins no one
	}
	all := append([]string{"serve",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--retry-join-interval", "100ms", "--log-level", "warn"}, args...)
	return serveWith(t, env, all)
}

// serveExactly runs the command line args, with no environment, and stops
// it when the test ends.
func serveExactly(t *testing.T, args ...string) *served {
	t.Helper()
	return serveWith(t, nil, args)
}

func serveWith(t *testing.T, env map[string]string, args []string) *served {
	t.Helper()
	return serveApp(t, &app{env: envMap(env)}, args)
}

// serveApp runs a with args, its output and onReady set, and stops it
// when the test ends.
func serveApp(t *testing.T, a *app, args []string) *served {
	t.Helper()
	ready := make(chan *daemon.Daemon, 1)
	s := &served{done: make(chan error, 1), logs: new(syncBuffer)}
	a.stdout, a.stderr = io.Discard, s.logs
	// The daemons of a test share a process that -race and other test
	// binaries starve of CPU: DefaultConfig's fast gossip suspects a
	// member whose probe is not answered within 100ms, and the ring and
	// the routing of keys change under the test (checks were decided
	// without their owner). TestConfig's gossip waits longer.
	a.daemonOptions = append(a.daemonOptions, daemon.WithClusterBase(cluster.TestConfig))
	a.onReady = func(d *daemon.Daemon) { ready <- d }
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- a.run(ctx, args) }()
	select {
	case s.Daemon = <-ready:
	case err := <-s.done:
		cancel()
		t.Fatalf("%v: %v\n%s", args, err, s.logs)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("%v did not start", args)
	}
	s.base = "http://" + s.HTTPAddr()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// stop stops s gracefully and returns run's result.
func (s *served) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
		return nil
	}
}

// probe is an HTTP client that opens a new connection per request.
var probe = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := probe.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape returns every sample of base's /metrics by series.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	status, body := httpGet(t, base+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d", status)
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestThreeDaemonsShareOneLimit runs three daemons that form a cluster
// through serf, spreads 100 checks of one limit of 30 over them, half over
// HTTP/JSON and half over gRPC, and expects exactly 30 admitted; then one
// daemon leaves gracefully and the others see it go.
func TestThreeDaemonsShareOneLimit(t *testing.T) {
	// A generous peer timeout: under -race on a loaded machine the first
	// forwarded batch, which dials, can take more than the default second,
	// and this test is about exactness, not timing.
	slow := []string{"--peer-timeout", "20s"}
	nodes := []*served{serve(t, "e2e-0", slow...)}
	nodes = append(nodes, serve(t, "e2e-1", append(slow, "--join", nodes[0].GossipAddr())...))
	nodes = append(nodes, serve(t, "e2e-2", append(slow, "--join", nodes[0].GossipAddr())...))
	for _, n := range nodes {
		// Routing to 3 is not enough: until a node has the hand-over
		// confirmation of every member, checks of keys that moved wait for
		// it (up to cluster.Config.HandoverTimeout, 5s) and then go without their owner.
		testwait.ForTimeout(t, 20*time.Second, n.Config().NodeName+" to route to 3 members, confirmed", func() bool {
			return len(n.Node().RingMembers()) == 3 && len(n.Node().Unconfirmed()) == 0
		})
		testwait.ForTimeout(t, 20*time.Second, n.Config().NodeName+" to be ready", func() bool { s, _ := httpGet(t, n.base+"/readyz"); return s == http.StatusOK })
	}
	clients := make([]*client.Client, len(nodes))
	for i, n := range nodes {
		// As the peer timeout: a check waits for its forward, and this
		// test is about exactness, not timing.
		c, err := client.New(n.GRPCAddr(), client.WithTimeout(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}

	const sent, limit = 100, 30
	req := limiter.Request{Name: "shared", Key: "tenant:1", Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: limiter.TokenBucket}
	body := fmt.Sprintf(`{"name":%q,"key":%q,"limit":%d,"period":"24h","algorithm":"token_bucket"}`, req.Name, req.Key, req.Limit)
	type outcome struct {
		allowed      bool
		owner        string
		withoutOwner bool
		err          error
	}
	// Concurrent requests make the transport dial connections it may not
	// use; a server's graceful shutdown waits up to 5s for such unused
	// connections, so the test closes them once done.
	// As the gRPC clients, it waits as long as a forward may take.
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}
	outcomes := make([]outcome, sent)
	httpSent := make([]int, len(nodes))
	var wg sync.WaitGroup
	for i := range sent {
		n := i % len(nodes)
		if i%2 == 0 {
			httpSent[n]++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				d, err := clients[n].Check(context.Background(), req)
				outcomes[i] = outcome{d.Allowed, d.Owner, d.WithoutOwner, err}
				return
			}
			resp, err := hc.Post(nodes[n].base+"/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				outcomes[i].err = err
				return
			}
			defer resp.Body.Close()
			var d daemon.Decision
			if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK {
				outcomes[i].err = fmt.Errorf("HTTP %d: %v", resp.StatusCode, err)
				return
			}
			outcomes[i] = outcome{d.Allowed, d.Owner, d.WithoutOwner, nil}
		}()
	}
	wg.Wait()
	hc.CloseIdleConnections()
	admitted := 0
	owners := make(map[string]int)
	for i, o := range outcomes {
		if o.err != nil {
			t.Fatalf("check %d: %v", i, o.err)
		}
		if o.withoutOwner {
			t.Errorf("check %d was decided without its owner", i)
		}
		owners[o.owner]++
		if o.allowed {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("%d of %d checks admitted, want exactly %d", admitted, sent, limit)
	}
	if len(owners) != 1 {
		t.Errorf("decided by %v, want one owner", owners)
	}
	if t.Failed() {
		for _, n := range nodes {
			t.Logf("%s logs:\n%s", n.Config().NodeName, n.logs)
		}
	}

	// Every daemon counted the HTTP checks it received; the node metrics on
	// the same registries count every check once, where it was received.
	var nodeAllowed, nodeLimited float64
	for i, n := range nodes {
		m := scrape(t, n.base)
		if got := m[`sluice_http_requests_total{code="200",endpoint="/v1/check"}`]; got != float64(httpSent[i]) {
			t.Errorf("node %d: sluice_http_requests_total for /v1/check = %v, want %d", i, got, httpSent[i])
		}
		nodeAllowed += m[`sluice_checks_total{algorithm="token_bucket",name="shared",result="allowed"}`]
		nodeLimited += m[`sluice_checks_total{algorithm="token_bucket",name="shared",result="limited"}`]
		if m[`sluice_members`] != 3 {
			t.Errorf("node %d: sluice_members = %v", i, m[`sluice_members`])
		}
	}
	if nodeAllowed != limit || nodeLimited != sent-limit {
		t.Errorf("sluice_checks_total: %v allowed, %v limited; want %d and %d", nodeAllowed, nodeLimited, limit, sent-limit)
	}

	// The seed leaves gracefully; the others see it leave and stay ready.
	if err := nodes[0].stop(t); err != nil {
		t.Fatalf("serve e2e-0 returned %v\n%s", err, nodes[0].logs)
	}
	for i, n := range nodes[1:] {
		c := clients[i+1]
		testwait.ForTimeout(t, 20*time.Second, n.Config().NodeName+" to see e2e-0 leave", func() bool {
			h, err := c.Health(context.Background())
			if err != nil || h.Members != 2 {
				return false
			}
			for _, m := range n.Node().Members() {
				if m.Name == "e2e-0" {
					return m.Status == "left"
				}
			}
			return true // already reaped
		})
		if s, body := httpGet(t, n.base+"/readyz"); s != http.StatusOK || !strings.Contains(body, `"members":2`) {
			t.Errorf("%s /readyz after e2e-0 left: %d %s", n.Config().NodeName, s, body)
		}
		// Checks still work, decided by one of the two left.
		d, err := c.Check(context.Background(), limiter.Request{Name: "after", Key: "k", Hits: 1, Limit: 1, Period: time.Hour, Algorithm: limiter.GCRA})
		if err != nil || d.WithoutOwner || d.Owner == "e2e-0" {
			t.Errorf("%s: check after the leave: %+v %v", n.Config().NodeName, d, err)
		}
	}
	// memberlist logs at ERROR what a loaded machine makes of its probes
	// (a ping's timeout, a packet to a closed connection): gossip retries
	// them; serf's lines come through the same writer. Any other error is
	// sluice's own.
	for _, line := range strings.Split(nodes[0].logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && !strings.Contains(line, `msg="memberlist: `) && !strings.Contains(line, `msg="serf: `) {
			t.Errorf("e2e-0 logged an error: %s", line)
		}
	}
}

// runCheck runs `sluice check` with args and returns its exit code and
// output.
func runCheck(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	return runCommand(t, env, append([]string{"check"}, args...)...)
}

// runCommand runs `sluice` with args and returns its exit code and output.
func runCommand(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	a := &app{env: envMap(env), stdout: &stdout, stderr: &stderr}
	code := a.exitCode(a.run(context.Background(), args))
	return code, stdout.String(), stderr.String()
}

func TestCheckCommand(t *testing.T) {
	s := serve(t, "cli")
	addr := s.GRPCAddr()
	base := []string{"--addr", addr, "--name", "cli", "--key", "user:1", "--limit", "2", "--period", "1h"}
	steps := []struct {
		name       string
		env        map[string]string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "allowed", args: base, wantCode: 0, wantStdout: "allowed limit=2 remaining=1"},
		{name: "peek", args: append(base, "--hits", "0"), wantCode: 0, wantStdout: "allowed limit=2 remaining=1"},
		{name: "json", args: append(base, "--json"), wantCode: 0, wantStdout: `"remaining":0`},
		{name: "limited", args: base, wantCode: 1, wantStdout: "limited limit=2 remaining=0"},
		{name: "limited shows retry_after", args: append(base, "--unreachable", "deny"), wantCode: 1, wantStdout: "retry_after="},
		{name: "address from the environment", env: map[string]string{"SLUICE_ADDR": addr},
			args: []string{"--name", "cli", "--key", "env", "--limit", "1", "--period", "1m", "--algorithm", "gcra"}, wantCode: 0, wantStdout: "owner=cli"},
		{name: "invalid limit", args: []string{"--addr", addr, "--name", "n", "--key", "k", "--limit", "0", "--period", "1m"}, wantCode: 2, wantStderr: "Limit"},
		{name: "hits over the limit", args: append(base, "--hits", "3"), wantCode: 2, wantStderr: "Hits"},
		{name: "unknown algorithm", args: append(base, "--algorithm", "random"), wantCode: 2, wantStderr: "--algorithm"},
		{name: "unknown policy", args: append(base, "--unreachable", "maybe"), wantCode: 2, wantStderr: "--unreachable"},
		{name: "missing name", args: []string{"--addr", addr, "--key", "k", "--limit", "1"}, wantCode: 2, wantStderr: "--name is required"},
		{name: "bad flag", args: append(base, "--limit", "ten"), wantCode: 2, wantStderr: "invalid value"},
		{name: "nobody there", args: []string{"--addr", "127.0.0.1:1", "--name", "n", "--key", "k", "--limit", "1", "--period", "1m", "--timeout", "2s"}, wantCode: 2, wantStderr: "check:"},
		{name: "help", args: []string{"-h"}, wantCode: 0, wantStderr: "Exit status: 0 allowed, 1 limited, 2 error"},
	}
	for _, st := range steps {
		code, stdout, stderr := runCheck(t, st.env, st.args...)
		if code != st.wantCode || !strings.Contains(stdout, st.wantStdout) || !strings.Contains(stderr, st.wantStderr) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				st.name, code, stdout, stderr, st.wantCode, st.wantStdout, st.wantStderr)
		}
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantCode   int
		wantStderr string
		wantStdout string
	}{
		{name: "no command", wantCode: 2, wantStderr: "Usage: sluice"},
		{name: "unknown command", args: []string{"serv"}, wantCode: 2, wantStderr: `unknown command "serv"`},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: "Commands:"},
		{name: "serve help", args: []string{"serve", "-h"}, wantCode: 0, wantStderr: "SLUICE_JOIN"},
		{name: "serve with an unknown flag", args: []string{"serve", "--nope"}, wantCode: 2, wantStderr: "flag provided but not defined: -nope"},
		{name: "serve with a bad flag", args: []string{"serve", "--unreachable", "perhaps"}, wantCode: 2, wantStderr: "flag --unreachable: unreachable:"},
		{name: "serve with a bad env", args: []string{"serve"}, env: map[string]string{"SLUICE_HTTP_ADDR": "8080"}, wantCode: 2, wantStderr: "env SLUICE_HTTP_ADDR: http_addr:"},
		{name: "serve on an address it cannot bind", args: []string{"serve", "--node-name", "x", "--http-addr", "256.0.0.1:1", "--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, wantCode: 1, wantStderr: "http_addr"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		a := &app{env: envMap(tt.env), stdout: &stdout, stderr: &stderr}
		code := a.exitCode(a.run(context.Background(), tt.args))
		if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantStderr) || !strings.Contains(stdout.String(), tt.wantStdout) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.name, code, stdout.String(), stderr.String(), tt.wantCode, tt.wantStdout, tt.wantStderr)
		}
	}
}

func TestCheckCommandMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "sluice test CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	nodeCert, nodeKey := testpki.WriteCert(t, dir, "node", ca.Issue(t, "node"))
	cliCert, cliKey := testpki.WriteCert(t, dir, "cli", ca.Issue(t, "cli"))
	s := serve(t, "tls", "--tls-cert-file", nodeCert, "--tls-key-file", nodeKey, "--tls-ca-file", caFile)
	base := []string{"--addr", s.GRPCAddr(), "--name", "cli", "--key", "k", "--limit", "5", "--period", "1h", "--timeout", "3s"}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOutput string
	}{
		{"client certificate", append(base, "--tls-cert", cliCert, "--tls-key", cliKey, "--tls-ca", caFile), 0, "allowed"},
		{"no client certificate", append(base, "--tls-ca", caFile), 2, "check:"},
		{"plain text", base, 2, "check:"},
		{"cert without key", append(base, "--tls-cert", cliCert), 2, "--tls-key"},
		{"ca file missing", append(base, "--tls-ca", dir+"/none.pem"), 2, "--tls-ca"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCheck(t, nil, tt.args...)
		if code != tt.wantCode || !strings.Contains(stdout+stderr, tt.wantOutput) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", tt.name, code, stdout, stderr, tt.wantCode, tt.wantOutput)
		}
	}
}

// TestInspectAndResetCommands runs `sluice inspect` and `sluice reset`
// against a daemon: the state a check left, the same twice, as JSON, then
// fresh after a reset; and a daemon that denies destructive behaviors
// refuses the reset but not the inspection.
func TestInspectAndResetCommands(t *testing.T) {
	s := serve(t, "admin-cli")
	addr := s.GRPCAddr()
	key := []string{"--addr", addr, "--name", "cli", "--key", "user:1"}
	if code, _, stderr := runCheck(t, nil, append(key, "--limit", "5", "--period", "1h", "--algorithm", "fixed_window", "--hits", "3")...); code != 0 {
		t.Fatalf("check: exit %d: %s", code, stderr)
	}
	steps := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"inspect", append([]string{"inspect"}, key...), 0, "fixed_window window_start=", ""},
		{"inspect shows the hits", append([]string{"inspect"}, key...), 0, "window_hits=3 expire_at=", ""},
		{"inspect names the owner", append([]string{"inspect"}, key...), 0, "owner=admin-cli replicas=", ""},
		{"inspect as JSON", append([]string{"inspect", "--json"}, key...), 0, `"window_hits":3`, ""},
		{"inspect a fresh key", []string{"inspect", "--addr", addr, "--name", "cli", "--key", "nobody"}, 0, "fresh owner=admin-cli", ""},
		{"inspect without a key", []string{"inspect", "--addr", addr, "--name", "cli"}, 2, "", "inspect: --key is required"},
		{"inspect an invalid name", []string{"inspect", "--addr", addr, "--name", strings.Repeat("n", limiter.MaxNameLen+1), "--key", "k"}, 2, "", "Name is 129 bytes"},
		{"inspect help", []string{"inspect", "-h"}, 0, "", "Changes nothing"},
		{"reset", append([]string{"reset"}, key...), 0, "reset owner=admin-cli", ""},
		{"fresh after the reset", append([]string{"inspect"}, key...), 0, "fresh owner=admin-cli", ""},
		{"reset without a name", []string{"reset", "--addr", addr, "--key", "k"}, 2, "", "reset: --name is required"},
		{"reset help", []string{"reset", "-h"}, 0, "", "destructive_behaviors"},
	}
	for _, st := range steps {
		code, stdout, stderr := runCommand(t, nil, st.args...)
		if code != st.wantCode || !strings.Contains(stdout, st.wantStdout) || !strings.Contains(stderr, st.wantStderr) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				st.name, code, stdout, stderr, st.wantCode, st.wantStdout, st.wantStderr)
		}
	}
	// The state is the same when inspected twice.
	_, first, _ := runCommand(t, nil, "inspect", "--json", "--addr", addr, "--name", "cli", "--key", "user:1")
	_, second, _ := runCommand(t, nil, "inspect", "--json", "--addr", addr, "--name", "cli", "--key", "user:1")
	drop := func(s string) string { return s[:max(strings.Index(s, `"read_at"`), 0)] }
	if drop(first) != drop(second) {
		t.Errorf("inspected twice: %s then %s", first, second)
	}

	denied := serve(t, "admin-cli-deny", "--destructive-behaviors", "deny")
	code, _, stderr := runCommand(t, nil, "reset", "--addr", denied.GRPCAddr(), "--name", "cli", "--key", "k")
	if code != 2 || !strings.Contains(stderr, "PermissionDenied") || !strings.Contains(stderr, "destructive_behaviors") {
		t.Errorf("reset under deny: exit %d, stderr %q; want 2 and PermissionDenied naming destructive_behaviors", code, stderr)
	}
	if code, stdout, stderr := runCommand(t, nil, "inspect", "--addr", denied.GRPCAddr(), "--name", "cli", "--key", "k"); code != 0 || !strings.Contains(stdout, "fresh") {
		t.Errorf("inspect under deny: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// With peer_addr, the commands dial grpc_addr, where the public API is:
// check, inspect and reset are served there, and refused on peer_addr,
// which serves the peers alone.
func TestCommandsDialGRPCAddr(t *testing.T) {
	s := serve(t, "peer-port", "--peer-addr", "127.0.0.1:0")
	if s.GRPCAddr() == s.PeerAddr() {
		t.Fatalf("grpc_addr and peer_addr are both %s", s.GRPCAddr())
	}
	key := []string{"--name", "cli", "--key", "k", "--timeout", "3s"}
	for _, tc := range []struct {
		addr     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{s.GRPCAddr(), append([]string{"check", "--limit", "5", "--period", "1h"}, key...), 0, "allowed"},
		{s.GRPCAddr(), append([]string{"inspect"}, key...), 0, "owner=peer-port"},
		{s.GRPCAddr(), append([]string{"reset"}, key...), 0, "reset owner=peer-port"},
		{s.PeerAddr(), append([]string{"check", "--limit", "5", "--period", "1h"}, key...), 2, "Unimplemented"},
		{s.PeerAddr(), append([]string{"inspect"}, key...), 2, "Unimplemented"},
	} {
		code, stdout, stderr := runCommand(t, nil, append(tc.args, "--addr", tc.addr)...)
		if code != tc.wantCode || !strings.Contains(stdout+stderr, tc.wantOut) {
			t.Errorf("%v on %s: exit %d, stdout %q, stderr %q; want exit %d with %q", tc.args, tc.addr, code, stdout, stderr, tc.wantCode, tc.wantOut)
		}
	}
}

// httpAllowed posts one check of key (a daily limit of 1) to base and
// reports whether it was admitted.
func httpAllowed(t *testing.T, base, key string) bool {
	t.Helper()
	body := fmt.Sprintf(`{"name":"quick","key":%q,"limit":1,"period":"24h","algorithm":"fixed_window","unreachable":"deny"}`, key)
	resp, err := probe.Post(base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("check %s on %s: %d %s", key, base, resp.StatusCode, b)
	}
	return strings.Contains(string(b), `"allowed":true`)
}

// TestQuickStartRestartDoesNotSplit follows the quick start: three
// daemons with bootstrap_expect 3, the first with nothing to join, the
// others joining it. The first stops gracefully and starts again at its
// address, still with nothing to join. It must not become a cluster of
// its own: /readyz answers 200 only once it routes to all three again,
// and keys whose limit of 1 was used before the restart admit nothing
// more, through it or the others.
func TestQuickStartRestartDoesNotSplit(t *testing.T) {
	expect := []string{"--bootstrap-expect", "3"}
	first := serve(t, "quick-0", expect...)
	addr := first.GossipAddr()
	second := serve(t, "quick-1", append(expect, "--join", addr)...)
	for _, n := range []*served{first, second} {
		if s, body := httpGet(t, n.base+"/readyz"); s != http.StatusServiceUnavailable || !strings.Contains(body, "BootstrapExpect") {
			t.Fatalf("%s /readyz with 2 of 3 nodes: %d %s", n.Config().NodeName, s, body)
		}
	}
	third := serve(t, "quick-2", append(expect, "--join", addr)...)
	nodes := []*served{first, second, third}
	for _, n := range nodes {
		testwait.ForTimeout(t, 20*time.Second, n.Config().NodeName+" to be ready", func() bool {
			s, body := httpGet(t, n.base+"/readyz")
			return s == http.StatusOK && strings.Contains(body, `"members":3`)
		})
	}
	const keys = 30
	for i := range keys {
		if !httpAllowed(t, second.base, fmt.Sprintf("k%d", i)) {
			t.Fatalf("k%d: the first check was not admitted", i)
		}
	}
	if err := first.stop(t); err != nil {
		t.Fatalf("stop quick-0: %v\n%s", err, first.logs)
	}
	restarted := serve(t, "quick-0", append(expect, "--gossip-addr", addr)...)
	// Ready means rejoined: a ready member of the running cluster in its
	// ring, perhaps before gossip has brought the third.
	testwait.ForTimeout(t, 20*time.Second, "the restarted node to be ready", func() bool {
		s, body := httpGet(t, restarted.base+"/readyz")
		if s == http.StatusOK && strings.Contains(body, `"members":1,`) {
			t.Fatalf("the restarted node is ready in a cluster of its own: %s", body)
		}
		return s == http.StatusOK
	})
	testwait.ForTimeout(t, 20*time.Second, "the restarted node to route to all three", func() bool {
		_, body := httpGet(t, restarted.base+"/readyz")
		return strings.Contains(body, `"members":3`)
	})
	owned := 0
	for i := range keys {
		key := fmt.Sprintf("k%d", i)
		if m, _ := restarted.Node().Owner("quick", key); m.Name == "quick-0" {
			owned++
		}
		for _, n := range []*served{restarted, second, third} {
			if httpAllowed(t, n.base, key) {
				t.Fatalf("%s admitted %s again after the restart", n.Config().NodeName, key)
			}
		}
	}
	if owned == 0 {
		t.Fatal("the restarted node owns none of the keys: the test proves nothing")
	}
}

// sluice inspect prints numbers and durations for people.
func TestFormatInspectionForPeople(t *testing.T) {
	level, interval := 9.273093861500001, daemon.Duration(1500*time.Millisecond)
	for _, tc := range []struct {
		name  string
		state *daemon.KeyState
		want  string
	}{
		{"a level rounded", &daemon.KeyState{Algorithm: "token_bucket", Level: &level}, "token_bucket level=9.273 "},
		{"an interval as a duration", &daemon.KeyState{Algorithm: "gcra", Interval: &interval}, " interval=1.5s "},
		{"fresh", nil, "fresh owner=a replicas="},
	} {
		got := formatInspection(daemon.Inspection{Owner: "a", State: tc.state})
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q lacks %q", tc.name, got, tc.want)
		}
	}
}

// sluice version prints the module version, the commit and the Go
// version from the binary's build information.
func TestVersionCommand(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"}, {Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"}}}
	for _, tc := range []struct {
		name string
		info func() (*debug.BuildInfo, bool)
		args []string
		want string
	}{
		{"stamped", func() (*debug.BuildInfo, bool) { return stamped, true }, []string{"version"},
			"sluice v1.2.3 (commit abc123 2026-01-02T03:04:05Z modified) go1.26.0 linux/arm64\n"},
		{"a work tree build", func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, true
		}, []string{"--version"}, "sluice devel go1.26.0 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"},
		{"no build information", func() (*debug.BuildInfo, bool) { return nil, false }, []string{"version"},
			"sluice (no build information) " + runtime.GOOS + "/" + runtime.GOARCH + "\n"},
	} {
		var stdout bytes.Buffer
		a := &app{env: envMap(nil), stdout: &stdout, stderr: io.Discard, buildInfo: tc.info}
		if err := a.run(context.Background(), tc.args); err != nil || stdout.String() != tc.want {
			t.Errorf("%s: %v, %q; want %q", tc.name, err, stdout.String(), tc.want)
		}
	}
	// The test binary's own build information is read by default.
	var stdout bytes.Buffer
	a := &app{env: envMap(nil), stdout: &stdout, stderr: io.Discard, buildInfo: debug.ReadBuildInfo}
	if err := a.run(context.Background(), []string{"version"}); err != nil || !strings.Contains(stdout.String(), runtime.Version()) {
		t.Errorf("version of the test binary: %v, %q; want the Go version %s", err, stdout.String(), runtime.Version())
	}
}

// check, inspect and reset pointed at a daemon's HTTP port say that it is
// the HTTP port and which one is the gRPC port.
func TestCommandsAtTheHTTPPort(t *testing.T) {
	s := serve(t, "wrong-port")
	want := s.HTTPAddr() + " is sluice's HTTP port; the gRPC port is " + s.GRPCAddr()
	key := []string{"--addr", s.HTTPAddr(), "--name", "n", "--key", "k", "--timeout", "10s"}
	for _, args := range [][]string{
		append([]string{"check", "--limit", "5", "--period", "1m"}, key...),
		append([]string{"inspect"}, key...),
		append([]string{"reset"}, key...),
	} {
		code, _, stderr := runCommand(t, nil, args...)
		if code != 2 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "answered as an HTTP/1 server") {
			t.Errorf("%s at the HTTP port: exit %d, stderr %q; want 2 with %q", args[0], code, stderr, want)
		}
	}
}

// The loopback configuration the README shows is examples/daemon/loopback.yaml
// and starts a node that answers as pasted, on its own ports when they are
// free (on free ports otherwise: the test shares the machine).
func TestLoopbackConfigAsPasted(t *testing.T) {
	const path = "../../examples/daemon/loopback.yaml"
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, file) {
		t.Fatalf("README.md does not show %s as it is", path)
	}
	free := true
	for _, addr := range []string{"127.0.0.1:7946", "127.0.0.1:7947", "127.0.0.1:8080"} {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			free = false
			break
		}
		lis.Close()
	}
	var s *served
	if free {
		s = serveExactly(t, "serve", "--config", path, "--log-level", "warn")
		if s.HTTPAddr() != "127.0.0.1:8080" || s.GRPCAddr() != "127.0.0.1:7947" || s.GossipAddr() != "127.0.0.1:7946" {
			t.Fatalf("serves on %s, %s, %s; want the file's addresses", s.HTTPAddr(), s.GRPCAddr(), s.GossipAddr())
		}
	} else {
		t.Log("the file's ports are taken: serving it on free ports")
		s = serve(t, "local-1", "--config", path)
	}
	if status, body := httpGet(t, s.base+"/readyz"); status != http.StatusOK || !strings.Contains(body, `"node":"local-1"`) {
		t.Fatalf("/readyz: %d %s", status, body)
	}
	code, stdout, stderr := runCommand(t, nil, "check", "--addr", s.GRPCAddr(), "--name", "api_per_user", "--key", "user:42", "--limit", "100", "--period", "1m")
	if code != 0 || !strings.Contains(stdout, "allowed limit=100 remaining=99") {
		t.Fatalf("check: exit %d, %q, %q", code, stdout, stderr)
	}
}

// sluice ready exits 0 for a ready node, printing its /readyz, and 1 for
// an address where nothing answers, or a gRPC port, which it names as
// one.
func TestReadyCommand(t *testing.T) {
	s := serve(t, "ready-cmd")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	// A node whose seed never answers serves, but is not ready.
	alone := serve(t, "ready-cmd-alone", "--join", closed)
	for _, tc := range []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{[]string{"ready", "--http-addr", s.HTTPAddr()}, 0, `"status":"ready"`, ""},
		{[]string{"ready", "--http-addr", alone.HTTPAddr()}, 1, `"status":"not ready"`, ""},
		{[]string{"ready", "--http-addr", closed}, 1, "", "connection refused"},
		{[]string{"ready", "--http-addr", s.GRPCAddr()}, 1, "", s.GRPCAddr() + " is a gRPC port (a node's grpc_addr); sluice ready asks the node's HTTP port"},
		{[]string{"ready", "--http-addr", s.HTTPAddr(), "--timeout", "0s"}, 2, "", "--timeout 0s must be positive"},
		{[]string{"ready", "extra"}, 2, "", `unexpected argument "extra"`},
	} {
		code, stdout, stderr := runCommand(t, nil, tc.args...)
		if code != tc.wantCode || !strings.Contains(stdout, tc.wantStdout) || !strings.Contains(stderr, tc.wantStderr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout, stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
		}
	}
}

// serve sets the soft memory limit it computes and, under it, GOGC
// serveGCPercent, unless GOMEMLIMIT or GOGC in the environment says
// otherwise.
func TestServeSetsGCUnderItsMemoryLimit(t *testing.T) {
	args := []string{"serve", "--node-name", "gc", "--gossip-addr", "127.0.0.1:0", "--gossip-profile", "fast",
		"--bootstrap-expect", "1", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "warn"}
	for _, tt := range []struct {
		name      string
		env       map[string]string
		wantLimit int64
		wantGC    int
	}{
		{"defaults", nil, 128<<20 + daemon.MemoryHeadroom, serveGCPercent},
		{"GOGC set", map[string]string{"GOGC": "100"}, 128<<20 + daemon.MemoryHeadroom, 0},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "1GiB"}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var limit atomic.Int64
			var gc atomic.Int64
			a := &app{env: envMap(tt.env),
				setMemoryLimit: func(n int64) int64 { limit.Store(n); return 0 },
				setGCPercent:   func(n int) int { gc.Store(int64(n)); return 100 },
			}
			s := serveApp(t, a, args)
			if err := s.stop(t); err != nil {
				t.Fatal(err)
			}
			if limit.Load() != tt.wantLimit || gc.Load() != int64(tt.wantGC) {
				t.Fatalf("memory limit %d, GOGC %d; want %d, %d", limit.Load(), gc.Load(), tt.wantLimit, tt.wantGC)
			}
		})
	}
}
