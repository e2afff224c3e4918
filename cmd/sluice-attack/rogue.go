package main

import (
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testrogue"
	"github.com/sluicehq/sluice/internal/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Bounds of the rogue-member attack.
const (
	// rogueKeysEach is how many legitimate keys of each daemon the
	// legitimate client checks.
	rogueKeysEach = 4
	// rogueLimit is each legitimate key's limit, per rogueLimitPeriod: a
	// GCRA key that gives back one hit every 2.4 hours admits exactly
	// rogueLimit in a run.
	rogueLimit       = 10
	rogueLimitPeriod = 24 * time.Hour
	// watchReadyEvery is how often the daemons' /readyz is read during the
	// attack, for rogues in their rings.
	watchReadyEvery = 100 * time.Millisecond
)

// gossipKeyLabel is the HKDF label under which a daemon with a cluster
// secret and no gossip keys derives its gossip key (docs/design.md,
// "Gossip itself").
const gossipKeyLabel = "sluice gossip encryption v1"

// rogueMember: two daemons with --cluster-secret-file, and no gossip keys
// (gossip is encrypted under a key derived from the secret). Each attacker
// is a stock serf agent whose grpc tag names a gRPC server of its own that
// serves the Peer service, answering allowed to every check and taking
// every state and lease. Half the agents join with no gossip key: they
// must not join. Half hold the derived gossip key, but not the secret:
// insiders of the gossip that must never enter the ring. Meanwhile the
// legitimate client checks keys of both daemons, each with a limit, on
// the first daemon: every check must be decided by its owner, and exactly
// the limit admitted.
func rogueMember(ctx context.Context, c *config) (*row, error) {
	secret := rand.Text()
	secretFile := filepath.Join(c.tmp, "rogue-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		return nil, err
	}
	gossipKey, err := hkdf.Key(sha256.New, []byte(secret), nil, gossipKeyLabel, 32)
	if err != nil {
		return nil, err
	}
	return rogueAttack(ctx, c, &rogueSetup{
		prefix: "rogue", args: []string{"--cluster-secret-file", secretFile}, gossipKey: gossipKey,
		daemons: "--cluster-secret-file", insider: "the gossip key derived from the secret but not the secret",
	})
}

// rogueMemberTLS is rogueMember under mutual TLS: the daemons' certificates
// carry a peer identity, --peer-identities names it, and --gossip-keys
// encrypts gossip. Each rogue server presents a certificate of the same
// CA without the identity, as the API clients' do.
func rogueMemberTLS(ctx context.Context, c *config) (*row, error) {
	const identity = "spiffe://sluice.test/peer"
	ca, err := testpki.New("sluice-attack CA")
	if err != nil {
		return nil, err
	}
	caFile, err := ca.WriteCAFile(c.tmp, "rogue-ca.crt")
	if err != nil {
		return nil, err
	}
	node, err := ca.IssueCert("node", identity)
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := testpki.WriteCertFiles(c.tmp, "rogue-node", node)
	if err != nil {
		return nil, err
	}
	caller, err := ca.IssueCert("api-client")
	if err != nil {
		return nil, err
	}
	gossipKey := []byte(rand.Text()[:16])
	// The daemons' peer key is derived from the gossip key: the insiders
	// answer the challenge, and only the certificate keeps them out.
	proofKey, err := transport.PeerKey(gossipKey)
	if err != nil {
		return nil, err
	}
	return rogueAttack(ctx, c, &rogueSetup{
		prefix: "rogue-tls",
		args: []string{"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-file", caFile,
			"--peer-identities", identity, "--gossip-keys", base64.StdEncoding.EncodeToString(gossipKey)},
		gossipKey: gossipKey, proofKey: proofKey, rogueTLS: ca.Config(caller), clientTLS: ca.Config(caller),
		daemons: "mutual TLS, --peer-identities and --gossip-keys",
		insider: "the gossip key, so the peer key derived from it, and an API client's certificate of the cluster's CA",
	})
}

// rogueSetup is how a rogue-member attack's daemons and rogues are set up.
type rogueSetup struct {
	prefix    string   // of the daemons' names
	args      []string // the daemons'
	gossipKey []byte   // the insiders'
	proofKey  []byte   // the rogue servers' answer to Prove; nil: a random MAC
	// rogueTLS is the rogue servers' TLS; clientTLS this program's, to the
	// daemons. nil: in the clear.
	rogueTLS, clientTLS *tls.Config
	daemons, insider    string // how the daemons are set up, what the insiders hold
}

// rogueAttack runs a rogue-member attack set up as s.
func rogueAttack(ctx context.Context, c *config, s *rogueSetup) (*row, error) {
	a, b, err := startPair(ctx, c, s.prefix, s.clientTLS, s.args...)
	if err != nil {
		return nil, err
	}
	defer a.stop(stopGrace)
	defer b.stop(stopGrace)
	daemons := []*daemon{a, b}

	rogues, err := startRogues(c.attackers, s.gossipKey, s.proofKey, s.rogueTLS, a.gossip, b.gossip)
	defer rogues.stop()
	if err != nil {
		return nil, err
	}
	watch := newReadyWatch(daemons)
	// Every insider that joined is challenged, and refused, by both
	// daemons before the legitimate client picks its keys.
	listed := watch.waitRefused(ctx, rogues.insidersJoined(), time.Now().Add(startTimeout))

	conn, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pb.NewSluiceClient(conn)
	lk := &limitedKeys{}
	for _, d := range daemons {
		reqs, err := ownedOf(ctx, client, d.name, c.count(rogueKeysEach), rogueRequest)
		if err != nil {
			return nil, err
		}
		for _, req := range reqs {
			lk.add(ownerCheck(conn, req, d.name))
		}
	}

	r := &row{}
	stopWatch := watch.run()
	l := startLegit(lk.check, c.deadline)
	select {
	case <-time.After(c.duration):
	case <-ctx.Done():
	}
	r.legit = l.stop()
	stopWatch()
	refused, metric, reasons := watch.refusedNow()
	checks, states, leases := rogues.received()
	rogues.stop()
	r.proc = worse(a.stop(stopGrace), b.stop(stopGrace))

	half := c.attackers / 2
	outsiders, insiders := c.attackers-half, half
	r.did = fmt.Sprintf("%d stock serf agents, each naming in its grpc tag a gRPC server of its own that answers allowed to every check and takes every state and lease, join two daemons with %s: %d with no gossip key, %d with %s; meanwhile the legitimate client checks %d keys (%d of each daemon), %d per day each, for %v",
		c.attackers, s.daemons, outsiders, insiders, s.insider, len(lk.checks), c.count(rogueKeysEach), rogueLimit, c.duration)
	admitted, exact, over := lk.admitted()
	r.result = fmt.Sprintf("joined gossip: %d of %d without the key, %d of %d insiders; entered a ring: %d (ring members at most %d); refused_members %s%s, sluice_members_refused %s; checks, states, leases at rogue servers: %d, %d, %d; admitted on the legitimate keys: %d, exact %d",
		rogues.outsidersJoined(), outsiders, rogues.insidersJoined(), insiders, max(watch.maxMembers()-len(daemons), 0), watch.maxMembers(),
		strings.Join(refused, "/"), parens(strings.Join(reasons, "; ")), strings.Join(metric, "/"), checks, states, leases, admitted, exact)
	switch {
	case rogues.outsidersJoined() > 0:
		r.miss("%d agents without the gossip key joined the gossip", rogues.outsidersJoined())
	case rogues.insidersJoined() < insiders:
		r.miss("%d of %d insiders joined the gossip: the ring was not attacked", rogues.insidersJoined(), insiders)
	}
	if !listed {
		r.miss("the daemons did not list every insider among refused_members within %v", startTimeout)
	}
	if n := watch.maxMembers(); n > len(daemons) {
		r.miss("a ring had %d members", n)
	}
	if n := checks + states + leases; n > 0 {
		r.miss("the rogue servers received %d checks, states and leases", n)
	}
	if over > 0 {
		r.miss("%d keys admitted more than their limit", over)
	} else if admitted != exact {
		r.miss("admitted %d, want %d", admitted, exact)
	}
	r.judge(c)
	return r, nil
}

// parens is s in parentheses after a space, or "" for "".
func parens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// rogueRequest is a legitimate key with a limit: rogueLimit per
// rogueLimitPeriod, GCRA.
func rogueRequest(i int) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Name: "rogue-member", Key: fmt.Sprintf("key-%d", i), Limit: rogueLimit,
		PeriodNanos: int64(rogueLimitPeriod), Algorithm: pb.Algorithm_ALGORITHM_GCRA}
}

