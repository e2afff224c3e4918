package cluster_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// stateFile builds a state file as cluster/datadir.go lays it out: the
// magic, format version 1, each record with its length, the end marker
// and the CRC-32C of all before it. The records are raw bytes, so that a
// test can write one with a valid checksum and content no node wrote.
func stateFile(records ...[]byte) []byte {
	b := append([]byte("SLUICEST"), 1)
	for _, r := range records {
		b = binary.AppendUvarint(b, uint64(len(r)))
		b = append(b, r...)
	}
	b = append(b, 0)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// encoded returns s in the state format, failing the test if s is invalid.
func encoded(t *testing.T, s limiter.Snapshot) []byte {
	t.Helper()
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// spentDataDir returns a data directory a node closed on after spending
// every quota of reqs (their whole limit each).
func spentDataDir(t *testing.T, reqs []limiter.Request) string {
	t.Helper()
	dir := t.TempDir()
	cfg := cluster.TestConfig("writer")
	cfg.DataDir = dir
	nd, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		r.Hits = r.Limit
		consume(t, nd, []limiter.Request{r})
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startOn starts a node alone on dir, closed when the test ends.
func startOn(t *testing.T, name, dir string, edit ...func(*cluster.Config)) *cluster.Node {
	t.Helper()
	cfg := cluster.TestConfig(name)
	cfg.DataDir = dir
	for _, e := range edit {
		e(&cfg)
	}
	return startNode(t, cfg)
}

// stillSpent counts the quotas of reqs that nd admits one more hit of.
func readmittedOn(t *testing.T, nd *cluster.Node, reqs []limiter.Request) int {
	t.Helper()
	n := 0
	for _, r := range reqs {
		d, err := nd.Check(context.Background(), r, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			t.Fatalf("%s: %v", r.Key, err)
		}
		if d.Allowed {
			n++
			t.Logf("%s (%s) admitted again", r.Key, r.Algorithm)
		}
	}
	return n
}

// A crash in the middle of a write leaves temporary files: a snapshot and
// a segment cut short under their .tmp names, and a members file's
// temporary copy. The next start restores every state the complete files
// hold, ignores the torn ones, and removes every temporary file, so that
// crashes do not fill the volume.
func TestRestartAfterCrashMidWrite(t *testing.T) {
	reqs := dailyQuotas(30)
	dir := spentDataDir(t, reqs)
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshot-*.state"))
	if len(snaps) != 1 {
		t.Fatalf("snapshots %v, want one", snaps)
	}
	whole, err := os.ReadFile(snaps[0])
	if err != nil {
		t.Fatal(err)
	}
	torn := map[string][]byte{
		// The next snapshot and segment, cut short as a crash leaves them.
		"snapshot-00000000000000f0.state.tmp": whole[:len(whole)/2],
		"segment-00000000000000f1.state.tmp":  []byte("SLUICEST\x01\x05"),
		"members.json.tmp-1234567":            []byte(`{"format":"sluice-members","vers`),
	}
	for name, b := range torn {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	nd := startOn(t, "reader", dir)
	if got := readmittedOn(t, nd, reqs); got != 0 {
		t.Fatalf("%d quotas admitted again after a crash mid-write", got)
	}
	if r := nd.Stats().Persist.Restored; r != int64(len(reqs)) {
		t.Fatalf("%d states restored, want %d", r, len(reqs))
	}
	for name := range torn {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the start (%v)", name, err)
		}
	}
}

// A state file whose checksum is right but whose records hold a state no
// node writes (found by a disk that flipped a bit before the checksum was
// taken, or written by another program) is refused whole, naming the file
// and the record; set aside, the node starts without it and still
// restores the other files.
func TestDataFileWithInvalidStateRefused(t *testing.T) {
	day := 24 * time.Hour
	expire := time.Now().Add(day).UnixNano()
	good := limiter.Snapshot{Name: "n", Key: "k", Algorithm: limiter.FixedWindow, ExpireAt: expire}
	withAlgo := func(code byte) []byte {
		b := encoded(t, good)
		b[1] = code // after the format version
		return b
	}
	bigKey := func() []byte {
		b := binary.AppendUvarint([]byte{1, 3}, 1)
		b = append(b, 'n')
		b = binary.AppendUvarint(b, limiter.MaxKeyLen+1)
		return append(b, strings.Repeat("k", limiter.MaxKeyLen+1)...)
	}
	// A fixed window's record: header, then rate, window start and count.
	window := func(limit, burst uint64, period int64, hits uint64) []byte {
		b := binary.AppendUvarint(nil, 1)
		b = append(b, 3) // fixed window
		b = binary.AppendUvarint(b, 1)
		b = append(b, 'n')
		b = binary.AppendUvarint(b, 1)
		b = append(b, 'k')
		b = binary.AppendVarint(b, expire)
		b = binary.AppendUvarint(b, limit)
		b = binary.AppendUvarint(b, burst)
		b = binary.AppendVarint(b, period)
		b = binary.AppendVarint(b, time.Now().Truncate(day).UnixNano())
		return binary.AppendUvarint(b, hits)
	}
	steps := []struct {
		name   string
		record []byte
		want   string
	}{
		{"a foreign algorithm", withAlgo(42), "unknown algorithm code 42"},
		{"algorithm 0", withAlgo(0), "unknown algorithm code 0"},
		{"an enormous key", bigKey(), "more than the maximum"},
		{"a rate of limit 0", window(0, 0, int64(day), 1), "rate"},
		{"a negative period", window(5, 5, -int64(day), 1), "rate"},
		{"more hits than any limit", window(0, 0, 0, limiter.MaxLimit+1), "window count"},
		{"a byte after the state", append(encoded(t, good), 0), "1 bytes after the state"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "segment-0000000000000001.state")
			ok := encoded(t, limiter.Snapshot{Name: "n", Key: "other", Algorithm: limiter.FixedWindow, ExpireAt: expire})
			if err := os.WriteFile(file, stateFile(ok, s.record), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := cluster.TestConfig("reader")
			cfg.DataDir = dir
			nd, err := cluster.New(cfg)
			var bad *cluster.DataFileError
			if err == nil {
				nd.Close()
			}
			if !errors.As(err, &bad) || bad.Path != file || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("New: %v, want a DataFileError on %s saying %q", err, file, s.want)
			}
			if !strings.Contains(err.Error(), "record 1") {
				t.Errorf("New: %v, want the record named (record 1)", err)
			}
			// Set aside, the node starts with the states of the files
			// that are intact, and none of the refused one's, not even
			// those before its bad record.
			intact := stateFile(encoded(t, limiter.Snapshot{Name: "n", Key: "kept", Algorithm: limiter.FixedWindow, ExpireAt: expire,
				Words: [3]int64{time.Now().Truncate(day).UnixNano(), 3}}))
			if err := os.WriteFile(filepath.Join(dir, "segment-0000000000000002.state"), intact, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.DamagedData = cluster.SetDamagedAside
			nd = startNode(t, cfg)
			if _, err := os.Stat(file + ".damaged"); err != nil {
				t.Fatalf("the file was not set aside: %v", err)
			}
			if r := nd.Stats().Persist.Restored; r != 1 {
				t.Fatalf("%d states restored, want the intact file's 1", r)
			}
		})
	}
}

// A node whose clock ran ahead wrote its states, then started again with
// its clock set right (an NTP step back, a VM restored on another host):
// its own states' times are now in the future. Restoring them keeps
// their consumption: the quotas spent before the restart stay spent
// (daily windows, whose starts are aligned, stay in their day).
func TestRestoreStatesWrittenByAClockAhead(t *testing.T) {
	for _, ahead := range []time.Duration{time.Minute, 10 * time.Minute, 2 * time.Hour} {
		t.Run(fmt.Sprintf("ahead=%v", ahead), func(t *testing.T) {
			dir := t.TempDir()
			right := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
			reqs := dailyQuotas(12)
			start := func(clk *fakeclock.Clock) *cluster.Node {
				return startOn(t, "skewed", dir, func(c *cluster.Config) { c.Clock = cluster.ClockFunc(clk.Now) })
			}
			nd := start(fakeclock.New(right.Add(ahead)))
			for _, r := range reqs {
				r.Hits = r.Limit
				consume(t, nd, []limiter.Request{r})
			}
			if err := nd.Close(); err != nil {
				t.Fatal(err)
			}
			nd = start(fakeclock.New(right))
			if got := readmittedOn(t, nd, reqs); got != 0 {
				t.Fatalf("%d of %d spent daily quotas admitted again after a restart with the clock %v earlier (%d states restored)",
					got, len(reqs), ahead, nd.Stats().Persist.Restored)
			}
		})
	}
}

// A write that fails (the segment's temporary name is taken by a
// directory, as an unwritable volume would fail it) is counted, and the
// states it held are written at a later interval once writing works
// again: a kill after that loses none of them.
func TestPersistRetriesAFailedWrite(t *testing.T) {
	dir := t.TempDir()
	nd := startOn(t, "writer", dir, func(c *cluster.Config) { c.PersistInterval = 20 * time.Millisecond })
	// The directory holds no state file yet: the first segment is 1.
	block := filepath.Join(dir, "segment-0000000000000001.state.tmp")
	if err := os.MkdirAll(filepath.Join(block, "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	reqs := dailyQuotas(20)
	for _, r := range reqs {
		r.Hits = r.Limit
		consume(t, nd, []limiter.Request{r})
	}
	testwait.For(t, "a failed write", func() bool { return nd.Stats().Persist.WriteErrors >= 2 })
	if st := nd.Stats().Persist; st.Segments != 0 || st.Written != 0 {
		t.Fatalf("%+v: a segment written while its name was blocked", st)
	}
	if err := os.RemoveAll(block); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the states written once the write works", func() bool { return nd.Stats().Persist.Written == int64(len(reqs)) })
	// What a SIGKILL now leaves: the directory as it is, without the
	// snapshot Close would write.
	copied := t.TempDir()
	copyDir(t, dir, copied)
	again := startOn(t, "after-kill", copied)
	if got := readmittedOn(t, again, reqs); got != 0 {
		t.Fatalf("%d quotas admitted again after a kill that followed a failed write", got)
	}
}

// copyDir copies the regular files of src to dst, but the lock.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // replaced by a snapshot meanwhile
				continue
			}
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(out, in)
		in.Close()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A node remembers the members it saw (members.json) and joins their
// addresses again on start and every RetryJoinInterval. When its whole
// cluster is gone and another, unrelated cluster now listens at a
// remembered address, the restarted node must not glue itself, and its
// keys, to that cluster, in either direction: a remembered member is
// joined only once it answers as itself at its remembered gRPC address.
func TestRememberedAddressNowAnotherCluster(t *testing.T) {
	dirA := t.TempDir()
	ca := cluster.TestConfig("a")
	ca.DataDir = dirA
	a := startNode(t, ca)
	cb := cluster.TestConfig("b")
	cb.Seeds = []string{a.GossipAddr()}
	b := startNode(t, cb)
	converged(t, a, b)
	bAddr, bGRPC := b.GossipAddr(), b.GRPCAddr()
	testwait.For(t, "a to remember b", func() bool {
		text, _ := os.ReadFile(filepath.Join(dirA, "members.json"))
		return strings.Contains(string(text), bAddr) && strings.Contains(string(text), bGRPC)
	})
	if err := b.Leave(); err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    func(*cluster.Config) // the other cluster's node at b's gossip address
	}{
		// Its gRPC port is another: nothing answers at b's.
		{"another gRPC address", func(*cluster.Config) {}},
		// b's gRPC address too: it answers under another name.
		{"b's gRPC address", func(c *cluster.Config) { c.GRPCAddr = bGRPC }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := cluster.TestConfig("other-p")
			cp.GossipAddr = bAddr
			tc.p(&cp)
			p := startNode(t, cp)
			cq := cluster.TestConfig("other-q")
			cq.Seeds = []string{p.GossipAddr()}
			q := startNode(t, cq)
			converged(t, p, q)

			log := &logLines{}
			ca := ca
			ca.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ca.GossipAddr = cluster.TestConfig("a").GossipAddr
			a := startNode(t, ca)
			// The pass at start and two of the passes every
			// RetryJoinInterval have tried the remembered member.
			testwait.For(t, "three of a's passes over its remembered members", func() bool {
				return log.count("remembered members that did not answer as themselves") >= 3 || len(p.RingMembers()) > 2
			})
			for _, n := range []*cluster.Node{a, p, q} {
				for _, m := range n.RingMembers() {
					if (n == a) != (m.Name == "a") {
						t.Fatalf("%s routes to %v: a restarted node and an unrelated cluster at a remembered address merged", n.Name(), n.RingMembers())
					}
				}
			}
			a.Close()
			q.Close()
			p.Close()
		})
	}
}

// A members file of version 1, as a release before gRPC addresses were
// remembered wrote it, is read on upgrade, and its members are joined
// by gossip address alone; the node writes version 2 once it sees them.
func TestMembersFileVersion1Rejoined(t *testing.T) {
	b := startNode(t, cluster.TestConfig("b"))
	dir := t.TempDir()
	v1 := `{"format":"sluice-members","version":1,"members":[{"name":"b","gossip":"` + b.GossipAddr() + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, "members.json"), []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := cluster.TestConfig("a")
	ca.DataDir = dir
	a := startNode(t, ca)
	converged(t, a, b)
	testwait.For(t, "a to write version 2 with b's gRPC address", func() bool {
		text, _ := os.ReadFile(filepath.Join(dir, "members.json"))
		return strings.Contains(string(text), `"version": 2`) && strings.Contains(string(text), `"grpc": "`+b.GRPCAddr()+`"`)
	})
}

