package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
)

// swarm runs attack on n attackers at once, each given its number, and
// waits for all of them.
func swarm(n int, attack func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { attack(i) })
	}
	wg.Wait()
}

// rounds runs round on c.attackers attackers at once, attacker i running
// round(i, 0), round(i, 1)... until end, or ctx ends, or total rounds,
// shared among the attackers, have run. It returns the rounds run.
func (c *config) rounds(ctx context.Context, total int, end time.Time, round func(i, k int)) int64 {
	var n atomic.Int64
	swarm(c.attackers, func(i int) {
		for k := 0; k < share(total, c.attackers, i) && time.Now().Before(end) && ctx.Err() == nil; k++ {
			round(i, k)
			n.Add(1)
		}
	})
	return n.Load()
}

// share returns attacker i's part of total items shared among n.
func share(total, n, i int) int {
	return total/n + btoi(i < total%n)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hostile returns when an attack's hostile phase ends.
func (c *config) hostile() time.Time { return time.Now().Add(c.duration) }

// codeOf names the gRPC status of err: "OK" for nil.
func codeOf(err error) string { return status.Code(err).String() }

// tally counts outcomes by name, and keeps the first error of each.
// Safe for concurrent use.
type tally struct {
	mu     sync.Mutex // guards counts and errs
	counts map[string]int64
	errs   map[string]string
}

// addErr counts one name, keeping err's text when it is name's first.
func (t *tally) addErr(name string, err error) {
	t.add(name, 1)
	if err == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.errs == nil {
		t.errs = make(map[string]string)
	}
	if _, ok := t.errs[name]; !ok {
		t.errs[name] = status.Convert(err).Message()
	}
}

// firstErrors lists the distinct texts of the first errors of the names,
// in name order, quoted, each cut to 120 bytes.
func (t *tally) firstErrors() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(t.errs)) {
		msg := t.errs[name]
		if len(msg) > 120 {
			msg = msg[:120] + "..."
		}
		if q := strconv.Quote(msg); !slices.Contains(parts, q) {
			parts = append(parts, q)
		}
	}
	return strings.Join(parts, ", ")
}

func (t *tally) add(name string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = make(map[string]int64)
	}
	t.counts[name] += n
}

// get returns the count of name.
func (t *tally) get(name string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counts[name]
}

// sum returns the total count.
func (t *tally) sum() int64 { return t.others() }

// others returns the total count of the names not listed.
func (t *tally) others(names ...string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for k, v := range t.counts {
		if !slices.Contains(names, k) {
			n += v
		}
	}
	return n
}

// String lists the counts, largest first: "PermissionDenied 1,024, OK 3".
func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.counts) == 0 {
		return "none"
	}
	names := make([]string, 0, len(t.counts))
	for k := range t.counts {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(t.counts[b], t.counts[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %s", k, thousands(t.counts[k]))
	}
	return strings.Join(parts, ", ")
}
