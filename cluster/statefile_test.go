package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// settledStates returns a state of each window algorithm and a token
// bucket's, the second and the last with stand-in parts, the last's rate
// a calendar day in a zone.
func settledStates(t testing.TB) []limiter.Snapshot {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	paris, err := limiter.LoadZone("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	reqs := []limiter.Request{
		{Name: "n", Key: "fixed", Hits: 3, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow},
		{Name: "n", Key: "counter", Hits: 30, Limit: 100, Period: time.Hour, Algorithm: limiter.SlidingWindowCounter},
		{Name: "n", Key: "bucket", Hits: 7, Limit: 100, Period: time.Minute, Burst: 20, Algorithm: limiter.TokenBucket},
		{Name: "n", Key: "day", Hits: 40, Limit: 100, Calendar: limiter.Day, Location: paris, Algorithm: limiter.FixedWindow},
	}
	var out []limiter.Snapshot
	for _, r := range reqs {
		if _, err := store.CheckAt(r, now); err != nil {
			t.Fatal(err)
		}
		sn, ok := store.Snapshot(r.Name, r.Key, now)
		if !ok {
			t.Fatalf("%s: no state", r.Key)
		}
		out = append(out, sn)
	}
	charge := func(r limiter.Request) limiter.Request { r.Hits = 0; return r }
	out[1].Settle = &limiter.Settlement{Request: charge(reqs[1]), Parts: []limiter.SettlePart{
		{Origin: "node-0", Gen: 1_700_000_000_000_000_001, Hits: 20}, {Origin: "node-2", Gen: 5, Hits: 10}}}
	out[3].Settle = &limiter.Settlement{Request: charge(reqs[3]), Parts: []limiter.SettlePart{{Origin: "node-0", Gen: 9, Hits: 40}}}
	return out
}

// v1File lays out states as version 1 of the state file: the layout every
// earlier release writes and reads.
func v1File(t testing.TB, states []limiter.Snapshot) []byte {
	t.Helper()
	b := append([]byte(stateFileMagic), 1)
	for _, s := range states {
		s.Settle = nil
		rec, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		b = binary.AppendUvarint(b, uint64(len(rec)))
		b = append(b, rec...)
	}
	b = append(b, 0)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func writeStates(t testing.TB, states []limiter.Snapshot) []byte {
	t.Helper()
	w := newStateFileWriter()
	for i := range states {
		if err := w.add(&states[i]); err != nil {
			t.Fatal(err)
		}
	}
	return w.bytes()
}

func readStates(t testing.TB, data []byte) ([]limiter.Snapshot, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "segment-0000000000000001.state")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return readStateFile(path)
}