// A cluster that kept no copies (Replicas 1) stops, and one node comes
// back on the directory of the last to leave, which holds every key, with
// two new nodes and Replicas 3. The restored keys reach their owners and
// every replica: once they do, the restored node is killed hard and no
// spent quota admits again on the two left.
func TestRestartWithMoreReplicas(t *testing.T) {
	waitBound(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	reqs := dailyQuotas(60)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, c *cluster.Config) {
		c.DataDir, c.Replicas = dirs[i], 1
	}))
	spendAll(t, c, reqs)
	for i := range 3 {
		c.Leave(i)
	}
	again := testcluster.New(t, 3, testcluster.WithConfig(func(i int, c *cluster.Config) {
		c.NodeName = fmt.Sprintf("more-%d", i)
		c.Replicas = 3
		c.DataDir = t.TempDir()
		if i == 0 {
			c.DataDir = dirs[2] // the last to leave: every key
		}
	}))
	if r := again.Node(0).Stats().Persist.Restored; r != int64(len(reqs)) {
		t.Fatalf("%d states restored, want %d", r, len(reqs))
	}
	testwait.For(t, "every key on every node", func() bool {
		for _, nd := range again.Nodes() {
			if nd.Stats().Store.Entries < int64(len(reqs)) {
				return false
			}
		}
		return true
	})
	again.StopHard(0)
	again.WaitConverged()
	if got := readmitted(t, again, reqs); got != 0 {
		t.Fatalf("%d quotas admitted again after the restored node was killed", got)
	}
}