// worse is the worse of two daemons' stats, for one row: the higher peak,
// either killed, either's death.
func worse(x, y *procStats) *procStats {
	w := *x
	w.peak = max(x.peak, y.peak)
	w.killed = x.killed || y.killed
	if w.died == "" {
		w.died = y.died
	}
	return &w
}

// limitedKeys is the legitimate client's round of keys: each check goes to
// the next key. Its counts are the legitimate loop's, read once it stopped.
type limitedKeys struct {
	checkers        []checkFunc
	checks, allowed []int // answered checks and admitted ones, per key
	next            int
}

func (k *limitedKeys) add(check checkFunc) {
	k.checkers = append(k.checkers, check)
	k.checks = append(k.checks, 0)
	k.allowed = append(k.allowed, 0)
}

func (k *limitedKeys) check(ctx context.Context) (bool, error) {
	i := k.next % len(k.checkers)
	k.next++
	ok, err := k.checkers[i](ctx)
	if err == nil {
		k.checks[i]++
		if ok {
			k.allowed[i]++
		}
	}
	return ok, err
}

// admitted returns the hits admitted on every key, what an exact limit
// admits for the checks answered, and how many keys admitted more than
// their limit.
func (k *limitedKeys) admitted() (admitted, exact, over int) {
	for i := range k.checkers {
		admitted += k.allowed[i]
		exact += min(k.checks[i], rogueLimit)
		over += btoi(k.allowed[i] > rogueLimit)
	}
	return admitted, exact, over
}