// A file whose states carry no stand-in parts is version 1, byte for byte
// as before parts were written; one with parts is version 2 and reads back
// with every part, each on its state.
func TestStateFileVersions(t *testing.T) {
	states := settledStates(t)
	plain := make([]limiter.Snapshot, len(states))
	for i, s := range states {
		s.Settle = nil
		plain[i] = s
	}
	if got, want := writeStates(t, plain), v1File(t, plain); !bytes.Equal(got, want) {
		t.Fatalf("a file without parts:\n%x\nwant version 1:\n%x", got, want)
	}
	file := writeStates(t, states)
	if file[len(stateFileMagic)] != stateFileSettled {
		t.Fatalf("a file with parts is version %d, want %d", file[len(stateFileMagic)], stateFileSettled)
	}
	got, err := readStates(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(states) {
		t.Fatalf("%d states read, want %d", len(got), len(states))
	}
	for i := range states {
		if !reflect.DeepEqual(got[i].Settle, states[i].Settle) {
			t.Errorf("state %d (%s): settlement %+v, want %+v", i, states[i].Key, got[i].Settle, states[i].Settle)
		}
		got[i].Settle, states[i].Settle = nil, nil
		a, _ := got[i].MarshalBinary()
		b, _ := states[i].MarshalBinary()
		if !bytes.Equal(a, b) {
			t.Errorf("state %d (%s) read as %+v, want %+v", i, states[i].Key, got[i], states[i])
		}
	}
}

// A version 2 file whose settlements are damaged, foreign or larger than
// any node writes (with a right checksum) is refused with a
// *DataFileError that names the settlement and what is wrong with it.
func TestStateFileSettlementRefused(t *testing.T) {
	states := settledStates(t)
	plain := make([]limiter.Snapshot, len(states))
	for i, s := range states {
		s.Settle = nil
		plain[i] = s
	}
	// raw lays out plain's states as version 2, then tail, then a right
	// checksum.
	raw := func(tail ...byte) []byte {
		b := v1File(t, plain)
		b = b[:len(b)-4]
		b[len(stateFileMagic)] = stateFileSettled
		b = append(b, tail...)
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	// file lays out plain's states and the settlement records as version
	// 2.
	file := func(settlements ...[]byte) []byte {
		var tail []byte
		for _, s := range settlements {
			tail = binary.AppendUvarint(tail, uint64(len(s)))
			tail = append(tail, s...)
		}
		return raw(append(tail, 0)...)
	}
	// settlement is the record of the settlement of states[index] (of
	// states[1] when it has none) at index, edited.
	settlement := func(index int, edit func(*limiter.Settlement)) []byte {
		st := *states[1].Settle
		if index < len(states) && states[index].Settle != nil {
			st = *states[index].Settle
		}
		st.Parts = append([]limiter.SettlePart(nil), st.Parts...)
		if edit != nil {
			edit(&st)
		}
		b := appendSettlement(nil, index, &st)
		_, k := binary.Uvarint(b)
		return b[k:]
	}
	good := settlement(1, nil)
	steps := []struct {
		name string
		data []byte
		want string
	}{
		{"a settlement longer than any", file(bytes.Repeat([]byte{1}, maxEncodedSettlement+1)),
			fmt.Sprintf("settlement 0: length %d, more than the maximum %d", maxEncodedSettlement+1, maxEncodedSettlement)},
		{"a length past the end", raw(100, 1, 2, 3, 0), "settlement 0: length 100 runs past the end"},
		{"no end marker", raw(append(binary.AppendUvarint(nil, uint64(len(good))), good...)...), "settlement 1: bad length"},
		{"no settlement section", raw(), "settlement 0: bad length"},
		{"an index past the states", file(settlement(4, nil)), "settlement 0: state index 4, of a file of 4 states"},
		{"two of one state", file(good, good), "settlement 1: state index 1 after 1: repeated"},
		{"out of order", file(settlement(3, nil), good), "settlement 1: state index 1 after 3: repeated or out of order"},
		{"no parts", file(settlement(1, func(st *limiter.Settlement) { st.Parts = nil })), "0 parts"},
		{"nine parts", file(settlement(1, func(st *limiter.Settlement) {
			for i := range 7 {
				st.Parts = append(st.Parts, limiter.SettlePart{Origin: "x", Gen: uint64(i), Hits: 1})
			}
		})), "9 parts"},
		{"a part of 0 hits", file(settlement(1, func(st *limiter.Settlement) { st.Parts[0].Hits = 0 })), "hits 0"},
		{"a part repeated", file(settlement(1, func(st *limiter.Settlement) { st.Parts[1] = st.Parts[0] })), "repeats"},
		{"an origin too long", file(settlement(1, func(st *limiter.Settlement) { st.Parts[0].Origin = strings.Repeat("o", limiter.MaxNameLen+1) })), "more than the maximum 128"},
		{"a rate of limit 0", file(settlement(1, func(st *limiter.Settlement) { st.Request.Limit = 0 })), "settlement request"},
		{"an unknown calendar", file(bytes.Replace(settlement(3, nil), []byte("\x03day"), []byte("\x03dax"), 1)), "unknown calendar unit"},
		{"a zone that does not load", file(bytes.Replace(settlement(3, nil), []byte("Europe/Paris"), []byte("Europe/Xaris"), 1)), "does not load"},
		{"a byte after a settlement", file(append(settlement(1, nil), 0)), "1 bytes after the settlement"},
		{"bytes after the end marker", func() []byte {
			b := file(good)
			b = append(b[:len(b)-4], 9)
			return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}(), "1 bytes after the end marker"},
		{"a settlement in version 1", func() []byte {
			b := file(good)
			b[len(stateFileMagic)] = stateFileVersion
			b = b[:len(b)-4]
			return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}(), "bytes after the end marker"},
		{"version 3 without a grant section", func() []byte {
			b := file(good)
			b[len(stateFileMagic)] = stateFileGranted
			b = b[:len(b)-4]
			return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}(), "grant 0: bad length"},
		{"version 4", func() []byte {
			b := file(good)
			b[len(stateFileMagic)] = 4
			b = b[:len(b)-4]
			return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}(), "file format version 4; this node reads versions 1 to 3"},
	}
	// The calendar of states[3] is a day in Paris: its settlement holds
	// the unit's and the zone's names.
	if !bytes.Contains(settlement(3, nil), []byte("\x03day")) || !bytes.Contains(settlement(3, nil), []byte("Europe/Paris")) {
		t.Fatal("the day's settlement does not hold its unit and zone names")
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			states, err := readStates(t, s.data)
			var bad *DataFileError
			if !errors.As(err, &bad) || !errors.Is(err, ErrDataDir) || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("read: %v (%d states), want a DataFileError saying %q", err, len(states), s.want)
			}
		})
	}
	if got, err := readStates(t, file(good, settlement(3, nil))); err != nil || got[1].Settle == nil || got[3].Settle == nil {
		t.Fatalf("the intact file: %v", err)
	}
}

