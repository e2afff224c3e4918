package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// attackDomain is one of the domains the pooled-state attack calls: a
// user limit, a path of four entries, a shadow-mode limit of 1, each
// with a detailed metric so that a Hit names its request's values, and
// metadata returned while the descriptor is not over.
func attackDomain(name string) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: user
    detailed_metric: true
    metadata: {owner: %s}
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            descriptors:
              - key: d
                detailed_metric: true
                rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`, name, name)
}

// failingLimiter fails a request whose key names "fail", and every
// request of a context that has ended, around a local limiter.
type failingLimiter struct{ sluice.Limiter }

func (f failingLimiter) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	out := f.Limiter.CheckMany(ctx, reqs, opts...)
	for i := range reqs {
		switch {
		case ctx.Err() != nil:
			out[i].Err = ctx.Err()
		case strings.Contains(reqs[i].Key, "fail"):
			out[i].Err = errors.New("injected failure")
		}
	}
	return out
}

// attackCall is one request of the pooled-state attack and what must
// come back: per descriptor its limit, remaining, code and Hit.
type attackCall struct {
	domain   string
	req      *rlsv3.RateLimitRequest
	ctx      context.Context
	wantCode codes.Code // OK: a response
	limits   []uint32
	remain   []uint32
	shadow   []bool
	hits     []Hit // Key and stats; Domain is domain
}

// attackCallOf builds request i of caller g: 1 to 5 descriptors of
// every kind (a user, a path of four entries, a limit Envoy sends with
// two entries, a shadow-mode limit), values unique to the call, hits
// 1 to 3; every 7th has a last descriptor with too many entries, every
// 11th a descriptor the limiter fails, every 13th a cancelled context.
// With stop (Config.StopIncrementOverLimit), a request whose shadow-mode
// descriptor is over reports its other descriptors uncharged.
func attackCallOf(g, i int, stop bool) attackCall {
	c := attackCall{domain: fmt.Sprintf("d%d", g%4), ctx: context.Background(), wantCode: codes.OK}
	c.req = &rlsv3.RateLimitRequest{Domain: c.domain}
	tag := fmt.Sprintf("g%di%d", g, i)
	n := 1 + (g+i)%5
	entry := func(k, v string) *rlcommon.RateLimitDescriptor_Entry {
		return &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	for j := range n {
		v := fmt.Sprintf("%s-%d", tag, j)
		hits := uint64(1 + (i+j)%3)
		d := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(hits)}
		var limit uint32
		h := Hit{Domain: c.domain, TotalHits: hits, WithinLimit: hits}
		shadow := false
		switch j % 4 {
		case 0:
			if (g+i)%11 == 5 {
				v = "fail-" + v
				c.wantCode = codes.Unavailable
			}
			d.Entries = []*rlcommon.RateLimitDescriptor_Entry{entry("user", v)}
			limit, h.Key = 1000, c.domain+".user_"+v
		case 1:
			d.Entries = []*rlcommon.RateLimitDescriptor_Entry{entry("a", "1"), entry("b", "2"), entry("c", "3"), entry("d", v)}
			limit, h.Key = 100, c.domain+".a_1.b_2.c_3.d_"+v
		case 2:
			limit = uint32(500 + g)
			d.Entries = []*rlcommon.RateLimitDescriptor_Entry{entry("user", v), entry("route", "r"+v)}
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: limit, Unit: typev3.RateLimitUnit_MINUTE}
			h.Key = c.domain + ".user_" + v + ".route_r" + v
		case 3:
			d.Entries = []*rlcommon.RateLimitDescriptor_Entry{entry("shadow", v)}
			limit, h.Key, shadow = 1, c.domain+".shadow_"+v, true
			if hits > 1 { // over in shadow mode: reported OK with none left
				h = Hit{Domain: c.domain, Key: h.Key, TotalHits: hits, OverLimit: hits - 1, NearLimit: 1, ShadowMode: hits - 1}
			} else {
				h.NearLimit = 1
			}
		}
		c.req.Descriptors = append(c.req.Descriptors, d)
		c.limits = append(c.limits, limit)
		c.remain = append(c.remain, uint32(max(int64(limit)-int64(hits), 0)))
		c.shadow = append(c.shadow, shadow)
		c.hits = append(c.hits, h)
	}
	if over := slices.ContainsFunc(c.hits, func(h Hit) bool { return h.OverLimit > 0 }); stop && over {
		for j, h := range c.hits {
			if h.OverLimit == 0 {
				c.remain[j] = c.limits[j]
				c.hits[j] = Hit{Domain: h.Domain, Key: h.Key, TotalHits: h.TotalHits, WithinLimit: h.TotalHits}
			}
		}
	}
	if (g+i)%7 == 3 {
		d := &rlcommon.RateLimitDescriptor{}
		for k := range 7 {
			d.Entries = append(d.Entries, entry(fmt.Sprint("k", k), tag))
		}
		c.req.Descriptors = append(c.req.Descriptors, d)
		c.wantCode = codes.InvalidArgument
	}
	if (g+i)%13 == 7 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c.ctx = ctx
		if c.wantCode == codes.OK || c.wantCode == codes.Unavailable {
			c.wantCode = codes.Canceled
		}
	}
	return c
}

// check compares resp with what c expects, and returns the problems.
func (c *attackCall) check(resp *rlsv3.RateLimitResponse, headers bool) []string {
	var bad []string
	if len(resp.Statuses) != len(c.limits) {
		return []string{fmt.Sprintf("%d statuses for %d descriptors", len(resp.Statuses), len(c.limits))}
	}
	for j, st := range resp.Statuses {
		if st.CurrentLimit == nil || st.CurrentLimit.RequestsPerUnit != c.limits[j] || st.LimitRemaining != c.remain[j] || st.Code != rlsv3.RateLimitResponse_OK {
			bad = append(bad, fmt.Sprintf("status %d: %v, want OK %d of %d", j, st, c.remain[j], c.limits[j]))
		}
	}
	if headers {
		// The headers name the limit of one of this request's statuses.
		if len(resp.ResponseHeadersToAdd) != 3 {
			bad = append(bad, fmt.Sprintf("headers %v", resp.ResponseHeadersToAdd))
		} else {
			pair := resp.ResponseHeadersToAdd[0].Value + "/" + resp.ResponseHeadersToAdd[1].Value
			found := false
			for j := range c.limits {
				found = found || pair == fmt.Sprintf("%d/%d", c.limits[j], c.remain[j])
			}
			if !found {
				bad = append(bad, "headers of another request: "+pair)
			}
		}
	}
	md := resp.DynamicMetadata
	if md == nil {
		return append(bad, "no dynamic metadata")
	}
	if d := md.Fields["domain"].GetStringValue(); d != c.domain {
		bad = append(bad, "metadata domain "+d)
	}
	ds := md.Fields["descriptors"].GetListValue().GetValues()
	if len(ds) != len(c.req.Descriptors) {
		return append(bad, fmt.Sprintf("metadata of %d descriptors", len(ds)))
	}
	for j, d := range c.req.Descriptors {
		got := ds[j].GetStructValue().GetFields()
		es := got["entries"].GetListValue().GetValues()
		if len(es) != len(d.Entries) {
			bad = append(bad, fmt.Sprintf("metadata descriptor %d: %d entries", j, len(es)))
			continue
		}
		for k, e := range d.Entries {
			if es[k].GetStringValue() != e.Key+"="+e.Value {
				bad = append(bad, fmt.Sprintf("metadata descriptor %d entry %d: %s", j, k, es[k].GetStringValue()))
			}
		}
		if got["hitsAddend"].GetNumberValue() != float64(d.HitsAddend.GetValue()) {
			bad = append(bad, fmt.Sprintf("metadata descriptor %d hits %v", j, got["hitsAddend"]))
		}
	}
	if o := md.Fields["metadata"].GetStructValue().GetFields()["owner"].GetStringValue(); o != c.domain {
		bad = append(bad, "the metadata of domain "+o)
	}
	return bad
}

// Many callers share the Service's pooled space at once: requests of one
// to five descriptors (past the pooled items and entries), of four
// domains, limits Envoy sends, shadow mode, some failing while resolved
// (too many entries), in the limiter, or with a cancelled context, and
// an OnHit that copies then scribbles over the Hit it is given. Every
// response carries only its own request's limits, remaining, headers and
// metadata, every OnHit its own request's key and statistics, and a
// failed request reports no Hit. Run with -race.
func TestAttackPooledStateAcrossCallers(t *testing.T) {
	for _, mode := range []struct {
		name string
		mod  func(*Config)
	}{
		{"plain", func(*Config) {}},
		{"quota shadow headers", func(c *Config) { c.QuotaMode, c.ShadowMode, c.Headers = true, true, XRateLimitHeaders() }},
		{"stop increment exact", func(c *Config) { c.StopIncrementOverLimit, c.ExactReset = true, true }},
	} {
		t.Run(mode.name, func(t *testing.T) {
			texts := []string{attackDomain("d0"), attackDomain("d1"), attackDomain("d2"), attackDomain("d3")}
			var mu sync.Mutex
			seen := map[string][]Hit{} // by key
			e := newEnv(t, texts, func(c *Config) {
				c.DynamicMetadata = true
				c.MaxEntries = 6
				c.Limiter = failingLimiter{c.Limiter}
				c.OnHit = func(h *Hit) {
					mu.Lock()
					seen[h.Key] = append(seen[h.Key], *h)
					mu.Unlock()
					*h = Hit{Domain: "scribbled", Key: "scribbled", TotalHits: 1 << 60, OverLimit: 1 << 60}
				}
				mode.mod(c)
			})
			const callers, calls = 16, 60
			var wg sync.WaitGroup
			errs := make(chan string, callers*calls)
			want := make([][]attackCall, callers)
			for g := range callers {
				wg.Go(func() {
					for i := range calls {
						c := attackCallOf(g, i, mode.name == "stop increment exact")
						want[g] = append(want[g], c)
						resp, err := e.svc.ShouldRateLimit(c.ctx, c.req)
						if got := status.Code(err); got != c.wantCode {
							errs <- fmt.Sprintf("caller %d call %d: %v, want %v", g, i, err, c.wantCode)
							continue
						}
						if err != nil {
							continue
						}
						for _, b := range c.check(resp, mode.name == "quota shadow headers") {
							errs <- fmt.Sprintf("caller %d call %d: %s", g, i, b)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			n := 0
			for err := range errs {
				if n++; n <= 20 {
					t.Error(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			counted := 0
			for g := range callers {
				for _, c := range want[g] {
					for _, h := range c.hits {
						got := seen[h.Key]
						switch {
						case c.wantCode != codes.OK && len(got) != 0:
							t.Errorf("failed request (%v) reported %+v", c.wantCode, got)
						case c.wantCode == codes.OK && (len(got) != 1 || got[0] != h):
							t.Errorf("hits of %s: %+v, want %+v", h.Key, got, h)
						}
						if c.wantCode == codes.OK {
							counted++
						}
					}
				}
			}
			if len(seen) != counted {
				t.Errorf("%d keys reported, want %d", len(seen), counted)
			}
		})
	}
}

// A descriptor's status and statistics do not depend on where the
// request's pooled space ends: alone (pooled items and entries), third of
// three (items beyond the pool), or after a descriptor of eight entries
// (entries beyond the pool). Through hits_addend 0 on an empty, a full
// and a drained window, a request straddling the limit, one over a full
// window, in enforced and shadow mode.
func TestAttackPooledAndUnpooledAgree(t *testing.T) {
	e := newEnv(t, []string{`domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: sh
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`})
	eight := desc("e1=1", "e2=2", "e3=3", "e4=4", "e5=5", "e6=6", "e7=7", "e8=8")
	shapes := []struct {
		name string
		of   func(target *rlDesc) []*rlDesc
	}{
		{"alone", func(d *rlDesc) []*rlDesc { return descs(d) }},
		{"third of three", func(d *rlDesc) []*rlDesc { return descs(desc("x=1"), desc("y=2"), d) }},
		{"after eight entries", func(d *rlDesc) []*rlDesc { return descs(eight, d) }},
	}
	type outcome struct {
		overall, code string
		remaining     uint32
		hit           Hit
	}
	hits := []uint64{0, 3, 0, 2, 0, 3, 0, 1}
	// What upstream answers on the enforced limit, step by step.
	want := []outcome{
		{"OK", "OK", 5, Hit{}},
		{"OK", "OK", 2, Hit{TotalHits: 3, WithinLimit: 3}},
		{"OK", "OK", 2, Hit{}},
		{"OK", "OK", 0, Hit{TotalHits: 2, WithinLimit: 2, NearLimit: 1}},
		{"OK", "OK", 0, Hit{WithinLimit: 0, NearLimit: 0}}, // hits_addend 0 on a full window
		{"OVER", "OVER", 0, Hit{TotalHits: 3, OverLimit: 3}},
		{"OVER", "OVER", 0, Hit{}}, // a check of 0 after a request went past the limit
		{"OVER", "OVER", 0, Hit{TotalHits: 1, OverLimit: 1}},
	}
	for _, key := range []string{"k", "sh"} {
		for si, shape := range shapes {
			for i, h := range hits {
				d := desc(fmt.Sprintf("%s=v%d", key, si), fmt.Sprintf("hits=%d", h))
				resp := e.call("s", 1, shape.of(d)...)
				st := resp.Statuses[len(resp.Statuses)-1]
				got := outcome{overall: code(resp.OverallCode), code: code(st.Code), remaining: st.LimitRemaining}
				for _, x := range e.takeHits() {
					if x.Key == "s."+key {
						x.Domain, x.Key = "", ""
						got.hit = x
					}
				}
				w := want[i]
				if key == "sh" {
					w.overall, w.code, w.hit.ShadowMode = "OK", "OK", w.hit.OverLimit
				}
				if got != w {
					t.Errorf("%s %s step %d (hits %d): %+v, want %+v", key, shape.name, i, h, got, w)
				}
			}
		}
	}
	// A request straddling the limit: 4 then 3 of 5 (the near-limit
	// threshold is 4): 2 over, 1 near.
	for si, shape := range shapes {
		v := fmt.Sprintf("k=straddle%d", si)
		e.call("s", 1, shape.of(desc(v, "hits=4"))...)
		e.takeHits()
		e.call("s", 1, shape.of(desc(v, "hits=3"))...)
		for _, x := range e.takeHits() {
			if want := (Hit{Domain: "s", Key: "s.k", TotalHits: 3, OverLimit: 2, NearLimit: 1}); x.Key == "s.k" && x != want {
				t.Errorf("straddling, %s: %+v, want %+v", shape.name, x, want)
			}
		}
	}
}

// A descriptor that is nil, which only a caller in the same process can
// send (gRPC decodes none), is refused as invalid, not a panic.
func TestAttackNilDescriptor(t *testing.T) {
	e := newEnv(t, []string{"domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"},
		func(c *Config) { c.DynamicMetadata = true })
	for _, ds := range [][]*rlDesc{{nil}, {desc("k=1"), nil}, {desc("k=1"), desc("k=2"), nil}} {
		for _, domain := range []string{"s", "unknown"} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("domain %s, %d descriptors, the last nil: panic %v", domain, len(ds), p)
					}
				}()
				_, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("domain %s, %d descriptors, the last nil: %v, want InvalidArgument", domain, len(ds), err)
				}
			}()
		}
	}
}

// A caller in the same process that changes a response's dynamic
// metadata (adds, removes, rewrites nested values) changes neither the
// configuration's metadata nor the next response's.
func TestAttackDynamicMetadataIsTheResponses(t *testing.T) {
	e := newEnv(t, []string{`domain: m
