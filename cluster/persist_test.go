package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// dailyQuotas returns one request on each of n keys, a limit of 50 a day,
// across the algorithms whose state a day keeps.
func dailyQuotas(n int) []limiter.Request {
	algos := []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingWindowCounter, limiter.GCRA, limiter.SlidingWindowLog, limiter.LeakyBucket}
	reqs := make([]limiter.Request, n)
	for i := range reqs {
		reqs[i] = limiter.Request{Name: "daily", Key: fmt.Sprintf("user-%d", i), Hits: 1, Limit: 50,
			Period: 24 * time.Hour, Algorithm: algos[i%len(algos)]}
	}
	return reqs
}

// spendAll takes every hit of every quota, each on its owner: the test is
// about what the owners keep, not about forwarding under load.
func spendAll(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request) {
	t.Helper()
	for _, r := range reqs {
		r.Hits = r.Limit
		consume(t, c.Owner(r.Name, r.Key), []limiter.Request{r})
	}
}

// readmitted checks one hit of every quota on its owner and returns how
// many were admitted.
func readmitted(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request) int {
	t.Helper()
	admitted := 0
	for _, r := range reqs {
		nd := c.Owner(r.Name, r.Key)
		d, err := nd.Check(context.Background(), r)
		if err != nil {
			t.Fatalf("%s checks %s: %v", nd.Name(), r.Key, err)
		}
		if d.Allowed {
			admitted++
			t.Logf("%s (%s) admitted again by %s (without owner: %v)", r.Key, r.Algorithm, nd.Name(), d.WithoutOwner)
		}
	}
	return admitted
}

// Every node of a cluster with data directories stopped gracefully, one
// after another, then a cluster started on those directories: every daily
// quota spent before is still spent, whatever the new membership is. The
// last node to leave has no one to hand its keys to: it keeps them on disk.
func TestRestartKeepsDailyQuotas(t *testing.T) {
	waitBound(t)
	steps := []struct {
		name  string
		dirs  []int // the directories the new cluster starts on, by old index
		names string
	}{
		{"same nodes", []int{0, 1, 2}, "node-%d"},
		{"fewer nodes", []int{2, 1}, "node-%d"},
		{"new names", []int{0, 1, 2}, "renamed-%d"},
		{"the last to leave alone", []int{2}, "alone-%d"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
			reqs := dailyQuotas(120)
			c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, c *cluster.Config) { c.DataDir = dirs[i] }))
			spendAll(t, c, reqs)
			for i := range 3 {
				c.Leave(i)
				if i < 2 {
					// One after another: the next to leave sees this one
					// left, not failed (a member it held cut off would
					// make it wait LeaveTimeout for it).
					c.WaitConverged()
				}
			}
			again := testcluster.New(t, len(s.dirs), testcluster.WithConfig(func(i int, c *cluster.Config) {
				c.NodeName = fmt.Sprintf(s.names, i)
				c.DataDir = dirs[s.dirs[i]]
			}))
			var restored int64
			for _, nd := range again.Nodes() {
				restored += nd.Stats().Persist.Restored
			}
			if got := readmitted(t, again, reqs); got != 0 {
				t.Fatalf("%d hits re-admitted after the restart, want 0 (%d states restored)", got, restored)
			}
			t.Logf("%d states restored", restored)
		})
	}
}

