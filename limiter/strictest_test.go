package limiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// rateVariant is a change of a request's rate that a caller may try.
type rateVariant struct {
	name string
	set  func(r *Request)
}

// rateVariants are the changes an attacker tries on a key charged under
// base's rate: every other algorithm, with base's rate and with a laxer
// one, a higher Limit or Burst, a shorter or longer Period, a cut, and
// calendar windows.
func rateVariants(base Request) []rateVariant {
	vs := []rateVariant{
		{"limit_up", func(r *Request) { r.Limit = 1_000_000 }},
		{"period_down", func(r *Request) { r.Period = time.Millisecond }},
		{"limit_up_period_down", func(r *Request) { r.Limit, r.Period = 1_000_000, time.Millisecond }},
		{"period_up", func(r *Request) { r.Period = time.Hour }},
		{"limit_cut", func(r *Request) { r.Limit = 3 }},
		{"burst_up", func(r *Request) { r.Burst = 1000 }},
		{"burst_up_limit_down", func(r *Request) { r.Limit, r.Burst = 1, 1000 }},
	}
	for _, a := range Algorithms {
		if a == base.Algorithm {
			continue
		}
		vs = append(vs,
			rateVariant{"to_" + a.String(), func(r *Request) { r.Algorithm = a }},
			rateVariant{"to_" + a.String() + "_lax", func(r *Request) {
				r.Algorithm, r.Limit, r.Period = a, 1_000_000, time.Millisecond
			}})
	}
	for _, c := range []Calendar{Minute, Hour} {
		vs = append(vs, rateVariant{"calendar_" + c.String(), func(r *Request) {
			r.Algorithm, r.Calendar, r.Period, r.Limit = FixedWindow, c, 0, 1_000_000
		}})
	}
	return vs
}

// TestKeepStrictestSurvey attacks a key charged at 10 hits a minute, for
// every algorithm, with every rate variant: interleaved with the rightful
// caller's checks (the variant first, then the variant and a return to
// the base rate, A->B->A), and before the rightful caller's first check
// (a key claimed at a laxer rate). No sequence of checks without Reset
// admits more than the strictest rate seen allows: the rightful caller is
// admitted no more than alone on the key, and the attacker's hits and
// the caller's together no more than if every check had used the base
// rate.
func TestKeepStrictestSurvey(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	const steps, step = 40, 100 * time.Millisecond
	var bases []Request
	for _, a := range Algorithms {
		bases = append(bases, Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: a})
	}
	// Calendar windows: every variant that changes the Period or the
	// Algorithm leaves them.
	bases = append(bases, Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Algorithm: FixedWindow, Calendar: Minute})
	for _, base := range bases {
		a := base.Algorithm
		if base.Calendar != NoCalendar {
			a = 0 // named below by its calendar
		}
		for _, v := range rateVariants(base) {
			for _, order := range []string{"spent_first", "claimed_first", "round_trip"} {
				name := base.Algorithm.String()
				if a == 0 {
					name = "calendar_" + base.Calendar.String()
				}
				t.Run(fmt.Sprintf("%s/%s/%s", name, v.name, order), func(t *testing.T) {
					attacked := newStrictStore(t)
					alone := newStrictStore(t)  // the rightful caller alone
					asBase := newStrictStore(t) // every check at the base rate
					bad := base
					v.set(&bad)
					if bad.Calendar != NoCalendar && (bad.Period != 0 || bad.Algorithm != FixedWindow) {
						bad.Calendar = NoCalendar
						if bad.Period == 0 {
							bad.Period = time.Minute
						}
					}
					if err := bad.Validate(); err != nil {
						t.Skipf("variant invalid for %s: %v", name, err)
					}
					var legit, legitAlone, total, totalBase int64
					check := func(s *Store, r Request, at time.Time) int64 {
						d, err := s.CheckAt(r, at)
						if err != nil {
							t.Fatalf("%+v: %v", r, err)
						}
						if d.Allowed {
							return r.Hits
						}
						return 0
					}
					attack := func(at time.Time) {
						total += check(attacked, bad, at)
						totalBase += check(asBase, base, at)
						if order == "round_trip" {
							back := base
							back.Hits = 0 // a peek at the base rate
							check(attacked, back, at)
							total += check(attacked, bad, at)
							totalBase += check(asBase, base, at)
						}
					}
					if order == "claimed_first" {
						attack(t0)
					} else {
						for range base.Capacity() {
							n := check(attacked, base, t0)
							legit, total = legit+n, total+n
							n = check(alone, base, t0)
							legitAlone += n
							totalBase += check(asBase, base, t0)
						}
					}
					for i := range steps {
						at := t0.Add(time.Duration(i) * step)
						attack(at)
						n := check(attacked, base, at)
						legit, total = legit+n, total+n
						legitAlone += check(alone, base, at)
						totalBase += check(asBase, base, at)
						if legit > legitAlone {
							t.Fatalf("step %d: the rightful caller got %d hits, %d alone", i, legit, legitAlone)
						}
						if total > totalBase {
							t.Fatalf("step %d: %d hits admitted in all, %d at the base rate", i, total, totalBase)
						}
					}
				})
			}
		}
	}
}

