package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
)

// Persistence: with Config.DataDir set, the node keeps the key states it
// holds, owned and replicated, in the directory's state files
// (datadir.go), so that they outlive its process.
//
//   - Every PersistInterval the changes loop (replicate.go) takes the keys
//     the store changed and writes those that changed since the last
//     segment to a new segment file. The states are read under their
//     shard's lock, as replication reads them; they are encoded and
//     written by the changes loop with no lock held.
//   - When the segments outgrow the snapshot (or 1 MiB), and on Close (so
//     at the end of Leave), the loop writes a snapshot of every live state
//     and deletes the files it covers.
//   - Each state is written with its key's stand-in parts, when this node
//     holds some (standin.go; state file version 2), read as the file is
//     written (standins.settlements, before the states' shard locks). A
//     key whose parts changed since the last segment is written again
//     (standins.takeDirty), as its parts may grow after its state did, or
//     without it.
//   - Each state is written with the lease grants whose hits it counts
//     and that their holders may still give back (carry.go's
//     carryLocked; state file version 3), read before the states, each
//     key's under its decide lock: a new owner that took a key's grants
//     with its state, or an owner whose leased hits entered the state,
//     takes the holders' returns after a restart as before it. Restored,
//     they are kept as carried grants (grantTable.restore), their times
//     bounded as a Transfer's are. A key whose token bucket or GCRA
//     leases hold hits apart from its bucket is written with them
//     charged and their grants named, as a replica's copy is sent
//     (persistedHeld); a key granted such hits since the last segment is
//     written at the next one (grantTable.takeUnwritten).
//   - New reads the newest snapshot and the segments after it, keeps the
//     last state of each key that is still live, merges them into the
//     store (Store.Merge, which never lowers consumption) and plans its
//     first hand-off as from a ring of this node alone: every restored key
//     that the ring now gives another member is handed to it, and every
//     key it owns is copied to its replicas, whatever the membership is.
//     The parts of the states the store took are restored
//     (standins.restore), so that hand-off charges them to the owners.
//
// The bound: a hard kill forgets what the node admitted since its last
// segment, at most one PersistInterval of traffic plus the write; states
// that return to fresh within the interval may never be written.

// PersistStats counts what the node kept in and restored from DataDir.
type PersistStats struct {
	Restored    int64 // key states restored at start
	Written     int64 // key states written to segments and snapshots
	Segments    int64 // segment files written
	Snapshots   int64 // snapshot files written
	WriteErrors int64 // writes that failed (their states are tried again)
}

// persister keeps the node's states in its data directory. Only the
// changes loop and then Close call it, never at once.
type persister struct {
	dir      string
	interval time.Duration
	logger   *slog.Logger
	release  func() // gives the directory's lock back
	// standins holds the stand-in parts to write with the states.
	standins *standins
	// grants returns the lease grants to write with the states of keys
	// (of every key with grants when keys is nil): Node.persistedGrants.
	grants func(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey][]limiter.LeaseGrant
	// held returns the states of keys (of every key when keys is nil)
	// that token bucket and GCRA leases hold hits apart for, with those
	// hits charged and their grants named: Node.persistedHeld.
	held func(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey]limiter.Snapshot
	// heldChanged returns the keys leases were granted hits held apart
	// for since it was last called (grantTable.takeUnwritten), and
	// heldDirty holds them until a segment holds their states.
	heldChanged func() map[stateKey]struct{}
	heldDirty   map[stateKey]struct{}

	// pending holds the states changed since the last segment, the last
	// of each key.
	pending   map[stateKey]limiter.Snapshot
	lastWrite time.Time
	// nextSeq numbers the next file; every snapshot covers the files
	// numbered below it.
	nextSeq uint64
	// covered lists the files the next snapshot replaces, and
	// segmentBytes their size beside the snapshot's.
	covered                     []string
	segmentBytes, snapshotBytes int

	restored, written, segments, snapshots, writeErrors atomic.Int64
}

type stateKey struct{ name, key string }

// restoring is a state read from the data directory and its place in the
// order the node used the keys: a snapshot lists them most recently used
// first in each shard (Store.Range), and the segments after it follow in
// the order they were written. Restored oldest first, the store's
// least-recently-used order comes back as it was, and a store over its
// MaxEntries or MaxBytes evicts the keys it would have evicted before.
type restoring struct {
	s   limiter.Snapshot
	seq int
}