descriptors:
  - key: a
    metadata: {team: {name: alpha, tags: [x, y]}, tier: gold}
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: b
    metadata: {team: {size: 2}, tier: silver}
    rate_limit: {unit: minute, requests_per_unit: 100}
`}, func(c *Config) { c.DynamicMetadata = true })
	var first string
	for i := range 3 {
		resp := e.call("m", 1, desc("a=1"), desc("b=2"))
		md := resp.DynamicMetadata.Fields["metadata"].GetStructValue()
		got := md.String()
		if i == 0 {
			first = got
		} else if got != first {
			t.Fatalf("response %d's metadata %s, want %s as the first's", i, got, first)
		}
		team := md.Fields["team"].GetStructValue()
		team.Fields["name"] = structpb.NewStringValue("mallory")
		team.Fields["tags"].GetListValue().Values[0] = structpb.NewStringValue("z")
		delete(team.Fields, "size")
		md.Fields["tier"] = structpb.NewNullValue()
		resp.DynamicMetadata.Fields["domain"] = structpb.NewStringValue("other")
	}
	if !strings.Contains(first, "alpha") || !strings.Contains(first, "size") {
		t.Errorf("merged metadata %s, want alpha and size", first)
	}
}

// Token-based limits (Envoy AI Gateway's, the check-then-charge pattern
// of upstream's hits_addend 0) check each request with hits_addend 0 and
// charge its tokens afterwards. envoyproxy/ratelimit's counter goes past
// the limit when a charge does, and a check of 0 on it is then
// OVER_LIMIT until the window ends: the limit holds. Once a charge has
// gone over, every later check is OVER_LIMIT until the window ends, as
// upstream answers: sluice's window never holds more than the limit, and
// a mark beside it records that a request went past. (Before the mark, a
// check of the full window answered OK, and the limit never blocked again
// in its window.)
func TestAttackCheckThenChargeAfterOver(t *testing.T) {
	e := newEnv(t, []string{"domain: ai\ndescriptors:\n  - key: model\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"})
	e.run("ai", []step{
		{name: "check", descs: descs(desc("model=m", "hits=0")), want: "OK; OK 1000/1000/minute t=40s"},
		{name: "charge 900 tokens", descs: descs(desc("model=m", "hits=900")), want: "OK; OK 100/1000/minute t=40s"},
		{name: "check", descs: descs(desc("model=m", "hits=0")), want: "OK; OK 100/1000/minute t=40s"},
		{name: "charge 500 tokens, over", descs: descs(desc("model=m", "hits=500")), want: "OVER_LIMIT; OVER 0/1000/minute t=40s"},
		{name: "check after the charge over", descs: descs(desc("model=m", "hits=0")), want: "OVER_LIMIT; OVER 0/1000/minute t=40s"},
		{name: "check again", descs: descs(desc("model=m", "hits=0")), want: "OVER_LIMIT; OVER 0/1000/minute t=40s"},
		{name: "next window", advance: time.Minute, descs: descs(desc("model=m", "hits=0")), want: "OK; OK 1000/1000/minute t=40s"},
	})
}

// markFailingLimiter fails every request of an over mark.
type markFailingLimiter struct{ sluice.Limiter }

func (f markFailingLimiter) CheckMany(ctx context.Context, reqs []limiter.Request, opts ...sluice.CheckOption) []sluice.Result {
	out := f.Limiter.CheckMany(ctx, reqs, opts...)
	for i := range reqs {
		if strings.HasSuffix(reqs[i].Key, "|over") {
			out[i] = sluice.Result{Err: errors.New("the mark's owner is away")}
		}
	}
	return out
}

// The over mark is best effort: when it cannot be charged or read, a
// request over is still OVER_LIMIT (not a failure), and a check of 0 is
// decided on the window alone, full: OK with none left.
func TestAttackOverMarkUnreachable(t *testing.T) {
	e := newEnv(t, []string{"domain: ai\ndescriptors:\n  - key: model\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"},
		func(c *Config) { c.Limiter = markFailingLimiter{c.Limiter} })
	e.run("ai", []step{
		{name: "charge 8", descs: descs(desc("model=m", "hits=8")), want: "OK; OK 2/10/minute t=40s"},
		{name: "check", descs: descs(desc("model=m", "hits=0")), want: "OK; OK 2/10/minute t=40s"},
		{name: "charge 5, over", descs: descs(desc("model=m", "hits=5")), want: "OVER_LIMIT; OVER 0/10/minute t=40s"},
		{name: "check, the mark unread", descs: descs(desc("model=m", "hits=0")), want: "OK; OK 0/10/minute t=40s"},
	})
}

// A descriptor's hits_addend is a uint64 of Envoy's choosing: near its
// maximum, the count before plus the hits must not wrap around to a
// figure under the limit. Such a request is over (it never fits) and
// leaves the window full and past the limit, whatever the window held
// before, and its statistics count every hit over or between the
// threshold and the limit, none within.
func TestAttackHitsAddendOverflow(t *testing.T) {
	const max = "18446744073709551615"
	const m = "/10/minute t=40s"
	for _, stop := range []bool{false, true} {
		e := newEnv(t, []string{hitsConfig}, func(c *Config) { c.StopIncrementOverLimit = stop })
		e.run("hits", []step{
			{name: "the maximum on an empty window", descs: descs(desc("user=a", "hits="+max)), want: "OVER_LIMIT; OVER 0" + m},
			{name: "5 hits", descs: descs(desc("user=b", "hits=5")), want: "OK; OK 5" + m},
			{name: "the maximum after 5", descs: descs(desc("user=b", "hits="+max)), want: "OVER_LIMIT; OVER 0" + m},
			{name: "the window is past the limit", descs: descs(desc("user=b", "hits=0")), want: "OVER_LIMIT; OVER 0" + m},
			{name: "the maximum less 4 after 5", descs: descs(desc("user=c", "hits=5"), desc("user=d", "hits=5")), want: "OK; OK 5" + m + "; OK 5" + m},
			{name: "", descs: descs(desc("user=c", "hits=18446744073709551611"), desc("user=d", "hits=1")), want: ""},
			{name: "c is past the limit", descs: descs(desc("user=c", "hits=0")), want: "OVER_LIMIT; OVER 0" + m},
		})
		hits := e.takeHits()
		wantOver := Hit{Domain: "hits", Key: "hits.user", TotalHits: 1<<64 - 1, OverLimit: 1<<64 - 1 - 10 + 5, NearLimit: 2}
		if hits[2] != wantOver {
			t.Errorf("stop %v: hit of the maximum after 5: %+v, want %+v", stop, hits[2], wantOver)
		}
		resp := e.call("hits", 0, desc("user=d", "hits=0"))
		want := "OK; OK 4" + m // d charged beside c over
		if stop {
			want = "OK; OK 5" + m
		}
		if got := summary(resp); got != want {
			t.Errorf("stop %v: d after c's maximum: %s, want %s", stop, got, want)
		}
	}
}

// Shadow mode under every combination of the settings that change what
// an over descriptor does (StopIncrementOverLimit, global ShadowMode,
// global QuotaMode), with the response headers on: a shadow_mode
// descriptor over is OK with none left, never makes a request over nor
// counts as a failed quota, yet stops the others' charges with
// StopIncrementOverLimit as upstream's Redis cache does (it reads the
// counter before the status turns OK); a quota_mode descriptor over is
// OVER_LIMIT but makes the request over only when every quota is;
// global shadow mode turns an over request OK, and only those are
// reported; the headers carry the first least remaining unless an
// enforced descriptor is over. Checks of 0 after the window went past
// the limit answer alike.
func TestAttackShadowModeEverySetting(t *testing.T) {
	const config = `domain: sq