// A rolling restart of every node of three, each on its data directory,
// under traffic: 16 callers check 120 keys of limit 10 (20 of each
// algorithm) on every live node, denying when the owner cannot be
// reached. Each node leaves gracefully and starts again with its name and
// directory, restoring the states it held (older than what its keys'
// owners hold meanwhile); no key admits more than its limit.
func TestRollingRestartWithDataDir(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, c *cluster.Config) { c.DataDir = dirs[i] }))
	var reqs []limiter.Request
	for _, a := range allAlgorithms {
		reqs = append(reqs, transitionRequests("rolling-"+a.String(), a, 20, 10)...)
	}
	tr := startTraffic(t, c, reqs, 16, 1<<30, 2*time.Minute)
	defer tr.finish()
	tr.admittedAtLeast(t, 200)
	var restored int64
	for i := range 3 {
		c.Leave(i)
		restored += c.Restart(i).Stats().Persist.Restored
		tr.checkedMore(t, 400)
	}
	tr.checkedMore(t, 1000)
	tr.finish()
	tr.overLimit(t)
	if restored == 0 {
		t.Fatal("no state restored: the restarts proved nothing")
	}
	t.Logf("%d states restored in all; %d checks decided without their owner", restored, tr.unowned.Load())
}

// A damaged state file can be large and cost nothing on disk: a file of
// zeros of its former length (what a crash leaves on some file systems),
// or a sparse one. Refusing it must not cost memory in proportion to its
// length: New allocates less than a tenth of the file's 64 MiB before it
// refuses it, where reading it whole and sizing the restore's map by it
// took 704 MiB.
func TestLargeDamagedDataFileRefusedCheaply(t *testing.T) {
	const size = 64 << 20
	for name, head := range map[string]string{
		"zeros":                "",
		"a header, then zeros": "SLUICEST\x01",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "snapshot-0000000000000001.state")
			f, err := os.Create(file)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteString(head)
			if err == nil {
				err = f.Truncate(size) // sparse: zeros that take no disk
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg := cluster.TestConfig("reader")
			cfg.DataDir = dir
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			nd, err := cluster.New(cfg)
			runtime.ReadMemStats(&after)
			if err == nil {
				nd.Close()
				t.Fatal("New started on a damaged file")
			}
			var bad *cluster.DataFileError
			if !errors.As(err, &bad) || bad.Path != file {
				t.Fatalf("New: %v, want a DataFileError on %s", err, file)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("refused (%v) after allocating %d KiB", err, alloc>>10)
			if alloc > size/10 {
				t.Fatalf("New allocated %d MiB to refuse a damaged file of %d MiB", alloc>>20, size>>20)
			}
		})
	}
}

