package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// inspectURL is the inspect URL of (name, key) on d, with the extra query.
func inspectURL(d *Daemon, name, key, extra string) string {
	u := "http://" + d.HTTPAddr() + "/v1/admin/keys?name=" + url.QueryEscape(name) + "&key=" + url.QueryEscape(key)
	if extra != "" {
		u += "&" + extra
	}
	return u
}

// inspectHTTP inspects (name, key) on d and fails the test unless it is
// answered 200.
func inspectHTTP(t *testing.T, d *Daemon, name, key, extra string) Inspection {
	t.Helper()
	resp := do(t, "GET", inspectURL(d, name, key, extra), "")
	if resp.status != http.StatusOK {
		t.Fatalf("inspect %s/%s: %d %s", name, key, resp.status, resp.body)
	}
	var out Inspection
	if err := json.Unmarshal(resp.body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAdminInspectAndReset runs 3 daemons with 2 replicas. A key consumed
// through a daemon that neither owns nor copies it is inspected from there
// as its owner holds it (owner and replica named, 7 hits, the same twice,
// a peek's decision when the limit is given), then reset from there: the
// owner holds nothing, the replica drops its copy, and once the owner
// stops hard the replica, the key's owner now, decides it as fresh.
func TestAdminInspectAndReset(t *testing.T) {
	var ds []*Daemon
	for i := range 3 {
		cfg := testConfig(fmt.Sprintf("admin-%d", i))
		cfg.Replicas = 2
		cfg.ReplicateInterval = 20 * time.Millisecond
		if i > 0 {
			cfg.Join = []string{ds[0].GossipAddr()}
		}
		ds = append(ds, start(t, cfg))
	}
	testwait.For(t, "3 members everywhere", func() bool {
		for _, d := range ds {
			if !d.Node().Ready() || len(d.Node().RingMembers()) != 3 || len(d.Node().Unconfirmed()) != 0 {
				return false
			}
		}
		return true
	})
	owner := ds[2]
	key, err := testcluster.FailoverKey(owner.Node(), "api", cluster.DefaultConfig().Ring)
	if err != nil {
		t.Fatal(err)
	}
	ms := owner.Node().Replicas("api", key)
	var replica, asker *Daemon
	for _, d := range ds[:2] {
		if d.Node().Name() == ms[1].Name {
			replica = d
		} else {
			asker = d
		}
	}

	check := `{"name":"api","key":"` + key + `","limit":10,"period":"1h","algorithm":"fixed_window","hits":7}`
	if resp := do(t, "POST", "http://"+asker.HTTPAddr()+"/v1/check", check); resp.status != http.StatusOK {
		t.Fatalf("check: %d %s", resp.status, resp.body)
	}
	ins := inspectHTTP(t, asker, "api", key, "")
	if ins.Owner != owner.Node().Name() || ins.WithoutOwner || !reflect.DeepEqual(ins.Replicas, []string{replica.Node().Name()}) ||
		ins.State == nil || ins.State.Algorithm != "fixed_window" || ins.State.WindowHits == nil || *ins.State.WindowHits != 7 ||
		ins.State.WindowStart == "" || ins.State.ExpireAt == "" || ins.Decision != nil {
		t.Fatalf("inspect: %+v (state %+v); want 7 hits on %s, replica %s", ins, ins.State, owner.Node().Name(), replica.Node().Name())
	}
	peeked := inspectHTTP(t, asker, "api", key, "algorithm=fixed_window&limit=10&period=1h")
	if d := peeked.Decision; d == nil || !d.Allowed || d.Remaining != 3 || d.Owner != owner.Node().Name() {
		t.Fatalf("inspect with a peek: decision %+v, want 3 remaining", d)
	}
	if again := inspectHTTP(t, asker, "api", key, ""); !reflect.DeepEqual(again.State, ins.State) {
		t.Fatalf("inspecting again: %+v, want the state unchanged: %+v", again.State, ins.State)
	}
	testwait.For(t, "the replica's copy", func() bool {
		s, ok := replica.Node().Store().Snapshot("api", key, time.Now())
		return ok && s.View().WindowHits == 7
	})

	resp := do(t, "POST", "http://"+asker.HTTPAddr()+"/v1/admin/keys/reset", `{"name":"api","key":"`+key+`"}`)
	var reset ResetResponse
	if resp.status != http.StatusOK || json.Unmarshal(resp.body, &reset) != nil || reset.Owner != owner.Node().Name() {
		t.Fatalf("reset: %d %s", resp.status, resp.body)
	}
	if ins := inspectHTTP(t, asker, "api", key, ""); ins.State != nil || ins.Owner != owner.Node().Name() {
		t.Fatalf("inspect after the reset: %+v, want no state on %s", ins, owner.Node().Name())
	}
	testwait.For(t, "the replica to drop its copy", func() bool {
		_, ok := replica.Node().Store().Snapshot("api", key, time.Now())
		return !ok
	})

	owner.Node().Close() // hard: no hand-off, no leave
	testwait.For(t, "the replica to own the key", func() bool {
		o, _ := asker.Node().Owner("api", key)
		r, _ := replica.Node().Owner("api", key)
		return o.Name == replica.Node().Name() && r.Name == o.Name
	})
	peek := strings.Replace(check, `"hits":7`, `"hits":0`, 1)
	var dec Decision
	resp = do(t, "POST", "http://"+asker.HTTPAddr()+"/v1/check", peek)
	if resp.status != http.StatusOK || json.Unmarshal(resp.body, &dec) != nil || dec.Remaining != 10 || dec.Owner != replica.Node().Name() {
		t.Fatalf("peek on the new owner: %d %s; want 10 remaining on %s", resp.status, resp.body, replica.Node().Name())
	}
}

// Invalid input is refused with 400 and the field at fault; a reset under
// deny is refused with 403, while inspecting is not restricted.
func TestAdminRefusals(t *testing.T) {
	cfg := testConfig("admin-refusals")
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	long := strings.Repeat("n", limiter.MaxNameLen+1)
	for _, tt := range []struct {
		method, url, body string
		status            int
		field             string
	}{
		{"GET", base + "/v1/admin/keys?name=api", "", 400, "key"},
		{"GET", base + "/v1/admin/keys?key=k", "", 400, "name"},
		{"GET", inspectURL(d, long, "k", ""), "", 400, "name"},
		{"GET", inspectURL(d, "api", "k", "owner=me"), "", 400, "owner"},
		{"GET", inspectURL(d, "api", "k", "key=again"), "", 400, "key"},
		{"GET", inspectURL(d, "api", "k", "limit=ten&algorithm=gcra&period=1s"), "", 400, "limit"},
		{"GET", inspectURL(d, "api", "k", "limit=10&algorithm=gcra&period=soon"), "", 400, "period"},
		{"GET", inspectURL(d, "api", "k", "limit=10&algorithm=cubic&period=1s"), "", 400, "algorithm"},
		{"GET", inspectURL(d, "api", "k", "limit=10&algorithm=gcra"), "", 400, "period"},
		{"GET", inspectURL(d, "api", "k", ""), "", 200, ""},
		{"POST", base + "/v1/admin/keys/reset", `{"name":"api"}`, 400, "key"},
		{"POST", base + "/v1/admin/keys/reset", `{"name":"api","key":"k","hits":1}`, 400, "hits"},
		{"POST", base + "/v1/admin/keys/reset", `{"name":"api","key":"k"}`, 403, ""},
	} {
		resp := do(t, tt.method, tt.url, tt.body)
		var p problem
		json.Unmarshal(resp.body, &p)
		if resp.status != tt.status || p.Field != tt.field {
			t.Errorf("%s %s %s: %d %s, want %d naming field %q", tt.method, tt.url, tt.body, resp.status, resp.body, tt.status, tt.field)
		}
		if tt.status == 403 && !strings.Contains(p.Detail, "destructive_behaviors") {
			t.Errorf("the refusal %q does not name destructive_behaviors", p.Detail)
		}
	}
}
