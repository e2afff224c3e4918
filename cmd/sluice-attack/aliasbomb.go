package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The alias bomb: aliasDepth levels, each a list of aliasWidth aliases
// of the level below.
const (
	aliasWidth = 200
	aliasDepth = 40
	// refusalTimeout bounds a daemon that must refuse to start.
	refusalTimeout = time.Minute
	// reloadTimeout bounds the wait, after the hostile phase, for each
	// watched file's refused reload.
	reloadTimeout = 30 * time.Second
)

// aliasBomb returns a YAML document whose rules, aliases expanded, are
// width^depth nodes ("billion laughs").
func aliasBomb(width, depth int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "a0: &a0 [%s]\n", strings.TrimSuffix(strings.Repeat("lol, ", width), ", "))
	for i := 1; i < depth; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), width), ", "))
	}
	fmt.Fprintf(&b, "rules: *a%d\n", depth-1)
	return b.Bytes()
}

// The files a daemon under yaml-alias-bomb starts with: one rule and one
// Envoy domain, both valid; the attackers replace them with bombs.
const (
	validRules = "rules:\n  - name: attack-rule\n    algorithm: gcra\n    limit: 5\n    period: 1m\n    match: {routes: [/never]}\n"
	validEnvoy = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
)

// yamlAliasBomb: one YAML alias bomb against each of the daemon's three
// YAML readers. A daemon started with it as its --config, as its
// --rules-file and as a file of its --envoy-config-dir must refuse to
// start, naming file:line:col. Then a daemon started with valid files
// has them replaced by bombs (each a new text: a comment differs) by the
// attackers, half the rule file and half the Envoy file, for the hostile
// phase: every reload must fail and what was in force stay, while the
// legitimate client is answered.
func yamlAliasBomb(ctx context.Context, c *config) (*row, error) {
	data := aliasBomb(aliasWidth, aliasDepth)
	bomb := filepath.Join(c.tmp, "bomb.yaml")
	envoyBomb := filepath.Join(c.tmp, "bomb-envoy")
	if err := writeAtomically(bomb, data); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(envoyBomb, 0o700); err != nil {
		return nil, err
	}
	if err := writeAtomically(filepath.Join(envoyBomb, "bomb.yaml"), data); err != nil {
		return nil, err
	}
	var refusals []string
	var starts []*procStats
	for _, s := range []struct{ flag, path string }{
		{"--config", bomb}, {"--rules-file", bomb}, {"--envoy-config-dir", envoyBomb},
	} {
		said, st, err := refusedAtStart(ctx, c, s.flag, s.path, "bomb.yaml")
		if err != nil {
			return nil, err
		}
		refusals = append(refusals, fmt.Sprintf("%s: %s (peak %s)", s.flag, said, mb(st.peak)))
		st.what = "sluice serve " + s.flag
		starts = append(starts, st)
	}

	rulesFile := filepath.Join(c.tmp, "bomb-target-rules.yaml")
	envoyDir := filepath.Join(c.tmp, "bomb-target-envoy")
	if err := os.MkdirAll(envoyDir, 0o700); err != nil {
		return nil, err
	}
	if err := writeAtomically(rulesFile, []byte(validRules)); err != nil {
		return nil, err
	}
	if err := writeAtomically(filepath.Join(envoyDir, "api.yaml"), []byte(validEnvoy)); err != nil {
		return nil, err
	}
	args := []string{"--rules-file", rulesFile, "--envoy-config-dir", envoyDir}
	r, err := onDaemon(ctx, c, "yaml-alias-bomb", args, overGRPC, func(t *target, r *row) error {
		var failed tally
		writes := c.rounds(ctx, c.count(20_000), c.hostile(), func(i, k int) {
			path := rulesFile
			if i%2 == 1 {
				path = filepath.Join(envoyDir, "api.yaml")
			}
			text := append(append([]byte(nil), data...), fmt.Sprintf("# attacker %d, write %d\n", i, k)...)
			if err := writeAtomically(path, text); err != nil {
				failed.addErr("write failed", err)
			}
		})
		m, err := waitMetrics(ctx, t.d, func(m map[string]float64) bool {
			return m["sluice_rules_reload_errors_total"] > 0 && m["sluice_envoy_config_reload_errors_total"] > 0
		})
		r.did = fmt.Sprintf("a %s YAML alias bomb (%d levels of %d aliases of the level below, a billion laughs many times over) as --config, --rules-file and a file of --envoy-config-dir of daemons starting; then %d attackers write it over the rule file and the Envoy file of a running daemon, each write a new text",
			size(int64(len(data))), aliasDepth, aliasWidth, c.attackers)
		r.result = fmt.Sprintf("refused at start: %s; running: %s bombs written%s, reloads refused: rules %.0f, envoy %.0f; made current: rules %.0f, envoy %.0f; in force: %.0f rule, %.0f domain",
			strings.Join(refusals, "; "), thousands(writes), failedWrites(&failed),
			m["sluice_rules_reload_errors_total"], m["sluice_envoy_config_reload_errors_total"],
			m["sluice_rules_reloads_total"], m["sluice_envoy_config_reloads_total"], m["sluice_rules"], m["sluice_envoy_domains"])
		switch {
		case err != nil:
			r.miss("%v", err)
		case m["sluice_rules_reloads_total"] > 0 || m["sluice_envoy_config_reloads_total"] > 0:
			r.miss("a bomb was made current")
		case m["sluice_rules"] != 1 || m["sluice_envoy_domains"] != 1:
			r.miss("what was in force did not stay")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, st := range starts {
		judgeStart(r, st, c)
	}
	return r, nil
}

func failedWrites(t *tally) string {
	if t.sum() == 0 {
		return ""
	}
	return " (" + t.String() + ")"
}

// refusedAtStart runs `sluice serve` with flag naming path, which must
// exit at start with an error that names the bomb's file (file), line and
// column; it returns that error's text and the process's stats. Its peak
// is the largest VmHWM read while it ran or, when it exited before one was
// read, its rusage's maxrss: an upper bound, in which Linux counts the
// memory of this program the child was forked from.
func refusedAtStart(ctx context.Context, c *config, flag, path, file string) (string, *procStats, error) {
	cmd := exec.CommandContext(ctx, c.sluice, "serve", flag, path, "--node-name", "bomb",
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = daemonEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := startProc(cmd, "sluice serve "+flag, c.rssCap)
	if err != nil {
		return "", nil, err
	}
	st := p.await(refusalTimeout)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && st.peak == 0 {
		st.peak = ru.Maxrss << 10
	}
	said := "no refusal naming the bomb: " + lastLine(out.String())
	if line := refusal(out.String(), file); line != "" {
		said = "exit " + strconv.Itoa(cmd.ProcessState.ExitCode()) + ", " + line
	}
	return strings.ReplaceAll(said, filepath.Dir(path)+"/", ""), st, nil
}

// refusal returns the line of out that reports the bomb at a position
// (file:line:col), trimmed to the position and what follows it.
func refusal(out, file string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, file+":")
		if i < 0 || !strings.Contains(line, "expands the document beyond") {
			continue
		}
		if j := strings.LastIndex(line[:i], " "); j >= 0 {
			i = j + 1
		}
		return strings.TrimRight(line[i:], `"}`)
	}
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// judgeStart records the targets of a daemon that must refuse to start:
// it exited on its own, with the refusal, below the RSS target.
func judgeStart(r *row, st *procStats, c *config) {
	switch {
	case st.killed:
		r.miss("%s passed -rss-cap (%d MB) and was killed", st.what, c.rssCap/megabyte)
	case st.peak >= c.rssTarget:
		r.miss("%s: peak RSS %s", st.what, mb(st.peak))
	case st.died != "":
		r.miss("%s %s", st.what, st.died)
	}
	if strings.Contains(r.result, st.what+": no refusal") {
		r.miss("%s did not refuse the bomb naming file:line:col", st.what)
	}
}

// writeAtomically replaces path with data by a rename, as editors and
// ConfigMap volumes do, so that a watcher never reads half a file. The
// temporary file's name starts with '.', which the Envoy directory's
// reader skips.
func writeAtomically(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// waitMetrics scrapes the daemon's /metrics until done holds of the
// unlabelled series, or reloadTimeout passes; it returns the last scrape.
func waitMetrics(ctx context.Context, d *daemon, done func(map[string]float64) bool) (map[string]float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	until := time.Now().Add(reloadTimeout)
	var m map[string]float64
	var err error
	for {
		m, err = scrape(client, "http://"+d.httpAddr+"/metrics")
		if err == nil && done(m) {
			return m, nil
		}
		if time.Now().After(until) || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("the refused reloads did not show on /metrics within %v", reloadTimeout)
			}
			return m, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scrape reads the unlabelled series of a Prometheus text exposition.
func scrape(client *http.Client, url string) (map[string]float64, error) {
	res, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", url, res.StatusCode)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(res.Body, 64<<20))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			m[name] = v
		}
	}
	return m, sc.Err()
}
