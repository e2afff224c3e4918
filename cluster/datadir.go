package cluster

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/limiter"
)

// The data directory (Config.DataDir) holds the node's key states in
// files of one layout, each written whole to a temporary name, synced and
// renamed, so that a file under its own name is complete or damaged, never
// half-written:
//
//	snapshot-<seq>.state  every live state the node held when it wrote
//	                      it, covering the segments up to seq, most
//	                      recently used first (Store.Range's order)
//	segment-<seq>.state   the states that changed in one PersistInterval
//	LOCK                  held (flock) by the process that uses the
//	                      directory
//
// A state file is "SLUICEST", a uvarint file format version (1), then
// records, each a uvarint length and one state in limiter's state format
// (Snapshot.AppendBinary), then a zero length and the CRC-32C of every
// byte before it, 4 bytes little endian. Other files are left alone.

// ErrDataDir wraps every error about Config.DataDir: it cannot be locked,
// read or written, or a state file in it is damaged, truncated or
// foreign. A *DataFileError carries the file.
var ErrDataDir = errors.New("cluster: data directory")

// DataFileError is a state file New refused; it wraps ErrDataDir.
type DataFileError struct {
	Path   string
	Reason string
}

func (e *DataFileError) Error() string {
	return fmt.Sprintf("cluster: data directory: state file %s refused: %s", e.Path, e.Reason)
}

func (e *DataFileError) Unwrap() error { return ErrDataDir }

// DamagedDataPolicy says what New does with a state file it refuses.
type DamagedDataPolicy uint8

const (
	// RefuseDamaged fails New with the *DataFileError: the operator
	// decides (moves the file away, restores a backup).
	RefuseDamaged DamagedDataPolicy = iota
	// SetDamagedAside renames the file to <name>.damaged, logs the error
	// and starts without its states: what only that file held is lost.
	SetDamagedAside
)

func (p DamagedDataPolicy) String() string {
	switch p {
	case RefuseDamaged:
		return "refuse"
	case SetDamagedAside:
		return "set-aside"
	}
	return fmt.Sprintf("DamagedDataPolicy(%d)", uint8(p))
}

