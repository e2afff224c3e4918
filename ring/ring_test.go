package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func mustNew(t testing.TB, cfg Config) *Ring {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return r
}

func mustSet(t testing.TB, r *Ring, ms []Member) {
	t.Helper()
	if err := r.SetMembers(ms); err != nil {
		t.Fatalf("SetMembers(%d members): %v", len(ms), err)
	}
}

// testMembers returns n members named prefix0, prefix1, ... Names ending in
// digits make consistent's point labels collide ("n1"+"0" and "n"+"10"),
// which the ring must handle deterministically.
func testMembers(prefix string, n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Name: fmt.Sprintf("%s%d", prefix, i), Addr: fmt.Sprintf("10.0.%d.%d:7000", i/256, i%256)}
	}
	return ms
}

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	return keys
}

// checkTable checks the invariants of r's current snapshot: every
// partition has an owner among n members and none owns more partitions than
// the bounded-load cap.
func checkTable(t *testing.T, r *Ring, n int) {
	t.Helper()
	cfg := r.Config()
	if got := r.Len(); got != n {
		t.Fatalf("Len() = %d, want %d", got, n)
	}
	if n == 0 {
		if m, ok := r.OwnerOfHash(0); ok {
			t.Fatalf("empty ring: OwnerOfHash(0) = %v, true", m)
		}
		return
	}
	names := make(map[string]bool, n)
	for _, m := range r.Members() {
		names[m.Name] = true
	}
	capacity := int(math.Ceil(float64(cfg.PartitionCount/n) * cfg.Load))
	load := make(map[string]int, n)
	for p := range cfg.PartitionCount {
		m, ok := r.OwnerOfHash(uint64(p))
		if !ok || !names[m.Name] {
			t.Fatalf("%d members: partition %d owner = %v, %v", n, p, m, ok)
		}
		load[m.Name]++
	}
	for name, l := range load {
		if l > capacity {
			t.Fatalf("%d members: %s owns %d partitions, more than the cap %d", n, name, l, capacity)
		}
	}
}

func TestEmptyRing(t *testing.T) {
	r := mustNew(t, DefaultConfig())
	check := func(wantVersion uint64) {
		t.Helper()
		if m, ok := r.Owner("api", "k"); ok {
			t.Errorf("Owner on an empty ring = %v, true", m)
		}
		if got := r.Owners("api", "k", 3); got != nil {
			t.Errorf("Owners on an empty ring = %v, want nil", got)
		}
		if r.Len() != 0 || len(r.Members()) != 0 {
			t.Errorf("Len() = %d, Members() = %v, want none", r.Len(), r.Members())
		}
		if got := r.Version(); got != wantVersion {
			t.Errorf("Version() = %d, want %d", got, wantVersion)
		}
	}
	check(0)
	mustSet(t, r, nil)
	check(1)
	mustSet(t, r, []Member{}) // consistent.New panics on this; the ring must not
	check(2)
	mustSet(t, r, testMembers("n", 3))
	mustSet(t, r, nil)
	check(4)
}

func TestOrderDoesNotMatter(t *testing.T) {
	ms := append(testMembers("n", 12), // n1, n10, n11 collide in consistent's labels
		Member{Name: "a", Addr: "a:1"}, Member{Name: "a1", Addr: "a1:1"}, Member{Name: "a11", Addr: "a11:1"})
	rng := rand.New(rand.NewPCG(1, 2))
	r1 := mustNew(t, DefaultConfig())
	mustSet(t, r1, ms)
	keys := testKeys(10000)
	for trial := range 5 {
		shuffled := slices.Clone(ms)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		r2 := mustNew(t, DefaultConfig())
		mustSet(t, r2, shuffled)
		if !slices.Equal(r1.current.Load().owners, r2.current.Load().owners) {
			t.Fatalf("trial %d: partition tables differ for the same members in another order", trial)
		}
		for _, k := range keys {
			m1, _ := r1.Owner("api", k)
			m2, _ := r2.Owner("api", k)
			if m1 != m2 {
				t.Fatalf("trial %d: key %q routes to %v and %v", trial, k, m1, m2)
			}
		}
	}
	if got := r1.Members(); !slices.IsSortedFunc(got, func(a, b Member) int { return cmpName(a, b) }) {
		t.Fatalf("Members() not sorted by Name: %v", got)
	}
}

