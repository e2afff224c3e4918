package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// standinCutOff starts 3 nodes of 2 replicas, node i on dirs[i] (read
// again when it restarts) and edited by edit, and keys of every heal
// algorithm owned by node 1 and copied to node 2: 50 hits through node 1,
// replicated, then the partition {0} | {1,2} and 30 hits through node 0,
// which holds no copy and stands in for node 1.
func standinCutOff(t *testing.T, dirs []string, edit func(i int, cfg *cluster.Config)) (*testcluster.Cluster, []limiter.Request) {
	t.Helper()
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas, cfg.DataDir = 2, dirs[i]
		if edit != nil {
			edit(i, cfg)
		}
	}))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
	}
	consume(t, c.Node(1), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 30))
	return c, reqs
}

// chargedTo waits until every node counts the 80 hits of every key of
// reqs, then checks that the owner admits exactly the 20 left.
func chargedTo(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request) {
	t.Helper()
	if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 20) }); err != nil {
		t.Error(err)
	}
	remainingAfter(t, c, reqs, 20)
}

// The stand-in (node 0) stops while cut off and starts again from its
// DataDir with another replica count than it had (1: it keeps no copies;
// 3: every node holds every key): its hits are still charged to the
// owner once the partition has healed.
func TestStandinRestartWithOtherReplicas(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas %d", replicas), func(t *testing.T) {
			noLeaksAfter(t)
			restarted := false
			c, reqs := standinCutOff(t, []string{t.TempDir(), t.TempDir(), t.TempDir()}, func(i int, cfg *cluster.Config) {
				if i == 0 && restarted {
					cfg.Replicas = replicas
				}
			})
			c.StopHard(0)
			c.Heal()
			restarted = true
			c.Restart(0)
			chargedTo(t, c, reqs)
		})
	}
}

