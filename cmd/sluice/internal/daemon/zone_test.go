package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// zoneCase is a Location of a calendar window that every entry point must
// refuse, because another node could not load it as the same zone.
type zoneCase struct {
	name string
	loc  *time.Location
	// wire is its name in the JSON, gRPC and YAML forms; "" when it has
	// none (the paths that take a name are then skipped: "" means UTC
	// there).
	wire string
	// inText is what every refusal's text must contain.
	inText string
}

var zoneCases = []zoneCase{
	{name: "Local", loc: time.Local, wire: "Local", inText: `"Local"`},
	{name: "unnamed fixed zone", loc: time.FixedZone("", 3600), inText: "no name"},
	{name: "fixed zone under a name no node loads", loc: time.FixedZone("UTC+1", 3600), wire: "UTC+1", inText: `"UTC+1"`},
	// On the wire the name is the zone every node loads.
	{name: "fixed zone under a real zone's name", loc: time.FixedZone("Europe/Paris", 3600), inText: `"Europe/Paris"`},
}

// zoneRequest is a daily fixed window in loc.
func zoneRequest(key string, loc *time.Location) limiter.Request {
	return limiter.Request{Name: "zone", Key: key, Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: loc}
}

// A fixed-window calendar request in a zone other nodes could not load
// (time.Local above all, "Local" on the wire) is refused by every entry
// point, naming the zone, with an error wrapping limiter.ErrInvalidLocation
// where the entry point returns a Go error: the store, sluice.Local, a
// cluster node for a key it owns and for one another node owns (checks
// and leases), the daemon's client, the daemon's HTTP and gRPC APIs, the
// rules loader and rules built in code, which is how httplimit would be
// given one.
//
// A zone built with time.FixedZone under a name that does not load
// ("UTC+1") is refused too: Validate loads the name (once per name). So
// is one under a name that loads ("Europe/Paris") whose offsets are not
// that zone's: the nodes it reaches by name would read other windows.
func TestZoneRefusedOnEveryPath(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	local := sluice.NewLocal(store, func() time.Time { return now })
	c := testcluster.New(t, 3)
	node := c.Node(0)
	own, other := zoneKey(t, c, node, true), zoneKey(t, c, node, false)

	d := start(t, testConfig("zone"))
	cl, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rpc := pb.NewSluiceClient(conn)
	base := "http://" + d.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The entry points that return a Go error.
	goPaths := []struct {
		name   string
		refuse func(loc *time.Location) error
	}{
		{"limiter.Store.CheckAt", func(loc *time.Location) error {
			_, err := store.CheckAt(zoneRequest("k", loc), now)
			return err
		}},
		{"limiter.Store.TakeAt", func(loc *time.Location) error {
			_, _, err := store.TakeAt(zoneRequest("k", loc), 1, now)
			return err
		}},
		{"sluice.Local.Check", func(loc *time.Location) error {
			_, err := local.Check(ctx, zoneRequest("k", loc))
			return err
		}},
		{"sluice.Local.CheckMany", func(loc *time.Location) error {
			return local.CheckMany(ctx, []limiter.Request{zoneRequest("k", loc)})[0].Err
		}},
		{"cluster.Node.Check, own key", func(loc *time.Location) error {
			_, err := node.Check(ctx, zoneRequest(own, loc))
			return err
		}},
		{"cluster.Node.Check, other's key", func(loc *time.Location) error {
			_, err := node.Check(ctx, zoneRequest(other, loc))
			return err
		}},
		{"cluster.Node.CheckMany, own key", func(loc *time.Location) error {
			return node.CheckMany(ctx, []limiter.Request{zoneRequest(own, loc)})[0].Err
		}},
		{"cluster.Node.CheckMany, other's key", func(loc *time.Location) error {
			return node.CheckMany(ctx, []limiter.Request{zoneRequest(other, loc)})[0].Err
		}},
		{"cluster.Node.Lease, own key", func(loc *time.Location) error {
			_, err := node.Lease(ctx, "node-1", zoneRequest(own, loc), 1, time.Second)
			return err
		}},
		{"client.Client.Check", func(loc *time.Location) error {
			_, err := cl.Check(ctx, zoneRequest("k", loc))
			return err
		}},
		{"client.Client.CheckMany", func(loc *time.Location) error {
			return cl.CheckMany(ctx, []limiter.Request{zoneRequest("k", loc)})[0].Err
		}},
		{"rules.NewSet", func(loc *time.Location) error {
			_, err := rules.NewSet(zoneRule(loc))
			var rerr *rules.Error
			if err != nil && (!errors.As(err, &rerr) || rerr.Field != "rules[0].zone" || !errors.Is(err, rules.ErrInvalidCalendar)) {
				return fmt.Errorf("does not name rules[0].zone with rules.ErrInvalidCalendar: %w", err)
			}
			return err
		}},
	}
	// The entry points that take the zone by name.
	wirePaths := []struct {
		name   string
		refuse func(t *testing.T, zone string) string // the refusal's text, "" if admitted
	}{
		{"daemon HTTP /v1/check", func(t *testing.T, zone string) string {
			r := do(t, http.MethodPost, base+"/v1/check", zoneJSON(zone))
			var p problem
			if err := json.Unmarshal(r.body, &p); r.status == http.StatusOK || err != nil {
				return ""
			}
			if r.status != http.StatusBadRequest || p.Field != "time_zone" || p.Code != "invalid_calendar" || !strings.Contains(p.Detail, "time_zone") {
				t.Errorf("%d %s, want 400 naming time_zone with invalid_calendar", r.status, r.body)
			}
			return p.Detail
		}},
		{"daemon HTTP /v1/check/batch", func(t *testing.T, zone string) string {
			r := do(t, http.MethodPost, base+"/v1/check/batch", `{"requests":[`+zoneJSON(zone)+`]}`)
			var out struct {
				Responses []struct {
					Error *itemError `json:"error"`
				} `json:"responses"`
			}
			if err := json.Unmarshal(r.body, &out); r.status != http.StatusOK || err != nil || len(out.Responses) != 1 {
				t.Fatalf("batch: %d %s", r.status, r.body)
			}
			e := out.Responses[0].Error
			if e == nil {
				return ""
			}
			if e.Field != "time_zone" || e.Code != "invalid_calendar" {
				t.Errorf("item error %+v, want time_zone and invalid_calendar", e)
			}
			return e.Message
		}},
		{"daemon gRPC Check", func(t *testing.T, zone string) string {
			resp, err := rpc.Check(ctx, &pb.CheckRequest{Request: zoneProto(zone)})
			if err != nil {
				t.Fatalf("Check failed as a whole: %v", err)
			}
			return grpcItemRefusal(t, resp.GetResponse())
		}},
		{"daemon gRPC CheckBatch", func(t *testing.T, zone string) string {
			resp, err := rpc.CheckBatch(ctx, &pb.BatchCheckRequest{Requests: []*pb.RateLimitRequest{zoneProto(zone)}})
			if err != nil || len(resp.GetResponses()) != 1 {
				t.Fatalf("CheckBatch: %v %v", resp, err)
			}
			return grpcItemRefusal(t, resp.GetResponses()[0])
		}},
		{"rules.Parse", func(t *testing.T, zone string) string {
			_, err := rules.Parse("zones.yaml", []byte(zoneYAML(zone)))
			if err == nil {
				return ""
			}
			var rerr *rules.Error
			if !errors.As(err, &rerr) || rerr.File != "zones.yaml" || rerr.Line != 7 || rerr.Field != "rules[0].zone" ||
				!errors.Is(err, rules.ErrInvalidCalendar) || !errors.Is(err, limiter.ErrInvalidLocation) ||
				!strings.Contains(err.Error(), "zones.yaml:7:") || !strings.Contains(err.Error(), "zone") {
				t.Errorf("%v, want zones.yaml line 7, rules[0].zone, wrapping rules.ErrInvalidCalendar and limiter.ErrInvalidLocation", err)
			}
			return err.Error()
		}},
	}

	for _, zc := range zoneCases {
		t.Run(zc.name, func(t *testing.T) {
			for _, p := range goPaths {
				t.Run(p.name, func(t *testing.T) {
					err := p.refuse(zc.loc)
					ok := err != nil && errors.Is(err, limiter.ErrInvalidLocation) && strings.Contains(err.Error(), zc.inText)
					if !ok {
						t.Errorf("got %v, want an error naming %s that wraps limiter.ErrInvalidLocation", err, zc.inText)
					}
				})
			}
			if zc.wire == "" {
				return
			}
			for _, p := range wirePaths {
				t.Run(p.name, func(t *testing.T) {
					text := p.refuse(t, zc.wire)
					if text == "" || !strings.Contains(text, zc.inText) {
						t.Errorf("refusal %q, want one naming %s", text, zc.inText)
					}
				})
			}
		})
	}

	// httplimit takes its rules from a rules.Provider, whose *Set only
	// NewSet and Parse build, and both refuse the zone (above). A Rule
	// built by hand and used directly does not apply to any request.
	r := zoneRule(time.Local)
	if req, ok := r.Request(&rules.Descriptor{Route: "/"}, 1); ok {
		t.Errorf("a hand-built rule in time.Local gives the request %+v", req)
	}
	if _, err := rules.NewStatic(r); !errors.Is(err, limiter.ErrInvalidLocation) {
		t.Errorf("rules.NewStatic = %v, want limiter.ErrInvalidLocation", err)
	}
	if err := rules.NewSource(nil).Update(r); !errors.Is(err, limiter.ErrInvalidLocation) {
		t.Errorf("rules.Source.Update = %v, want limiter.ErrInvalidLocation", err)
	}
}