// FuzzStateFile decodes any records as a state file of any version: never
// a panic, and what it accepts is written again as it was read.
func FuzzStateFile(f *testing.F) {
	states := settledStates(f)
	for _, file := range [][]byte{writeStates(f, states), v1File(f, states), writeStates(f, markedStates(f)), writeStates(f, grantedStates(f))} {
		f.Add(file[len(stateFileMagic)+1:len(file)-4], file[len(stateFileMagic)])
	}
	f.Add([]byte{0, 0}, byte(stateFileSettled))
	f.Add([]byte{0, 0, 0}, byte(stateFileGranted))
	f.Fuzz(func(t *testing.T, records []byte, version byte) {
		v := uint64(stateFileVersion + version%stateFileGranted)
		got, reason := decodeStateRecords(records, v)
		if reason != "" {
			return
		}
		b := writeStates(t, got)
		again, reason := decodeStateRecords(b[len(stateFileMagic)+1:len(b)-4], uint64(b[len(stateFileMagic)]))
		if reason != "" {
			t.Fatalf("what was read is refused once written: %s", reason)
		}
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("written and read again:\n%+v\nread first:\n%+v", again, got)
		}
	})
}

// markedStates returns a fixed window's state with a reset's mark, the
// mark alone of a GCRA key reset with no hits, and an unmarked token
// bucket's state.
func markedStates(t testing.TB) []limiter.Snapshot {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	check := func(r limiter.Request, at time.Time) {
		if _, err := store.CheckAt(r, at); err != nil {
			t.Fatal(err)
		}
	}
	fixed := limiter.Request{Name: "n", Key: "fixed", Hits: 3, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
	gcra := limiter.Request{Name: "n", Key: "gcra", Hits: 3, Limit: 100, Period: time.Hour, Algorithm: limiter.GCRA}
	bucket := limiter.Request{Name: "n", Key: "bucket", Hits: 7, Limit: 100, Period: time.Minute, Algorithm: limiter.TokenBucket}
	check(fixed, now.Add(-2*time.Second))
	check(gcra, now.Add(-2*time.Second))
	check(bucket, now)
	fixed.Hits, fixed.Behavior = 1, limiter.Reset
	gcra.Hits, gcra.Behavior = 0, limiter.Reset
	check(fixed, now.Add(-time.Second))
	check(gcra, now.Add(-time.Second))
	var out []limiter.Snapshot
	store.Range(now, func(s limiter.Snapshot) bool { out = append(out, s); return true })
	if len(out) != 3 {
		t.Fatalf("%d states, want 3", len(out))
	}
	return out
}

// A reset's mark is written to the state file with its state, and read
// back: its records alone are of state format version 3, the file stays
// version 1 (it holds no stand-in parts) and the checksum covers the
// mark; the files of earlier releases read as before
// (TestStateFileVersions' v1File).
func TestStateFileResetMark(t *testing.T) {
	states := markedStates(t)
	file := writeStates(t, states)
	if v := file[len(stateFileMagic)]; v != stateFileVersion {
		t.Fatalf("file format version %d, want %d", v, stateFileVersion)
	}
	rest := file[len(stateFileMagic)+1 : len(file)-4]
	for i, s := range states {
		n, k := binary.Uvarint(rest)
		rec := rest[k : k+int(n)]
		rest = rest[k+int(n):]
		want := byte(1)
		if s.HasResetMark() {
			want = 3
		}
		if rec[0] != want {
			t.Errorf("state %d (%s, mark %v): record of format version %d", i, s.Key, s.HasResetMark(), rec[0])
		}
	}
	path := filepath.Join(t.TempDir(), "snapshot-1.state")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readStateFile(path)
	if err != nil || !reflect.DeepEqual(got, states) {
		t.Fatalf("read back %+v, %v, want %+v", got, err, states)
	}
	// A bit of the mark flipped: the checksum refuses the file.
	marked, _ := states[0].MarshalBinary()
	at := bytes.Index(file, marked)
	if at < 0 || !states[0].HasResetMark() {
		t.Fatalf("no marked record in the file")
	}
	damaged := bytes.Clone(file)
	damaged[at+len(marked)-3] ^= 0x10
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	var dfe *DataFileError
	if _, err := readStateFile(path); !errors.As(err, &dfe) || !strings.Contains(dfe.Reason, "checksum") {
		t.Fatalf("a flipped bit: %v, want the checksum to refuse it", err)
	}
}

// grantedStates returns settledStates with lease grants: two of the fixed
// window's (one holder per limit), one of the token bucket's, and one of
// the calendar day's in Paris, which carries stand-in parts as well.
func grantedStates(t testing.TB) []limiter.Snapshot {
	t.Helper()
	states := settledStates(t)
	now := time.Unix(1_700_000_000, 0).UnixNano()
	paris, err := limiter.LoadZone("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	rate := func(s *limiter.Snapshot, limit int64, period time.Duration) limiter.Request {
		return limiter.Request{Name: s.Name, Key: s.Key, Algorithm: s.Algorithm, Limit: limit, Period: period}
	}
	fixed, bucket, day := &states[0], &states[2], &states[3]
	fixed.Grants = []limiter.LeaseGrant{
		{Holder: "node-0", Hits: 2, Request: rate(fixed, 100, time.Hour), Entered: now - 5e9, Expires: now + 5e9, Window: now + 3000e9},
		{Holder: "node-2", Hits: 1, Request: rate(fixed, 200, time.Hour), Entered: now - 1e9, Expires: now - 1, Window: now + 3000e9},
	}
	bucketRate := rate(bucket, 100, time.Minute)
	bucketRate.Burst = 20
	bucket.Grants = []limiter.LeaseGrant{{Holder: "node-1", Hits: 7, Request: bucketRate, Entered: now + 2e9, Expires: now + 2e9}}
	dayRate := limiter.Request{Name: day.Name, Key: day.Key, Algorithm: day.Algorithm, Limit: 100, Calendar: limiter.Day, Location: paris}
	day.Grants = []limiter.LeaseGrant{{Holder: "nöde-3", Hits: 40, Request: dayRate, Entered: now - 7e9, Expires: now + 1e9, Window: now + 40_000e9}}
	for i := range states {
		for j := range states[i].Grants {
			if err := states[i].Grants[j].Validate(&states[i]); err != nil {
				t.Fatalf("state %d grant %d: %v", i, j, err)
			}
		}
	}
	return states
}

// A file whose states carry lease grants is version 3 and reads back with
// every grant on its state, and every settlement; with grants and no
// parts it is version 3 as well, its settlement section empty. Files
// without grants keep their versions (TestStateFileVersions).
func TestStateFileGrants(t *testing.T) {
	for _, parts := range []bool{true, false} {
		t.Run(fmt.Sprintf("parts %v", parts), func(t *testing.T) {
			states := grantedStates(t)
			if !parts {
				for i := range states {
					states[i].Settle = nil
				}
			}
			file := writeStates(t, states)
			if v := file[len(stateFileMagic)]; v != stateFileGranted {
				t.Fatalf("a file with grants is version %d, want %d", v, stateFileGranted)
			}
			got, err := readStates(t, file)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, states) {
				t.Fatalf("read back:\n%+v\nwant:\n%+v", got, states)
			}
		})
	}
}