// rogueSet is the attackers: agent i holds the gossip key when i is odd.
type rogueSet struct {
	peers  []*testrogue.Peer
	stops  []func()
	agents []*serf.Serf
	joined []bool
	once   sync.Once
}

// startRogues starts n rogue servers and joins an agent naming each to
// seeds, all at once; the servers serve under serverTLS when it is not
// nil, and answer proofs under proofKey when it is not nil. On an error, the caller still stops the set.
func startRogues(n int, gossipKey, proofKey []byte, serverTLS *tls.Config, seeds ...string) (*rogueSet, error) {
	s := &rogueSet{peers: make([]*testrogue.Peer, n), stops: make([]func(), n), agents: make([]*serf.Serf, n), joined: make([]bool, n)}
	errs := make([]error, n)
	swarm(n, func(i int) {
		p := &testrogue.Peer{Allow: true, ProofKey: proofKey}
		stop, err := testrogue.ServePeer(p, serverTLS)
		if err != nil {
			errs[i] = err
			return
		}
		s.peers[i], s.stops[i] = p, stop
		var key []byte
		if i%2 == 1 {
			key = gossipKey
		}
		agent, err := testrogue.Join(fmt.Sprintf("rogue-%d", i), p.Addr, key, seeds...)
		if agent == nil {
			errs[i] = fmt.Errorf("rogue agent %d: %w", i, err)
			return
		}
		s.agents[i] = agent
		s.joined[i] = err == nil && agent.NumNodes() > 1
	})
	for _, err := range errs {
		if err != nil {
			return s, err
		}
	}
	return s, nil
}

func (s *rogueSet) insidersJoined() int  { return s.countJoined(1) }
func (s *rogueSet) outsidersJoined() int { return s.countJoined(0) }

// countJoined counts the agents of the parity odd that joined.
func (s *rogueSet) countJoined(odd int) int {
	n := 0
	for i, j := range s.joined {
		n += btoi(j && i%2 == odd)
	}
	return n
}

// received sums what reached the rogue servers.
func (s *rogueSet) received() (checks, states, leases int64) {
	for _, p := range s.peers {
		if p != nil {
			checks, states, leases = checks+p.Checks.Load(), states+p.States.Load(), leases+p.Leases.Load()
		}
	}
	return checks, states, leases
}

// stop shuts the agents and the servers down, once.
func (s *rogueSet) stop() {
	s.once.Do(func() {
		swarm(len(s.agents), func(i int) {
			if s.agents[i] != nil {
				s.agents[i].Shutdown()
			}
			if s.stops[i] != nil {
				s.stops[i]()
			}
		})
	})
}

// readyWatch reads the daemons' /readyz and /metrics: how many ring
// members they report, and which gossip members they refuse.
type readyWatch struct {
	daemons []*daemon
	most    atomic.Int64 // ring members, the most any daemon reported
}

func newReadyWatch(daemons []*daemon) *readyWatch {
	return &readyWatch{daemons: daemons}
}

// readyBody is what the watch reads of /readyz.
type readyBody struct {
	Members int `json:"members"`
	Refused []struct {
		Name   string `json:"name"`
		Reason string `json:"reason"`
	} `json:"refused_members"`
}

// read reads d's /readyz and notes its ring members.
func (w *readyWatch) read(d *daemon) (*readyBody, error) {
	res, err := d.web.Get(d.url("/readyz"))
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var body readyBody
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("/readyz of %s: %w", d.name, err)
	}
	atomicMax(&w.most, int64(body.Members))
	return &body, nil
}

// waitRefused waits until every daemon lists n refused members, or until;
// it reports whether they did.
func (w *readyWatch) waitRefused(ctx context.Context, n int, until time.Time) bool {
	for {
		all := true
		for _, d := range w.daemons {
			body, err := w.read(d)
			all = all && err == nil && len(body.Refused) == n
		}
		if all {
			return true
		}
		if time.Now().After(until) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(watchReadyEvery):
		}
	}
}

// run reads every daemon's /readyz each watchReadyEvery until the
// returned stop is called.
func (w *readyWatch) run() (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(watchReadyEvery)
		defer t.Stop()
		for {
			for _, d := range w.daemons {
				w.read(d)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// maxMembers is the most ring members a daemon reported.
func (w *readyWatch) maxMembers() int { return int(w.most.Load()) }

// refusedNow returns, per daemon, how many members /readyz lists as
// refused and what sluice_members_refused says, and the reasons listed, of
// every daemon, each once.
func (w *readyWatch) refusedNow() (listed, metric, reasons []string) {
	for _, d := range w.daemons {
		l, m := "?", "?"
		if body, err := w.read(d); err == nil {
			l = fmt.Sprint(len(body.Refused))
			for _, r := range body.Refused {
				if !slices.Contains(reasons, r.Reason) {
					reasons = append(reasons, r.Reason)
				}
			}
		}
		if s, err := scrape(d.web, d.url("/metrics")); err == nil {
			m = fmt.Sprint(s["sluice_members_refused"])
		}
		listed, metric = append(listed, l), append(metric, m)
	}
	return listed, metric, reasons
}