// A DataDir that cannot be a directory (a file is there, or under it) stops
// New with ErrDataDir, as every error about the directory does, naming it.
func TestDataDirNotADirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(file, "under")} {
		cfg := cluster.TestConfig("n")
		cfg.DataDir = dir
		nd, err := cluster.New(cfg)
		if err == nil {
			nd.Close()
			t.Fatalf("New started on DataDir %s", dir)
		}
		if !errors.Is(err, cluster.ErrDataDir) || !strings.Contains(err.Error(), file) {
			t.Errorf("DataDir %s: %v, want ErrDataDir naming the path", dir, err)
		}
	}
}

// A whole cluster of three with BootstrapExpect 3 and data directories
// stops gracefully, and only two come back: they are not ready, say they
// wait for the third, and decide nothing as owner (under deny, every
// spent quota stays denied); the third's return makes all ready, with
// every quota still spent.
func TestFullRestartWaitsForBootstrapExpect(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	names := []string{"boot-0", "boot-1", "boot-2"}
	start := func(i int, seeds ...*cluster.Node) *cluster.Node {
		c := cluster.TestConfig(names[i])
		c.DataDir, c.BootstrapExpect = dirs[i], 3
		for _, s := range seeds {
			c.Seeds = append(c.Seeds, s.GossipAddr())
		}
		return startNode(t, c)
	}
	first := start(0)
	nodes := []*cluster.Node{first, start(1, first), start(2, first)}
	waitReady(t, nodes...)
	converged(t, nodes...)
	reqs := dailyRequests("boot-restart", 30, 2)
	for _, r := range reqs {
		if got := admitted(t, nodes[0], r, 3); got != 2 {
			t.Fatalf("%s: %d of 3 admitted, want the limit 2", r.Key, got)
		}
	}
	for _, n := range nodes {
		if err := n.Leave(); err != nil {
			t.Fatal(err)
		}
	}
	a := start(0)
	b := start(1, a)
	routes(t, 2, a, b)
	for _, n := range []*cluster.Node{a, b} {
		if n.Ready() {
			t.Fatalf("%s is ready with 2 of the 3 members BootstrapExpect names", n.Name())
		}
		if why := n.NotReadyReason(); !strings.Contains(why, "3 members") || !strings.Contains(why, "2 seen") {
			t.Errorf("%s is not ready for %q, want the count of members it waits for", n.Name(), why)
		}
		for _, r := range reqs[:10] {
			if got := admitted(t, n, r, 1); got != 0 {
				t.Fatalf("%s admitted %s, spent before the restart, while not ready", n.Name(), r.Key)
			}
		}
	}
	c := start(2, a)
	waitReady(t, a, b, c)
	converged(t, a, b, c)
	for i, r := range reqs {
		if got := admitted(t, []*cluster.Node{a, b, c}[i%3], r, 1); got != 0 {
			t.Fatalf("%s admitted again after the full restart", r.Key)
		}
	}
}