// The stand-in is killed while cut off, after the segment holding its
// hits and their parts was written and in the middle of the next write:
// it starts again on what a kill leaves in its DataDir (a copy taken then,
// with a snapshot and a segment torn under their temporary names), so no
// snapshot of Close covers it. Its parts come back from the segment and
// are charged to the owner after the heal.
func TestStandinKilledMidWrite(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c, reqs := standinCutOff(t, dirs, func(i int, cfg *cluster.Config) { cfg.PersistInterval = 20 * time.Millisecond })
	crash := t.TempDir()
	// The copy holds a segment with every key's 30 stand-in hits as a
	// part; nothing changes on node 0 after them, so its files stand
	// still once it is written.
	err := testcluster.WaitFor(20*time.Second, func() error {
		if err := copyStateFiles(dirs[0], crash); err != nil {
			return err
		}
		states, err := cluster.ReadDataDir(crash)
		if err != nil {
			return err
		}
		parts := 0
		for _, s := range states {
			if s.Settle != nil && len(s.Settle.Parts) == 1 && s.Settle.Parts[0].Hits == 30 && s.Settle.Parts[0].Origin == c.Node(0).Name() {
				parts++
			}
		}
		if parts != len(reqs) {
			return fmt.Errorf("%d of %d keys written with their parts", parts, len(reqs))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(crash, "segment-*.state"))
	if len(segs) == 0 {
		t.Fatal("no segment in the data directory")
	}
	last, err := os.ReadFile(segs[len(segs)-1])
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"snapshot-00000000000000f0.state.tmp": last[:len(last)/2],
		"segment-00000000000000f1.state.tmp":  last[:len(last)-3],
	} {
		if err := os.WriteFile(filepath.Join(crash, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c.StopHard(0) // its Close writes to dirs[0], which the restart leaves
	c.Heal()
	dirs[0] = crash
	c.Restart(0)
	chargedTo(t, c, reqs)
}

// copyStateFiles copies the state files of dir to to, replacing those of
// to.
func copyStateFiles(dir, to string) error {
	old, _ := filepath.Glob(filepath.Join(to, "*.state"))
	for _, f := range old {
		os.Remove(f)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.state"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err // removed by a snapshot meanwhile
		}
		if err := os.WriteFile(filepath.Join(to, filepath.Base(f)), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// The owner (node 1) restarts from its DataDir instead of the stand-in:
// before the heal, it comes back with its 50 and is charged the stand-in's
// 30 when the partition heals; after the heal, it comes back with the 80
// and the stand-in's part it was charged, and the states its replica and
// the stand-in send it again with that part charge nothing more.
func TestOwnerRestartedFromDataDir(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, when := range []string{"before the heal", "after the heal"} {
		t.Run(when, func(t *testing.T) {
			noLeaksAfter(t)
			c, reqs := standinCutOff(t, []string{t.TempDir(), t.TempDir(), t.TempDir()}, nil)
			if when == "after the heal" {
				c.Heal()
				c.WaitConverged()
				if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 20) }); err != nil {
					t.Fatal(err)
				}
			}
			c.StopHard(1)
			c.WaitConverged()
			c.Restart(1)
			c.Heal()
			c.WaitConverged()
			chargedTo(t, c, reqs)
		})
	}
}

// A stand-in's record older than its key's window: keys of 100 a minute,
// on a clock that stands still, take 50 hits through their owner (node
// 1) and 30 through node 0 cut off, in one minute; half a minute into the
// next, node 0 admits 5 more, so that its part holds 35, 30 of them from
// the minute that ended, then stops and starts again. The part charges
// what its state still counts: the fixed window's new minute counts the
// 5 and admits 95, not 65; the sliding window counter counts the 5 and
// half of the 80 of the minute that ended.
func TestStandinRecordOlderThanItsWindow(t *testing.T) {
	waitBound(t)
	// Ten seconds into a minute ahead of the system's clock, which
	// waitReplicated reads.
	start := time.Now().Truncate(time.Minute).Add(time.Minute + 10*time.Second)
	clk := fakeclock.New(start)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	noLeaksAfter(t)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas, cfg.DataDir, cfg.Clock = 2, dirs[i], cluster.ClockFunc(clk.Now)
	}))
	var reqs []limiter.Request
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		r := keyHeldBy(t, c, a, 1, 2)
		r.Period = time.Minute
		reqs = append(reqs, r)
	}
	consume(t, c.Node(1), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 30))
	later := start.Truncate(time.Minute).Add(90 * time.Second)
	clk.Set(later)
	consume(t, c.Node(0), withHits(reqs, 5))
	c.StopHard(0)
	c.Heal()
	c.Restart(0)
	for _, r := range reqs {
		want := remainingOf(t, r, later, hitsAt{80, start}, hitsAt{5, later})
		owner := c.Owner(r.Name, r.Key)
		// The owner's own 50 leave it more than want: wait for node 0's
		// state.
		if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, []limiter.Request{r}, want) }); err != nil {
			t.Error(err)
		}
		if more := admitUntilDenied(t, owner, r, int(r.Limit)); more != int(want) {
			t.Errorf("%s: its owner %s admits %d more, want %d", r.Algorithm, owner.Name(), more, want)
		}
	}
	if t.Failed() {
		for _, nd := range c.Nodes() {
			st := nd.Stats()
			t.Logf("%s: %+v %+v %+v", nd.Name(), st.Settle, st.Persist, st.Transfers)
			for _, r := range reqs {
				sn, ok := nd.Store().Snapshot(r.Name, r.Key, clk.Now())
				t.Logf("  %s %v %+v", r.Key, ok, sn.View())
			}
		}
	}
}

type hitsAt struct {
	hits int64
	at   time.Time
}

// remainingOf returns what a key of r has left at at after the hits of
// steps.
func remainingOf(t *testing.T, r limiter.Request, at time.Time, steps ...hitsAt) int64 {
	t.Helper()
	store, err := limiter.NewStore(limiter.StoreConfig{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		r.Hits = s.hits
		if _, err := store.CheckAt(r, s.at); err != nil {
			t.Fatal(err)
		}
	}
	r.Hits = 0
	d, err := store.CheckAt(r, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}
