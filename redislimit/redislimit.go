package redislimit

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/limiter"
)

//go:embed decide.lua
var decideSource string

// Limiter is a sluice.Limiter whose state lives in Redis. It is safe for
// concurrent use and starts no goroutines of its own.
type Limiter struct {
	cfg    Config
	client redis.UniversalClient
	owned  bool // Close closes client
	script *redis.Script
	local  *sluice.Local
	over   *overLimit // nil unless Config.OverLimitCache
	brks   sync.Map   // node address ("" for one server) -> *breaker.Breaker
	closed atomic.Bool

	// clock is the clock of this process: the local store's, the
	// breaker's and the calendar windows'.
	clock func() time.Time
	// serverNow, when set, replaces the Redis server's clock (TIME) with
	// its reading, in every script: tests run one trace through Redis and
	// limiter at the same instants with it.
	serverNow func() time.Time

	withoutOwner atomic.Int64

	// zones holds the calendar zone of every request this Limiter has
	// sent, by zoneID: the script names the zone of a state's calendar by
	// that number when it asks for the state's windows.
	zones sync.Map // uint32 -> *time.Location
}

// slotReloader is a cluster client, which can read its slot map again.
type slotReloader interface {
	ReloadState(ctx context.Context)
}

var _ sluice.Limiter = (*Limiter)(nil)

// New returns a Limiter on cfg's Redis. It does not contact Redis: the
// first check does, and the script is loaded then.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	local := cfg.Local
	local.KeepStrictest = local.KeepStrictest || cfg.KeepStrictest
	store, err := limiter.NewStore(local)
	if err != nil {
		return nil, fmt.Errorf("redislimit: local store: %w", err)
	}
	l := &Limiter{cfg: cfg, client: cfg.Client, script: redis.NewScript(decideSource), clock: cfg.Clock}
	if l.clock == nil {
		l.clock = time.Now
	}
	if l.client == nil {
		l.client, l.owned = cfg.client(), true
	}
	l.local = sluice.NewLocal(store, func() time.Time { return l.clock() })
	if cfg.OverLimitCache > 0 {
		l.over = newOverLimit(cfg.OverLimitCache)
	}
	return l, nil
}

// Close closes the client New built; a Config.Client stays open. It is
// safe to call twice.
func (l *Limiter) Close() error {
	if l.closed.Swap(true) || !l.owned {
		return nil
	}
	return l.client.Close()
}

// Ping reports whether Redis answers within Config.Timeout: the server,
// or every master of a cluster. It returns ErrClosed on a closed Limiter.
func (l *Limiter) Ping(ctx context.Context) error {
	if err := l.callError(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			if err := m.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("redislimit: %s: %w", m.Options().Addr, err)
			}
			return nil
		})
	}
	if err := l.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redislimit: %w", err)
	}
	return nil
}

// WithoutOwner counts the checks the Unreachable policy decided.
func (l *Limiter) WithoutOwner() int64 { return l.withoutOwner.Load() }

// Check decides req on Redis. It returns an error wrapping a limiter
// sentinel for an invalid request (ErrUnsupported too for one Redis time
// cannot decide), ErrNilContext for a nil ctx and ctx's error when ctx
// ends first. When Redis cannot decide, the Unreachable policy does and
// Decision.WithoutOwner says so.
func (l *Limiter) Check(ctx context.Context, req limiter.Request, opts ...sluice.CheckOption) (sluice.Decision, error) {
	r := l.CheckMany(ctx, []limiter.Request{req}, opts...)[0]
	return r.Decision, r.Err
}

// CheckMany decides every request, in order, with the errors Check would
// return in each Result's Err. The valid requests go to Redis in one
// pipeline, which a cluster client splits by node and sends to the nodes
// in parallel.
func (l *Limiter) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	out := make([]sluice.Result, len(reqs))
	if err := l.callError(ctx); err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	calls := make([]call, 0, len(reqs))
	for i := range reqs {
		if err := validate(&reqs[i]); err != nil {
			out[i].Err = err
			continue
		}
		if l.over != nil {
			if d, ok := l.over.lookup(&reqs[i], l.clock()); ok {
				out[i].Decision.Decision = d
				continue
			}
		}
		calls = append(calls, call{index: i, req: &reqs[i]})
	}
	if len(calls) == 0 {
		return out
	}
	policy := sluice.Options(opts).Unreachable
	if policy == sluice.PolicyDefault || !policy.Valid() {
		policy = l.cfg.Unreachable
	}
	failed := l.run(ctx, calls) != nil
	for _, c := range calls {
		switch {
		case c.decided:
			// Redis decided it, even if it failed others of the batch
			// (a master of a cluster down, say): its count is taken.
			out[c.index].Decision, out[c.index].Err = c.decision, c.err
			if l.over != nil && c.err == nil {
				if c.req.Behavior&(limiter.Reset|limiter.Refund) != 0 {
					l.over.forget(c.req)
				}
				l.over.remember(c.req, c.decision.Decision, l.clock())
			}
		case failed && ctx.Err() != nil: // the caller's context ended, not Redis
			out[c.index].Err = ctx.Err()
		default:
			out[c.index].Decision, out[c.index].Err = l.unreachable(ctx, c.req, policy)
		}
	}
	return out
}