// TestRestartKeepsTheStrictestPeriodRate: a key of a 24h Period spent on
// a node with KeepStrictest, restored from its data directory, is decided
// at the rate it was charged under: a check at 50 a second finds it spent.
func TestRestartKeepsTheStrictestPeriodRate(t *testing.T) {
	dir := t.TempDir()
	clk := fakeclock.New(time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC))
	start := func() *cluster.Node {
		return startOn(t, "strict", dir, func(c *cluster.Config) {
			c.Store.KeepStrictest, c.Clock = true, cluster.ClockFunc(clk.Now)
		})
	}
	var reqs []limiter.Request
	for _, a := range allAlgorithms {
		reqs = append(reqs, limiter.Request{Name: "daily", Key: a.String(), Hits: 50, Limit: 50, Period: 24 * time.Hour, Algorithm: a})
	}
	nd := start()
	consume(t, nd, reqs)
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
	nd = start()
	for range 3 {
		clk.Advance(1500 * time.Millisecond)
		for _, r := range reqs {
			lax := r
			lax.Hits, lax.Period = 1, time.Second
			d, err := nd.Check(context.Background(), lax)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Errorf("%s: a spent key restored from the data directory admitted a check at 50 a second at %v", r.Algorithm, clk.Now())
			}
		}
	}
}

