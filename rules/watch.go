package rules

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// WatchConfig configures a Watcher. Start from DefaultWatchConfig.
type WatchConfig struct {
	// PollInterval is how often the file is re-read whatever the file
	// system reports: the fallback for file systems and symlink layouts
	// that notifications miss. It is at least MinPollInterval.
	PollInterval time.Duration
	// Debounce delays a reload after a change notification, so that the
	// burst of events one save makes causes one reload. 0 reloads at once.
	Debounce time.Duration
	// NoNotify disables file system notifications: polling only.
	NoNotify bool

	// Logger receives reloads and errors. nil sends the failures (a
	// reload that failed, notifications that stopped) to slog.Default(),
	// so that a broken file is never silent, and drops the rest.
	Logger *slog.Logger
	// OnReload is called with each new set after it became current, and
	// OnError with each reload that failed (the previous set stays). Both
	// are called from the watcher's goroutine, or from Reload's caller,
	// one at a time; they must not block for long.
	OnReload func(*Set)
	OnError  func(error)

	// Tick, when set, replaces the poll ticker: each value received makes
	// a poll. Tests use it to poll exactly when they want.
	Tick <-chan time.Time
	// After replaces time.After for the debounce; nil uses a real timer.
	After func(time.Duration) <-chan time.Time
}

// MinPollInterval is the shortest PollInterval: each poll reads the whole
// file, so a shorter one would keep a core busy re-reading it.
const MinPollInterval = 100 * time.Millisecond

// DefaultWatchConfig polls every ten seconds and debounces notifications
// by 100ms.
func DefaultWatchConfig() WatchConfig {
	return WatchConfig{PollInterval: 10 * time.Second, Debounce: 100 * time.Millisecond}
}

// Validate reports the first invalid field.
func (c *WatchConfig) Validate() error {
	switch {
	case c.PollInterval < MinPollInterval && c.Tick == nil:
		return fmt.Errorf("%w: PollInterval %v is below %v", ErrInvalidWatchConfig, c.PollInterval, MinPollInterval)
	case c.Debounce < 0:
		return fmt.Errorf("%w: Debounce %v is negative", ErrInvalidWatchConfig, c.Debounce)
	}
	return nil
}

// WatchStats counts what a Watcher has done.
type WatchStats struct {
	Reloads   int64 // new sets made current after the first load
	Errors    int64 // reloads that failed; the previous set stayed
	LastError error // the last failure, nil once a reload succeeded
}

// Watcher keeps the Set of one rule file current. It watches the file's
// directory, so editors that save by renaming and Kubernetes ConfigMap
// volumes (which swap a symlink) are both seen, and it polls the file as
// a fallback. A reload whose file is invalid leaves the previous set in
// place and is reported. Current is lock-free; all methods are safe for
// concurrent use.
type Watcher struct {
	w *filewatch.Watcher[Set]
}

// Watch loads the rule file at path and keeps it current until Close. It
// fails if the file cannot be read or is invalid at the start.
func Watch(path string, cfg WatchConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src := filewatch.Source[Set]{
		Component: "rules", What: "rules", Path: path,
		Read: func() ([sha256.Size]byte, func() (*Set, error), error) {
			data, err := readFile(path)
			if err != nil {
				return [sha256.Size]byte{}, nil, err
			}
			return sha256.Sum256(data), func() (*Set, error) { return Parse(path, data) }, nil
		},
		Describe: func(s *Set) []any { return []any{"rules", s.Len()} },
		OnReload: cfg.OnReload,
		OnError:  cfg.OnError,
	}
	fc := filewatch.Config{PollInterval: cfg.PollInterval, Debounce: cfg.Debounce, NoNotify: cfg.NoNotify, Tick: cfg.Tick, After: cfg.After}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(minLevel{slog.Default().Handler(), slog.LevelWarn})
	}
	w, err := filewatch.Watch(filepath.Dir(path), src, fc, logger)
	if err != nil {
		return nil, err
	}
	return &Watcher{w}, nil
}

// Current returns the current set; never nil.
func (w *Watcher) Current() *Set { return w.w.Current() }

// Stats returns the watcher's counters.
func (w *Watcher) Stats() WatchStats { return WatchStats(w.w.Stats()) }

// Reload reads the file now and applies it if it changed, as a change
// notification would. It returns the error of an invalid file (the
// previous set stays), and nil when the file is valid or unchanged.
// Content identical to the last attempt, good or bad, is skipped, so a
// broken file is reported once until it changes.
func (w *Watcher) Reload() error { return w.w.Reload() }

// Close stops watching and waits for the watcher's goroutine. Current
// keeps returning the last set. Safe to call more than once.
func (w *Watcher) Close() error { return w.w.Close() }

// minLevel passes its Handler the records of level min and above.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(attrs), m.min}
}

func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{m.Handler.WithGroup(name), m.min}
}
