package rules

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
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

	// Logger receives reloads and errors; nil discards them.
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
	path   string
	cfg    WatchConfig
	logger *slog.Logger
	cur    atomic.Pointer[Set]

	mu      sync.Mutex // guards lastSum and lastErr, and serialises reloads
	lastSum [sha256.Size]byte
	lastErr error

	reloads, errs atomic.Int64

	notify    *fsnotify.Watcher // nil with NoNotify
	shutdown  chan struct{}     // closed by Close
	done      chan struct{}     // closed when the loop has returned
	closeOnce sync.Once
}

// Watch loads the rule file at path and keeps it current until Close. It
// fails if the file cannot be read or is invalid at the start.
func Watch(path string, cfg WatchConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Watcher{path: path, cfg: cfg, logger: cfg.Logger, shutdown: make(chan struct{}), done: make(chan struct{})}
	if w.logger == nil {
		w.logger = slog.New(slog.DiscardHandler)
	}
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	set, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	w.cur.Store(set)
	w.lastSum = sha256.Sum256(data)
	if !cfg.NoNotify {
		if w.notify, err = fsnotify.NewWatcher(); err != nil {
			return nil, fmt.Errorf("rules: watch %s: %w", path, err)
		}
		if err := w.notify.Add(filepath.Dir(path)); err != nil {
			w.notify.Close()
			return nil, fmt.Errorf("rules: watch %s: %w", filepath.Dir(path), err)
		}
	}
	go w.loop()
	return w, nil
}

// Current returns the current set; never nil.
func (w *Watcher) Current() *Set { return w.cur.Load() }

// Stats returns the watcher's counters.
func (w *Watcher) Stats() WatchStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WatchStats{Reloads: w.reloads.Load(), Errors: w.errs.Load(), LastError: w.lastErr}
}

// Reload reads the file now and applies it if it changed, as a change
// notification would. It returns the error of an invalid file (the
// previous set stays), and nil when the file is valid or unchanged.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reloadLocked()
}

// reloadLocked requires w.mu. Content identical to the last attempt, good
// or bad, is skipped, so a broken file is reported once until it changes.
func (w *Watcher) reloadLocked() error {
	data, err := readFile(w.path)
	if err != nil {
		// A file being replaced can be missing for a moment; the next
		// event or poll retries. Report it like an invalid file.
		return w.failLocked(err, nil)
	}
	sum := sha256.Sum256(data)
	if bytes.Equal(sum[:], w.lastSum[:]) {
		return w.lastErr
	}
	set, err := Parse(w.path, data)
	if err != nil {
		return w.failLocked(err, &sum)
	}
	w.lastSum, w.lastErr = sum, nil
	w.cur.Store(set)
	w.reloads.Add(1)
	w.logger.Info("rules: reloaded", "file", w.path, "rules", set.Len())
	if w.cfg.OnReload != nil {
		w.cfg.OnReload(set)
	}
	return nil
}

func (w *Watcher) failLocked(err error, sum *[sha256.Size]byte) error {
	if sum != nil {
		w.lastSum = *sum
	} else if w.lastErr != nil && w.lastErr.Error() == err.Error() {
		return err // the same read error again: reported already
	}
	w.lastErr = err
	w.errs.Add(1)
	w.logger.Error("rules: reload failed, keeping the previous rules", "file", w.path, "err", err)
	if w.cfg.OnError != nil {
		w.cfg.OnError(err)
	}
	return err
}

func (w *Watcher) loop() {
	defer close(w.done)
	tick := w.cfg.Tick
	if tick == nil {
		t := time.NewTicker(w.cfg.PollInterval)
		defer t.Stop()
		tick = t.C
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w.notify != nil {
		events, errs = w.notify.Events, w.notify.Errors
	}
	var debounce <-chan time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-w.shutdown:
			return
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Any change in the directory may be ours: a rename onto
			// the file, a ConfigMap's ..data symlink swap. Reloading
			// unchanged content is a no-op.
			switch {
			case w.cfg.Debounce == 0:
				w.Reload()
			case debounce != nil: // a reload is pending already
			case w.cfg.After != nil:
				debounce = w.cfg.After(w.cfg.Debounce)
			default:
				if timer == nil {
					timer = time.NewTimer(w.cfg.Debounce)
				} else {
					timer.Reset(w.cfg.Debounce)
				}
				debounce = timer.C
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.logger.Warn("rules: file notifications failed, polling continues", "file", w.path, "err", err)
		case <-debounce:
			debounce = nil
			w.Reload()
		case <-tick:
			w.Reload()
		}
	}
}

// Close stops watching and waits for the watcher's goroutine. Current
// keeps returning the last set. Safe to call more than once.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		close(w.shutdown)
		<-w.done
		if w.notify != nil {
			err = w.notify.Close()
		}
	})
	return err
}