// A node at its MaxEntries evicts the keys used least recently. Its data
// directory, as a kill leaves it, holds the evicted keys too (in a
// snapshot or earlier segments): a restore into a store of the same bound
// keeps the keys the store held at the kill, and evicts those it had
// evicted already, not some of the others.
func TestRestoreAtMaxEntriesKeepsTheRecentKeys(t *testing.T) {
	bound := func(c *cluster.Config) {
		c.Store.Shards, c.Store.MaxEntries = 1, 100
		c.PersistInterval = 20 * time.Millisecond
	}
	reqs := dailyQuotas(150)
	// spend spends reqs in order, 50 at a time, each 50 written before
	// the next.
	spend := func(nd *cluster.Node, reqs []limiter.Request) {
		for i := 0; i < len(reqs); i += 50 {
			written := nd.Stats().Persist.Written
			for _, r := range reqs[i : i+50] {
				r.Hits = r.Limit
				consume(t, nd, []limiter.Request{r})
			}
			testwait.For(t, "50 more states written", func() bool { return nd.Stats().Persist.Written >= written+50 })
		}
	}
	steps := []struct {
		name  string
		write func(t *testing.T, dir string) *cluster.Node // the node to kill
	}{
		{"segments", func(t *testing.T, dir string) *cluster.Node {
			nd := startOn(t, "bounded", dir, bound)
			spend(nd, reqs)
			return nd
		}},
		{"a snapshot then segments", func(t *testing.T, dir string) *cluster.Node {
			nd := startOn(t, "bounded", dir, bound)
			spend(nd, reqs[:100])
			if err := nd.Close(); err != nil { // a snapshot of the 100
				t.Fatal(err)
			}
			nd = startOn(t, "bounded", dir, bound)
			spend(nd, reqs[100:])
			return nd
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			dir := t.TempDir()
			nd := s.write(t, dir)
			if ev := nd.Stats().Store.Evictions; ev != 50 {
				t.Fatalf("%d keys evicted, want the 50 used first", ev)
			}
			copied := t.TempDir()
			copyDir(t, dir, copied) // what a kill leaves
			again := startOn(t, "bounded-again", copied, bound)
			// Inspect reads without inserting: a check of a lost key
			// would evict another.
			lost := 0
			for _, r := range reqs[50:] {
				ins, err := again.Inspect(context.Background(), r.Name, r.Key)
				if err != nil {
					t.Fatal(err)
				}
				if !ins.Found {
					lost++
				}
			}
			if lost != 0 {
				t.Fatalf("%d of the 100 keys the store held at the kill were not restored (%d states restored, %d evicted)",
					lost, again.Stats().Persist.Restored, again.Stats().Store.Evictions)
			}
		})
	}
}

