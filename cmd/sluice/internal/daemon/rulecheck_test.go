package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/rules"
)

// checkRules are the rules of the descriptor tests: a token bucket per
// user on the free plan, a fixed window per organisation, and a shadow
// GCRA per client IP on logins.
const checkRules = `rules:
  - name: per_user
    match: {descriptors: {plan: free}}
    key: [user]
    algorithm: token_bucket
    limit: 3
    period: 1h
  - name: per_org
    match: {descriptors: {org: "*"}}
    key: [descriptor:org]
    algorithm: fixed_window
    limit: 5
    period: 1h
  - name: login_per_ip
    match: {routes: ["/login"], methods: [POST], headers: {X-Client: "*"}}
    key: [ip]
    algorithm: gcra
    limit: 1
    period: 1h
    shadow: true
`

// rulesStart is where the clocks of the descriptor tests stand: 800s into
// an hour, so that per_org's window ends in 2800s.
var rulesStart = time.Unix(1_700_000_000, 0)

// writeRules writes text to path the way a deployment should: to a
// temporary file renamed over path, so that no reader sees half of it.
func writeRules(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// rulesConfig is testConfig with rules_file set to a new file holding text.
func rulesConfig(t *testing.T, name, text string) Config {
	t.Helper()
	cfg := testConfig(name)
	cfg.RulesFile = filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, cfg.RulesFile, text)
	return cfg
}

// fastRulesPoll polls the rule file as often as rules allows, beside the
// file system's notifications, so that a missed notification costs a
// test a tenth of a second.
func fastRulesPoll(wc *rules.WatchConfig) { wc.PollInterval = rules.MinPollInterval }

