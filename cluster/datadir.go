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
	"time"

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
// A state file is "SLUICEST", a uvarint file format version (1 to 3),
// then records, each a uvarint length and one state in limiter's state
// format (Snapshot.AppendBinary), then a zero length; versions 2 and 3
// then hold the stand-in parts of some of those states (standin.go), each
// a uvarint length and one settlement in the format below, then a zero
// length; version 3 then holds the lease grants of some of those states
// (carry.go, limiter.LeaseGrant), each a uvarint length and one grant in
// the format below, then a zero length; then the CRC-32C of every byte
// before it, 4 bytes little endian. A writer writes the lowest version
// that holds what its states carry: version 1 unless a state carries
// parts or grants, so that a node that holds none writes the files every
// release reads; a reader refuses a version it does not know. The records carry their own state format
// version: a state with a reset's mark, or the mark alone of a key whose
// state is fresh, is written in version 3, which earlier releases refuse
// by its version; every other record in the oldest version that holds
// it. Other files are left alone.
//
// A settlement, every integer a Go varint (signed, zig-zag) or uvarint:
//
//	uvarint  the index of its state among the file's records, from 0,
//	         each greater than the one before
//	uvarint  Limit, varint Period (ns), uvarint Burst: the rate the parts
//	         were admitted at (limiter.Settlement.Request; its name, key
//	         and algorithm are the state's)
//	uvarint  length of the calendar unit's name (limiter.Calendar.String,
//	         "" for none), then its bytes
//	uvarint  length of the zone's IANA name ("" for UTC), then its bytes
//	uvarint  number of parts, 1 to limiter.MaxSettleParts, then per part:
//	         uvarint length of Origin then its bytes, uvarint Gen,
//	         uvarint Hits
//
// Nothing may follow; a settlement longer than maxEncodedSettlement, or
// one its state refuses (limiter.Settlement.Validate), refuses the file.
//
// A lease grant, in the same encodings:
//
//	uvarint  the index of its state among the file's records, from 0,
//	         each no less than the one before, at most
//	         limiter.MaxLeaseGrants grants of one state
//	         the rate the hits were leased at, as a settlement's: Limit,
//	         Period, Burst, calendar unit and zone (the grant's name, key
//	         and algorithm are the state's)
//	uvarint  length of the holder's name, then its bytes
//	uvarint  Hits
//	varint   Entered, Expires, Window: Unix ns on the clock of the node
//	         that wrote the file (Window 0 but for a fixed window)
//
// Nothing may follow; a grant longer than maxEncodedGrant, or one its
// state refuses (limiter.LeaseGrant.Validate), refuses the file. The
// reader does not judge the grants' times: the node bounds them at its
// start (grantsBefore).

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
	// stateFileSettled is the version that holds settlements.
	stateFileSettled = 2
	// stateFileGranted is the version that holds settlements and lease
	// grants: the newest this node reads.
	stateFileGranted = 3
	stateFileExt     = ".state"
	snapshotPrefix   = "snapshot-"
	segmentPrefix    = "segment-"
	lockFileName     = "LOCK"
	// maxStateFile bounds the size of a state file New reads: a store of
	// a few million keys.
	maxStateFile = 1 << 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxEncodedSettlement bounds the length of one encoded settlement: the
// longest calendar unit, zone and origins, every integer at its longest.
const maxEncodedSettlement = 7*binary.MaxVarintLen64 + 16 + limiter.MaxZoneNameLen +
	limiter.MaxSettleParts*(3*binary.MaxVarintLen64+limiter.MaxNameLen)

// maxEncodedGrant bounds the length of one encoded lease grant: the
// longest calendar unit, zone and holder, every integer at its longest.
const maxEncodedGrant = 11*binary.MaxVarintLen64 + 16 + limiter.MaxZoneNameLen + limiter.MaxNameLen