// A New that fails after it restored its data directory (its gRPC port is
// taken) gives the directory back, states intact: the next New on it
// starts and restores every state.
func TestFailedStartKeepsTheDataDir(t *testing.T) {
	reqs := dailyQuotas(20)
	dir := spentDataDir(t, reqs)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := cluster.TestConfig("retry")
	cfg.DataDir, cfg.GRPCAddr = dir, busy.Addr().String()
	if nd, err := cluster.New(cfg); err == nil {
		nd.Close()
		t.Fatal("New started on a taken gRPC port")
	}
	nd := startOn(t, "retry", dir)
	if r := nd.Stats().Persist.Restored; r != int64(len(reqs)) {
		t.Fatalf("%d states restored after a failed start, want %d", r, len(reqs))
	}
	if got := readmittedOn(t, nd, reqs); got != 0 {
		t.Fatalf("%d quotas admitted again after a failed start", got)
	}
}

// The node's clock steps back an hour while it runs (an NTP step, a VM
// migrated): the keys that change after it are still written within an
// interval, so that a kill loses no more than PersistInterval of traffic,
// not the hour the clock went back.
func TestPersistAfterTheClockStepsBack(t *testing.T) {
	clk := fakeclock.New(time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC))
	nd := startOn(t, "stepped", t.TempDir(), func(c *cluster.Config) {
		c.Clock, c.PersistInterval = cluster.ClockFunc(clk.Now), 20*time.Millisecond
	})
	reqs := dailyQuotas(20)
	written := func(want int64) {
		t.Helper()
		testwait.For(t, fmt.Sprintf("%d states written", want), func() bool { return nd.Stats().Persist.Written >= want })
	}
	consume(t, nd, reqs[:10])
	clk.Advance(time.Second)
	written(10)
	clk.Advance(-time.Hour)
	consume(t, nd, reqs[10:])
	clk.Advance(time.Second)
	written(20)
}

// A state file with a valid checksum whose record dates a window in 2100
// (no clock of this node wrote it) starts the node: that state is refused
// by the merge's bound on times and its key starts fresh, logged, while
// the file's other states are restored.
func TestDataFileWithAStateFromTheFarFuture(t *testing.T) {
	day := 24 * time.Hour
	now := time.Now()
	future := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	window := func(key string, start time.Time) limiter.Snapshot {
		return limiter.Snapshot{Name: "n", Key: key, Algorithm: limiter.FixedWindow, ExpireAt: start.Add(day).UnixNano(),
			Words: [3]int64{start.UnixNano(), 7}}
	}
	dir := t.TempDir()
	file := stateFile(encoded(t, window("now", now.Truncate(day))), encoded(t, window("2100", future)))
	if err := os.WriteFile(filepath.Join(dir, "segment-0000000000000001.state"), file, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &logLines{}
	nd := startOn(t, "reader", dir, func(c *cluster.Config) {
		c.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	for key, want := range map[string]bool{"now": true, "2100": false} {
		ins, err := nd.Inspect(context.Background(), "n", key)
		if err != nil {
			t.Fatal(err)
		}
		if ins.Found != want || (want && ins.State.View().WindowHits != 7) {
			t.Errorf("key %s: found %v (%+v), want %v", key, ins.Found, ins.State.View(), want)
		}
	}
	if !log.find("refused by the store") {
		t.Error("the refused state was not logged")
	}
	if r := nd.Stats().Persist.Restored; r != 1 {
		t.Errorf("%d states counted restored, want 1: the refused one is not", r)
	}
}
