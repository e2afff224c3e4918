package egtest

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
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testwait"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// Envoy Gateway's fixed names and ports (internal/infrastructure/
// kubernetes/ratelimit in its source): the snapshot of the rate limit
// xDS server is set for node envoy-ratelimit, served on 18001.
const (
	egRateLimitNode = "envoy-ratelimit"
	egRateLimitAddr = "127.0.0.1:18001"
)

// The ports Envoy Gateway binds, all fixed: Envoy's xDS, the rate limit
// xDS, the Wasm HTTP server, admin and metrics.
var egPorts = []int{18000, 18001, 18002, 19000, 19001}

// egEnvoyVersion is the Envoy the test's EnvoyGateway configuration
// names for the host infrastructure; its stand-in is installed under that
// version so that func-e finds it and downloads nothing.
const egEnvoyVersion = "1.39.1"

// envoyGatewayBinary returns the envoy-gateway binary to run, or skips.
func envoyGatewayBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_ENVOY_GATEWAY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SLUICE_ENVOY_GATEWAY: %v", err)
		}
		return p
	}
	p, err := exec.LookPath("envoy-gateway")
	if err != nil {
		t.Skip("no envoy-gateway binary: set SLUICE_ENVOY_GATEWAY or put it on PATH (scripts/envoy-gateway-test.sh builds one)")
	}
	return p
}

// process is a child process whose error output is kept.
type process struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex   // guards out
	out    bytes.Buffer // its error output, and standard output when merged
	lines  chan string  // each line, dropped when no one reads
	exited chan struct{}
}

// start runs bin with args; the process is killed when t ends.
func start(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, cmd: exec.Command(bin, args...), lines: make(chan string, 64), exited: make(chan struct{})}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // ends when the process has exited and its output is read
		defer close(done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.Write(sc.Bytes())
			p.out.WriteByte('\n')
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		io.Copy(io.Discard, r)
	}()
	go func() {
		p.cmd.Wait()
		w.Close()
		<-done
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	return p
}

// stop sends sig, then SIGKILL after 20 seconds, and waits for the exit.
func (p *process) stop(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *process) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// The route's resources, as the Envoy Gateway standalone quick start
// writes them, and a policy with two global rules: each value of
// x-user-id gets usersPerHour requests an hour, and the route as a whole
// routePerHour.
const resources = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  listeners:
  - name: http
    protocol: HTTP
    port: 8888
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: backend
  namespace: default
spec:
  parentRefs:
  - name: eg
  hostnames:
  - www.example.com
  rules:
  - backendRefs:
    - group: gateway.envoyproxy.io
      kind: Backend
      name: backend
    matches:
    - path:
        type: PathPrefix
        value: /
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: backend
  namespace: default
spec:
  endpoints:
  - ip:
      address: 127.0.0.1
      port: 3000
`

func policy(usersPerHour int) string {
	return fmt.Sprintf(`apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: limits
  namespace: default
spec:
  targetRefs:
  - group: gateway.networking.k8s.io
    kind: HTTPRoute
    name: backend
  rateLimit:
    global:
      rules:
      - clientSelectors:
        - headers:
          - name: x-user-id
            type: Distinct
        limit:
          requests: %d
          unit: Hour
      - clientSelectors:
        - sourceCIDR:
            type: Distinct
            value: 10.0.0.0/8
          methods:
          - value: POST
          path:
            type: PathPrefix
            value: /api
        limit:
          requests: 7
          unit: Minute
        shadowMode: true
      - clientSelectors:
        - headers:
          - name: x-plan
            value: free
        limit:
          requests: 4
          unit: Day
        shared: true
      - limit:
          requests: 5
          unit: Hour
