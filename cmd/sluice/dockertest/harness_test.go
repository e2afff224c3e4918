package dockertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testwait"
)

// label marks every container, network and image the tests create; its
// value is the run's id.
const label = "sluice-dockertest"

// Timeouts. Docker commands are bounded so that a hung daemon fails a test
// instead of the whole test binary; the waits are generous because the
// machine is shared and gossip under load is slow to notice a failure.
const (
	dockerTimeout = time.Minute     // one docker command
	buildTimeout  = 5 * time.Minute // docker build of the image
	convergeWait  = 60 * time.Second
	httpTimeout   = 10 * time.Second // one HTTP request to a daemon
)

// env is what every test shares: the image and the network, built once.
type env struct {
	run     string // random id, part of every name
	dir     string // temporary directory of the binary and Dockerfile
	image   string
	network string
}

// shared holds the environment; TestMain tears it down.
var shared struct {
	once sync.Once
	env  *env
	skip string // why the tests skip; "" when Docker answers
	err  error  // why setting up failed
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.teardown(); err != nil {
			fmt.Fprintln(os.Stderr, "dockertest: cleaning up:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	// As goleak.VerifyTestMain, but after the teardown.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "dockertest: a test left goroutines behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup returns the shared environment, building it on first use, and
// skips t when Docker is not available.
func setup(t *testing.T) *env {
	t.Helper()
	shared.once.Do(func() {
		if shared.skip = dockerMissing(); shared.skip != "" {
			return
		}
		// go build is bounded by the test binary's -timeout alone: a
		// cold cache on a loaded machine takes minutes, and the build
		// does not hang.
		ctx := context.Background()
		if deadline, ok := t.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		shared.env, shared.err = newEnv(ctx)
	})
	switch {
	case shared.skip != "":
		t.Skip(shared.skip)
	case shared.err != nil:
		t.Fatal(shared.err)
	}
	return shared.env
}

// dockerMissing returns why Docker cannot be used, or "".
func dockerMissing() string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "docker tests skipped: no docker command on PATH"
	}
	if _, err := docker(20*time.Second, "info", "--format", "{{.ServerVersion}}"); err != nil {
		return fmt.Sprintf("docker tests skipped: docker info failed: %v", err)
	}
	return ""
}

// newEnv builds the binary, the image and the network. On failure it
// removes what it made.
func newEnv(ctx context.Context) (e *env, err error) {
	e = &env{run: randomID()}
	e.image = "sluice-test:" + e.run
	e.network = "sluice-test-" + e.run
	defer func() {
		if err != nil {
			err = errors.Join(err, e.teardown())
			e = nil
		}
	}()
	if e.dir, err = os.MkdirTemp("", "sluice-dockertest-"); err != nil {
		return e, fmt.Errorf("dockertest: %w", err)
	}
	if err := buildBinary(ctx, filepath.Join(e.dir, "sluice")); err != nil {
		return e, err
	}
	dockerfile, err := imageDockerfile()
	if err != nil {
		return e, err
	}
	if err := os.WriteFile(filepath.Join(e.dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return e, fmt.Errorf("dockertest: %w", err)
	}
	if _, err := docker(buildTimeout, "build", "--quiet", "--label", label+"="+e.run, "--tag", e.image, e.dir); err != nil {
		return e, err
	}
	if _, err := docker(dockerTimeout, "network", "create", "--label", label+"="+e.run, e.network); err != nil {
		return e, err
	}
	return e, nil
}

// buildBinary builds a static cmd/sluice for Linux at out; ctx bounds it.
func buildBinary(ctx context.Context, out string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("dockertest: building cmd/sluice needs the go command: %w", err)
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", out, "github.com/sluicehq/sluice/cmd/sluice")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("dockertest: go build cmd/sluice: %w\n%s", err, b)
	}
	return nil
}

// teardown removes the run's containers, then its network, image and
// directory, and returns every error met on the way.
func (e *env) teardown() error {
	var errs []error
	ids, err := docker(dockerTimeout, "ps", "--all", "--quiet", "--filter", "label="+label+"="+e.run)
	if err != nil {
		errs = append(errs, err)
	} else if ids != "" {
		if _, err := docker(dockerTimeout, append([]string{"rm", "--force", "--volumes"}, strings.Fields(ids)...)...); err != nil {
			errs = append(errs, err)
		}
	}
	if out, err := docker(dockerTimeout, "network", "ls", "--quiet", "--filter", "name=^"+e.network+"$"); err != nil {
		errs = append(errs, err)
	} else if out != "" {
		if _, err := docker(dockerTimeout, "network", "rm", e.network); err != nil {
			errs = append(errs, err)
		}
	}
	if out, err := docker(dockerTimeout, "images", "--quiet", e.image); err != nil {
		errs = append(errs, err)
	} else if out != "" {
		if _, err := docker(dockerTimeout, "rmi", "--force", e.image); err != nil {
			errs = append(errs, err)
		}
	}
	if e.dir != "" {
		if err := os.RemoveAll(e.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// docker runs the docker command with args, killed after timeout, and
// returns its standard output trimmed. The error holds the command and its
// standard error.
func docker(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (killed after %v)", err, timeout)
		}
		return "", fmt.Errorf("dockertest: docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

func randomID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// cluster is a set of sluice daemons, one per container.
type cluster struct {
	t      *testing.T
	env    *env
	nodes  []*node
	client *http.Client
	join   joinPlan
	args   []string // serve flags of every node
}

// node is one container. Its name is also the daemon's node name and its
// host name on the network.
type node struct {
	name string
	base string // http://127.0.0.1:port of its published HTTP port
}

// joinPlan returns how node i of c joins the others: options of its
// docker run, and flags of its sluice serve.
type joinPlan func(c *cluster, i int) (runOpts, serveArgs []string)

// joinFirst makes node 0 the seed: it starts with no join address and the
// others join it by its container name.
func joinFirst(c *cluster, i int) (runOpts, serveArgs []string) {
	if i == 0 {
		return nil, nil
	}
	return nil, []string{"--join", c.nodes[0].name + ":7946"}
}

// joinAlias gives every node the network alias alias and makes it join
// alias alone: Docker's DNS answers the alias with every container that
// carries it, as a Kubernetes headless Service's name does with its pods.
func joinAlias(alias string) joinPlan {
	return func(*cluster, int) (runOpts, serveArgs []string) {
		return []string{"--network-alias", alias}, []string{"--join", alias + ":7946"}
	}
}

// startCluster starts n containers, node 0 the seed (joinFirst), and
// waits until each is ready and routes to all n.
func startCluster(t *testing.T, n int, serveArgs ...string) *cluster {
	t.Helper()
	c := newCluster(t, n, joinFirst, serveArgs...)
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.waitMembers(c.nodes, n)
	return c
}

// newCluster names n containers, which join as plan says, and starts
// none. The containers are removed when the test ends, after their logs
// are written to the test log if it failed.
func newCluster(t *testing.T, n int, plan joinPlan, serveArgs ...string) *cluster {
	t.Helper()
	e := setup(t)
	c := &cluster{t: t, env: e, join: plan, args: serveArgs, client: newHTTPClient()}
	short := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	for i := range n {
		c.nodes = append(c.nodes, &node{name: fmt.Sprintf("sluice-%s-%s-%d", e.run, short, i+1)})
	}
	t.Cleanup(c.remove)
	return c
}

// newHTTPClient returns the client of the daemons' HTTP APIs.
func newHTTPClient() *http.Client {
	return &http.Client{
		Timeout: httpTimeout,
		// Only loopback addresses are ever dialled (see loopbackURL); no
		// proxy from the environment may take the requests elsewhere.
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16},
	}
}

// peerPort is the port of the containers' peer_addr, as in
// deploy/kubernetes: peers call each other there, clients on 7947.
const peerPort = "7948"

// start runs nd's container, which runs the image's entrypoint,
// `sluice serve`, and waits until Docker publishes its HTTP port.
func (c *cluster) start(nd *node) {
	c.t.Helper()
	runOpts, joinArgs := c.join(c, slices.Index(c.nodes, nd))
	args := []string{"run", "--detach", "--name", nd.name, "--hostname", nd.name,
		"--network", c.env.network, "--label", label + "=" + c.env.run,
		"--publish", "127.0.0.1::8080",
	}
	args = append(args, runOpts...)
	args = append(args, c.env.image,
		"--node-name", nd.name,
		"--gossip-addr", ":7946", "--grpc-addr", ":7947", "--peer-addr", ":"+peerPort, "--http-addr", ":8080",
		"--gossip-profile", "fast",
		"--unreachable", "local",
		"--retry-join-interval", "500ms",
		"--bootstrap-expect", "1", // a node joined by the others' retries is ready alone, as the tests expect
		"--log-format", "text", "--log-level", "info",
	)
	args = append(args, c.args...)
	args = append(args, joinArgs...)
	if _, err := docker(dockerTimeout, args...); err != nil {
		c.t.Fatal(err)
	}
	c.findPort(nd)
}

// remove dumps the logs of a failed test and removes the containers.
func (c *cluster) remove() {
	var names []string
	for _, nd := range c.nodes {
		if c.t.Failed() {
			logs, err := dockerLogs(nd.name)
			c.t.Logf("logs of %s (%v):\n%s", nd.name, err, logs)
		}
		names = append(names, nd.name)
	}
	if _, err := docker(dockerTimeout, append([]string{"rm", "--force", "--volumes"}, names...)...); err != nil {
		c.t.Error(err)
	}
}

func dockerLogs(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dockerTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "logs", "--tail", "40", name).CombinedOutput()
	return string(out), err
}

// findPort sets nd.base from the host port Docker published for the
// container's 8080, which changes when the container restarts or is
// reconnected, waiting until Docker reports one.
func (c *cluster) findPort(nd *node) {
	c.t.Helper()
	c.waitFor(nd.name+" to publish its HTTP port on 127.0.0.1", func() error {
		out, err := docker(dockerTimeout, "port", nd.name, "8080/tcp")
		if err != nil {
			return err
		}
		base, err := loopbackURL(out)
		if err != nil {
			return err
		}
		nd.base = base
		return nil
	})
}

// loopbackURL returns the URL of the first loopback address:port in the
// output of docker port, so that the tests never talk to anything else.
func loopbackURL(out string) (string, error) {
	for line := range strings.Lines(out) {
		host, port, err := net.SplitHostPort(strings.TrimSpace(line))
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return "http://" + net.JoinHostPort(host, port), nil
		}
	}
	return "", fmt.Errorf("docker port gave no loopback address: %q", out)
}

// waitFor waits until cond returns nil, through testwait.Until, and fails
// the test with cond's last error if that does not happen within
// convergeWait.
func (c *cluster) waitFor(what string, cond func() error) {
	c.t.Helper()
	if err := testwait.Until(convergeWait, cond); err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitRoutesWithout checks req on every node of living, which must keep
// answering and never name gone as the decider, until each routes to
// len(living) members. It returns how many checks were decided without
// their owner meanwhile (by the unreachable policy).
func (c *cluster) waitRoutesWithout(gone *node, living []*node, req checkRequest) (withoutOwner int) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%s to see %s gone", names(living), gone.name), func() error {
		for _, nd := range living {
			d, err := c.check(nd, req)
			if err != nil {
				c.t.Fatalf("%s is gone and a node failed to answer: %v", gone.name, err)
			}
			if d.Owner == gone.name {
				c.t.Fatalf("%s answered for %s, which is gone: %+v", nd.name, gone.name, d)
			}
			if d.WithoutOwner {
				withoutOwner++
			}
			r, err := c.readyz(nd)
			if err != nil {
				c.t.Fatalf("%s is gone and a node failed to answer: %v", gone.name, err)
			}
			if r.Members != len(living) {
				return fmt.Errorf("%s routes to %d members", nd.name, r.Members)
			}
		}
		return nil
	})
	return withoutOwner
}