descriptors:
  - {key: s, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: q, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: u, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: z, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 0}}
`
	const s, q, u, z = "/2/minute t=40s", "/3/minute t=40s", "/10/minute t=40s", "/0/minute t=40s"
	headers := func(limit int, remaining int) string {
		return fmt.Sprintf("; X-RateLimit-Limit: %d; X-RateLimit-Remaining: %d; X-RateLimit-Reset: 40", limit, remaining)
	}
	for _, stop := range []bool{false, true} {
		for _, gShadow := range []bool{false, true} {
			for _, gQuota := range []bool{false, true} {
				name := fmt.Sprintf("stop=%v,shadow=%v,quota=%v", stop, gShadow, gQuota)
				var shadowed int
				e := newEnv(t, []string{config}, func(c *Config) {
					c.StopIncrementOverLimit, c.ShadowMode, c.QuotaMode = stop, gShadow, gQuota
					c.Headers = XRateLimitHeaders()
					c.OnGlobalShadow = func(string) { shadowed++ }
				})
				// u's remaining after the steps that charge it beside a
				// descriptor over: uncharged with stop.
				u1, u2 := "OK 9"+u, "OK 8"+u
				if stop {
					u1, u2 = "OK 10"+u, "OK 10"+u
				}
				// q over alone among the quotas makes the request over
				// without global quota mode (then u and s are quotas too,
				// and not over).
				overall, turned := "OVER_LIMIT", 0
				if gQuota {
					overall = "OK"
				} else if gShadow {
					overall, turned = "OK", 2
				}
				e.run("sq", []step{
					{name: name + ": s over in shadow mode", descs: descs(desc("s=1", "hits=3"), desc("u=1")), want: "OK; OK 0" + s + "; " + u1 + headers(2, 0)},
					{name: name + ": q over", descs: descs(desc("q=1", "hits=4"), desc("u=1")), want: overall + "; OVER 0" + q + "; " + u2 + headers(3, 0)},
					{name: name + ": checks of 0", descs: descs(desc("s=1", "hits=0"), desc("q=1", "hits=0"), desc("u=1", "hits=0")),
						want: overall + "; OK 0" + s + "; OVER 0" + q + "; " + u2 + headers(2, 0)},
					{name: name + ": a limit of 0 in shadow mode", descs: descs(desc("z=1"), desc("u=2")), want: "OK; OK 0" + z + "; " + map[bool]string{false: "OK 9", true: "OK 10"}[stop] + u + headers(0, 0)},
				})
				if shadowed != turned {
					t.Errorf("%s: %d requests turned OK by global shadow mode, want %d", name, shadowed, turned)
				}
				hits := e.takeHits()
				if want := (Hit{Domain: "sq", Key: "sq.s", TotalHits: 3, OverLimit: 1, NearLimit: 1, ShadowMode: 1}); hits[0] != want {
					t.Errorf("%s: hit of s over: %+v, want %+v", name, hits[0], want)
				}
			}
		}
	}
}