func cmpName(a, b Member) int {
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// TestOwnerMatchesConsistent checks that Owner is consistent's own answer
// for the key bytes RouteHash hashes: same partition, same owner.
func TestOwnerMatchesConsistent(t *testing.T) {
	r := mustNew(t, DefaultConfig())
	mustSet(t, r, testMembers("node-", 7))
	c := r.current.Load().hashRing
	for _, k := range testKeys(10000) {
		got, _ := r.Owner("api", k)
		want := c.LocateKey(routeBytes("api", k)).String()
		if got.Name != want {
			t.Fatalf("Owner(api, %q) = %s, consistent says %s", k, got.Name, want)
		}
	}
}

func TestOwnerAllocs(t *testing.T) {
	r := mustNew(t, DefaultConfig())
	mustSet(t, r, testMembers("node-", 5))
	if n := testing.AllocsPerRun(1000, func() { r.Owner("api", "user-123456") }); n != 0 {
		t.Fatalf("Owner allocates %v times per call, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { r.OwnerOfHash(12345) }); n != 0 {
		t.Fatalf("OwnerOfHash allocates %v times per call, want 0", n)
	}
}

func TestDistribution(t *testing.T) {
	cfg := DefaultConfig()
	r := mustNew(t, cfg)
	ms := testMembers("node-", 5)
	mustSet(t, r, ms)
	checkTable(t, r, len(ms))

	const keys = 100000
	counts := make(map[string]int)
	for _, k := range testKeys(keys) {
		m, _ := r.Owner("api", k)
		counts[m.Name]++
	}
	fair := 1.0 / float64(len(ms))
	for _, m := range ms {
		share := float64(counts[m.Name]) / keys
		t.Logf("%s: %.4f of keys (fair share %.4f)", m.Name, share, fair)
		// The cap bounds partitions, not keys; allow a little for how keys
		// fall into partitions.
		if share > fair*cfg.Load*1.05 {
			t.Errorf("%s owns %.4f of keys, above the load bound %.4f", m.Name, share, fair*cfg.Load)
		}
		if share < fair/2 {
			t.Errorf("%s owns only %.4f of keys", m.Name, share)
		}
	}
}

func TestMembershipChangeMovesMinority(t *testing.T) {
	tests := []struct {
		name     string
		from, to []Member
	}{
		{"join 6th", testMembers("node-", 5), testMembers("node-", 6)},
		{"leave 6th", testMembers("node-", 6), testMembers("node-", 5)},
		{"leave 1st", testMembers("node-", 6), testMembers("node-", 6)[1:]},
	}
	keys := testKeys(100000)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, after := mustNew(t, DefaultConfig()), mustNew(t, DefaultConfig())
			mustSet(t, before, tt.from)
			mustSet(t, after, tt.to)
			moved := 0
			for _, k := range keys {
				m1, _ := before.Owner("api", k)
				m2, _ := after.Owner("api", k)
				if m1 != m2 {
					moved++
				}
			}
			frac := float64(moved) / float64(len(keys))
			t.Logf("%d -> %d members: %.1f%% of keys moved", len(tt.from), len(tt.to), 100*frac)
			if frac >= 0.35 {
				t.Fatalf("%.1f%% of keys moved, want < 35%%", 100*frac)
			}
		})
	}
}

func TestOwners(t *testing.T) {
	keys := testKeys(300)
	for _, size := range []int{0, 1, 2, 5, 9} {
		r := mustNew(t, DefaultConfig())
		mustSet(t, r, testMembers("node-", size))
		for _, n := range []int{-1, 0, 1, 2, 3, 5, 9, 100} {
			t.Run(fmt.Sprintf("members=%d/n=%d", size, n), func(t *testing.T) {
				want := max(0, min(n, size))
				for _, k := range keys {
					got := r.Owners("api", k, n)
					if len(got) != want {
						t.Fatalf("Owners(%q, %d) has %d members, want %d", k, n, len(got), want)
					}
					if want == 0 {
						if got != nil {
							t.Fatalf("Owners(%q, %d) = %v, want nil", k, n, got)
						}
						continue
					}
					if owner, _ := r.Owner("api", k); got[0] != owner {
						t.Fatalf("Owners(%q, %d)[0] = %v, Owner = %v", k, n, got[0], owner)
					}
					seen := make(map[string]bool)
					for _, m := range got {
						if seen[m.Name] {
							t.Fatalf("Owners(%q, %d) = %v repeats %s", k, n, got, m.Name)
						}
						seen[m.Name] = true
					}
					// A longer list extends a shorter one.
					if n > 1 {
						if shorter := r.Owners("api", k, n-1); !slices.Equal(shorter, got[:len(shorter)]) {
							t.Fatalf("Owners(%q, %d) = %v is not a prefix of Owners(%q, %d) = %v", k, n-1, shorter, k, n, got)
						}
					}
				}
			})
		}
	}
}

func TestSetMembersErrors(t *testing.T) {
	small := DefaultConfig()
	small.PartitionCount = 3
	tests := []struct {
		name    string
		cfg     Config
		members []Member
		want    error
	}{
		{"duplicate name", DefaultConfig(), []Member{{"a", "h:1"}, {"b", "h:2"}, {"a", "h:3"}}, ErrDuplicateName},
		{"duplicate member", DefaultConfig(), []Member{{"a", "h:1"}, {"a", "h:1"}}, ErrDuplicateName},
		{"empty name", DefaultConfig(), []Member{{"a", "h:1"}, {"", "h:2"}}, ErrEmptyName},
		{"more members than partitions", small, testMembers("n", 4), ErrTooManyMembers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, tt.cfg)
			prev := testMembers("prev-", 2)
			mustSet(t, r, prev)
			err := r.SetMembers(tt.members)
			if !errors.Is(err, tt.want) {
				t.Fatalf("SetMembers = %v, want %v", err, tt.want)
			}
			if r.Version() != 1 || !slices.Equal(r.Members(), prev) {
				t.Fatalf("after a failed SetMembers: version %d, members %v; want 1, %v", r.Version(), r.Members(), prev)
			}
		})
	}
}