`, usersPerHour)
}

// The names Envoy Gateway gives the policy's rate limit configuration
// (as v1.9 serves it). A rule of the route is in the domain of the
// listener (namespace/gateway/listener), under a first descriptor for the
// route (its rule, match and host); a shared rule has a domain of its own
// (the policy's namespace/name) and a first descriptor naming the rule.
// Then come the rule's selectors, numbered by the rule's place among the
// route's rules (or among the shared ones): rule-<i>-match-<j> for a
// header (the header's value for a Distinct one, the key again for an
// exact value), rule-<i>-method and rule-<i>-path, masked_remote_address
// and remote_address for a Distinct source CIDR, and rule-<i>-match--1
// for a rule that selects every request.
const (
	egDomain       = "default/eg/http"
	egRouteKey     = "httproute/default/backend/rule/0/match/0/www_example_com"
	egSharedDomain = "default/limits"
	egSharedKey    = "default/limits/rule/2"
)

// entries is a descriptor of key, value pairs.
func entries(kv ...string) *corev3.RateLimitDescriptor {
	d := new(corev3.RateLimitDescriptor)
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &corev3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// What Envoy sends for each rule: for the first, user's requests; for
// the second, a POST under /api from ip; for the third (shared), a
// request with x-plan: free; for the fourth, any request.
func userDescriptor(user string) *corev3.RateLimitDescriptor {
	return entries(egRouteKey, egRouteKey, "rule-0-match-0", user)
}

func apiDescriptor(ip string) *corev3.RateLimitDescriptor {
	return entries(egRouteKey, egRouteKey, "rule-1-method", "rule-1-method", "rule-1-path", "rule-1-path",
		"masked_remote_address", "10.0.0.0/8", "remote_address", ip)
}

func planDescriptor() *corev3.RateLimitDescriptor {
	return entries(egSharedKey, egSharedKey, "rule-0-match-0", "rule-0-match-0")
}

func routeDescriptor() *corev3.RateLimitDescriptor {
	return entries(egRouteKey, egRouteKey, "rule-2-match--1", "rule-2-match--1")
}

// writeFile replaces path's content at once, as an editor saving it
// would, so that Envoy Gateway's watcher never reads half a file.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(filepath.Dir(path)), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Envoy Gateway in standalone mode configures the daemon's Envoy rate
// limit service over its rate limit xDS server: the descriptors Envoy
// sends for the route are limited as the BackendTrafficPolicy says; once
// Envoy Gateway is gone the last configuration stays in force; Envoy
// Gateway started again with the policy deleted (at version 1 again)
// leaves no domain; and a policy written again, edited, sets the new
// limit.
func TestEnvoyGatewayConfiguresTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("runs envoy-gateway and cmd/sluice as processes")
	}
	eg := envoyGatewayBinary(t)
	for _, port := range egPorts {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("Envoy Gateway binds port %d, which is taken: %v", port, err)
		}
		l.Close()
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	watched := filepath.Join(dir, "resources")
	for _, d := range []string{home, watched} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(eg, "certgen", "--local", "--config-home", home).CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen --local: %v\n%s", err, out)
	}
	// The Envoy proxy func-e would download: a stand-in that waits.
	stand := filepath.Join(home, "envoy-versions", egEnvoyVersion, "bin", "envoy")
	if err := os.MkdirAll(filepath.Dir(stand), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stand, []byte("#!/bin/sh\nexec sleep 3600\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	// rateLimit turns on the rate limit xDS server. Its Redis is for the
	// envoyproxy/ratelimit deployment Envoy Gateway runs on Kubernetes;
	// the host infrastructure runs none, and nothing connects to it.
	config := filepath.Join(dir, "standalone.yaml")
	writeFile(t, config, fmt.Sprintf(`apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: [%q]
    infrastructure:
      type: Host
      host:
        configHome: %q
        dataHome: %q
        stateHome: %q
        runtimeDir: %q
envoyProxy:
  provider:
    type: Host
    host:
      envoyVersion: %q
