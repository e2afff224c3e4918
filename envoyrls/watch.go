package envoyrls

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// WatchConfig configures a Watcher. Start from DefaultWatchConfig.
type WatchConfig struct {
	// PollInterval is how often the directory is read again whatever the
	// file system reports, at least MinPollInterval; Debounce delays a
	// reload after a change notification, so that one save reloads once.
	PollInterval, Debounce time.Duration
	// NoNotify disables file system notifications: polling only.
	NoNotify bool
	// Logger receives reloads and errors; nil discards them.
	Logger *slog.Logger
	// OnReload is called with the rules of each reload that changed them,
	// OnError with each reload that failed (the previous rules stay):
	// from the watcher's goroutine, or from Reload's caller, one at a
	// time; they must not block for long.
	OnReload func(*Rules)
	OnError  func(error)
	// Tick, when set, replaces the poll ticker: each value received makes
	// a poll.
	Tick <-chan time.Time
	// Load says how the files are read: lenient by default. Its Warn
	// receives the keys ignored at each load of changed files.
	Load LoadConfig
}

// MinPollInterval is the shortest PollInterval: each poll reads every
// file of the directory.
const MinPollInterval = 100 * time.Millisecond

// DefaultWatchConfig polls every ten seconds and debounces notifications
// by 100ms.
func DefaultWatchConfig() WatchConfig {
	return WatchConfig{PollInterval: 10 * time.Second, Debounce: 100 * time.Millisecond}
}

// Validate reports the first invalid field.
func (c *WatchConfig) Validate() error {
	if (c.PollInterval < MinPollInterval && c.Tick == nil) || c.Debounce < 0 {
		return fmt.Errorf("%w: PollInterval %v must be at least %v, Debounce %v not negative",
			ErrInvalidWatchConfig, c.PollInterval, MinPollInterval, c.Debounce)
	}
	return nil
}

// Watcher keeps the Rules of a configuration directory current: it loads
// the directory again (see LoadDir) when the file system reports a change
// in it and every PollInterval, and makes the result current when the
// files changed and are all valid; otherwise the previous rules stay and
// the error is reported (logged, counted, and given to OnError) once per
// content. It is a RulesSource; all methods are safe for concurrent use.
type Watcher struct {
	w *filewatch.Watcher[Rules]
}

var _ RulesSource = (*Watcher)(nil)

// WatchStats counts what a Watcher has done.
type WatchStats = filewatch.Stats

// WatchDir loads dir and keeps its rules current until Close. It fails if
// dir cannot be read or holds an invalid file at the start.
func WatchDir(dir string, cfg WatchConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src := filewatch.Source[Rules]{
		Component: "envoyrls", What: "configuration", Path: dir,
		Read: func() ([sha256.Size]byte, func() (*Rules, error), error) {
			files, err := configFiles(dir)
			if err != nil {
				return [sha256.Size]byte{}, nil, err
			}
			h := sha256.New()
			for _, f := range files {
				fmt.Fprintf(h, "%d:%s%d:", len(f.path), f.path, len(f.data))
				h.Write(f.data)
			}
			var sum [sha256.Size]byte
			h.Sum(sum[:0])
			return sum, func() (*Rules, error) { return parseFiles(files, cfg.Load) }, nil
		},
		Describe: func(r *Rules) []any { return []any{"domains", r.Len()} },
		OnReload: cfg.OnReload,
		OnError:  cfg.OnError,
	}
	fc := filewatch.Config{PollInterval: cfg.PollInterval, Debounce: cfg.Debounce, NoNotify: cfg.NoNotify, Tick: cfg.Tick}
	w, err := filewatch.Watch(dir, src, fc, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &Watcher{w}, nil
}

// Current returns the rules in force; never nil.
func (w *Watcher) Current() *Rules { return w.w.Current() }

// Stats returns the watcher's counters.
func (w *Watcher) Stats() WatchStats { return w.w.Stats() }

// Reload loads the directory now and applies it if it changed, as a
// change notification would: it returns the error of an invalid file
// (the previous rules stay), and nil when all are valid or unchanged.
func (w *Watcher) Reload() error { return w.w.Reload() }

// Close stops watching and waits for the watcher's goroutine; Current
// keeps returning the last rules. Safe to call more than once.
func (w *Watcher) Close() error { return w.w.Close() }