// callError is why a call with ctx cannot be made, or nil.
func (l *Limiter) callError(ctx context.Context) error {
	if ctx == nil {
		return sluice.ErrNilContext
	}
	if l.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// call is one request on its way through Redis.
type call struct {
	index    int
	req      *limiter.Request
	key      string // its Redis key
	gate     *gate  // its node's breaker in this run
	decided  bool   // Redis answered: decision, or err
	decision sluice.Decision
	err      error     // of this request alone: a bad state
	hint     time.Time // the server's time, when a calendar window missed it
	// stateCal, when set, is the calendar (unit and zone) of the rate the
	// key's state was charged under, whose windows around its at the
	// script asked for.
	stateCal *stateCalendar
}

// stateCalendar is the script's question for the windows of the calendar
// a key's state was charged under, around the server's time.
type stateCalendar struct {
	unit limiter.Calendar
	zone uint32
	at   time.Time
}

// run decides calls on Redis within the timeout, each behind the breaker
// of the node that holds its key. It returns an error when Redis did not
// decide them all (a breaker open, or Redis unreachable, slow, refusing or
// failing over); the calls it decided are marked decided. A call's own
// error (a bad state) is in it.
func (l *Limiter) run(ctx context.Context, calls []call) error {
	tctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	now := l.clock()
	gates := make(map[string]*gate, 1)
	send := make([]*call, 0, len(calls))
	for i := range calls {
		c := &calls[i]
		c.key = Key(l.cfg.Prefix, c.req.Name, c.req.Key)
		node := l.nodeOf(tctx, c.key)
		c.gate = gates[node]
		if c.gate == nil {
			b := l.breakerFor(node)
			c.gate = &gate{b: b, open: b.Closed()}
			if !c.gate.open {
				c.gate.open = b.Allow(now.UnixNano(), l.cfg.BreakerCooldown)
				c.gate.probe = c.gate.open // half-open: this run probes
			}
			gates[node] = c.gate
		}
		if c.gate.open {
			send = append(send, c)
		}
	}
	var err error
	if len(send) > 0 {
		err = l.pipeline(tctx, send)
	}
	for _, c := range send {
		if !c.decided {
			c.gate.failed = true
		}
	}
	gaveUp := err != nil && ctx.Err() != nil // no news of Redis
	if r, ok := l.client.(slotReloader); ok && err != nil && !gaveUp {
		// A master that fails answers nothing, not MOVED: the slot map
		// is read again so that the replica that takes over is found.
		r.ReloadState(ctx)
	}
	now = l.clock()
	for _, g := range gates {
		switch {
		case !g.open:
		case gaveUp && g.failed:
			if g.probe {
				g.b.GiveBack()
			}
		default:
			g.b.Done(g.probe, !g.failed, now.UnixNano(), int32(l.cfg.BreakerThreshold), l.cfg.BreakerCooldown)
		}
	}
	if err == nil && len(send) < len(calls) {
		err = errBreakerOpen
	}
	return err
}

// gate is one node's breaker as one run passes it: whether calls may go
// (open), whether this run holds the probe, and whether a call failed.
type gate struct {
	b           *breaker.Breaker
	open, probe bool
	failed      bool
}

// nodeOf names the node that holds key: its master's address on a
// cluster, "" on one server (or when the cluster cannot say, whose calls
// then share one breaker).
func (l *Limiter) nodeOf(ctx context.Context, key string) string {
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// breakerFor returns node's breaker, made on first use. Nodes are the
// servers of one deployment, so the map stays small.
func (l *Limiter) breakerFor(node string) *breaker.Breaker {
	if b, ok := l.brks.Load(node); ok {
		return b.(*breaker.Breaker)
	}
	b, _ := l.brks.LoadOrStore(node, new(breaker.Breaker))
	return b.(*breaker.Breaker)
}

var errBreakerOpen = errors.New("redislimit: breaker open")

// pipeline runs the script for every call, EVALSHA first and EVAL for the
// calls whose server lacks the script, then once more for calendar windows
// that the server's clock placed outside the caller's. It returns the
// first error of Redis after every pass has read every answer, so that
// the calls Redis did decide are kept, those of a node that failed as
// well; a call's bad state is that call's error.
func (l *Limiter) pipeline(ctx context.Context, pending []*call) error {
	var failed error
	for pass := 0; len(pending) > 0; pass++ {
		if pass == maxPasses {
			return cmp.Or(failed, fmt.Errorf("redislimit: %d checks undecided after %d passes", len(pending), pass))
		}
		cmds := make([]*redis.Cmd, len(pending))
		send := func(c redis.Scripter) {
			for i, p := range pending {
				keys := []string{p.key}
				if pass == 0 {
					cmds[i] = l.script.EvalSha(ctx, c, keys, l.args(p.req, p.hint, p.stateCal)...)
				} else {
					cmds[i] = l.script.Eval(ctx, c, keys, l.args(p.req, p.hint, p.stateCal)...)
				}
			}
		}
		if len(pending) == 1 {
			send(l.client) // one command needs no pipeline
		} else {
			// Pipelined's error is the first command's; each is read
			// below.
			_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error { send(p); return nil })
		}
		var again []*call
		for i, cmd := range cmds {
			c := pending[i]
			vals, err := cmd.Int64Slice()
			switch {
			case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, c)
			case err != nil && (strings.Contains(err.Error(), badStateReply) || redis.HasErrorPrefix(err, "WRONGTYPE")):
				c.decided, c.err = true, fmt.Errorf("%w: %v", ErrBadState, err)
			case err != nil && redis.HasErrorPrefix(err, "user_script"):
				// The script failed on this key: a fault of this
				// package, named, rather than an outage hidden by the
				// policy.
				c.decided, c.err = true, fmt.Errorf("%w: %v", ErrScript, err)
			case err != nil:
				failed = cmp.Or(failed, err)
			case len(vals) == 2 && vals[0] == -1: // outside the calendar windows given
				c.hint = time.UnixMicro(vals[1])
				again = append(again, c)
			case len(vals) == 4 && vals[0] == -2: // the state's calendar windows wanted
				c.stateCal = &stateCalendar{unit: limiter.Calendar(vals[2]), zone: uint32(vals[3]), at: time.UnixMicro(vals[1])}
				again = append(again, c)
			case len(vals) != 9:
				failed = cmp.Or(failed, fmt.Errorf("redislimit: script answered %v, want 9 numbers", vals))
			default:
				c.decided, c.decision = true, decisionOf(c.req, vals, l.clock())
			}
		}
		pending = again
	}
	return failed
}