rateLimit:
  backend:
    type: Redis
    redis:
      url: localhost:6379
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
`, watched, home, home, filepath.Join(dir, "state"), filepath.Join(dir, "run"), egEnvoyVersion))
	writeFile(t, filepath.Join(watched, "route.yaml"), resources)
	policyFile := filepath.Join(watched, "policy.yaml")
	writeFile(t, policyFile, policy(3))

	egp := start(t, "envoy-gateway", eg, "server", "--config-path", config)
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("envoy-gateway's output:\n%s", egp.log())
		}
	})

	// The daemon's reconnections back off up to 30 seconds: it starts once
	// Envoy Gateway's rate limit xDS server listens.
	testwait.ForTimeout(t, 3*time.Minute, "Envoy Gateway's rate limit xDS server to listen", func() bool {
		select {
		case <-egp.exited:
			t.Fatalf("envoy-gateway exited")
		default:
		}
		c, err := net.Dial("tcp", egRateLimitAddr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	certs := filepath.Join(home, "certs", "envoy-rate-limit")
	d := startDaemon(t, "--envoy-xds-addr", egRateLimitAddr, "--envoy-xds-node-id", egRateLimitNode,
		"--envoy-xds-ca-file", filepath.Join(certs, "ca.crt"),
		"--envoy-xds-cert-file", filepath.Join(certs, "tls.crt"), "--envoy-xds-key-file", filepath.Join(certs, "tls.key"),
		"--envoy-xds-server-name", "envoy-gateway")
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("sluice's output:\n%s", d.log())
		}
	})
	testwait.ForTimeout(t, 3*time.Minute, "the daemon's first configuration from Envoy Gateway", func() bool {
		return d.ready()
	})

	conn, err := grpc.NewClient(d.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	checkIn := func(domain string, descs ...*corev3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs, HitsAddend: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Statuses) != len(descs) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(descs))
		}
		return resp
	}
	check := func(descs ...*corev3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		return checkIn(egDomain, descs...)
	}

	// Envoy Gateway may serve the route before its policy: each poll asks
	// for a user not seen again, so that none is counted twice.
	fresh := 0
	limitOf := func() uint32 {
		fresh++
		return check(userDescriptor("poll-" + strconv.Itoa(fresh))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	testwait.ForTimeout(t, 2*time.Minute, "the policy to reach the daemon", func() bool { return limitOf() == 3 })

	// As Envoy sends them: one request per HTTP request (a POST under
	// /api from 10.1.2.3 with x-user-id), with a descriptor for each rule
	// of the route; the shared rule's in a request of its own (Envoy
	// Gateway gives it a filter of its own).
	type step struct {
		user                        string
		wantUser, wantAll, wantCode rlsv3.RateLimitResponse_Code
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, s := range []step{
		{"alice", ok, ok, ok}, {"alice", ok, ok, ok}, {"alice", ok, ok, ok},
		{"alice", over, ok, over}, // alice's fourth in the hour
		{"bob", ok, ok, ok},       // the route's fifth
		{"bob", ok, over, over},
		{"carol", ok, over, over},
		{"carol", ok, over, over}, // the eighth POST from 10.1.2.3 in the minute: shadow mode
	} {
		resp := check(userDescriptor(s.user), apiDescriptor("10.1.2.3"), routeDescriptor())
		if resp.OverallCode != s.wantCode {
			t.Errorf("request %d (%s): %v overall, want %v", i+1, s.user, resp.OverallCode, s.wantCode)
		}
		if got := resp.Statuses[0]; got.Code != s.wantUser || got.CurrentLimit.GetRequestsPerUnit() != 3 || got.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("request %d (%s): the user's rule answered %v, want %v under 3 an hour", i+1, s.user, got, s.wantUser)
		}
		wantLeft := uint32(max(7-(i+1), 0))
		if got := resp.Statuses[1]; got.Code != ok || got.CurrentLimit.GetRequestsPerUnit() != 7 || got.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || got.LimitRemaining != wantLeft {
			t.Errorf("request %d: the shadow rule answered %v, want OK with %d left of 7 a minute", i+1, got, wantLeft)
		}
		if got := resp.Statuses[2]; got.Code != s.wantAll || got.CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Errorf("request %d (%s): the route's rule answered %v, want %v under 5 an hour", i+1, s.user, got, s.wantAll)
		}
	}
	if got := check(apiDescriptor("10.9.9.9")).Statuses[0]; got.LimitRemaining != 6 {
		t.Errorf("another address under 10.0.0.0/8: %v, want a count of its own (6 left of 7)", got)
	}
	for i := range 5 {
		want := map[bool]rlsv3.RateLimitResponse_Code{true: ok, false: over}[i < 4]
		if got := checkIn(egSharedDomain, planDescriptor()).Statuses[0]; got.Code != want || got.CurrentLimit.GetRequestsPerUnit() != 4 || got.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Errorf("shared rule, request %d: %v, want %v under 4 a day", i+1, got, want)
		}
	}

	spend := func(user string, want int) {
		t.Helper()
		for i := range want + 1 {
			got := check(userDescriptor(user)).Statuses[0]
			if wantCode := map[bool]rlsv3.RateLimitResponse_Code{true: ok, false: over}[i < want]; got.Code != wantCode {
				t.Fatalf("%s's request %d: %v, want %v under %d an hour", user, i+1, got, wantCode, want)
			}
		}
	}

	// Envoy Gateway killed: the daemon's stream ends and the last
	// configuration stays.
	egp.stop(syscall.SIGKILL)
	testwait.ForTimeout(t, time.Minute, "the daemon to see its xDS stream end", func() bool {
		return d.metric("sluice_envoy_xds_disconnects_total") >= 1
	})
	if !d.ready() {
		t.Errorf("the daemon is not ready once Envoy Gateway is gone")
	}
	spend("dave", 3)

	// Envoy Gateway started again with the policy deleted meanwhile: its
	// versions count from 1 again (the daemon most likely holds a version
	// 1 as well), and its state of the world has no rate limit
	// configuration; the daemon drops the domains.
	if err := os.Remove(policyFile); err != nil {
		t.Fatal(err)
	}
	again := start(t, "envoy-gateway", eg, "server", "--config-path", config)
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("the restarted envoy-gateway's output:\n%s", again.log())
		}
	})
	testwait.ForTimeout(t, 3*time.Minute, "the daemon to take the restarted Envoy Gateway's empty configuration", func() bool {
		return d.metric("sluice_envoy_domains") == 0
	})
	if got := check(userDescriptor("dave")).Statuses[0]; got.Code != ok || got.CurrentLimit != nil {
		t.Errorf("dave once the policy is deleted: %v, want OK with no limit", got)
	}

	// The policy written again, edited: 6 an hour per user.
	writeFile(t, policyFile, policy(6))
	testwait.ForTimeout(t, 2*time.Minute, "the edited policy to reach the daemon", func() bool { return limitOf() == 6 })
	spend("erin", 6)
}

// daemon is one `sluice serve` process with its addresses.
type daemon struct {
	*process
	http, grpc string
}

// startDaemon starts `sluice serve`, a single node on loopback ports,
// with args, and waits until its log names its addresses.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/sluice: %v\n%s", err, out)
	}
	all := append([]string{"serve", "--node-name", "eg", "--bootstrap-expect", "1", "--gossip-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json"}, args...)
	d := &daemon{process: start(t, "sluice", bin, all...)}
	timeout := time.After(60 * time.Second)
	for d.http == "" {
		select {
		case line := <-d.lines:
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "sluice: daemon started" {
				d.http, _ = rec["http"].(string)
				d.grpc, _ = rec["grpc"].(string)
			}
		case <-d.exited:
			t.Fatalf("sluice exited:\n%s", d.log())
		case <-timeout:
			t.Fatalf("sluice did not start:\n%s", d.log())
		}
	}
	return d
}

// ready reports whether the daemon's /readyz answers 200.
func (d *daemon) ready() bool {
	resp, err := http.Get("http://" + d.http + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// metric returns the value of the series name (without labels) on the
// daemon's /metrics, or -1.
func (d *daemon) metric(name string) float64 {
	resp, err := http.Get("http://" + d.http + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