// A writer writes at most limiter.MaxLeaseGrants grants of a state, and
// leaves out a grant its state refuses, keeping the state and the others.
func TestStateFileGrantsBounded(t *testing.T) {
	states := grantedStates(t)
	fixed := &states[0]
	g := fixed.Grants[0]
	fixed.Grants = nil
	for i := range limiter.MaxLeaseGrants + 3 {
		g.Holder = fmt.Sprintf("node-%d", i)
		fixed.Grants = append(fixed.Grants, g)
	}
	bad := states[2].Grants[0]
	bad.Hits = 0
	states[2].Grants = append([]limiter.LeaseGrant{bad}, states[2].Grants...)
	got, err := readStates(t, writeStates(t, states))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got[0].Grants, fixed.Grants[:limiter.MaxLeaseGrants]) {
		t.Errorf("fixed window: %d grants read, want the first %d", len(got[0].Grants), limiter.MaxLeaseGrants)
	}
	if !reflect.DeepEqual(got[2].Grants, states[2].Grants[1:]) {
		t.Errorf("token bucket: grants %+v, want %+v", got[2].Grants, states[2].Grants[1:])
	}
}

// A version 3 file whose grants are damaged, foreign or more than a state
// holds (with a right checksum) is refused with a *DataFileError that
// names the grant and what is wrong with it.
func TestStateFileGrantRefused(t *testing.T) {
	states := grantedStates(t)
	plain := make([]limiter.Snapshot, len(states))
	for i, s := range states {
		s.Settle, s.Grants = nil, nil
		plain[i] = s
	}
	// file lays out plain's states, no settlement and the grant records
	// as version 3.
	file := func(grants ...[]byte) []byte {
		b := v1File(t, plain)
		b = b[:len(b)-4]
		b[len(stateFileMagic)] = stateFileGranted
		b = append(b, 0)
		for _, g := range grants {
			b = binary.AppendUvarint(b, uint64(len(g)))
			b = append(b, g...)
		}
		b = append(b, 0)
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	// grant is the record of the first grant of states[index] (of
	// states[0] when it has none) at index, edited.
	grant := func(index int, edit func(*limiter.LeaseGrant)) []byte {
		g := states[0].Grants[0]
		if index < len(states) && len(states[index].Grants) > 0 {
			g = states[index].Grants[0]
		}
		if edit != nil {
			edit(&g)
		}
		b := appendGrant(nil, index, &g)
		_, k := binary.Uvarint(b)
		return b[k:]
	}
	good := grant(0, nil)
	many := make([][]byte, limiter.MaxLeaseGrants+1)
	for i := range many {
		many[i] = grant(0, func(g *limiter.LeaseGrant) { g.Holder = fmt.Sprintf("node-%d", i) })
	}
	steps := []struct {
		name string
		data []byte
		want string
	}{
		{"a grant longer than any", file(bytes.Repeat([]byte{1}, maxEncodedGrant+1)),
			fmt.Sprintf("grant 0: length %d, more than the maximum %d", maxEncodedGrant+1, maxEncodedGrant)},
		{"an index past the states", file(grant(4, nil)), "grant 0: state index 4, of a file of 4 states"},
		{"out of order", file(grant(2, nil), good), "grant 1: state index 0 after 2: out of order"},
		{"more than a state holds", file(many...), fmt.Sprintf("grant %d: more than %d grants of state 0", limiter.MaxLeaseGrants, limiter.MaxLeaseGrants)},
		{"a grant of 0 hits", file(grant(0, func(g *limiter.LeaseGrant) { g.Hits = 0 })), "grant 0: limiter: invalid snapshot: lease grant of 0 hits"},
		{"no holder", file(grant(0, func(g *limiter.LeaseGrant) { g.Holder = "" })), "holder of 0 bytes"},
		{"a holder too long", file(grant(0, func(g *limiter.LeaseGrant) { g.Holder = strings.Repeat("h", limiter.MaxNameLen+1) })), "holder: 129 bytes, more than the maximum 128"},
		{"a fixed window's without its window", file(grant(0, func(g *limiter.LeaseGrant) { g.Window = 0 })), "with window end 0"},
		{"a token bucket's with a window", file(grant(2, func(g *limiter.LeaseGrant) { g.Window = 1 })), "with window end 1"},
		{"a rate of limit 0", file(grant(2, func(g *limiter.LeaseGrant) { g.Request.Limit = 0 })), "lease grant request"},
		{"a zone that does not load", file(bytes.Replace(grant(3, nil), []byte("Europe/Paris"), []byte("Europe/Xaris"), 1)), "does not load"},
		{"a byte after a grant", file(append(bytes.Clone(good), 0)), "1 bytes after the grant"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			states, err := readStates(t, s.data)
			var bad *DataFileError
			if !errors.As(err, &bad) || !errors.Is(err, ErrDataDir) || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("read: %v (%d states), want a DataFileError saying %q", err, len(states), s.want)
			}
		})
	}
	if got, err := readStates(t, file(good, grant(0, func(g *limiter.LeaseGrant) { g.Holder = "node-9" }), grant(3, nil))); err != nil || len(got[0].Grants) != 2 || len(got[3].Grants) != 1 {
		t.Fatalf("the intact file: %v", err)
	}
}