// testMinTTL is the least TTL, in milliseconds, of a key written at a
// time a test passed: its state's expiry is on the test's clock, and the
// key must outlive the real time the test takes.
const testMinTTL = 600_000

// maxPasses bounds the passes of pipeline: EVALSHA, EVAL, a calendar
// window placed by the server's clock, and the windows of a state's
// calendar.
const maxPasses = 4

// badStateReply is what the script's error reply for a bad state holds.
const badStateReply = "redislimit: state of"

// args are the script's ARGV for req. hint, when not zero, is the server's
// time as a previous pass reported it, around which the calendar windows
// are given. sc, when not nil, is the calendar of the key's state whose
// windows a previous pass asked for.
func (l *Limiter) args(req *limiter.Request, hint time.Time, sc *stateCalendar) []any {
	now, minTTL := "", 0
	if l.serverNow != nil {
		now, minTTL = strconv.FormatInt(l.serverNow().UnixMicro(), 10), testMinTTL
	}
	keep := "0"
	if l.cfg.KeepStrictest {
		keep = "1"
	}
	cs, ce := chargedMicro(req.Charged)
	args := []any{int(req.Algorithm), req.Hits, req.Limit, int64(req.Period / time.Microsecond), req.Capacity(), int(req.Behavior), now, minTTL,
		keep, int(req.Calendar), zoneID(req), cs, ce}
	charged := req.Calendar != limiter.NoCalendar && req.Behavior&limiter.Refund != 0 && !req.Charged.IsZero()
	if req.Calendar == limiter.NoCalendar {
		if sc == nil {
			return args
		}
		args = append(args, "", "", "", "")
	} else {
		if id := zoneID(req); !l.knowsZone(id) {
			l.zones.Store(id, req.Location)
		}
		around := hint
		if around.IsZero() {
			around = l.clock()
			if l.serverNow != nil {
				around = l.serverNow()
			}
		}
		args = append(args, windowsAround(req.Calendar, req.Location, around)...)
	}
	switch {
	case sc == nil && !charged:
		return args
	case sc == nil:
		args = append(args, "", "", "", "", "", "")
	default:
		args = append(args, int(sc.unit), sc.zone)
		if loc, ok := l.zones.Load(sc.zone); ok {
			args = append(args, windowsAround(sc.unit, loc.(*time.Location), sc.at)...)
		} else {
			args = append(args, "", "", "", "")
		}
	}
	if charged {
		// The windows a refund's charged window names, which a clock
		// that stepped back may find outside those around now.
		args = append(args, windowsAround(req.Calendar, req.Location, time.Unix(0, req.Charged.Start))...)
	}
	return args
}