// zoneKey returns a key of the "zone" limit that node owns, or that
// another node of c owns.
func zoneKey(t *testing.T, c *testcluster.Cluster, node *cluster.Node, owned bool) string {
	t.Helper()
	for i := range 1000 {
		k := fmt.Sprintf("k%d", i)
		if (c.Owner("zone", k) == node) == owned {
			return k
		}
	}
	t.Fatalf("no key with owned %v", owned)
	return ""
}

// zoneRule is a rule of a daily window in loc.
func zoneRule(loc *time.Location) rules.Rule {
	return rules.Rule{Name: "daily", Algorithm: limiter.FixedWindow, Limit: 5, Calendar: limiter.Day, Location: loc}
}

// zoneJSON is zoneRequest in the HTTP API's JSON, in the zone named zone.
func zoneJSON(zone string) string {
	return fmt.Sprintf(`{"name":"zone","key":"k","limit":5,"algorithm":"fixed_window","calendar":"day","time_zone":%q}`, zone)
}

// zoneProto is zoneRequest in wire form, in the zone named zone.
func zoneProto(zone string) *pb.RateLimitRequest {
	m := transport.RequestToProto(zoneRequest("k", nil))
	m.TimeZone = zone
	return m
}

// zoneYAML is a rule file whose one rule is in the zone named zone, on
// line 7.
func zoneYAML(zone string) string {
	return `rules:
  - name: daily
    key: [ip]
    algorithm: fixed_window
    limit: 5
    calendar: day
    zone: ` + zone + "\n"
}

// grpcItemRefusal returns the text of m's error, "" when it carries a
// decision, and checks that its code is INVALID_CALENDAR.
func grpcItemRefusal(t *testing.T, m *pb.RateLimitResponse) string {
	t.Helper()
	if m.GetErrorCode() == pb.ErrorCode_ERROR_CODE_NONE {
		return ""
	}
	if m.GetErrorCode() != pb.ErrorCode_ERROR_CODE_INVALID_CALENDAR {
		t.Errorf("error code %v (%s), want INVALID_CALENDAR", m.GetErrorCode(), m.GetErrorMessage())
	}
	return m.GetErrorMessage()
}
