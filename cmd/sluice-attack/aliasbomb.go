package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// The child process: this program, run with childEnv set, loads the rule
// file named by rulesFileEnv and prints "loaded: <n> rules" or
// "error: <error>", then "peak: <bytes>", its VmHWM: it may finish before
// its parent's watch has read it.
const (
	childEnv     = "SLUICE_ATTACK_CHILD"
	rulesFileEnv = "SLUICE_ATTACK_RULES_FILE"
	childRules   = "rules-load"
)

// The alias bomb: aliasDepth levels, each a list of aliasWidth aliases
// of the level below.
const (
	aliasWidth   = 200
	aliasDepth   = 40
	childTimeout = time.Minute
)

// childMain runs the child's work when the environment asks for it, and
// reports whether it did.
func childMain(stdout io.Writer) (code int, ok bool) {
	if os.Getenv(childEnv) != childRules {
		return 0, false
	}
	set, err := rules.Load(os.Getenv(rulesFileEnv))
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		fmt.Fprintln(stdout, "error:", msg)
	} else {
		fmt.Fprintf(stdout, "loaded: %d rules\n", set.Len())
	}
	if hwm, _, err := readMemory(os.Getpid()); err == nil {
		fmt.Fprintf(stdout, "peak: %d\n", hwm)
	}
	return 0, true
}

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

// rulesAliasBomb: rules.Load of a YAML alias bomb in a child process of
// this program, whose peak RSS is measured. The daemon loads no rule file
// yet, so this attack cannot be sent to it. The load must fail.
func rulesAliasBomb(ctx context.Context, c *config) (*row, error) {
	const name = "alias-bomb.yaml"
	path := filepath.Join(c.tmp, name)
	data := aliasBomb(aliasWidth, aliasDepth)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+childRules, rulesFileEnv+"="+path)
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := startProc(cmd, "child", c.rssCap)
	if err != nil {
		return nil, err
	}
	st := p.await(childTimeout)
	said, peak, _ := strings.Cut(strings.TrimSpace(strings.ReplaceAll(out.String(), path, name)), "\npeak: ")
	if b, err := strconv.ParseInt(peak, 10, 64); err == nil {
		st.peak = max(st.peak, b)
	}
	r := &row{proc: st, result: said}
	r.did = fmt.Sprintf("rules.Load, in a child process, of a %s YAML alias bomb: %d levels of %d aliases of the level below", size(int64(len(data))), aliasDepth, aliasWidth)
	switch {
	case strings.HasPrefix(said, "loaded:"):
		r.miss("the alias bomb was loaded")
	case !strings.HasPrefix(said, "error:"):
		r.result = "no result: " + said
		r.miss("the child did not report an error")
	}
	r.judge(c)
	return r, nil
}