// A state file that is truncated, damaged or foreign is refused: New
// fails with a *DataFileError naming the file, unless DamagedData sets it
// aside, and then the node starts without its states.
func TestDamagedDataFileRefused(t *testing.T) {
	// A data directory with one snapshot, written by a node's Close.
	prepare := func(t *testing.T) (dir, file string) {
		dir = t.TempDir()
		cfg := cluster.TestConfig("writer")
		cfg.DataDir = dir
		nd, err := cluster.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range dailyQuotas(10) {
			r.Hits = r.Limit
			consume(t, nd, []limiter.Request{r})
		}
		if err := nd.Close(); err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "snapshot-*.state"))
		if len(files) != 1 {
			t.Fatalf("snapshots %v, want one", files)
		}
		return dir, files[0]
	}
	steps := []struct {
		name    string
		damage  func(b []byte) []byte
		setAsid bool
		want    string
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-7] }, false, "checksum"},
		{"cut to the header", func(b []byte) []byte { return b[:9] }, false, "truncated"},
		{"a bit flipped", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }, false, "checksum"},
		{"foreign", func([]byte) []byte { return []byte("{\"not\": \"sluice\"}\n") }, false, "not a sluice state file"},
		{"a later format", func(b []byte) []byte { b[8] = 9; return b }, false, "file format version 9"},
		{"empty", func([]byte) []byte { return nil }, false, "not a sluice state file"},
		{"set aside", func(b []byte) []byte { return b[:len(b)/2] }, true, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			dir, file := prepare(t)
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, s.damage(bytes.Clone(b)), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := cluster.TestConfig("reader")
			cfg.DataDir = dir
			if s.setAsid {
				cfg.DamagedData = cluster.SetDamagedAside
			}
			nd, err := cluster.New(cfg)
			if s.setAsid {
				if err != nil {
					t.Fatalf("set aside: %v", err)
				}
				defer nd.Close()
				if _, err := os.Stat(file + ".damaged"); err != nil {
					t.Fatalf("the damaged file was not set aside: %v", err)
				}
				if r := nd.Stats().Persist.Restored; r != 0 {
					t.Fatalf("%d states restored from a damaged file", r)
				}
				return
			}
			var bad *cluster.DataFileError
			if !errors.As(err, &bad) || !errors.Is(err, cluster.ErrDataDir) || bad.Path != file || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("New: %v, want a DataFileError on %s saying %q", err, file, s.want)
			}
			// Refused, the file is left as it was for the operator.
			if after, _ := os.ReadFile(file); !bytes.Equal(after, s.damage(bytes.Clone(b))) {
				t.Fatal("the refused file was changed")
			}
		})
	}
}

// Two nodes never share a data directory: the second is refused while the
// first holds its lock, and starts once the first has closed.
func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first := cluster.TestConfig("first")
	first.DataDir = dir
	a, err := cluster.New(first)
	if err != nil {
		t.Fatal(err)
	}
	second := cluster.TestConfig("second")
	second.DataDir = dir
	if _, err := cluster.New(second); !errors.Is(err, cluster.ErrDataDir) || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a second node on the same directory: %v, want ErrDataDir", err)
	}
	a.Close()
	b, err := cluster.New(second)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	b.Close()
}

// Only the keys that changed are written each interval, and a state that
// returns to fresh before it would be written is not written at all.
func TestPersistWritesChangedKeys(t *testing.T) {
	cfg := cluster.TestConfig("writer")
	cfg.DataDir = t.TempDir()
	cfg.PersistInterval = 20 * time.Millisecond
	nd, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	written := func(step string, want int64) {
		t.Helper()
		err := testcluster.WaitFor(10*time.Second, func() error {
			if got := nd.Stats().Persist.Written; got != want {
				return fmt.Errorf("%s: %d states written, want %d", step, got, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	quotas := dailyQuotas(10)
	steps := []struct {
		name        string
		reqs        []limiter.Request
		wantWritten int64 // in all
	}{
		{"ten new keys", quotas, 10},
		{"one of them again", quotas[3:4], 11},
		{"a bucket full again in a nanosecond", []limiter.Request{{Name: "brief", Key: "k", Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}}, 11},
		{"two more", quotas[:2], 13},
	}
	for _, s := range steps {
		consume(t, nd, s.reqs)
		written(s.name, s.wantWritten)
	}
	if st := nd.Stats().Persist; st.Segments < 3 || st.WriteErrors != 0 {
		t.Fatalf("%+v: want a segment per step that changed a live key, no errors", st)
	}
}