const (
	stateFileMagic   = "SLUICEST"
	stateFileVersion = 1
	stateFileExt     = ".state"
	snapshotPrefix   = "snapshot-"
	segmentPrefix    = "segment-"
	lockFileName     = "LOCK"
	// maxStateFile bounds the size of a state file New reads: a store of
	// a few million keys.
	maxStateFile = 1 << 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// stateFileWriter builds a state file in memory.
type stateFileWriter struct{ buf, scratch []byte }

func newStateFileWriter() *stateFileWriter {
	w := &stateFileWriter{buf: make([]byte, 0, 4096)}
	w.buf = append(w.buf, stateFileMagic...)
	w.buf = binary.AppendUvarint(w.buf, stateFileVersion)
	return w
}

// add appends s; an invalid s is skipped and reported.
func (w *stateFileWriter) add(s *limiter.Snapshot) error {
	b, err := s.AppendBinary(w.scratch[:0])
	if err != nil {
		return err
	}
	w.scratch = b
	w.buf = binary.AppendUvarint(w.buf, uint64(len(b)))
	w.buf = append(w.buf, b...)
	return nil
}

// bytes ends the file and returns it.
func (w *stateFileWriter) bytes() []byte {
	w.buf = append(w.buf, 0)
	return binary.LittleEndian.AppendUint32(w.buf, crc32.Checksum(w.buf, castagnoli))
}

// readStateFile reads the states of a state file, calling fn with each in
// file order. A file that is not complete and intact is refused with a
// *DataFileError saying why, and fn may have been called before: the
// caller keeps the states only when it returns nil. The header and the
// checksum are checked before the file is read into memory, so that a
// damaged file (a large one of zeros, say) costs no more than a buffer.
func readStateFile(path string, fn func(limiter.Snapshot)) error {
	refuse := func(format string, a ...any) error {
		return &DataFileError{Path: path, Reason: fmt.Sprintf(format, a...)}
	}
	failed := func(err error) error { return fmt.Errorf("%w: %v", ErrDataDir, err) }
	f, err := os.Open(path)
	if err != nil {
		return failed(err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return failed(err)
	}
	size := info.Size()
	if size > maxStateFile {
		return refuse("%d bytes, more than the maximum %d", size, int64(maxStateFile))
	}
	head := make([]byte, min(size, int64(len(stateFileMagic)+binary.MaxVarintLen64)))
	if _, err := io.ReadFull(f, head); err != nil {
		return failed(err)
	}
	if !bytes.HasPrefix(head, []byte(stateFileMagic)) {
		return refuse("not a sluice state file (it does not begin with %q)", stateFileMagic)
	}
	v, n := binary.Uvarint(head[len(stateFileMagic):])
	if n <= 0 {
		return refuse("truncated header")
	}
	if v != stateFileVersion {
		return refuse("file format version %d; this node reads version %d", v, stateFileVersion)
	}
	if size < int64(len(stateFileMagic)+n+5) {
		return refuse("truncated: no end marker")
	}
	end := size - 4
	sum := crc32.New(castagnoli)
	var tail [4]byte
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return failed(err)
	}
	if _, err := io.CopyN(sum, f, end); err != nil {
		return failed(err)
	}
	if _, err := io.ReadFull(f, tail[:]); err != nil {
		return failed(err)
	}
	if got, want := sum.Sum32(), binary.LittleEndian.Uint32(tail[:]); got != want {
		return refuse("checksum %08x, the file says %08x: truncated or damaged", got, want)
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return failed(err)
	}
	if crc32.Checksum(data[:end], castagnoli) != binary.LittleEndian.Uint32(data[end:]) {
		return refuse("changed while it was read")
	}
	records := data[len(stateFileMagic)+n : end]
	for i := 0; ; i++ {
		l, k := binary.Uvarint(records)
		switch {
		case k <= 0:
			return refuse("record %d: bad length", i)
		case l == 0:
			if len(records) != k {
				return refuse("%d bytes after the end marker", len(records)-k)
			}
			return nil
		case l > uint64(len(records)-k) || l > limiter.MaxEncodedState:
			return refuse("record %d: length %d runs past the end", i, l)
		}
		var s limiter.Snapshot
		if err := s.UnmarshalBinary(records[k : k+int(l)]); err != nil {
			return refuse("record %d: %v", i, err)
		}
		fn(s)
		records = records[k+int(l):]
	}
}

// writeFileSynced writes data to path through a temporary file that is
// synced and renamed, then syncs the directory: after a crash path holds
// data whole or its earlier content.
func writeFileSynced(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDataDir, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%w: %v", ErrDataDir, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// stateFileName is the name of the snapshot or segment numbered seq.
func stateFileName(prefix string, seq uint64) string {
	return fmt.Sprintf("%s%016x%s", prefix, seq, stateFileExt)
}

// stateFiles lists the state files of dir: the newest snapshot's sequence
// number (0 and "" when there is none) and the segments after it, oldest
// first; stale lists the older snapshots and segments it covers, and
// temporary files a crash left (of state files and of the members file).
type stateFiles struct {
	snapshot    string
	snapshotSeq uint64
	segments    []string
	lastSeq     uint64 // the highest sequence number of any state file
	stale       []string
}

func listStateFiles(dir string) (stateFiles, error) {
	var sf stateFiles
	entries, err := os.ReadDir(dir)
	if err != nil {
		return sf, fmt.Errorf("%w: %v", ErrDataDir, err)
	}
	type numbered struct {
		name string
		seq  uint64
	}
	var snaps, segs []numbered
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, stateFileExt+".tmp") || strings.HasPrefix(name, membersFileName+".tmp-") {
			sf.stale = append(sf.stale, name)
			continue
		}
		if !e.Type().IsRegular() || !strings.HasSuffix(name, stateFileExt) {
			continue
		}
		for _, p := range []struct {
			prefix string
			list   *[]numbered
		}{{snapshotPrefix, &snaps}, {segmentPrefix, &segs}} {
			hex, ok := strings.CutPrefix(strings.TrimSuffix(name, stateFileExt), p.prefix)
			if !ok {
				continue
			}
			seq, err := strconv.ParseUint(hex, 16, 64)
			if err != nil || len(hex) != 16 {
				continue // not one of ours
			}
			*p.list = append(*p.list, numbered{name, seq})
			sf.lastSeq = max(sf.lastSeq, seq)
		}
	}
	bySeq := func(a, b numbered) int { return cmp.Compare(a.seq, b.seq) }
	slices.SortFunc(snaps, bySeq)
	slices.SortFunc(segs, bySeq)
	if k := len(snaps); k > 0 {
		sf.snapshot, sf.snapshotSeq = snaps[k-1].name, snaps[k-1].seq
		for _, s := range snaps[:k-1] {
			sf.stale = append(sf.stale, s.name)
		}
	}
	for _, s := range segs {
		if sf.snapshot != "" && s.seq <= sf.snapshotSeq {
			sf.stale = append(sf.stale, s.name)
		} else {
			sf.segments = append(sf.segments, s.name)
		}
	}
	return sf, nil
}

// lockDataDir creates dir if need be and takes its lock file, which the
// returned release gives back; another process holding it is an error.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDataDir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDataDir, err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: %s is used by another process (its LOCK file is held)", ErrDataDir, dir)
		}
		return nil, fmt.Errorf("%w: lock %s: %v", ErrDataDir, dir, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// ReadDataDir returns the last state of each key that the state files of
// dir hold, live or not, as a node started on dir would restore them, for
// inspection and tests. It takes no lock: run it on the directory of a
// node that is not running. A damaged file is an error (*DataFileError).
func ReadDataDir(dir string) ([]limiter.Snapshot, error) {
	files, err := listStateFiles(dir)
	if err != nil {
		return nil, err
	}
	last := map[stateKey]limiter.Snapshot{}
	for _, name := range files.all() {
		if err := readStateFile(filepath.Join(dir, name), func(s limiter.Snapshot) { last[stateKey{s.Name, s.Key}] = s }); err != nil {
			return nil, err
		}
	}
	out := make([]limiter.Snapshot, 0, len(last))
	for _, s := range last {
		out = append(out, s)
	}
	return out, nil
}

// all returns the snapshot, if any, then the segments after it.
func (sf *stateFiles) all() []string {
	if sf.snapshot == "" {
		return sf.segments
	}
	return append([]string{sf.snapshot}, sf.segments...)
}
