package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
)

func members(names ...string) []ring.Member {
	out := make([]ring.Member, len(names))
	for i, n := range names {
		out[i] = ring.Member{Name: n, Addr: "127.0.0.1:1"}
	}
	return out
}

// handoverOf is node self's hand-over tracker over a ring of its own, with
// a timeout of one second.
func handoverOf(t *testing.T, self string) (*handover, *ring.Ring) {
	t.Helper()
	r, err := ring.New(ring.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := newHandover(self, r, time.Second, slog.New(slog.DiscardHandler))
	if err := h.adopt(members(self), time.Unix(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	return h, r
}

// counts returns how many partitions h's ring gives its node, and how many
// of those h lets it decide now.
func counts(h *handover, r *ring.Ring) (mine, settled int) {
	for p := range r.Config().PartitionCount {
		switch st, _ := h.stateOf(uint64(p)); st {
		case owned:
			mine++
			settled++
		case pending:
			mine++
		}
	}
	return mine, settled
}

// The hand-over as a table of steps on one node: each step changes the
// membership, confirms, readies or lets time pass, and the node then
// decides all, some or none of the partitions it owns.
func TestHandoverSteps(t *testing.T) {
	const none, some, all = "none", "some", "all"
	type step struct {
		at      time.Duration
		ready   *bool
		ring    []string // adopt this membership
		confirm string   // this member confirms the current membership
		of      []string // ... or this one
		expire  bool     // call expire
		want    string   // none, some or all owned partitions settled ("": any)
	}
	yes, no := true, false
	for _, tc := range []struct {
		name  string
		self  string
		steps []step
	}{
		{"alone and ready decides everything", "a", []step{
			{want: none},
			{ready: &yes, want: all},
		}},
		{"a member joins: the old node keeps what it keeps", "a", []step{
			{ready: &yes, want: all},
			{ring: []string{"a", "b"}, want: all},
		}},
		{"the joiner waits for every other member", "c", []step{
			{ring: []string{"a", "b", "c"}, want: none},
			{ready: &yes, want: none},
			{confirm: "a", want: none},
			{confirm: "b", want: all},
		}},
		{"a stale confirmation does not count", "b", []step{
			{ready: &yes, ring: []string{"a", "b"}, want: none},
			{confirm: "a", of: []string{"a", "b", "z"}, want: none},
			{confirm: "a", want: all},
		}},
		{"confirmations that come before the ring", "c", []step{
			{confirm: "a", of: []string{"a", "b", "c"}, want: none},
			{confirm: "b", of: []string{"a", "b", "c"}, want: none},
			{ready: &yes, ring: []string{"a", "b", "c"}, want: all},
		}},
		{"a member leaves: what moves waits, the rest stays", "a", []step{
			{ready: &yes, ring: []string{"a", "b", "c"}, want: none},
			{confirm: "b", want: none},
			{confirm: "c", want: all},
			{ring: []string{"a", "b"}, want: some},
			{confirm: "b", want: all},
		}},
		{"the timeout settles what no one confirmed", "a", []step{
			{ready: &yes, ring: []string{"a", "b"}, want: none},
			{at: 999 * time.Millisecond, expire: true, want: none},
			{at: time.Second, expire: true, want: all},
		}},
		{"a confirmation of an earlier adoption of the membership does not count", "c", []step{
			{ready: &yes, ring: []string{"a", "b", "c"}, want: none},
			{confirm: "a", want: none},
			{confirm: "b", want: all},
			{ring: []string{"a", "b", "c", "d"}},
			{ring: []string{"a", "b", "c"}, want: some},
			{confirm: "a", want: some},
			{confirm: "b", want: all},
		}},
		{"a departure settles at once what moves from the leaver", "a", []step{
			{ready: &yes, ring: []string{"a", "b", "c"}, want: none},
			{confirm: "b", want: none},
			{confirm: "c", want: all},
			{confirm: "c", of: []string{"a", "b"}, want: all},
			{ring: []string{"a", "b"}, want: all},
		}},
		{"a departure that comes after the ring dropped the leaver", "a", []step{
			{ready: &yes, ring: []string{"a", "b", "c"}, want: none},
			{confirm: "b", want: none},
			{confirm: "c", want: all},
			{ring: []string{"a", "b"}, want: some},
			{confirm: "c", of: []string{"a", "b"}, want: all},
		}},
		{"a departure confirms the membership it leaves", "d", []step{
			{ready: &yes, ring: []string{"a", "b", "c", "d"}, want: none},
			{confirm: "a", want: none},
			{confirm: "b", want: none},
			{confirm: "c", of: []string{"a", "b", "d"}, want: all},
		}},
		{"a departure from another membership settles nothing", "a", []step{
			{ready: &yes, ring: []string{"a", "b", "c"}, want: none},
			{confirm: "b", want: none},
			{confirm: "c", want: all},
			{confirm: "c", of: []string{"a", "b", "z"}, want: all},
			{ring: []string{"a", "b"}, want: some},
			{confirm: "b", want: all},
		}},
		{"not ready decides nothing", "a", []step{
			{ready: &yes, want: all},
			{ready: &no, want: none},
			{ready: &yes, want: all},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, r := handoverOf(t, tc.self)
			cur := []string{tc.self}
			for i, s := range tc.steps {
				now := time.Unix(0, 0).Add(s.at)
				if s.ring != nil {
					cur = s.ring
					if err := h.adopt(members(cur...), now, nil); err != nil {
						t.Fatal(err)
					}
				}
				if s.ready != nil {
					h.setReady(*s.ready, now)
				}
				if s.confirm != "" {
					of := cur
					if s.of != nil {
						of = s.of
					}
					h.confirm(s.confirm, ring.Fingerprint(members(of...)))
				}
				if s.expire {
					h.expire(now)
				}
				owned, settled := counts(h, r)
				got := some
				switch settled {
				case 0:
					got = none
				case owned:
					got = all
				}
				if owned == 0 {
					t.Fatalf("step %d: the ring gives %s no partition", i, tc.self)
				}
				if s.want != "" && got != s.want {
					t.Fatalf("step %d: %d of %d owned partitions settled (%s), want %s", i, settled, owned, got, s.want)
				}
			}
		})
	}
}

// A key the ring gives another node is never this node's to decide, and
// previous names who decided it before this node had it.
func TestHandoverMovedAndPrevious(t *testing.T) {
	h, r := handoverOf(t, "a")
	h.setReady(true, time.Unix(0, 0))
	if err := h.adopt(members("a", "b"), time.Unix(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	var sawMoved, sawOwned bool
	for p := range r.Config().PartitionCount {
		st, m := h.stateOf(uint64(p))
		switch {
		case st == moved && m.Name == "b":
			sawMoved = true
		case st == owned && m.Name == "a":
			sawOwned = true
			if prev, ok := h.previous(uint64(p)); !ok || prev != "b" {
				t.Fatalf("partition %d: previous %q, %v; want b, the only other member", p, prev, ok)
			}
		default:
			t.Fatalf("partition %d: state %d, owner %s", p, st, m.Name)
		}
	}
	if !sawMoved || !sawOwned {
		t.Fatalf("moved %v, owned %v: want both", sawMoved, sawOwned)
	}
	h.barrier() // takes and releases every decide lock
}

func TestSerfLogLevels(t *testing.T) {
	var buf bytes.Buffer
	w := serfLogWriter{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, tc := range []struct{ line, level, msg string }{
		{"2026/11/23 20:43:00 [ERR] serf: Node name conflicts with another node at 127.0.0.1:1\n", "ERROR", "serf: Node name conflicts"},
		{"[WARN] memberlist: Refuting a suspect message\n", "WARN", "memberlist: Refuting"},
		{"[INFO] serf: EventMemberJoin: a 127.0.0.1\n", "INFO", "serf: EventMemberJoin"},
		{"[DEBUG] memberlist: Stream connection\n", "DEBUG", "memberlist: Stream"},
		{"no tag at all\n", "DEBUG", "no tag at all"},
	} {
		buf.Reset()
		if _, err := w.Write([]byte(tc.line)); err != nil {
			t.Fatal(err)
		}
		got := buf.String()
		if !strings.Contains(got, "level="+tc.level) || !strings.Contains(got, tc.msg) {
			t.Errorf("%q logged as %q, want level %s and %q", tc.line, got, tc.level, tc.msg)
		}
	}
}