func (l *Limiter) knowsZone(id uint32) bool {
	_, ok := l.zones.Load(id)
	return ok
}

// windowsAround are the bounds of three consecutive windows of cal in loc,
// the middle one holding t, in Unix microseconds.
func windowsAround(cal limiter.Calendar, loc *time.Location, t time.Time) []any {
	s1, e1 := limiter.CalendarWindow(cal, loc, t)
	s0, _ := limiter.CalendarWindow(cal, loc, s1.Add(-time.Nanosecond))
	_, e2 := limiter.CalendarWindow(cal, loc, e1)
	return []any{s0.UnixMicro(), s1.UnixMicro(), e1.UnixMicro(), e2.UnixMicro()}
}

// chargedMicro is a refund's charged window in Unix microseconds, the
// script's times: 0 and 0 for none, the instant twice for a bucket's,
// GCRA's or log's. A window or instant that is not on whole microseconds
// (one that Redis never reported) is sent as [-1, -1), which no live
// state's window or log entry is, and which every bucket or GCRA charge
// has drained since: the refund gives nothing back.
func chargedMicro(w limiter.Window) (start, end int64) {
	const us = int64(time.Microsecond)
	if w.Start%us != 0 || w.End%us != 0 {
		return -1, -1
	}
	return w.Start / us, w.End / us
}

// zoneID names req's calendar zone to the script, which compares rates
// by it: 0 without a calendar, otherwise a hash of the zone's name (UTC
// for nil), as limiter compares zones by name.
func zoneID(req *limiter.Request) uint32 {
	if req.Calendar == limiter.NoCalendar {
		return 0
	}
	name := "UTC"
	if req.Location != nil {
		name = req.Location.String()
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return max(h.Sum32(), 1)
}

// decisionOf reads the script's answer, read at local on this process's
// clock. The script's times are on the server's clock, whose now it
// answers with: ResetAt is moved onto the local clock by their
// difference, so that ResetAt - local is the time Redis counts until the
// reset, however far apart the two clocks are. The Window is not moved:
// it names the window of the key's state, which a refund gives back to.
func decisionOf(req *limiter.Request, v []int64, local time.Time) sluice.Decision {
	d := sluice.Decision{Decision: limiter.Decision{
		Allowed:    v[0] == 1,
		Limit:      v[6],
		Remaining:  v[1],
		ResetAt:    local.Add(time.Duration(v[2]-v[5]) * time.Microsecond),
		RetryAfter: time.Duration(v[3]) * time.Microsecond,
		Delay:      time.Duration(v[4]) * time.Microsecond,
	}}
	if v[7] != 0 || v[8] != 0 {
		d.Window = limiter.Window{Start: v[7] * int64(time.Microsecond), End: v[8] * int64(time.Microsecond)}
	}
	return d
}

// unreachable decides a valid request that Redis could not.
func (l *Limiter) unreachable(ctx context.Context, req *limiter.Request, policy sluice.Policy) (sluice.Decision, error) {
	l.withoutOwner.Add(1)
	now := l.clock()
	var d sluice.Decision
	switch policy {
	case sluice.PolicyAllow:
		d.Decision = limiter.Decision{Allowed: true, Limit: req.Limit, ResetAt: now}
	case sluice.PolicyDeny:
		d.Decision = limiter.Decision{Limit: req.Limit, RetryAfter: l.cfg.DenyRetryAfter, ResetAt: now.Add(l.cfg.DenyRetryAfter)}
	default:
		var err error
		if d, err = l.local.Check(ctx, *req); err != nil {
			return sluice.Decision{}, err
		}
	}
	d.WithoutOwner = true
	return d, nil
}

// validate checks req as limiter does, and what Redis time needs beyond.
func validate(req *limiter.Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if req.Behavior&limiter.Charge != 0 {
		return fmt.Errorf("%w: %w: Charge is decided by the in-process store only", ErrUnsupported, limiter.ErrInvalidBehavior)
	}
	if req.Calendar != limiter.NoCalendar {
		return nil
	}
	if req.Period%time.Microsecond != 0 {
		return fmt.Errorf("%w: %w: Period %v is not a whole number of microseconds, the resolution of Redis time", ErrUnsupported, limiter.ErrInvalidPeriod, req.Period)
	}
	if req.Algorithm == limiter.GCRA && req.Limit > int64(req.Period/time.Microsecond) {
		return fmt.Errorf("%w: %w: GCRA on Redis admits at most one hit per microsecond, Limit %d per %v is faster", ErrUnsupported, limiter.ErrInvalidLimit, req.Limit, req.Period)
	}
	return nil
}