// stateFileWriter builds a state file in memory.
type stateFileWriter struct {
	buf, scratch []byte
	states       int    // the states added
	settled      []byte // the settlements of those that carry one
	granted      []byte // the lease grants of those that carry some
}

func newStateFileWriter() *stateFileWriter {
	w := &stateFileWriter{buf: make([]byte, 0, 4096)}
	w.buf = append(w.buf, stateFileMagic...)
	w.buf = binary.AppendUvarint(w.buf, stateFileVersion)
	return w
}

// add appends s, its settlement and its lease grants, if any; an invalid
// s, or one with an invalid settlement, is skipped and reported. Of its
// grants, the first limiter.MaxLeaseGrants valid ones are written, the
// others left out (their holders' returns free nothing after a restart).
func (w *stateFileWriter) add(s *limiter.Snapshot) error {
	b, err := s.AppendBinary(w.scratch[:0])
	if err != nil {
		return err
	}
	w.scratch = b
	if st := s.Settle; st != nil {
		if err := st.Validate(s); err != nil {
			return err
		}
		w.settled = appendSettlement(w.settled, w.states, st)
	}
	written := 0
	for i := range s.Grants {
		if g := &s.Grants[i]; written < limiter.MaxLeaseGrants && g.Validate(s) == nil {
			w.granted = appendGrant(w.granted, w.states, g)
			written++
		}
	}
	w.buf = binary.AppendUvarint(w.buf, uint64(len(b)))
	w.buf = append(w.buf, b...)
	w.states++
	return nil
}

// bytes ends the file and returns it: version 1 unless a state carries a
// settlement (version 2) or lease grants (version 3).
func (w *stateFileWriter) bytes() []byte {
	v := stateFileVersion
	switch {
	case len(w.granted) > 0:
		v = stateFileGranted
	case len(w.settled) > 0:
		v = stateFileSettled
	}
	w.buf[len(stateFileMagic)] = byte(v) // one byte as a uvarint, as 1 is
	w.buf = append(w.buf, 0)
	if v >= stateFileSettled {
		w.buf = append(w.buf, w.settled...)
		w.buf = append(w.buf, 0)
	}
	if v >= stateFileGranted {
		w.buf = append(w.buf, w.granted...)
		w.buf = append(w.buf, 0)
	}
	return binary.LittleEndian.AppendUint32(w.buf, crc32.Checksum(w.buf, castagnoli))
}

// appendSettlement appends st, the settlement of the state numbered index,
// to b as a length and the settlement's format. st must be valid.
func appendSettlement(b []byte, index int, st *limiter.Settlement) []byte {
	var rec []byte
	rec = binary.AppendUvarint(rec, uint64(index))
	rec = appendRate(rec, &st.Request)
	rec = binary.AppendUvarint(rec, uint64(len(st.Parts)))
	for _, p := range st.Parts {
		rec = appendText(rec, p.Origin)
		rec = binary.AppendUvarint(rec, p.Gen)
		rec = binary.AppendUvarint(rec, uint64(p.Hits))
	}
	b = binary.AppendUvarint(b, uint64(len(rec)))
	return append(b, rec...)
}

// appendGrant appends g, a grant of the state numbered index, to b as a
// length and the grant's format. g must be valid.
func appendGrant(b []byte, index int, g *limiter.LeaseGrant) []byte {
	var rec []byte
	rec = binary.AppendUvarint(rec, uint64(index))
	rec = appendRate(rec, &g.Request)
	rec = appendText(rec, g.Holder)
	rec = binary.AppendUvarint(rec, uint64(g.Hits))
	rec = binary.AppendVarint(rec, g.Entered)
	rec = binary.AppendVarint(rec, g.Expires)
	rec = binary.AppendVarint(rec, g.Window)
	b = binary.AppendUvarint(b, uint64(len(rec)))
	return append(b, rec...)
}