// TestKeepStrictestCutAndRaise: a cut of Limit takes effect at once and
// keeps what was consumed; a raise waits until the key is fresh, then
// takes effect; a Reset takes any rate at once.
func TestKeepStrictestCutAndRaise(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newStrictStore(t)
			base := Request{Name: "n", Key: "k", Hits: 2, Limit: 10, Period: time.Minute, Algorithm: a}
			cut, raise := base, base
			cut.Limit, cut.Hits = 3, 1
			raise.Limit, raise.Hits = 100, 50
			steps := []struct {
				name string
				req  Request
				at   time.Time
				want bool
				lim  int64
			}{
				{"2 of 10", base, t0, true, 10},
				{"cut to 3: 1 left", cut, t0, true, 3},
				{"cut to 3: spent", cut, t0, false, 3},
				{"base after the cut: the cut holds", base, t0, false, 3},
				{"raise: more than the cut's capacity", raise, t0, false, 3},
				{"raise once fresh", raise, t0.Add(time.Hour), true, 100},
			}
			for _, st := range steps {
				d, err := s.CheckAt(st.req, st.at)
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				if d.Allowed != st.want || d.Limit != st.lim {
					t.Fatalf("%s: allowed %v limit %d, want %v and %d (%+v)", st.name, d.Allowed, d.Limit, st.want, st.lim, d)
				}
				if !d.Allowed && d.RetryAfter <= 0 {
					t.Fatalf("%s: denied with RetryAfter %v", st.name, d.RetryAfter)
				}
			}
			reset := raise
			reset.Behavior = Reset
			if d, _ := s.CheckAt(reset, t0.Add(time.Hour)); !d.Allowed || d.Limit != 100 {
				t.Fatalf("reset: %+v", d)
			}
		})
	}
}

func newStrictStore(t testing.TB) *Store {
	t.Helper()
	cfg := DefaultStoreConfig()
	cfg.Shards, cfg.KeepStrictest = 1, true
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKeepStrictestBytes: MaxBytes counts each key's rate under
// KeepStrictest, and a sweep gives it back with the key.
func TestKeepStrictestBytes(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	s := newStrictStore(t)
	req := Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: GCRA}
	if _, err := s.CheckAt(req, t0); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Bytes(), entryBytes(len(appendStoreKey(nil, "n", "k")))+RateOverhead; got != want {
		t.Fatalf("Bytes %d, want %d", got, want)
	}
	if n := s.Sweep(t0.Add(time.Hour)); n != 1 || s.Bytes() != 0 {
		t.Fatalf("swept %d, Bytes %d after", n, s.Bytes())
	}
	sh := &s.shards[0]
	if len(sh.rates) != 0 {
		t.Fatalf("%d rates left after the sweep", len(sh.rates))
	}
}

