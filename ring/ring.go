package ring

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Member is one node of the cluster as the ring sees it.
type Member struct {
	// Name identifies the node uniquely; it is what is placed on the hash
	// circle, so it decides which partitions the node owns.
	Name string
	// Addr is the node's gRPC address, "host:port". The ring carries it
	// without looking at it.
	Addr string
}

// Ring maps keys to members. The zero value is not usable; build one with
// [New]. All methods are safe for concurrent use.
type Ring struct {
	cfg Config // fixed at New

	// mu serialises SetMembers, so each rebuild starts from the version the
	// previous one stored. Lookups never take it.
	mu sync.Mutex

	// current is the snapshot lookups read; never nil after New. It is
	// replaced whole, never modified.
	current atomic.Pointer[table]
}

// table is an immutable snapshot of the ring for one member list.
type table struct {
	version uint64
	members []Member // sorted by Name
	// owners maps a partition to its owner's index in members. It is empty
	// when members is.
	owners []uint32
	// hashRing built owners and answers Owners. Nil when members is empty.
	// Only its read methods are called once the table is published.
	hashRing *consistent.Consistent
}

// node is a Member as the consistent library sees it: String returns the
// Name, and idx is the member's index in table.members.
type node struct {
	name string
	idx  int
}

func (n node) String() string { return n.name }

// New returns an empty ring using a copy of cfg, or an error wrapping
// [ErrInvalidConfig] if cfg is invalid. Until [Ring.SetMembers] is called,
// lookups report no owner.
func New(cfg Config) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Ring{cfg: cfg}
	r.current.Store(&table{})
	return r, nil
}

// Config returns the ring's configuration.
func (r *Ring) Config() Config { return r.cfg }

