package redistest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// The daemon binary, built once for every test of the run.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// daemonBinary returns the path of cmd/sluice built for this run.
func daemonBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "sluice-redistest-"); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "sluice")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build cmd/sluice: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// daemon is one `sluice serve` process.
type daemon struct {
	name       string
	http, grpc string // their addresses, from the start line of its log
	cmd        *exec.Cmd
	logs       *bytes.Buffer // guarded by logMu
	logMu      *sync.Mutex
	exited     chan struct{} // closed once the process has exited
}

// startDaemon starts `sluice serve` with backend redis and args on
// loopback ports, and waits until its log names its addresses and its
// /readyz answers 200. It stops it (SIGTERM, then SIGKILL) when t ends.
func startDaemon(t *testing.T, name string, args ...string) *daemon {
	t.Helper()
	all := append([]string{"serve", "--node-name", name, "--backend", "redis",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json", "--redis-timeout", "5s"}, args...)
	cmd := exec.Command(daemonBinary(t), all...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{name: name, cmd: cmd, logs: new(bytes.Buffer), logMu: new(sync.Mutex), exited: make(chan struct{})}
	started := make(chan map[string]any, 1)
	go func() { // owned by the process: ends when its stderr closes
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			d.logMu.Lock()
			d.logs.Write(line)
			d.logs.WriteByte('\n')
			d.logMu.Unlock()
			var rec map[string]any
			if json.Unmarshal(line, &rec) == nil && rec["msg"] == "sluice: daemon started" {
				select {
				case started <- rec:
				default:
				}
			}
		}
		cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-d.exited
		}
	})
	select {
	case rec := <-started:
		d.http, _ = rec["http"].(string)
		d.grpc, _ = rec["grpc"].(string)
	case <-d.exited:
		t.Fatalf("%s exited:\n%s", name, d.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start:\n%s", name, d.log())
	}
	testwait.For(t, name+" ready", func() bool {
		resp, err := http.Get("http://" + d.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return d
}

func (d *daemon) log() string {
	d.logMu.Lock()
	defer d.logMu.Unlock()
	return d.logs.String()
}

// The callers and what each sends: callers*attempts checks of one hit
// on one key whose limit is far below, in a period so long that nothing
// refills while the test runs.
const (
	callers  = 64
	attempts = 4
	limit    = 100
	period   = 24 * time.Hour
	// checkTimeout bounds one check over HTTP or gRPC.
	checkTimeout = 30 * time.Second
)

// deployment is a Redis the daemons decide on, and the settings that
// reach it.
type deployment struct {
	name  string
	start func(t *testing.T) (args []string)
}

var deployments = []deployment{
	{"cluster of 3 masters", func(t *testing.T) []string {
		rc := testredis.StartCluster(t, 3, 0)
		return []string{"--redis-addrs", strings.Join(rc.Addrs(), ",")}
	}},
	{"server with AUTH", func(t *testing.T) []string {
		srv := testredis.StartWithPassword(t, "pass-of-the-test")
		pw := filepath.Join(t.TempDir(), "redis-password")
		if err := os.WriteFile(pw, []byte("pass-of-the-test\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--redis-addrs", srv.Addr(), "--redis-password-file", pw}
	}},
	{"server with TLS", func(t *testing.T) []string {
		dir := t.TempDir()
		ca := testpki.NewCA(t, "redis-ca")
		caFile := ca.WriteCA(t, dir, "ca.pem")
		srvCert, srvKey := testpki.WriteCert(t, dir, "redis", ca.Issue(t, "redis"))
		cliCert := ca.Issue(t, "sluice")
		cliCertFile, cliKeyFile := testpki.WriteCert(t, dir, "sluice", cliCert)
		srv := testredis.StartTLS(t, srvCert, srvKey, caFile, true, ca.Config(cliCert))
		return []string{"--redis-addrs", srv.Addr(), "--redis-tls=true", "--redis-tls-ca-file", caFile,
			"--redis-tls-cert-file", cliCertFile, "--redis-tls-key-file", cliKeyFile}
	}},
}

// 64 callers spread over three daemon processes, half over HTTP and half
// over gRPC, check one key at once: each algorithm admits exactly its
// limit, on a Redis Cluster, on a server with AUTH and on one with TLS.
func TestThreeDaemonsAdmitExactlyTheLimit(t *testing.T) {
	testredis.NeedBinaries(t, "redis-server", "redis-cli")
	for _, dep := range deployments {
		t.Run(dep.name, func(t *testing.T) {
			args := dep.start(t)
			var ds []*daemon
			for i := range 3 {
				ds = append(ds, startDaemon(t, fmt.Sprintf("d%d", i), args...))
			}
			// A check waits as long over gRPC as over HTTP: the first
			// checks open the daemons' connections to Redis (TLS
			// handshakes, cluster slots) all at once, which a loaded
			// machine may take longer than the client's default two
			// seconds to do. The test counts admissions, not latency.
			clients := make([]*client.Client, len(ds))
			for i, d := range ds {
				c, err := client.New(d.grpc, client.WithTimeout(checkTimeout))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				clients[i] = c
			}
			httpc := &http.Client{Timeout: checkTimeout}
			defer httpc.CloseIdleConnections()
			for _, algo := range limiter.Algorithms {
				req := limiter.Request{Name: "exact", Key: "k-" + algo.String(), Hits: 1, Limit: limit, Period: period, Algorithm: algo}
				body := fmt.Sprintf(`{"name":%q,"key":%q,"limit":%d,"period":%q,"algorithm":%q}`, req.Name, req.Key, limit, period.String(), algo.String())
				var admitted, failed atomic.Int64
				var firstErr atomic.Value
				var wg sync.WaitGroup
				for caller := range callers {
					wg.Go(func() {
						d := caller % len(ds)
						for range attempts {
							allowed, err := checkOnce(httpc, clients[d], ds[d], caller%2 == 0, req, body)
							switch {
							case err != nil:
								failed.Add(1)
								firstErr.CompareAndSwap(nil, err.Error())
							case allowed:
								admitted.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if failed.Load() > 0 {
					t.Errorf("%v: %d checks failed, the first: %v", algo, failed.Load(), firstErr.Load())
				}
				if got := admitted.Load(); got != limit {
					t.Errorf("%v: %d of %d checks admitted by three daemons, want exactly %d", algo, got, callers*attempts, limit)
				}
			}
		})
	}
}

// checkOnce sends one check to d, over HTTP or gRPC, and reports whether
// Redis admitted it; a decision of the unreachable policy is an error.
func checkOnce(httpc *http.Client, c *client.Client, d *daemon, overHTTP bool, req limiter.Request, body string) (bool, error) {
	if !overHTTP {
		dec, err := c.Check(context.Background(), req)
		if err == nil && dec.WithoutOwner {
			err = fmt.Errorf("%s decided without Redis", d.name)
		}
		return dec.Allowed, err
	}
	resp, err := httpc.Post("http://"+d.http+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	var dec struct {
		Allowed      bool `json:"allowed"`
		WithoutOwner bool `json:"without_owner"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &dec) != nil {
		return false, fmt.Errorf("%s: HTTP %d %s", d.name, resp.StatusCode, b)
	}
	if dec.WithoutOwner {
		return false, fmt.Errorf("%s decided without Redis", d.name)
	}
	return dec.Allowed, nil
}

// A daemon killed hard (SIGKILL) while 64 callers check one key through
// three daemons, then started again, loses no count: the state is in
// Redis, so the daemons together admit at most the limit, at least the
// limit less the checks whose answers the kill lost, and once the key is
// spent every daemon, the restarted one included, denies it.
func TestDaemonKilledUnderTraffic(t *testing.T) {
	testredis.NeedBinaries(t, "redis-server")
	srv := testredis.Start(t)
	args := []string{"--redis-addrs", srv.Addr()}
	ds := []*daemon{startDaemon(t, "k0", args...), startDaemon(t, "k1", args...), startDaemon(t, "k2", args...)}
	httpc := &http.Client{Timeout: checkTimeout}
	defer httpc.CloseIdleConnections()
	const killLimit = 300
	req := limiter.Request{Name: "killed", Key: "k", Hits: 1, Limit: killLimit, Period: period, Algorithm: limiter.SlidingWindowCounter}
	body := fmt.Sprintf(`{"name":%q,"key":%q,"limit":%d,"period":%q,"algorithm":%q}`, req.Name, req.Key, killLimit, period.String(), req.Algorithm.String())
	var admitted, failed atomic.Int64
	// phase sends attempts checks from each caller, over HTTP, to the
	// daemons of ds in turn.
	phase := func(ds []*daemon, attempts int) {
		var wg sync.WaitGroup
		for caller := range callers {
			wg.Go(func() {
				for i := range attempts {
					allowed, err := checkOnce(httpc, nil, ds[(caller+i)%len(ds)], true, req, body)
					switch {
					case err != nil:
						failed.Add(1)
					case allowed:
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	// Under traffic: k1 is killed once a third of the limit is admitted.
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		// Not testwait.For: a failure there must not end the test from
		// this goroutine.
		if err := testwait.Until(testwait.Timeout, func() error {
			if admitted.Load() < killLimit/3 {
				return errors.New("a third of the limit not admitted yet")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		ds[1].cmd.Process.Kill()
		<-ds[1].exited
	}()
	phase(ds, 3)
	<-killed
	lost := failed.Load()
	ds[1] = startDaemon(t, "k1", args...)
	phase(ds, 3)
	t.Logf("%d checks failed with the kill", lost)
	if got := admitted.Load(); got > killLimit || got < killLimit-lost {
		t.Errorf("%d admitted, want between %d and %d (%d checks failed with the kill)", got, killLimit-lost, killLimit, lost)
	}
	if f := failed.Load() - lost; f != 0 {
		t.Errorf("%d checks failed after the restart", f)
	}
	for _, d := range ds {
		if allowed, err := checkOnce(httpc, nil, d, true, req, body); err != nil || allowed {
			t.Errorf("%s: a check of the spent key: allowed %v, %v", d.name, allowed, err)
		}
	}
}

// With Redis killed, the daemon's log stays one JSON record a line: what
// go-redis reports (failed dials) is in it as warnings of component
// redis, and /readyz says Redis does not answer.
func TestDaemonLogWhenRedisFails(t *testing.T) {
	testredis.NeedBinaries(t, "redis-server")
	srv := testredis.Start(t)
	d := startDaemon(t, "log", "--redis-addrs", srv.Addr())
	srv.Kill()
	testwait.For(t, "/readyz 503 with Redis killed", func() bool {
		resp, err := http.Get("http://" + d.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	testwait.For(t, "go-redis's failures in the log", func() bool { return strings.Contains(d.log(), `"component":"redis"`) })
	for i, line := range strings.Split(strings.TrimSpace(d.log()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %d is not JSON: %s", i+1, line)
		}
	}
}

// Callers of one key that disagree on its limit, 100 through one daemon
// and 50 through another, at once: the count is one, so the checks of
// limit 50 are admitted only while fewer than 50 hits are counted, and
// together the daemons admit exactly 100 (limiter's rule: a limit change
// takes effect at once and keeps what was consumed).
func TestDaemonsDisagreeOnTheLimit(t *testing.T) {
	testredis.NeedBinaries(t, "redis-server")
	srv := testredis.Start(t)
	args := []string{"--redis-addrs", srv.Addr()}
	ds := []*daemon{startDaemon(t, "l0", args...), startDaemon(t, "l1", args...)}
	httpc := &http.Client{Timeout: checkTimeout}
	defer httpc.CloseIdleConnections()
	for _, algo := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowLog} {
		var admitted [2]atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		for caller := range callers {
			side := caller % 2
			lim := []int64{100, 50}[side]
			req := limiter.Request{Name: "disagree", Key: algo.String(), Hits: 1, Limit: lim, Period: period, Algorithm: algo}
			body := fmt.Sprintf(`{"name":%q,"key":%q,"limit":%d,"period":%q,"algorithm":%q}`, req.Name, req.Key, lim, period.String(), algo.String())
			wg.Go(func() {
				for range attempts {
					allowed, err := checkOnce(httpc, nil, ds[side], true, req, body)
					switch {
					case err != nil:
						failed.Add(1)
					case allowed:
						admitted[side].Add(1)
					}
				}
			})
		}
		wg.Wait()
		hundred, fifty := admitted[0].Load(), admitted[1].Load()
		if failed.Load() > 0 || fifty > 50 || hundred+fifty != 100 {
			t.Errorf("%v: %d admitted with limit 100, %d with limit 50, %d failed; want 100 in all, at most 50 with limit 50",
				algo, hundred, fifty, failed.Load())
		}
	}
}