// openPersister locks cfg.DataDir and reads its state files: it returns
// the last live state of each key at now. A refused file fails it under
// RefuseDamaged; under SetDamagedAside the file is renamed and skipped.
func openPersister(cfg *Config, logger *slog.Logger, now time.Time) (p *persister, restored []limiter.Snapshot, err error) {
	release, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	files, err := listStateFiles(cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	p = &persister{dir: cfg.DataDir, interval: cfg.PersistInterval, logger: logger, release: release,
		pending: map[stateKey]limiter.Snapshot{}, nextSeq: files.lastSeq + 1, lastWrite: now}
	// Sized by the first file read whole, the snapshot when there is
	// one, not by the files' sizes, which a damaged file can make any.
	// seq numbers each state in the order of use, oldest first, so that
	// the store restores them in that order (restoreOrder).
	var last map[stateKey]restoring
	var seq int
	setAside := false
	read := func(name string) error {
		path := filepath.Join(cfg.DataDir, name)
		info, _ := os.Stat(path)
		// A file counts whole or not at all: the states before a bad
		// record are not restored either.
		states, err := readStateFile(path)
		var bad *DataFileError
		switch {
		case err == nil:
			if last == nil {
				last = make(map[stateKey]restoring, len(states))
			}
			if name == files.snapshot {
				slices.Reverse(states) // Store.Range: most recently used first
			}
			for _, s := range states {
				seq++
				last[stateKey{s.Name, s.Key}] = restoring{s, seq}
			}
			if info != nil {
				p.segmentBytes += int(info.Size())
			}
			p.covered = append(p.covered, name)
			return nil
		case errors.As(err, &bad) && cfg.DamagedData == SetDamagedAside:
			setAside = true
			logger.Error("cluster: a damaged state file is set aside; the node starts without the states only it held",
				"file", path, "aside", path+".damaged", "err", err)
			if rerr := os.Rename(path, path+".damaged"); rerr != nil {
				return fmt.Errorf("%w: set %s aside: %v", ErrDataDir, path, rerr)
			}
			return nil
		}
		return err
	}
	start := time.Now() // for the log: how long the restore took, on the system's clock
	for _, name := range files.all() {
		if err := read(name); err != nil {
			return nil, nil, err
		}
		if name == files.snapshot {
			p.snapshotBytes, p.segmentBytes = p.segmentBytes, 0
		}
	}
	for _, name := range files.stale { // covered by the snapshot, or torn
		if !setAside || !strings.HasSuffix(name, stateFileExt) {
			// Kept when a file was set aside: what it covered may be
			// all that is left of the states it held.
			os.Remove(filepath.Join(cfg.DataDir, name))
		}
	}
	live := make([]restoring, 0, len(last))
	for _, r := range last {
		if r.s.ExpireAt > now.UnixNano() || r.s.HasResetMark() && r.s.ResetUntil > now.UnixNano() { // a live state, or a reset's mark that lasts
			live = append(live, r)
		}
	}
	slices.SortFunc(live, func(a, b restoring) int { return cmp.Compare(a.seq, b.seq) })
	restored = make([]limiter.Snapshot, len(live))
	for i, r := range live {
		restored[i] = r.s
	}
	p.restored.Store(int64(len(restored)))
	logger.Info("cluster: key states restored", "dir", cfg.DataDir, "states", len(restored),
		"files", len(p.covered), "took", time.Since(start))
	return p, restored, nil
}

// note records s, a state the store changed, for the next segment.
func (p *persister) note(s limiter.Snapshot) {
	p.pending[stateKey{s.Name, s.Key}] = s
}

// tick writes a segment of the pending states once an interval has passed
// since the last, or the clock has gone back since (else a step back
// would hold every write for as long as it stepped), then a snapshot of
// store when the segments outgrow the last one.
func (p *persister) tick(store *limiter.Store, now time.Time) {
	if d := now.Sub(p.lastWrite); d >= 0 && d < p.interval {
		return
	}
	p.lastWrite = now
	if p.standins != nil {
		for _, k := range p.standins.takeDirty() {
			if s, ok := store.Snapshot(k.name, k.key, now); ok {
				p.pending[stateKey{k.name, k.key}] = s
			}
		}
	}
	if p.heldChanged != nil {
		for k := range p.heldChanged() {
			if p.heldDirty == nil {
				p.heldDirty = map[stateKey]struct{}{}
			}
			p.heldDirty[k] = struct{}{}
		}
	}
	if len(p.pending) == 0 && len(p.heldDirty) == 0 {
		return
	}
	w := newStateFileWriter()
	sets := p.parts()
	grants := p.grantsOf(p.pending, now)
	keys := p.pending
	if len(p.heldDirty) > 0 {
		keys = maps.Clone(p.pending)
		for k := range p.heldDirty {
			if _, ok := keys[k]; !ok {
				keys[k] = limiter.Snapshot{}
			}
		}
	}
	held := p.heldOf(keys, now)
	written := int64(0)
	add := func(s *limiter.Snapshot) {
		settle(s, sets)
		if err := w.add(s); err != nil {
			p.logger.Warn("cluster: a key state is not written to the data directory", "name", s.Name, "key", s.Key, "err", err)
			return
		}
		written++
	}
	for k, s := range p.pending {
		if h, ok := held[k]; ok {
			s = h
		} else {
			s.Grants = grants[k]
		}
		add(&s)
	}
	for k, h := range held {
		if _, ok := p.pending[k]; !ok { // leased hits the store does not count yet
			add(&h)
		}
	}
	if written == 0 {
		clear(p.pending)
		clear(p.heldDirty)
		return
	}
	name := stateFileName(segmentPrefix, p.nextSeq)
	data := w.bytes()
	if err := writeFileSynced(p.dir, name, data); err != nil {
		p.writeErrors.Add(1)
		p.logger.Error("cluster: writing key states to the data directory failed; retrying at the next interval", "err", err)
		return
	}
	p.nextSeq++
	p.written.Add(written)
	p.segments.Add(1)
	clear(p.pending)
	clear(p.heldDirty)
	p.covered = append(p.covered, name)
	p.segmentBytes += len(data)
	if p.segmentBytes > max(p.snapshotBytes, 1<<20) || len(p.covered) > 1000 {
		p.snapshot(store, now)
	}
}

// snapshot writes every state of store live at now to a new snapshot and
// removes the files it covers.
func (p *persister) snapshot(store *limiter.Store, now time.Time) error {
	w := newStateFileWriter()
	var states int64
	sets := p.parts()
	grants := p.grantsOf(nil, now)
	held := p.heldOf(nil, now)
	// Encoding under the shard's lock is CPU only; the write is after.
	store.Range(now, func(s limiter.Snapshot) bool {
		k := stateKey{s.Name, s.Key}
		if h, ok := held[k]; ok {
			s = h
			delete(held, k)
		} else {
			s.Grants = grants[k]
		}
		settle(&s, sets)
		if w.add(&s) == nil {
			states++
		}
		return true
	})
	for _, s := range held { // keys whose only hits are held apart
		settle(&s, sets)
		if w.add(&s) == nil {
			states++
		}
	}
	name := stateFileName(snapshotPrefix, p.nextSeq)
	data := w.bytes()
	if err := writeFileSynced(p.dir, name, data); err != nil {
		p.writeErrors.Add(1)
		p.logger.Error("cluster: writing a snapshot of key states to the data directory failed", "err", err)
		return err
	}
	p.nextSeq++
	p.written.Add(states)
	p.snapshots.Add(1)
	for _, old := range p.covered {
		os.Remove(filepath.Join(p.dir, old))
	}
	p.covered = append(p.covered[:0], name)
	p.snapshotBytes, p.segmentBytes = len(data), 0
	clear(p.pending) // the snapshot holds them
	clear(p.heldDirty)
	return nil
}

// parts returns the stand-in parts to write with the states, by key.
func (p *persister) parts() map[debtKey]*limiter.Settlement {
	if p.standins == nil {
		return nil
	}
	return p.standins.settlements()
}

// grantsOf returns the lease grants to write with the states of keys, by
// key (of every key when keys is nil), read before the states' shard
// locks are taken.
func (p *persister) grantsOf(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey][]limiter.LeaseGrant {
	if p.grants == nil {
		return nil
	}
	return p.grants(keys, now)
}

// heldOf returns the states of keys whose hits leases hold apart, with
// those hits charged, by key (of every key when keys is nil).
func (p *persister) heldOf(keys map[stateKey]limiter.Snapshot, now time.Time) map[stateKey]limiter.Snapshot {
	if p.held == nil {
		return nil
	}
	return p.held(keys, now)
}

// close writes a last snapshot of store and gives the directory back.
func (p *persister) close(store *limiter.Store, now time.Time) error {
	err := p.snapshot(store, now)
	p.release()
	return err
}

func (p *persister) stats() PersistStats {
	if p == nil {
		return PersistStats{}
	}
	return PersistStats{
		Restored:    p.restored.Load(),
		Written:     p.written.Load(),
		Segments:    p.segments.Load(),
		Snapshots:   p.snapshots.Load(),
		WriteErrors: p.writeErrors.Load(),
	}
}

// restore opens the data directory and merges its states into the store;
// the first hand-off pass then plans from a ring of this node alone, so
// that every restored key reaches its owner and replicas now.
func (n *Node) restore() error {
	now := n.now()
	p, restored, err := openPersister(&n.cfg, n.logger, now)
	if err != nil {
		return err
	}
	p.standins = n.standins
	p.grants = n.persistedGrants
	p.held = n.persistedHeld
	p.heldChanged = n.grants.takeUnwritten
	n.grants.persisting = true
	n.standins.keepDirty()
	n.persist = p
	if len(restored) == 0 {
		return nil
	}
	marks := aheadOfNow(restored, now)
	granted := grantsBefore(n.store, restored, now)
	// Into an empty store, every state the merge takes changes it: the
	// count leaves out those it refused.
	merged, err := n.store.Merge(restored, now)
	if err != nil {
		n.logger.Warn("cluster: some restored key states were refused by the store", "refused", len(restored)-merged, "err", err)
	}
	for i := range marks {
		// Merged at its own instant, which the store would refuse at
		// now; the later instant replaces now, which the state took.
		if _, err := n.store.Merge(marks[i:i+1], time.Unix(0, marks[i].ResetAt)); err != nil {
			n.logger.Warn("cluster: a restored reset mark was refused by the store", "name", marks[i].Name, "key", marks[i].Key, "err", err)
		}
	}
	p.restored.Store(int64(merged))
	// The stand-in parts written with the states the store took charge
	// their keys' owners as they would have before the restart.
	var settled []limiter.Snapshot
	for _, s := range restored {
		if s.Settle != nil {
			if _, ok := n.store.Snapshot(s.Name, s.Key, now); ok {
				settled = append(settled, s)
			}
		}
	}
	n.standins.restore(settled)
	n.grants.restore(n.store, granted, now)
	// The hand-off pass and the snapshot on Close cover them: they need
	// not be written or replicated again as changes.
	n.store.Changed(now, func(limiter.Snapshot) {})
	n.transfers.prev = []ring.Member{{Name: n.cfg.NodeName}}
	return nil
}

// aheadOfNow moves back to now the states of restored whose level time
// or last log entry is after now: this node wrote them while its clock
// read later than it does now (stepped back since, or a directory moved
// from a node whose clock was ahead). Each keeps the consumption it had
// when written, with nothing drained or expired for the time its clock
// was ahead; unmoved, Store.Merge would refuse those more than
// limiter.MaxClockSkew ahead, and their keys would admit again. Window
// starts stay, aligned on every clock (Snapshot.ShiftTimes); a GCRA
// arrival time is in the future by nature, and bounded by Merge.
//
// A reset mark's instant after now is read as now in the state, and
// returned apart in marks, to be merged at its own instant: the charges
// the reset cleared are dated on the clock ahead, and a refund naming
// one of them, after now but before the reset, must give nothing back,
// as after a reset made with the clock ahead (TestAtk18bResetMarkAcross
// ARestartWithTheClockOff). Only a mark within MaxStateLife of now is
// returned so.
func aheadOfNow(restored []limiter.Snapshot, now time.Time) (marks []limiter.Snapshot) {
	for i := range restored {
		s := &restored[i]
		if s.HasResetMark() && s.ResetAt > now.UnixNano() {
			if s.ResetAt-now.UnixNano() <= int64(limiter.MaxStateLife) {
				marks = append(marks, limiter.Snapshot{Name: s.Name, Key: s.Key, Algorithm: s.Algorithm, ResetAt: s.ResetAt, ResetUntil: s.ResetUntil})
			}
			// Past MaxClockSkew the store would refuse the state with
			// the mark's instant.
			s.ResetAt = now.UnixNano()
		}
		var latest time.Time
		switch s.Algorithm {
		case limiter.TokenBucket, limiter.LeakyBucket:
			latest = s.View().LevelAt
		case limiter.SlidingWindowLog:
			if k := len(s.Log); k > 0 {
				latest = time.Unix(0, s.Log[k-1].At)
			}
		}
		if latest.After(now) {
			s.ShiftTimes(now.Sub(latest))
		}
	}
	return marks
}