// SetMembers replaces the ring's members with ms, the full current member
// list; its order does not matter and ms is not retained. An empty list
// leaves the ring with no owner for any key.
//
// It returns an error wrapping [ErrEmptyName], [ErrDuplicateName],
// [ErrTooManyMembers] or [ErrRebuild], and then the ring is unchanged. On
// success the new assignment is published atomically and Version increases
// by one. Concurrent lookups see the old assignment or the new one, never a
// mix. SetMembers costs one full rebuild (milliseconds for tens of members):
// call it on membership changes, not per request.
func (r *Ring) SetMembers(ms []Member) error {
	sorted := slices.Clone(ms)
	slices.SortFunc(sorted, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	for i, m := range sorted {
		if m.Name == "" {
			return fmt.Errorf("%w (Addr %q)", ErrEmptyName, m.Addr)
		}
		if i > 0 && sorted[i-1].Name == m.Name {
			return fmt.Errorf("%w: %q", ErrDuplicateName, m.Name)
		}
	}
	if len(sorted) > r.cfg.PartitionCount {
		return fmt.Errorf("%w: %d members, %d partitions", ErrTooManyMembers, len(sorted), r.cfg.PartitionCount)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := buildTable(r.cfg, sorted, r.current.Load().version+1)
	if err != nil {
		return err
	}
	r.current.Store(t)
	return nil
}

// buildTable builds the snapshot for members, which must be sorted by Name,
// non-empty-named, unique and no more than cfg.PartitionCount. Sorting
// matters beyond tidiness: consistent places a member's points in insertion
// order, and two names can produce the same point ("a" with suffix 10 and
// "a1" with suffix 0), where the later one wins. A fixed order makes every
// node agree. A panic inside consistent is returned as [ErrRebuild].
func buildTable(cfg Config, members []Member, version uint64) (t *table, err error) {
	if len(members) == 0 {
		// consistent.New panics on an empty non-nil slice; an empty ring
		// needs no library at all.
		return &table{version: version}, nil
	}
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("%w: %d members: %v", ErrRebuild, len(members), p)
		}
	}()
	nodes := make([]consistent.Member, len(members))
	for i, m := range members {
		nodes[i] = node{name: m.Name, idx: i}
	}
	c := consistent.New(nodes, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    cfg.PartitionCount,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	owners := make([]uint32, cfg.PartitionCount)
	for p := range owners {
		n, ok := c.GetPartitionOwner(p).(node)
		if !ok {
			return nil, fmt.Errorf("%w: partition %d has no owner", ErrRebuild, p)
		}
		owners[p] = uint32(n.idx)
	}
	return &table{version: version, members: members, owners: owners, hashRing: c}, nil
}

// Owner returns the member that owns the key of the limit called name, and
// false if the ring has no members. It takes no lock and allocates nothing.
func (r *Ring) Owner(name, key string) (Member, bool) {
	return r.OwnerOfHash(RouteHash(name, key))
}

// OwnerOfHash returns the owner of the partition h falls in (h modulo
// PartitionCount), and false if the ring has no members. With h from
// [RouteHash] it is [Ring.Owner].
func (r *Ring) OwnerOfHash(h uint64) (Member, bool) {
	t := r.current.Load()
	if len(t.members) == 0 {
		return Member{}, false
	}
	return t.members[t.owners[h%uint64(len(t.owners))]], true
}

// OwnerAndVersion is [Ring.OwnerOfHash] together with the [Ring.Version]
// of the assignment that answered, read from one snapshot.
func (r *Ring) OwnerAndVersion(h uint64) (Member, uint64, bool) {
	t := r.current.Load()
	if len(t.members) == 0 {
		return Member{}, t.version, false
	}
	return t.members[t.owners[h%uint64(len(t.owners))]], t.version, true
}

// Partition returns the partition h falls in: h modulo PartitionCount.
func (r *Ring) Partition(h uint64) int { return int(h % uint64(r.cfg.PartitionCount)) }

// Fingerprint identifies a membership by its names: the xxhash of the
// names sorted, each followed by a zero byte. Nodes compare fingerprints to
// know that they route over the same members.
func Fingerprint(ms []Member) uint64 {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	slices.Sort(names)
	d := xxhash.New()
	for _, n := range names {
		d.WriteString(n)
		d.Write([]byte{0})
	}
	return d.Sum64()
}

// Owners returns the key's owner followed by the members next in line for
// it, as chosen by consistent's GetClosestNForPartition: min(n, Len())
// distinct members, the first equal to what [Ring.Owner] returns for the
// same snapshot. It returns nil if n < 1 or the ring has no members. It
// allocates and costs O(Len() log Len()): it is meant for replication, not
// for every request.
func (r *Ring) Owners(name, key string, n int) []Member {
	return r.OwnersOfHash(RouteHash(name, key), n)
}

// OwnersOfHash is [Ring.Owners] for a hash from [RouteHash].
func (r *Ring) OwnersOfHash(h uint64, n int) []Member {
	t := r.current.Load()
	if n < 1 || len(t.members) == 0 {
		return nil
	}
	n = min(n, len(t.members))
	p := int(h % uint64(len(t.owners)))
	res := make([]Member, 0, n)
	seen := make([]bool, len(t.members))
	add := func(i int) {
		if len(res) < n && !seen[i] {
			seen[i] = true
			res = append(res, t.members[i])
		}
	}
	add(int(t.owners[p]))
	if n > 1 {
		// The library's list starts with the same owner. It can only fall
		// short or repeat itself if two member names collide in 64-bit
		// xxhash; the loop below then completes the list in name order.
		closest, err := t.hashRing.GetClosestNForPartition(p, n)
		if err == nil {
			for _, m := range closest {
				if nd, ok := m.(node); ok {
					add(nd.idx)
				}
			}
		}
		for i := 0; len(res) < n && i < len(t.members); i++ {
			add(i)
		}
	}
	return res
}

// Members returns a copy of the current members, sorted by Name.
func (r *Ring) Members() []Member {
	return slices.Clone(r.current.Load().members)
}

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.current.Load().members) }

// Version returns the number of successful SetMembers calls so far: it
// increases by one each time a new assignment is published (even one equal
// to the previous). A new ring is at version 0.
func (r *Ring) Version() uint64 { return r.current.Load().version }