// waitMembers waits until every node of nodes reports ready and routes to
// want members.
func (c *cluster) waitMembers(nodes []*node, want int) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%s to route to %d members", names(nodes), want), func() error {
		for _, nd := range nodes {
			r, err := c.readyz(nd)
			if err != nil {
				return err
			}
			if r.Status != "ready" || r.Members != want || r.Unconfirmed > 0 {
				return fmt.Errorf("%s: %s, %d members (%s), waiting for the hand-over of %d members", nd.name, r.Status, r.Members, r.Reason, r.Unconfirmed)
			}
		}
		return nil
	})
}

func names(nodes []*node) string {
	s := make([]string, len(nodes))
	for i, nd := range nodes {
		s[i] = nd.name
	}
	return strings.Join(s, ", ")
}

// readiness is the body of /readyz.
type readiness struct {
	Node    string `json:"node"`
	Members int    `json:"members"`
	// Unconfirmed: members whose hand-over the node still waits for.
	Unconfirmed int    `json:"unconfirmed"`
	Status      string `json:"status"`
	Reason      string `json:"reason"`
}

func (c *cluster) readyz(nd *node) (readiness, error) {
	var r readiness
	resp, err := c.client.Get(nd.base + "/readyz")
	if err != nil {
		return r, fmt.Errorf("%s: %w", nd.name, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return r, fmt.Errorf("%s: /readyz %s: %w", nd.name, resp.Status, err)
	}
	return r, nil
}

// checkRequest is the body of POST /v1/check.
type checkRequest struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	Hits      *int64 `json:"hits,omitempty"` // nil: 1`
	Limit     int64  `json:"limit"`
	Period    string `json:"period,omitempty"`
	Algorithm string `json:"algorithm"`
	Calendar  string `json:"calendar,omitempty"`
	TimeZone  string `json:"time_zone,omitempty"`
}

