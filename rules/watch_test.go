package rules

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// waitTimeout bounds every wait on the watcher; no test sleeps.
const waitTimeout = 10 * time.Second

func ruleFile(limit int) string {
	return "rules:\n  - name: api\n    algorithm: token_bucket\n    limit: " + strconv.Itoa(limit) + "\n    period: 1m\n"
}

// replace writes content to a temporary file in path's directory and
// renames it onto path, as editors and config tools do.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type watchEvents struct {
	reloads chan *Set
	errs    chan error
}

func newWatchEvents(cfg *WatchConfig) *watchEvents {
	ev := &watchEvents{reloads: make(chan *Set, 16), errs: make(chan error, 16)}
	cfg.OnReload = func(s *Set) { ev.reloads <- s }
	cfg.OnError = func(err error) { ev.errs <- err }
	return ev
}

func (ev *watchEvents) reload(t *testing.T) *Set {
	t.Helper()
	select {
	case s := <-ev.reloads:
		return s
	case err := <-ev.errs:
		t.Fatalf("reload failed: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("no reload")
	}
	return nil
}

func (ev *watchEvents) failure(t *testing.T) error {
	t.Helper()
	select {
	case s := <-ev.reloads:
		t.Fatalf("reloaded %d rules, want a failure", s.Len())
	case err := <-ev.errs:
		return err
	case <-time.After(waitTimeout):
		t.Fatal("no failure reported")
	}
	return nil
}

func limitOf(t *testing.T, s *Set) int64 {
	t.Helper()
	r, ok := s.Rule("api")
	if !ok {
		t.Fatal("rule api missing")
	}
	return r.Limit
}

// Notifications: a rename onto the file applies the new limits; a broken
// version keeps the old ones and is reported with its position.
func TestWatchNotify(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(ruleFile(10)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultWatchConfig()
	cfg.PollInterval = time.Hour // notifications only
	cfg.Debounce = 0
	ev := newWatchEvents(&cfg)
	w, err := Watch(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := limitOf(t, w.Current()); got != 10 {
		t.Fatalf("initial limit %d", got)
	}

	replace(t, path, ruleFile(20))
	if got := limitOf(t, ev.reload(t)); got != 20 {
		t.Fatalf("reloaded limit %d, want 20", got)
	}
	if got := limitOf(t, w.Current()); got != 20 {
		t.Fatalf("current limit %d, want 20", got)
	}

	replace(t, path, "rules:\n  - name: api\n    algorithm: token_bucket\n    limit: -1\n    period: 1m\n")
	err = ev.failure(t)
	var e *Error
	if !errors.Is(err, ErrInvalidLimit) || !errors.As(err, &e) || e.File != path || e.Line != 4 {
		t.Fatalf("failure %v", err)
	}
	if got := limitOf(t, w.Current()); got != 20 {
		t.Fatalf("a broken reload changed the limit to %d", got)
	}
	if st := w.Stats(); st.Reloads != 1 || st.Errors != 1 || !errors.Is(st.LastError, ErrInvalidLimit) {
		t.Fatalf("stats %+v", st)
	}

	replace(t, path, ruleFile(30))
	if got := limitOf(t, ev.reload(t)); got != 30 {
		t.Fatalf("limit after the fix %d, want 30", got)
	}
	if st := w.Stats(); st.Reloads != 2 || st.LastError != nil {
		t.Fatalf("stats after the fix %+v", st)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if got := limitOf(t, w.Current()); got != 30 {
		t.Fatal("Current changed after Close")
	}
}

// A Kubernetes ConfigMap volume: the file is a symlink through ..data,
// and an update swaps ..data to a new directory. The file itself sees no
// event.
func TestWatchConfigMapSymlinkSwap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	version := func(name string, limit int) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "rules.yaml"), []byte(ruleFile(limit)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_01_01_v1", 10)
	must(t, os.Symlink("..2026_01_01_v1", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")))

	cfg := DefaultWatchConfig()
	cfg.PollInterval = time.Hour
	ev := newWatchEvents(&cfg)
	w, err := Watch(filepath.Join(dir, "rules.yaml"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	version("..2026_01_02_v2", 40)
	must(t, os.Symlink("..2026_01_02_v2", filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(t, os.RemoveAll(filepath.Join(dir, "..2026_01_01_v1")))
	if got := limitOf(t, ev.reload(t)); got != 40 {
		t.Fatalf("limit %d after the swap, want 40", got)
	}
}

// Polling alone, driven by the test's own ticks: a change is picked up at
// the next poll, and a broken file is reported once, not at every poll.
func TestWatchPoll(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	must(t, os.WriteFile(path, []byte(ruleFile(10)), 0o644))
	tick := make(chan time.Time) // unbuffered: a send returns once the loop took it
	cfg := DefaultWatchConfig()
	cfg.NoNotify = true
	cfg.Tick = tick
	ev := newWatchEvents(&cfg)
	w, err := Watch(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	must(t, os.WriteFile(path, []byte(ruleFile(50)), 0o644))
	if got := limitOf(t, w.Current()); got != 10 {
		t.Fatalf("changed before a poll: %d", got)
	}
	tick <- time.Time{}
	if got := limitOf(t, ev.reload(t)); got != 50 {
		t.Fatalf("limit %d after a poll, want 50", got)
	}

	must(t, os.WriteFile(path, []byte("rules: [\n"), 0o644))
	tick <- time.Time{}
	if err := ev.failure(t); !errors.Is(err, ErrSyntax) {
		t.Fatalf("failure %v", err)
	}
	tick <- time.Time{}
	tick <- time.Time{} // returns once the previous poll is done
	if st := w.Stats(); st.Errors != 1 || st.Reloads != 1 {
		t.Fatalf("a broken file was reported again: %+v", st)
	}
	if got := limitOf(t, w.Current()); got != 50 {
		t.Fatalf("limit %d, want the last good 50", got)
	}
	// A file that disappears for good is reported once too.
	must(t, os.Remove(path))
	tick <- time.Time{}
	if err := ev.failure(t); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failure %v", err)
	}
	tick <- time.Time{}
	tick <- time.Time{}
	if st := w.Stats(); st.Errors != 2 {
		t.Fatalf("a missing file was reported again: %+v", st)
	}
}

// A burst of notifications makes one reload, once the debounce fires.
func TestWatchDebounce(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	must(t, os.WriteFile(path, []byte(ruleFile(10)), 0o644))
	asked := make(chan time.Duration, 16)
	fire := make(chan time.Time, 1)
	cfg := DefaultWatchConfig()
	cfg.PollInterval = time.Hour
	cfg.Debounce = 250 * time.Millisecond
	cfg.After = func(d time.Duration) <-chan time.Time {
		asked <- d
		return fire
	}
	ev := newWatchEvents(&cfg)
	w, err := Watch(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	replace(t, path, ruleFile(60))
	select {
	case d := <-asked:
		if d != 250*time.Millisecond {
			t.Fatalf("debounce %v", d)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no debounce started")
	}
	if w.Stats().Reloads != 0 || limitOf(t, w.Current()) != 10 {
		t.Fatal("reloaded before the debounce fired")
	}
	fire <- time.Time{}
	if got := limitOf(t, ev.reload(t)); got != 60 {
		t.Fatalf("limit %d, want 60", got)
	}
}

func TestWatchReloadNow(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	must(t, os.WriteFile(path, []byte(ruleFile(10)), 0o644))
	cfg := DefaultWatchConfig()
	cfg.NoNotify = true
	cfg.PollInterval = time.Hour
	w, err := Watch(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	must(t, os.WriteFile(path, []byte(ruleFile(70)), 0o644))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, w.Current()); got != 70 {
		t.Fatalf("limit %d", got)
	}
	must(t, os.WriteFile(path, []byte("rules:\n  - name: api\n    limitt: 1\n"), 0o644))
	if err := w.Reload(); !errors.Is(err, ErrUnknownField) {
		t.Fatalf("Reload = %v", err)
	}
	if err := w.Reload(); !errors.Is(err, ErrUnknownField) {
		t.Fatalf("Reload of the same broken file = %v", err)
	}
	if st := w.Stats(); st.Errors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWatchStartErrors(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	if _, err := Watch(filepath.Join(dir, "none.yaml"), DefaultWatchConfig()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	must(t, os.WriteFile(bad, []byte("rules: 3\n"), 0o644))
	if _, err := Watch(bad, DefaultWatchConfig()); !errors.Is(err, ErrWrongType) {
		t.Errorf("invalid file: %v", err)
	}
	for _, poll := range []time.Duration{0, time.Nanosecond, MinPollInterval - 1} {
		cfg := DefaultWatchConfig()
		cfg.PollInterval = poll
		if _, err := Watch(bad, cfg); !errors.Is(err, ErrInvalidWatchConfig) {
			t.Errorf("PollInterval %v: %v, want ErrInvalidWatchConfig", poll, err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A watcher without a Logger logs its failures to slog.Default, and only
// those: a broken file is never silent, a good reload makes no noise. A
// Logger, when given, receives both.
func TestWatchLogsFailuresByDefault(t *testing.T) {
	var def bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(prev)
	for _, tc := range []struct {
		name       string
		logger     bool
		wantReload bool // a good reload is logged
	}{
		{"no logger", false, false},
		{"a logger", true, true},
	} {
		def.Reset()
		var own bytes.Buffer
		path := filepath.Join(t.TempDir(), "rules.yaml")
		must(t, os.WriteFile(path, []byte(ruleFile(10)), 0o644))
		cfg := DefaultWatchConfig()
		cfg.NoNotify, cfg.PollInterval = true, time.Hour
		if tc.logger {
			cfg.Logger = slog.New(slog.NewTextHandler(&own, nil))
		}
		w, err := Watch(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.WriteFile(path, []byte(ruleFile(20)), 0o644))
		must(t, w.Reload())
		must(t, os.WriteFile(path, []byte("rules:\n  - name: api\n    limitt: 1\n"), 0o644))
		if err := w.Reload(); !errors.Is(err, ErrUnknownField) {
			t.Fatalf("%s: Reload = %v", tc.name, err)
		}
		w.Close()
		out := def.String()
		if tc.logger {
			out = own.String()
			if def.Len() != 0 {
				t.Errorf("%s: slog.Default got %q", tc.name, def.String())
			}
		}
		if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "rules: reload failed") || !strings.Contains(out, "limitt") {
			t.Errorf("%s: the failure is not logged: %q", tc.name, out)
		}
		if got := strings.Contains(out, "rules: reloaded"); got != tc.wantReload {
			t.Errorf("%s: good reload logged %v, want %v: %q", tc.name, got, tc.wantReload, out)
		}
	}
}
