package envoyrls

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A watched directory's rules follow its files: a valid change is made
// current, an invalid one leaves the previous rules in force and is
// reported once, with its file and line, until the files change again.
// The watcher polls when the test ticks, and takes no notifications; the
// test waits for each poll's OnReload or OnError.
func TestWatchDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	limit := func(r *Rules, domain string) uint32 {
		d, ok := r.Domain(domain)
		if !ok {
			return 0
		}
		if m := d.Match([]Entry{{"k", "v"}}); m.Descriptor != nil {
			return m.Descriptor.RateLimit.RequestsPerUnit
		}
		return 0
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	tick := make(chan time.Time)
	reloads := make(chan *Rules, 10)
	failures := make(chan error, 10)
	cfg := DefaultWatchConfig()
	cfg.Tick, cfg.NoNotify = tick, true
	cfg.OnReload = func(r *Rules) { reloads <- r }
	cfg.OnError = func(err error) { failures <- err }
	w, err := WatchDir(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := limit(w.Current(), "a"); got != 1 {
		t.Fatalf("first load: limit %d, want 1", got)
	}

	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	write("b.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
	tick <- time.Time{}
	if r := <-reloads; limit(r, "a") != 2 || limit(r, "b") != 3 || w.Current() != r {
		t.Fatalf("after the change: a %d, b %d", limit(r, "a"), limit(r, "b"))
	}

	write("b.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	tick <- time.Time{}
	if err := <-failures; !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")+":4:") {
		t.Fatalf("invalid edit: %v", err)
	}
	if err := w.Reload(); err == nil { // the same content: not reported again
		t.Error("Reload of the same invalid directory succeeded")
	}
	write("b.yaml", "domain: b\n")
	write("c.yaml", "domain: a\n")
	tick <- time.Time{}
	if err := <-failures; !errors.Is(err, ErrDuplicateDomain) {
		t.Fatalf("duplicate domain: %v", err)
	}
	if got := limit(w.Current(), "b"); got != 3 {
		t.Errorf("after invalid edits: b's limit %d, want the previous 3", got)
	}
	if s := w.Stats(); s.Reloads != 1 || s.Errors != 2 || s.LastError == nil {
		t.Errorf("stats %+v, want 1 reload and 2 errors", s)
	}

	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := <-reloads; limit(r, "b") != 0 || limit(r, "a") != 2 {
		t.Errorf("after the fix: a %d, b %d", limit(r, "a"), limit(r, "b"))
	}
	if err := w.Close(); err != nil {
		t.Error(err)
	}
	if _, err := WatchDir(dir, WatchConfig{PollInterval: time.Millisecond}); !errors.Is(err, ErrInvalidWatchConfig) {
		t.Errorf("a 1ms poll: %v", err)
	}
}
