package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// fakeOwners grants every lease in full for the TTL, or none after a
// refusal is set, and records what is given back. The owner of every key
// is owner.
type fakeOwners struct {
	mu       sync.Mutex
	owner    string
	refuse   bool
	retry    time.Duration // RetryAfter of a lease of no hits
	fail     error         // what giveBack fails with, taking nothing
	now      func() time.Time
	returned map[string]int64 // by owner
}

func (f *fakeOwners) ownerOf(string, string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owner, true
}

func (f *fakeOwners) lease(_ context.Context, owner string, req limiter.Request, want int64, ttl time.Duration) (transport.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if f.refuse {
		return transport.Lease{Decision: limiter.Decision{Limit: req.Limit, RetryAfter: f.retry, ResetAt: now.Add(f.retry)}}, nil
	}
	return transport.Lease{Granted: want, ExpiresAt: now.Add(ttl), Decision: limiter.Decision{Allowed: true, Limit: req.Limit, ResetAt: now.Add(time.Hour)}}, nil
}

func (f *fakeOwners) giveBack(_ context.Context, owner string, _ limiter.Request, hits int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if f.returned == nil {
		f.returned = map[string]int64{}
	}
	f.returned[owner] += hits
	return nil
}

// The holder's side of leases as a table of steps on one clock: checks of
// a key, the lease requests they cause (made at once), sweeps, and what
// comes back to the owner.
func TestLeaseTableSteps(t *testing.T) {
	const ttl = 100 * time.Millisecond
	at := time.Unix(1000, 0)
	now := func() time.Time { return at }
	owners := &fakeOwners{owner: "o", now: now, retry: 30 * time.Millisecond}
	tab := newLeaseTable(LeaseConfig{Threshold: 100, TTL: ttl, Share: 0.1}, 0) // hot from 10 checks in 100ms
	req := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 1000, Period: time.Second, Algorithm: limiter.TokenBucket}
	check := func() (sluice.Decision, bool) {
		d, ok := tab.decide(&req, owners.ownerOf2(), at.UnixNano())
		select { // a lease request the check asked for is made at once
		case f := <-tab.fetches:
			if err := tab.fetch(context.Background(), &f, owners, at.UnixNano(), now); err != nil {
				t.Fatal(err)
			}
		default:
		}
		return d, ok
	}
	type step struct {
		at         time.Duration // since the start
		checks     int
		wantLocal  int  // of them admitted from a lease
		wantDenied int  // of them denied here
		sweep      bool // then sweep and send returns
		owner      string
		refuse     bool
		fail       error // giveBack's
		wantBack   int64 // hits given back so far, to every owner
	}
	for i, s := range []step{
		{checks: 10, wantLocal: 0},                             // the 10th makes it hot and leases
		{checks: 5, wantLocal: 5},                              // from the lease
		{at: 20 * time.Millisecond, sweep: true},               // used 20ms ago: kept
		{at: 25 * time.Millisecond, sweep: true, wantBack: 95}, // unused for a quarter TTL: back
		{at: 30 * time.Millisecond, checks: 1, wantBack: 95},   // forwarded; asks again
		{at: 30 * time.Millisecond, checks: 2, wantLocal: 2, wantBack: 95},
		{at: 130 * time.Millisecond, sweep: true, wantBack: 95 + 52},         // expired: back (the second lease: 16 checks in 30 ms make 54 hits a TTL)
		{at: 140 * time.Millisecond, refuse: true, checks: 1, wantBack: 147}, // a lease of no hits
		{at: 141 * time.Millisecond, refuse: true, checks: 3, wantDenied: 3, wantBack: 147},
		{at: 171 * time.Millisecond, checks: 1, wantBack: 147}, // the owner's RetryAfter passed: forwarded, leases again
		{at: 172 * time.Millisecond, checks: 1, wantLocal: 1, wantBack: 147},
		// The ring moved the key: the lease is void here, and its unused
		// hits go back to the owner that granted them.
		{at: 173 * time.Millisecond, owner: "p", sweep: true, wantBack: 164},
		{at: 174 * time.Millisecond, checks: 2, wantLocal: 1, wantBack: 164}, // forwarded; leases from p
		// Moved back while p cannot take a return: it is kept, and sent
		// once p takes it.
		{at: 175 * time.Millisecond, owner: "o", fail: errReturnNotSent, sweep: true, wantBack: 164},
		{at: 176 * time.Millisecond, fail: errReturnNotSent, sweep: true, wantBack: 164},
		{at: 177 * time.Millisecond, sweep: true, wantBack: 164 + 17},
		{at: 178 * time.Millisecond, checks: 2, wantLocal: 1, wantBack: 181}, // forwarded; leases from o
		// A return that failed once it may have been taken is not sent
		// again: a second one would free hits this node used.
		{at: 179 * time.Millisecond, owner: "p", fail: transport.ErrUnavailable, sweep: true, wantBack: 181},
		{at: 180 * time.Millisecond, sweep: true, wantBack: 181},
	} {
		at = time.Unix(1000, 0).Add(s.at)
		owners.mu.Lock()
		owners.refuse = s.refuse
		owners.fail = s.fail
		if s.owner != "" {
			owners.owner = s.owner
		}
		owners.mu.Unlock()
		local, denied := 0, 0
		for range s.checks {
			d, ok := check()
			switch {
			case ok && d.Allowed:
				local++
			case ok:
				denied++
			}
		}
		if local != s.wantLocal || denied != s.wantDenied {
			t.Fatalf("step %d: %d admitted and %d denied here, want %d and %d", i, local, denied, s.wantLocal, s.wantDenied)
		}
		if s.sweep {
			tab.sweep(at.UnixNano(), owners)
			tab.requeue(tab.sendReturns(context.Background(), owners), at.UnixNano())
		}
		owners.mu.Lock()
		var back int64
		for _, n := range owners.returned {
			back += n
		}
		owners.mu.Unlock()
		if back != s.wantBack {
			t.Fatalf("step %d: %d hits given back, want %d", i, back, s.wantBack)
		}
	}
}