// TestKeepStrictestRandom sends random valid requests of every algorithm,
// rate and calendar to a few keys of a KeepStrictest store, at times that
// step forward and sometimes back: no decision fails or panics, none is
// negative, and a denial has a RetryAfter.
func TestKeepStrictestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newStrictStore(t)
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	periods := []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour}
	limits := []int64{1, 3, 10, 1000, 1_000_000}
	n := 20_000
	if testing.Short() {
		n = 2_000
	}
	for i := range n {
		r := Request{Name: "n", Key: fmt.Sprint(rng.IntN(4)), Algorithm: Algorithms[rng.IntN(len(Algorithms))],
			Limit: limits[rng.IntN(len(limits))], Period: periods[rng.IntN(len(periods))]}
		if rng.IntN(3) == 0 && r.Algorithm.HasBurst() {
			r.Burst = limits[rng.IntN(len(limits))]
		}
		if rng.IntN(8) == 0 {
			r.Algorithm, r.Period, r.Calendar = FixedWindow, 0, Calendar(1+rng.IntN(int(numCalendars)-1))
		}
		r.Hits = rng.Int64N(min(r.Capacity(), 5) + 1)
		if r.Validate() != nil {
			continue
		}
		switch rng.IntN(10) {
		case 0:
			now = now.Add(-time.Duration(rng.Int64N(int64(time.Minute))))
		default:
			now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
		}
		d, err := s.CheckAt(r, now)
		if err != nil {
			t.Fatalf("step %d: %+v: %v", i, r, err)
		}
		if d.Remaining < 0 || d.RetryAfter < 0 || d.Delay < 0 {
			t.Fatalf("step %d: %+v: negative decision %+v", i, r, d)
		}
		if !d.Allowed && r.Hits > 0 && d.RetryAfter == 0 {
			t.Fatalf("step %d: %+v: denied without RetryAfter: %+v", i, r, d)
		}
	}
}

// attackMoved spends base at t0 on a KeepStrictest store, moves its key
// at now to another one through move (its snapshot, as it arrives), and
// checks that neither bad nor base is admitted there. It returns the
// snapshot that left.
func attackMoved(t *testing.T, base, bad Request, t0, now time.Time, move func(Snapshot) Snapshot) Snapshot {
	t.Helper()
	from, to := newStrictStore(t), newStrictStore(t)
	if d, err := from.CheckAt(base, t0); err != nil || !d.Allowed {
		t.Fatalf("spending: %+v %v", d, err)
	}
	sn := snapOf(t, from, base, now)
	mustMerge(t, to, []Snapshot{move(sn)}, now)
	if d, err := to.CheckAt(bad, now); err != nil || d.Allowed {
		t.Fatalf("after the move, a check at %+v admitted: %+v %v", bad, d, err)
	}
	own := base
	own.Hits = 1
	if d, err := to.CheckAt(own, now); err != nil || d.Allowed {
		t.Fatalf("after the move and %+v, a check at the key's rate admitted: %+v %v", bad, d, err)
	}
	return sn
}

// TestKeepStrictestAcrossMerge: a key spent on one KeepStrictest store and
// moved to another by Snapshot and Merge carries its rate: a check at a
// laxer rate on the receiving store finds it spent, for every algorithm
// and every variant. A snapshot's rate is validated like a request's.
func TestKeepStrictestAcrossMerge(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC)
	now := t0.Add(time.Second)
	for _, a := range Algorithms {
		base := Request{Name: "n", Key: "k", Hits: 10, Limit: 10, Period: time.Minute, Algorithm: a}
		for _, v := range rateVariants(base) {
			t.Run(a.String()+"/"+v.name, func(t *testing.T) {
				bad := base
				v.set(&bad)
				bad.Hits = 1
				if bad.Validate() != nil {
					t.Skip("invalid variant")
				}
				sn := attackMoved(t, base, bad, t0, now, func(sn Snapshot) Snapshot { return sn })
				if sn.RateLimit != 10 || sn.RatePeriod != time.Minute {
					t.Fatalf("snapshot rate %d per %v", sn.RateLimit, sn.RatePeriod)
				}
			})
		}
	}
	sn := Snapshot{Name: "n", Key: "k", Algorithm: GCRA, ExpireAt: now.UnixNano() + 1, Words: [3]int64{now.UnixNano() + 1, 1}}
	for _, bad := range []struct{ limit, burst int64 }{{-1, 1}, {10, 0}, {10, 2 * MaxLimit}, {MaxLimit + 1, 1}} {
		sn.RateLimit, sn.RateBurst, sn.RatePeriod = bad.limit, bad.burst, time.Minute
		if err := sn.Validate(); !errors.Is(err, ErrInvalidSnapshot) {
			t.Errorf("rate %+v: %v, want ErrInvalidSnapshot", bad, err)
		}
	}
}