// rulesBody is the body of a descriptor check of user in org on plan;
// empty values are left out, and hits < 0 means absent.
func rulesBody(user, plan, org string, hits int64) string {
	var parts []string
	if user != "" {
		parts = append(parts, fmt.Sprintf(`"user":%q`, user))
	}
	var ds []string
	if plan != "" {
		ds = append(ds, fmt.Sprintf(`"plan":%q`, plan))
	}
	if org != "" {
		ds = append(ds, fmt.Sprintf(`"org":%q`, org))
	}
	if len(ds) > 0 {
		parts = append(parts, `"descriptors":{`+strings.Join(ds, ",")+`}`)
	}
	if hits >= 0 {
		parts = append(parts, fmt.Sprintf(`"hits":%d`, hits))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// postRules sends a descriptor check and decodes a 200 answer; it returns
// an error rather than failing, for use from several goroutines.
func postRules(base, body string) (RulesDecision, error) {
	resp, err := probe.Post(base+"/v1/rules/check", "application/json", strings.NewReader(body))
	if err != nil {
		return RulesDecision{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return RulesDecision{}, err
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		return RulesDecision{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var out RulesDecision
	if err := json.Unmarshal(b, &out); err != nil {
		return RulesDecision{}, fmt.Errorf("%v: %s", err, b)
	}
	if out.Rules == nil {
		return RulesDecision{}, fmt.Errorf("rules is null, want a list: %s", b)
	}
	return out, nil
}

func mustPostRules(t *testing.T, base, body string) RulesDecision {
	t.Helper()
	out, err := postRules(base, body)
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return out
}

// summary writes a descriptor decision on one line: "allowed" or "denied
// retry=<ms>", then per rule "name[key] ok|no r=<remaining> t=<reset
// after ms>", with "retry=<ms>" when it rejects and "shadow" for a
// shadow rule.
func summary(d RulesDecision) string {
	var b strings.Builder
	if d.Allowed {
		b.WriteString("allowed")
	} else {
		fmt.Fprintf(&b, "denied retry=%d", d.RetryAfterMs)
	}
	if d.DelayMs > 0 {
		fmt.Fprintf(&b, " delay=%d", d.DelayMs)
	}
	for _, r := range d.Rules {
		verdict := "ok"
		if !r.Allowed {
			verdict = "no"
		}
		fmt.Fprintf(&b, "; %s[%s] %s r=%d t=%d", r.Name, r.Key, verdict, r.Remaining, r.ResetAfterMs)
		if !r.Allowed {
			fmt.Fprintf(&b, " retry=%d", r.RetryAfterMs)
		}
		if r.Shadow {
			b.WriteString(" shadow")
		}
	}
	return b.String()
}

// A request described by its user, descriptors, route, method, IP and
// headers is checked against every rule that applies, all or nothing, and
// the answer gives each rule's decision: the same steps, with the same
// answers, through POST /v1/rules/check and the Rules service. The clock
// stands still, so every value is exact.
func TestRulesCheckEndpoint(t *testing.T) {
	for _, tr := range rulesTransports {
		t.Run(tr.name, func(t *testing.T) { testRulesCheck(t, tr) })
	}
}

func testRulesCheck(t *testing.T, tr rulesTransport) {
	clk := fakeclock.New(rulesStart)
	d := start(t, rulesConfig(t, "rules-check", checkRules), WithClock(clk.Now))
	base := "http://" + d.HTTPAddr()
	check := tr.dial(t, d, clk.Now)
	login := func(ip, method string) string {
		return fmt.Sprintf(`{"route":"/login","method":%q,"ip":%q,"headers":{"x-client":"app"}}`, method, ip)
	}
	steps := []struct {
		name, body, want string
	}{
		{"first hit", rulesBody("u1", "free", "o1", -1),
			"allowed; per_user[user=u1] ok r=2 t=1200000; per_org[descriptor:org=o1] ok r=4 t=2800000"},
		{"cost 2 empties u1's bucket", rulesBody("u1", "free", "o1", 2),
			"allowed; per_user[user=u1] ok r=0 t=3600000; per_org[descriptor:org=o1] ok r=2 t=2800000"},
		{"u1 is limited by per_user, and per_org is not charged", rulesBody("u1", "free", "o1", -1),
			"denied retry=1200000; per_user[user=u1] no r=0 t=3600000 retry=1200000; per_org[descriptor:org=o1] ok r=2 t=2800000"},
		{"cost 3 fits per_user, not per_org: nothing stays consumed", rulesBody("u2", "free", "o1", 3),
			"denied retry=2800000; per_user[user=u2] ok r=3 t=0; per_org[descriptor:org=o1] no r=2 t=2800000 retry=2800000"},
		{"cost 2 fits both", rulesBody("u2", "free", "o1", 2),
			"allowed; per_user[user=u2] ok r=1 t=2400000; per_org[descriptor:org=o1] ok r=0 t=2800000"},
		{"o1 is spent for u3 too", rulesBody("u3", "free", "o1", -1),
			"denied retry=2800000; per_user[user=u3] ok r=3 t=0; per_org[descriptor:org=o1] no r=0 t=2800000 retry=2800000"},
		{"another org", rulesBody("u3", "free", "o2", -1),
			"allowed; per_user[user=u3] ok r=2 t=1200000; per_org[descriptor:org=o2] ok r=4 t=2800000"},
		{"the pro plan has no per_user limit", rulesBody("u4", "pro", "o2", -1),
			"allowed; per_org[descriptor:org=o2] ok r=3 t=2800000"},
		{"no user: per_user does not apply", rulesBody("", "free", "", -1), "allowed"},
		{"hits 0 peeks", rulesBody("u3", "free", "o2", 0),
			"allowed; per_user[user=u3] ok r=2 t=1200000; per_org[descriptor:org=o2] ok r=3 t=2800000"},
		{"a cost over per_user's capacity never fits", rulesBody("u5", "free", "o3", 4),
			"denied retry=0; per_user[user=u5] no r=3 t=0 retry=0; per_org[descriptor:org=o3] ok r=5 t=0"},
		{"a shadow rule admits", login("192.0.2.7", "post"),
			"allowed; login_per_ip[ip=192.0.2.7] ok r=0 t=3600000 shadow"},
		{"a shadow rule rejects, the request is allowed", login("::ffff:192.0.2.7", "POST"),
			"allowed; login_per_ip[ip=192.0.2.7] no r=0 t=3600000 retry=3600000 shadow"},
		{"an IPv6 client's zone is dropped", login("fe80::1%eth0", "POST"),
			"allowed; login_per_ip[ip=fe80::1] ok r=0 t=3600000 shadow"},
		{"another zone is the same client", login("fe80::1%eth1", "POST"),
			"allowed; login_per_ip[ip=fe80::1] no r=0 t=3600000 retry=3600000 shadow"},
		{"another method matches no rule", login("192.0.2.7", "GET"), "allowed"},
		{"no header matches no rule", `{"route":"/login","method":"POST","ip":"192.0.2.7"}`, "allowed"},
	}
	for _, s := range steps {
		got, err := check(s.body)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if sum := summary(got); sum != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.name, sum, s.want)
		}
		for _, r := range got.Rules {
			if r.Owner != "rules-check" || r.WithoutOwner || r.Limit == 0 || r.ResetAt == "" && r.ResetAfterMs != 0 {
				t.Errorf("%s: rule %+v", s.name, r)
			}
		}
	}
	httpChecks, allowed, limited := float64(len(steps)), 13.0, 4.0
	if tr.name != "http" { // the HTTP API's counters count none of them
		httpChecks, allowed, limited = 0, 0, 0
	}
	m := scrape(t, base)
	for series, want := range map[string]float64{
		`sluice_http_requests_total{code="200",endpoint="/v1/rules/check"}`: httpChecks,
		`sluice_http_check_items_total{result="allowed"}`:                   allowed,
		`sluice_http_check_items_total{result="limited"}`:                   limited,
		`sluice_rules`:                     3,
		`sluice_rules_reloads_total`:       0,
		`sluice_rules_reload_errors_total`: 0,
	} {
		if got := m[series]; got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// Every invalid input is answered 400 with a problem naming the field,
// before anything is built from it.
func TestRulesCheckInvalidInput(t *testing.T) {
	d := start(t, rulesConfig(t, "rules-invalid", checkRules))
	base := "http://" + d.HTTPAddr()
	many := func(n int) string {
		entries := make([]string, n)
		for i := range entries {
			entries[i] = fmt.Sprintf(`"d%d":"v"`, i)
		}
		return `{"descriptors":{` + strings.Join(entries, ",") + `}}`
	}
	long := strings.Repeat("x", 1025)
	post := func(name, body string, status int, field, code, detail string) checkStep {
		return checkStep{name: name, method: http.MethodPost, path: "/v1/rules/check", body: body,
			wantStatus: status, wantField: field, wantCode: code, wantInDetail: detail}
	}
	runSteps(t, base, []checkStep{
		post("empty body", "", 400, "", "", "empty"),
		post("not an object", `[]`, 400, "", "invalid_argument", "want a JSON object"),
		post("malformed", `{"user":`, 400, "", "invalid_argument", "malformed JSON"),
		post("unknown field", `{"domain":"api"}`, 400, "domain", "invalid_argument", `unknown field "domain"`),
		post("user not a string", `{"user":5}`, 400, "user", "invalid_argument", "want a string"),
		post("route too long", `{"route":"`+long+`"}`, 400, "route", "invalid_argument", "1025 bytes, more than 1024"),
		post("user too long", `{"user":"`+long+`"}`, 400, "user", "invalid_argument", "1025 bytes"),
		post("method not a token", `{"method":"GE T"}`, 400, "method", "invalid_argument", "not an HTTP token"),
		post("method too long", `{"method":"`+strings.Repeat("M", 129)+`"}`, 400, "method", "invalid_argument", "more than 128"),
		post("bad ip", `{"ip":"999.0.0.1"}`, 400, "ip", "invalid_argument", "not an IPv4 or IPv6 address"),
		post("a CIDR is no ip", `{"ip":"10.0.0.0/8"}`, 400, "ip", "invalid_argument", "not an IPv4 or IPv6 address"),
		post("negative hits", `{"hits":-1}`, 400, "hits", "invalid_hits", "negative"),
		post("fractional hits", `{"hits":1.5}`, 400, "hits", "invalid_hits", ""),
		post("descriptors not an object", `{"descriptors":["plan","free"]}`, 400, "descriptors", "invalid_argument", "want an object"),
		post("descriptor not a string", `{"descriptors":{"plan":1}}`, 400, "descriptors.plan", "invalid_argument", "want a string"),
		post("descriptor an object", `{"descriptors":{"plan":{"a":"b"}}}`, 400, "descriptors.plan", "invalid_argument", "want a string"),
		post("descriptor given twice", `{"descriptors":{"plan":"free","plan":"pro"}}`, 400, "descriptors.plan", "invalid_argument", "given twice"),
		post("empty descriptor name", `{"descriptors":{"":"x"}}`, 400, "descriptors", "invalid_argument", "empty"),
		post("descriptor name too long", `{"descriptors":{"`+strings.Repeat("n", 129)+`":"x"}}`, 400, "descriptors", "invalid_argument", "129 bytes, more than 128"),
		post("descriptor value too long", `{"descriptors":{"plan":"`+long+`"}}`, 400, "descriptors.plan", "invalid_argument", "1025 bytes"),
		post("too many descriptors", many(MaxRulesDescriptors+1), 400, "descriptors", "invalid_argument", "more than 64 entries"),
		post("header name not a token", `{"headers":{"X A":"1"}}`, 400, "headers", "invalid_argument", "not an HTTP header name"),
		post("header given twice in another case", `{"headers":{"x-a":"1","X-A":"2"}}`, 400, "headers.X-A", "invalid_argument", "given twice"),
		post("invalid UTF-8 in a descriptor", `{"descriptors":{"key":"a`+"\xff"+`"}}`, 400, "descriptors.key", "invalid_argument", "not valid UTF-8"),
		post("a lone surrogate in a descriptor name", `{"descriptors":{"\ud800":"x"}}`, 400, "descriptors", "invalid_argument", "surrogate"),
		{name: "GET", method: http.MethodGet, path: "/v1/rules/check", wantStatus: 405},
	})
	// The largest valid request is served.
	if got := mustPostRules(t, base, many(MaxRulesDescriptors)); !got.Allowed {
		t.Errorf("64 descriptors: %s", summary(got))
	}
	if m := scrape(t, base); m[`sluice_http_check_items_total{result="invalid"}`] != 24 {
		t.Errorf("invalid items %v, want 24: every 400 but the empty body's", m[`sluice_http_check_items_total{result="invalid"}`])
	}
}

// A daemon without rules_file refuses descriptor checks, naming why, and
// serves checks that carry their own limit as before.
func TestRulesCheckWithoutRulesFile(t *testing.T) {
	d := start(t, testConfig("no-rules"))
	base := "http://" + d.HTTPAddr()
	runSteps(t, base, []checkStep{
		{name: "no rules_file", method: http.MethodPost, path: "/v1/rules/check", body: rulesBody("u1", "free", "o1", -1),
			wantStatus: 404, wantCode: "rules_not_configured", wantInDetail: "no rules_file is configured"},
		{name: "a check with its own limit", body: `{"name":"api","key":"k","limit":2,"period":"1h","algorithm":"gcra"}`,
			wantStatus: 200, wantAllowed: true, wantRemaining: 1},
	})
}

// A rule file that cannot be used fails New with an error that names the
// setting, the file and the line, and leaves nothing running (goleak).
func TestRulesFileRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeRules(t, bad, "rules:\n  - name: r\n    algorithm: gcra\n    limit: -1\n    period: 1m\n")
	empty := filepath.Join(dir, "empty.yaml")
	writeRules(t, empty, "")
	for _, tt := range []struct {
		name, file string
		want       error
		inText     string
	}{
		{"invalid limit", bad, rules.ErrInvalidLimit, bad + ":4:"},
		{"empty file", empty, rules.ErrEmptyDocument, empty},
		{"missing file", filepath.Join(dir, "missing.yaml"), fs.ErrNotExist, filepath.Join(dir, "missing.yaml")},
	} {
		cfg := testConfig("bad-rules")
		cfg.RulesFile = tt.file
		d, err := New(cfg, WithLogOutput(io.Discard))
		if err == nil {
			d.Close()
			t.Errorf("%s: New succeeded", tt.name)
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "rules_file" || !errors.Is(err, tt.want) || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.inText) {
			t.Errorf("%s: New = %v, want a rules_file *ConfigError wrapping %v and naming %q", tt.name, err, tt.want, tt.inText)
		}
	}
	// A failure after the rules were loaded stops their watcher.
	taken := start(t, testConfig("taken-http"))
	cfg := rulesConfig(t, "second", checkRules)
	cfg.HTTPAddr = taken.HTTPAddr()
	if _, err := New(cfg, WithLogOutput(io.Discard)); err == nil || !strings.Contains(err.Error(), "http_addr") {
		t.Errorf("New on a taken port = %v", err)
	}
}

// An edit of the rule file takes effect without a restart; an invalid
// edit is logged and the last good rules stay in force, until the file is
// fixed.
func TestRulesHotReload(t *testing.T) {
	clk := fakeclock.New(rulesStart)
	var logs lockedBuffer
	cfg := rulesConfig(t, "rules-reload", checkRules)
	d := start(t, cfg, WithClock(clk.Now), WithRulesWatch(fastRulesPoll), WithLogOutput(&logs))
	base := "http://" + d.HTTPAddr()
	peek := rulesBody("u1", "free", "", 0)
	userLimit := func() int64 {
		got := mustPostRules(t, base, peek)
		if len(got.Rules) != 1 {
			t.Fatalf("peek: %s", summary(got))
		}
		return got.Rules[0].Limit
	}
	if l := userLimit(); l != 3 {
		t.Fatalf("per_user limit %d, want 3", l)
	}

	writeRules(t, cfg.RulesFile, strings.Replace(checkRules, "limit: 3", "limit: 7", 1))
	testwait.For(t, "per_user's limit to become 7", func() bool { return userLimit() == 7 })
	got := mustPostRules(t, base, rulesBody("u1", "free", "", 1))
	if sum := summary(got); sum != "allowed; per_user[user=u1] ok r=6 t=514286" {
		t.Errorf("a hit under the new limit: %s", sum)
	}

	broken := strings.Replace(checkRules, "limit: 3", "limit: -7", 1) // line 6
	writeRules(t, cfg.RulesFile, broken)
	// The watcher counts the failure, then logs it with its file and line.
	testwait.For(t, "the bad edit to be logged with its file and line", func() bool {
		return strings.Contains(logs.String(), "keeping the previous rules") && strings.Contains(logs.String(), cfg.RulesFile+":6:")
	})
	if l := userLimit(); l != 7 {
		t.Errorf("after a bad edit per_user's limit is %d, want the last good 7", l)
	}
	if m := scrape(t, base); m["sluice_rules_reload_errors_total"] < 1 || m["sluice_rules_reloads_total"] != 1 || m["sluice_rules"] != 3 {
		t.Errorf("metrics after a bad edit: errors %v reloads %v rules %v", m["sluice_rules_reload_errors_total"], m["sluice_rules_reloads_total"], m["sluice_rules"])
	}

	writeRules(t, cfg.RulesFile, strings.Replace(checkRules, "limit: 3", "limit: 9", 1))
	testwait.For(t, "per_user's limit to become 9", func() bool { return userLimit() == 9 })
}

// startThree starts a cluster of three daemons, named prefix-0 to -2,
// each with testConfig changed by mod, and waits until each sees the
// three.
func startThree(t *testing.T, prefix string, mod func(*Config), opts ...Option) []*Daemon {
	t.Helper()
	var ds []*Daemon
	for i := range 3 {
		cfg := testConfig(fmt.Sprintf("%s-%d", prefix, i))
		mod(&cfg)
		if i > 0 {
			cfg.Join = []string{ds[0].GossipAddr()}
		}
		ds = append(ds, start(t, cfg, opts...))
	}
	waitSettled(t, ds)
	return ds
}

// keysOnEveryNode returns n values v whose counters name/keyPrefix+v live
// on each of the nodes of node's ring, one per node first.
func keysOnEveryNode(node *cluster.Node, name, keyPrefix string, n int) []string {
	var vs []string
	owned := map[string]bool{}
	for i := 0; len(owned) < len(node.RingMembers()); i++ {
		v := fmt.Sprintf("user-%d", i)
		if owner, _ := node.Owner(name, keyPrefix+v); !owned[owner.Name] {
			owned[owner.Name] = true
			vs = append(vs, v)
		}
	}
	for i := 0; len(vs) < n; i++ {
		vs = append(vs, fmt.Sprintf("more-%d", i))
	}
	return vs
}

// Descriptor checks sent to every daemon of a cluster of three hold each
// limit exactly, through POST /v1/rules/check and through the Rules
// service: the node that receives a check forwards each rule's counter to
// its owner.
func TestRulesLimitAcrossCluster(t *testing.T) {
	for _, tr := range rulesTransports {
		t.Run(tr.name, func(t *testing.T) { testRulesLimitAcrossCluster(t, tr) })
	}
}

func testRulesLimitAcrossCluster(t *testing.T, tr rulesTransport) {
	clk := fakeclock.New(rulesStart)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, checkRules)
	ds := startThree(t, "rules-"+tr.name, func(c *Config) { c.RulesFile = file }, WithClock(clk.Now))
	node := ds[0].Node()
	checks := make([]func(string) (RulesDecision, error), len(ds))
	for i, d := range ds {
		checks[i] = tr.dial(t, d, clk.Now)
	}
	mustCheck := func(i int, body string) RulesDecision {
		t.Helper()
		got, err := checks[i](body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return got
	}
	users := keysOnEveryNode(node, serverNamePrefix+"per_user", "user=", 6)

	// Each user sends 5 checks at the three daemons in turn, all users at
	// once: per_user admits exactly 3 of each.
	var wg sync.WaitGroup
	errs := make(chan error, len(users))
	for _, u := range users {
		wg.Go(func() {
			owner, _ := node.Owner(serverNamePrefix+"per_user", "user="+u)
			allowed := 0
			for i := range 5 {
				got, err := checks[i%3](rulesBody(u, "free", "", -1))
				if err != nil {
					errs <- err
					return
				}
				if len(got.Rules) != 1 || got.Rules[0].Owner != owner.Name || got.Rules[0].WithoutOwner {
					errs <- fmt.Errorf("%s: %+v, want per_user decided by %s", u, got, owner.Name)
					return
				}
				if got.Allowed {
					allowed++
				}
			}
			if allowed != 3 {
				errs <- fmt.Errorf("%s: %d of 5 admitted, want 3", u, allowed)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Two rules at once, across the daemons: four users of one org send 4
	// checks each; per_org admits 5 in all, and a check it rejects
	// leaves the user's bucket as it was.
	var got []string
	for i, u := range []string{"a", "b", "c", "d"} {
		for j := range 4 {
			v := mustCheck((i+j)%3, rulesBody(u, "free", "org-1", -1))
			if v.Allowed {
				got = append(got, u)
			}
		}
	}
	if strings.Join(got, "") != "aaabb" {
		t.Errorf("admitted %q, want aaabb: a's 3, then b's 2 of the org's 5", strings.Join(got, ""))
	}
	for i, d := range ds {
		v := mustCheck(i, rulesBody("c", "free", "org-1", 0))
		if sum := summary(v); !strings.Contains(sum, "per_user[user=c] ok r=3 t=0") || !strings.Contains(sum, "per_org[descriptor:org=org-1] no r=0") {
			t.Errorf("%s: c after the org was spent: %s", d.Config().NodeName, sum)
		}
	}
}

// The example rule files, examples/daemon/rules.yaml and the one in its
// README, are valid.
func TestExampleRules(t *testing.T) {
	if _, err := rules.Load("../../../../examples/daemon/rules.yaml"); err != nil {
		t.Error(err)
	}
	readme, err := os.ReadFile("../../../../examples/daemon/README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(# rules.yaml\n.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("no rules.yaml block in the README")
	}
	if set, err := rules.Parse("README.md", m[1]); err != nil || set.Len() != 2 {
		t.Errorf("the README's rules: %d rules, %v", set.Len(), err)
	}
}