// ownerOf2 is ownerOf without the ok, for decide.
func (f *fakeOwners) ownerOf2() string {
	o, _ := f.ownerOf("", "")
	return o
}

// A holder whose clock ran an hour ahead, then was set back, holds a key
// here for at most a TTL: a denial after a lease of no hits ends within
// it, and so does a lease, whose unused hits then go back to the owner.
func TestLeaseTableClockStepsBack(t *testing.T) {
	const ttl = 100 * time.Millisecond
	base := time.Unix(1000, 0)
	for _, refuse := range []bool{true, false} {
		at := base.Add(time.Hour)
		now := func() time.Time { return at }
		owners := &fakeOwners{owner: "o", now: now, retry: 30 * time.Millisecond, refuse: refuse}
		tab := newLeaseTable(LeaseConfig{Threshold: 100, TTL: ttl, Share: 0.1}, 0)
		req := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 1000, Period: time.Second, Algorithm: limiter.TokenBucket}
		check := func() (sluice.Decision, bool) {
			d, ok := tab.decide(&req, "o", at.UnixNano())
			select {
			case f := <-tab.fetches:
				if err := tab.fetch(context.Background(), &f, owners, at.UnixNano(), now); err != nil {
					t.Fatal(err)
				}
			default:
			}
			return d, ok
		}
		for range 10 { // the 10th makes the key hot and asks for a lease
			check()
		}
		if d, ok := check(); ok != true || d.Allowed == refuse {
			t.Fatalf("refuse %v: with the clock ahead: %+v here %v, want decided here", refuse, d, ok)
		}
		at = base // set back an hour
		owners.mu.Lock()
		owners.refuse = false
		owners.mu.Unlock()
		if d, ok := tab.decide(&req, "o", at.UnixNano()); !ok || d.Allowed == refuse || d.RetryAfter > ttl {
			t.Fatalf("refuse %v: after the step back: %+v here %v, want decided here for at most a TTL", refuse, d, ok)
		}
		at = base.Add(ttl)
		tab.sweep(at.UnixNano(), owners)
		tab.sendReturns(context.Background(), owners)
		if d, ok := tab.decide(&req, "o", at.UnixNano()); ok && !d.Allowed {
			t.Fatalf("refuse %v: a TTL after the step back the key is still denied here: %+v", refuse, d)
		}
		owners.mu.Lock()
		back := owners.returned["o"]
		owners.mu.Unlock()
		if !refuse && back == 0 {
			t.Fatalf("a TTL after the step back the lease's unused hits are not back")
		}
	}
}

// A return its owner refuses (in hand-over, or no longer deciding the key)
// is tried again for returnRefusedWait from the first refusal; one whose
// owner cannot be reached, until it would free nothing.
func TestLeaseReturnRefusedGivesUp(t *testing.T) {
	tab := newLeaseTable(LeaseConfig{Threshold: 100, TTL: time.Second, Share: 0.1}, 0)
	start := time.Unix(1000, 0).UnixNano()
	until := start + int64(time.Hour)
	for _, s := range []struct {
		at   time.Duration
		want int
	}{
		{0, 2},
		{returnRefusedWait - 1, 2},
		{returnRefusedWait, 1}, // the refused one is dropped
		{time.Hour, 0},
	} {
		rs := tab.takeReturns()
		for i := range rs {
			rs[i].refused = rs[i].owner == "refuses"
		}
		if s.at == 0 {
			rs = []leaseReturn{{owner: "refuses", until: until, refused: true}, {owner: "away", until: until}}
		}
		tab.requeue(rs, start+int64(s.at))
		if n := len(tab.returns); n != s.want {
			t.Fatalf("at %v: %d returns queued, want %d", s.at, n, s.want)
		}
	}
}

// takeReturns removes and returns the queued returns.
func (t *leaseTable) takeReturns() []leaseReturn {
	t.returnsMu.Lock()
	defer t.returnsMu.Unlock()
	rs := t.returns
	t.returns = nil
	return rs
}