// appendRate appends r's rate: Limit, Period, Burst, the calendar unit's
// name and the zone's ("" for UTC).
func appendRate(b []byte, r *limiter.Request) []byte {
	b = binary.AppendUvarint(b, uint64(r.Limit))
	b = binary.AppendVarint(b, int64(r.Period))
	b = binary.AppendUvarint(b, uint64(r.Burst))
	b = appendText(b, r.Calendar.String())
	zone := ""
	if r.Location != nil && r.Location != time.UTC {
		zone = r.Location.String()
	}
	return appendText(b, zone)
}

func appendText(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeSettlement reads a settlement from rec and returns the index of
// its state and the settlement, not validated against the state yet.
func decodeSettlement(rec []byte) (int, *limiter.Settlement, error) {
	d := fieldReader{b: rec}
	index := d.uvarint("state index")
	rate := d.rate()
	n := d.uvarint("parts")
	if d.err == nil && (n == 0 || n > limiter.MaxSettleParts) {
		return 0, nil, fmt.Errorf("%d parts, not 1 to %d", n, limiter.MaxSettleParts)
	}
	st := &limiter.Settlement{}
	if d.err == nil {
		st.Parts = make([]limiter.SettlePart, n)
	}
	for i := range st.Parts {
		p := &st.Parts[i]
		p.Origin = d.text("part origin", limiter.MaxNameLen)
		p.Gen = d.uvarint("part generation")
		p.Hits = d.count("part hits")
	}
	switch {
	case d.err != nil:
		return 0, nil, d.err
	case len(d.b) > 0:
		return 0, nil, fmt.Errorf("%d bytes after the settlement", len(d.b))
	case index > maxStateFile:
		return 0, nil, fmt.Errorf("state index %d", index)
	}
	r, err := rate.request()
	if err != nil {
		return 0, nil, err
	}
	st.Request = r
	return int(index), st, nil
}

// decodeGrant reads a lease grant from rec and returns the index of its
// state and the grant, not validated against the state yet.
func decodeGrant(rec []byte) (int, limiter.LeaseGrant, error) {
	d := fieldReader{b: rec}
	index := d.uvarint("state index")
	rate := d.rate()
	var g limiter.LeaseGrant
	g.Holder = d.text("holder", limiter.MaxNameLen)
	g.Hits = d.count("hits")
	g.Entered = d.varint("entered")
	g.Expires = d.varint("expires")
	g.Window = d.varint("window end")
	switch {
	case d.err != nil:
		return 0, g, d.err
	case len(d.b) > 0:
		return 0, g, fmt.Errorf("%d bytes after the grant", len(d.b))
	case index > maxStateFile:
		return 0, g, fmt.Errorf("state index %d", index)
	}
	r, err := rate.request()
	if err != nil {
		return 0, g, err
	}
	g.Request = r
	return int(index), g, nil
}

// encodedRate is a rate as a settlement or a grant holds it, its calendar
// unit and zone by name.
type encodedRate struct {
	limit, burst int64
	period       time.Duration
	unit, zone   string
}

// rate reads a rate (appendRate).
func (d *fieldReader) rate() encodedRate {
	var e encodedRate
	e.limit = d.count("limit")
	e.period = time.Duration(d.varint("period"))
	e.burst = d.count("burst")
	e.unit = d.text("calendar unit", 16)
	e.zone = d.text("zone", limiter.MaxZoneNameLen)
	return e
}

// request returns e as a request of no name, key or algorithm.
func (e encodedRate) request() (limiter.Request, error) {
	r := limiter.Request{Limit: e.limit, Period: e.period, Burst: e.burst}
	var err error
	if r.Calendar, err = limiter.ParseCalendar(e.unit); err != nil {
		return r, err
	}
	if r.Location, err = limiter.LoadZone(e.zone); err != nil {
		return r, err
	}
	return r, nil
}

// fieldReader reads the fields of an encoded settlement; after the first
// error it reads zeros and keeps that error, which names the field.
type fieldReader struct {
	b   []byte
	err error
}

func (d *fieldReader) fail(field, what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s: %s", field, what)
	}
	d.b = nil
}