// TestRebuildPanicIsError bypasses Validate to reach configurations that
// make consistent panic, and checks the panic becomes ErrRebuild and leaves
// the ring as it was.
func TestRebuildPanicIsError(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(*Config)
	}{
		{"load 1", func(c *Config) { c.Load = 1 }},
		{"load below 1", func(c *Config) { c.Load = 0.5 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, DefaultConfig())
			prev := testMembers("prev-", 3)
			mustSet(t, r, prev)
			tt.corrupt(&r.cfg)
			err := r.SetMembers(testMembers("n", 4))
			if !errors.Is(err, ErrRebuild) {
				t.Fatalf("SetMembers = %v, want ErrRebuild", err)
			}
			t.Logf("error: %v", err)
			if r.Version() != 1 || !slices.Equal(r.Members(), prev) {
				t.Fatalf("after a failed rebuild: version %d, members %v; want 1, %v", r.Version(), r.Members(), prev)
			}
			if m, ok := r.Owner("api", "k"); !ok || !slices.Contains(prev, m) {
				t.Fatalf("after a failed rebuild Owner = %v, %v", m, ok)
			}
		})
	}
}

// TestNoPanicAnyMemberCount builds every member count from 0 to the
// partition count under valid configs near the edges consistent panics at.
func TestNoPanicAnyMemberCount(t *testing.T) {
	tests := []struct {
		cfg        Config
		maxMembers int
	}{
		{Config{PartitionCount: 1, ReplicationFactor: 2, Load: 1.25}, 1},
		{Config{PartitionCount: 2, ReplicationFactor: 2, Load: 1 + 1e-9}, 2},
		{Config{PartitionCount: 7, ReplicationFactor: 2, Load: 1.000001}, 7},
		{Config{PartitionCount: 13, ReplicationFactor: 2, Load: 1.05}, 13},
		{Config{PartitionCount: 31, ReplicationFactor: 3, Load: 1.01}, 31},
		{Config{PartitionCount: 64, ReplicationFactor: 20, Load: 1.25}, 64},
		{Config{PartitionCount: 97, ReplicationFactor: 2, Load: 2}, 97},
		{DefaultConfig(), 40},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.cfg), func(t *testing.T) {
			r := mustNew(t, tt.cfg)
			for n := 0; n <= tt.maxMembers; n++ {
				mustSet(t, r, testMembers("n", n))
				checkTable(t, r, n)
			}
			if tt.maxMembers == tt.cfg.PartitionCount {
				err := r.SetMembers(testMembers("n", tt.maxMembers+1))
				if !errors.Is(err, ErrTooManyMembers) {
					t.Fatalf("SetMembers(%d members) = %v, want ErrTooManyMembers", tt.maxMembers+1, err)
				}
			}
		})
	}
}

func TestConcurrentLookupsDuringSwaps(t *testing.T) {
	r := mustNew(t, DefaultConfig())
	sets := [][]Member{
		testMembers("node-", 5),
		testMembers("node-", 6),
		nil,
		testMembers("node-", 1),
		testMembers("node-", 8),
	}
	known := make(map[Member]bool)
	for _, s := range sets {
		for _, m := range s {
			known[m] = true
		}
	}
	keys := testKeys(256)

	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var lastVersion uint64
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(g*31+i)%len(keys)]
				if m, ok := r.Owner("api", k); ok && !known[m] {
					errs <- fmt.Errorf("Owner returned unknown member %v", m)
					return
				}
				if ms := r.Owners("api", k, 3); len(ms) > 3 {
					errs <- fmt.Errorf("Owners(3) returned %d members", len(ms))
					return
				}
				v := r.Version()
				if v < lastVersion {
					errs <- fmt.Errorf("Version went back from %d to %d", lastVersion, v)
					return
				}
				lastVersion = v
				if i%64 == 0 {
					if ms := r.Members(); len(ms) > 8 {
						errs <- fmt.Errorf("Members() returned %d members", len(ms))
						return
					}
				}
			}
		})
	}
	const swaps = 100
	for i := range swaps {
		if err := r.SetMembers(sets[i%len(sets)]); err != nil {
			t.Errorf("SetMembers: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := r.Version(); got != swaps {
		t.Fatalf("Version() = %d after %d swaps", got, swaps)
	}
}

// TestConcurrentSetMembers checks that concurrent rebuilds serialise: every
// one is counted and the ring ends with one of the lists it was given.
func TestConcurrentSetMembers(t *testing.T) {
	r := mustNew(t, DefaultConfig())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 10 {
				if err := r.SetMembers(testMembers("node-", 3+g)); err != nil {
					t.Errorf("SetMembers: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if got := r.Version(); got != 40 {
		t.Fatalf("Version() = %d after 40 SetMembers, want 40", got)
	}
	checkTable(t, r, r.Len())
}