// decision is the answer of POST /v1/check.
type decision struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	Owner        string `json:"owner"`
	WithoutOwner bool   `json:"without_owner"`
}

// check sends req to nd and returns its decision; any status but 200 is an
// error.
func (c *cluster) check(nd *node, req checkRequest) (decision, error) {
	var d decision
	body, err := json.Marshal(req)
	if err != nil {
		return d, err
	}
	resp, err := c.client.Post(nd.base+"/v1/check", "application/json", bytes.NewReader(body))
	if err != nil {
		return d, fmt.Errorf("%s: %w", nd.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return d, fmt.Errorf("%s: reading the answer: %w", nd.name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("%s: POST /v1/check: %s: %s", nd.name, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%s: decoding %q: %w", nd.name, b, err)
	}
	return d, nil
}

// checkExact spreads sent checks of req over every node (spread) and
// fails the test unless one owner decided them all and exactly req.Limit
// were allowed.
func (c *cluster) checkExact(req checkRequest, sent, workers int) {
	c.t.Helper()
	allowed, owners, err := c.spread(c.nodes, req, sent, workers)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(owners) != 1 {
		c.t.Errorf("checks of one key were decided by %v, want one owner", owners)
	}
	if allowed != int(req.Limit) {
		c.t.Errorf("admitted %d of %d checks over %d containers, want exactly %d", allowed, sent, len(c.nodes), req.Limit)
	}
}

// spread sends sent checks of req from workers goroutines at once, the
// i-th to nodes[i%len(nodes)], and returns how many were allowed and how
// many each owner decided; a failed check, or one decided without its
// owner, is an error.
func (c *cluster) spread(nodes []*node, req checkRequest, sent, workers int) (allowed int, owners map[string]int, err error) {
	jobs := make(chan int)
	var (
		mu   sync.Mutex // guards allowed, owners and errs
		errs []error
	)
	owners = map[string]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				d, err := c.check(nodes[i%len(nodes)], req)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case d.WithoutOwner:
					errs = append(errs, fmt.Errorf("check %d decided without its owner: %+v", i, d))
				default:
					owners[d.Owner]++
					if d.Allowed {
						allowed++
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range sent {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return allowed, owners, errors.Join(errs...)
}

// agreedOwner checks req on every node of nodes and returns the owner they
// all name; it is an error if one answers without its owner or they
// disagree.
func (c *cluster) agreedOwner(nodes []*node, req checkRequest) (string, error) {
	owner := ""
	for _, nd := range nodes {
		d, err := c.check(nd, req)
		if err != nil {
			return "", err
		}
		switch {
		case d.WithoutOwner:
			return "", fmt.Errorf("%s decided %s/%s without its owner", nd.name, req.Name, req.Key)
		case owner != "" && d.Owner != owner:
			return "", fmt.Errorf("owner of %s/%s: %s says %s, another says %s", req.Name, req.Key, nd.name, d.Owner, owner)
		}
		owner = d.Owner
	}
	return owner, nil
}