func (d *fieldReader) uvarint(field string) uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *fieldReader) varint(field string) int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a uvarint of at most limiter.MaxLimit.
func (d *fieldReader) count(field string) int64 {
	v := d.uvarint(field)
	if v > limiter.MaxLimit {
		d.fail(field, fmt.Sprintf("%d is more than %d", v, int64(limiter.MaxLimit)))
		return 0
	}
	return int64(v)
}

// text reads a length-prefixed string of at most limit bytes.
func (d *fieldReader) text(field string, limit int) string {
	n := d.uvarint(field + " length")
	switch {
	case d.err != nil:
		return ""
	case n > uint64(limit):
		d.fail(field, fmt.Sprintf("%d bytes, more than the maximum %d", n, limit))
		return ""
	case uint64(len(d.b)) < n:
		d.fail(field, "truncated")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// readStateFile returns the states of a state file in file order, each
// with its settlement and its lease grants when the file holds them. A file that is not
// complete and intact is refused with a *DataFileError saying why. The
// header and the checksum are checked before the file is read into
// memory, so that a damaged file (a large one of zeros, say) costs no
// more than a buffer.
func readStateFile(path string) ([]limiter.Snapshot, error) {
	refuse := func(format string, a ...any) error {
		return &DataFileError{Path: path, Reason: fmt.Sprintf(format, a...)}
	}
	failed := func(err error) error { return fmt.Errorf("%w: %v", ErrDataDir, err) }
	f, err := os.Open(path)
	if err != nil {
		return nil, failed(err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, failed(err)
	}
	size := info.Size()
	if size > maxStateFile {
		return nil, refuse("%d bytes, more than the maximum %d", size, int64(maxStateFile))
	}
	head := make([]byte, min(size, int64(len(stateFileMagic)+binary.MaxVarintLen64)))
	if _, err := io.ReadFull(f, head); err != nil {
		return nil, failed(err)
	}
	if !bytes.HasPrefix(head, []byte(stateFileMagic)) {
		return nil, refuse("not a sluice state file (it does not begin with %q)", stateFileMagic)
	}
	v, n := binary.Uvarint(head[len(stateFileMagic):])
	if n <= 0 {
		return nil, refuse("truncated header")
	}
	if v < stateFileVersion || v > stateFileGranted {
		return nil, refuse("file format version %d; this node reads versions %d to %d", v, stateFileVersion, stateFileGranted)
	}
	if size < int64(len(stateFileMagic)+n+5) {
		return nil, refuse("truncated: no end marker")
	}
	end := size - 4
	sum := crc32.New(castagnoli)
	var tail [4]byte
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, failed(err)
	}
	if _, err := io.CopyN(sum, f, end); err != nil {
		return nil, failed(err)
	}
	if _, err := io.ReadFull(f, tail[:]); err != nil {
		return nil, failed(err)
	}
	if got, want := sum.Sum32(), binary.LittleEndian.Uint32(tail[:]); got != want {
		return nil, refuse("checksum %08x, the file says %08x: truncated or damaged", got, want)
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, failed(err)
	}
	if crc32.Checksum(data[:end], castagnoli) != binary.LittleEndian.Uint32(data[end:]) {
		return nil, refuse("changed while it was read")
	}
	states, reason := decodeStateRecords(data[len(stateFileMagic)+n:end], v)
	if reason != "" {
		return nil, refuse("%s", reason)
	}
	return states, nil
}

// decodeStateRecords decodes the records of a state file of version v,
// between its header and its checksum; reason says why they are refused.
func decodeStateRecords(records []byte, v uint64) (states []limiter.Snapshot, reason string) {
	// next returns the next record, nil at the end marker.
	next := func(what string, i, limit int) ([]byte, string) {
		l, k := binary.Uvarint(records)
		switch {
		case k <= 0:
			return nil, fmt.Sprintf("%s %d: bad length", what, i)
		case l > uint64(len(records)-k):
			return nil, fmt.Sprintf("%s %d: length %d runs past the end", what, i, l)
		case l > uint64(limit):
			return nil, fmt.Sprintf("%s %d: length %d, more than the maximum %d", what, i, l, limit)
		}
		rec := records[k : k+int(l)]
		records = records[k+int(l):]
		if l == 0 {
			return nil, ""
		}
		return rec, ""
	}
	for i := 0; ; i++ {
		rec, reason := next("record", i, limiter.MaxEncodedState)
		if reason != "" {
			return nil, reason
		}
		if rec == nil {
			break
		}
		var s limiter.Snapshot
		if err := s.UnmarshalBinary(rec); err != nil {
			return nil, fmt.Sprintf("record %d: %v", i, err)
		}
		states = append(states, s)
	}
	if v >= stateFileSettled {
		last := -1
		for i := 0; ; i++ {
			rec, reason := next("settlement", i, maxEncodedSettlement)
			if reason != "" {
				return nil, reason
			}
			if rec == nil {
				break
			}
			index, st, err := decodeSettlement(rec)
			switch {
			case err != nil:
				return nil, fmt.Sprintf("settlement %d: %v", i, err)
			case index >= len(states):
				return nil, fmt.Sprintf("settlement %d: state index %d, of a file of %d states", i, index, len(states))
			case index <= last:
				return nil, fmt.Sprintf("settlement %d: state index %d after %d: repeated or out of order", i, index, last)
			}
			s := &states[index]
			st.Request.Name, st.Request.Key, st.Request.Algorithm = s.Name, s.Key, s.Algorithm
			if err := st.Validate(s); err != nil {
				return nil, fmt.Sprintf("settlement %d: %v", i, err)
			}
			s.Settle, last = st, index
		}
	}
	if v >= stateFileGranted {
		last := 0
		for i := 0; ; i++ {
			rec, reason := next("grant", i, maxEncodedGrant)
			if reason != "" {
				return nil, reason
			}
			if rec == nil {
				break
			}
			index, g, err := decodeGrant(rec)
			switch {
			case err != nil:
				return nil, fmt.Sprintf("grant %d: %v", i, err)
			case index >= len(states):
				return nil, fmt.Sprintf("grant %d: state index %d, of a file of %d states", i, index, len(states))
			case index < last:
				return nil, fmt.Sprintf("grant %d: state index %d after %d: out of order", i, index, last)
			}
			s := &states[index]
			if len(s.Grants) == limiter.MaxLeaseGrants {
				return nil, fmt.Sprintf("grant %d: more than %d grants of state %d", i, limiter.MaxLeaseGrants, index)
			}
			g.Request.Name, g.Request.Key, g.Request.Algorithm = s.Name, s.Key, s.Algorithm
			if err := g.Validate(s); err != nil {
				return nil, fmt.Sprintf("grant %d: %v", i, err)
			}
			s.Grants, last = append(s.Grants, g), index
		}
	}
	if len(records) != 0 {
		return nil, fmt.Sprintf("%d bytes after the end marker", len(records))
	}
	return states, ""
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
// inspection and tests; a state carries the stand-in parts and the lease
// grants written with it (Snapshot.Settle, Snapshot.Grants). It takes no lock: run it on the directory of a
// node that is not running. A damaged file is an error (*DataFileError).
func ReadDataDir(dir string) ([]limiter.Snapshot, error) {
	files, err := listStateFiles(dir)
	if err != nil {
		return nil, err
	}
	last := map[stateKey]limiter.Snapshot{}
	for _, name := range files.all() {
		states, err := readStateFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		for _, s := range states {
			last[stateKey{s.Name, s.Key}] = s
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
