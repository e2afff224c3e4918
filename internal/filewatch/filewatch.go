// Package filewatch keeps a value built from files current: it watches the
// files' directory for changes (so that editors that save by renaming and
// Kubernetes ConfigMap volumes, which swap a symlink, are both seen),
// polls as a fallback, rebuilds the value when the files' content changed,
// and keeps the last good value while the files are invalid. The rule
// watcher of package rules and the configuration watcher of package
// envoyrls are built on it.
//
// It imports only the standard library and fsnotify.
package filewatch

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Config configures a Watcher; the packages that use it validate it.
type Config struct {
	// PollInterval is how often the files are read whatever the file
	// system reports; ignored when Tick is set.
	PollInterval time.Duration
	// Debounce delays a reload after a change notification, so that the
	// burst of events one save makes causes one reload. 0 reloads at once.
	Debounce time.Duration
	// NoNotify disables file system notifications: polling only.
	NoNotify bool
	// Tick, when set, replaces the poll ticker: each value received makes
	// a poll.
	Tick <-chan time.Time
	// After replaces time.After for the debounce; nil uses a real timer.
	After func(time.Duration) <-chan time.Time
}

// Source reads what a Watcher watches. Read returns a digest of its
// content and a function that builds the value from that content;
// content identical to the last read, good or bad, is not built again.
// Describe gives the attributes that log a value ("rules", 12).
type Source[T any] struct {
	// Component prefixes the log messages ("rules"), and What names the
	// value in them ("rules").
	Component, What string
	// Path names what is watched in logs: a file or a directory.
	Path     string
	Read     func() (sum [sha256.Size]byte, build func() (*T, error), err error)
	Describe func(*T) []any
	// OnReload and OnError, when set, are called with each new value
	// after it became current and with each failed reload; from the
	// watcher's goroutine or from Reload's caller, one at a time.
	OnReload func(*T)
	OnError  func(error)
}

// Stats counts what a Watcher has done.
type Stats struct {
	Reloads   int64 // new values made current after the first
	Errors    int64 // reloads that failed; the previous value stayed
	LastError error // the last failure, nil once a reload succeeded
}

// Watcher keeps the value of a Source current. Current is lock-free; all
// methods are safe for concurrent use.
type Watcher[T any] struct {
	src    Source[T]
	cfg    Config
	logger *slog.Logger
	cur    atomic.Pointer[T]

	mu      sync.Mutex // guards lastSum and lastErr, and serialises reloads
	lastSum [sha256.Size]byte
	lastErr error

	reloads, errs atomic.Int64

	notify    *fsnotify.Watcher // nil with NoNotify
	shutdown  chan struct{}     // closed by Close
	done      chan struct{}     // closed when the loop has returned
	closeOnce sync.Once
}

// Watch builds the value of src, then watches dir (the directory that
// holds what src reads) until Close. It fails with src's error if the
// first value cannot be built. A nil logger discards the logs.
func Watch[T any](dir string, src Source[T], cfg Config, logger *slog.Logger) (*Watcher[T], error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher[T]{src: src, cfg: cfg, logger: logger, shutdown: make(chan struct{}), done: make(chan struct{})}
	sum, build, err := src.Read()
	if err != nil {
		return nil, err
	}
	v, err := build()
	if err != nil {
		return nil, err
	}
	w.cur.Store(v)
	w.lastSum = sum
	if !cfg.NoNotify {
		if w.notify, err = fsnotify.NewWatcher(); err != nil {
			return nil, fmt.Errorf("%s: watch %s: %w", src.Component, src.Path, err)
		}
		if err := w.notify.Add(dir); err != nil {
			w.notify.Close()
			return nil, fmt.Errorf("%s: watch %s: %w", src.Component, dir, err)
		}
	}
	go w.loop()
	return w, nil
}

// Current returns the current value; never nil.
func (w *Watcher[T]) Current() *T { return w.cur.Load() }

// Stats returns the watcher's counters.
func (w *Watcher[T]) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Stats{Reloads: w.reloads.Load(), Errors: w.errs.Load(), LastError: w.lastErr}
}

// Reload reads the source now and applies it if it changed, as a change
// notification would. It returns the error of an invalid source (the
// previous value stays), and nil when it is valid or unchanged.
func (w *Watcher[T]) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reloadLocked()
}

// reloadLocked requires w.mu. Content identical to the last attempt, good
// or bad, is skipped, so a broken source is reported once until it
// changes.
func (w *Watcher[T]) reloadLocked() error {
	sum, build, err := w.src.Read()
	if err != nil {
		// A file being replaced can be missing for a moment; the next
		// event or poll retries. Report it like an invalid file.
		return w.failLocked(err, nil)
	}
	if sum == w.lastSum {
		return w.lastErr
	}
	v, err := build()
	if err != nil {
		return w.failLocked(err, &sum)
	}
	w.lastSum, w.lastErr = sum, nil
	w.cur.Store(v)
	w.reloads.Add(1)
	attrs := []any{"file", w.src.Path}
	if w.src.Describe != nil {
		attrs = append(attrs, w.src.Describe(v)...)
	}
	w.logger.Info(w.src.Component+": reloaded", attrs...)
	if w.src.OnReload != nil {
		w.src.OnReload(v)
	}
	return nil
}

func (w *Watcher[T]) failLocked(err error, sum *[sha256.Size]byte) error {
	if sum != nil {
		w.lastSum = *sum
	} else if w.lastErr != nil && w.lastErr.Error() == err.Error() {
		return err // the same read error again: reported already
	}
	w.lastErr = err
	w.errs.Add(1)
	w.logger.Error(w.src.Component+": reload failed, keeping the previous "+w.src.What, "file", w.src.Path, "err", err)
	if w.src.OnError != nil {
		w.src.OnError(err)
	}
	return err
}

func (w *Watcher[T]) loop() {
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
			// a file, a ConfigMap's ..data symlink swap. Reloading
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
			w.logger.Warn(w.src.Component+": file notifications failed, polling continues", "file", w.src.Path, "err", err)
		case <-debounce:
			debounce = nil
			w.Reload()
		case <-tick:
			w.Reload()
		}
	}
}

// Close stops watching and waits for the watcher's goroutine. Current
// keeps returning the last value. Safe to call more than once.
func (w *Watcher[T]) Close() error {
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
