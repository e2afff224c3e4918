package rules

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

const matchRules = `rules:
  - name: any
    algorithm: gcra
    limit: 10
    period: 1s
  - name: api
    match: {routes: ["/api/*"]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: health_or_root
    match: {routes: [/health, /]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: writes
    match: {methods: [post, PUT]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: acme
    match: {headers: {x-tenant: acme}}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: debug_present
    match: {headers: {X-Debug: "*"}}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: private_nets
    match: {ips: ["10.0.0.0/8", "2001:db8::/32", 192.0.2.7]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: alice
    match: {users: [alice]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: signed_in
    match: {users: ["*"]}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: free_plan
    match: {descriptors: {plan: free}}
    algorithm: gcra
    limit: 10
    period: 1s
  - name: all_of
    match: {routes: ["/api/*"], methods: [GET], users: [bob], descriptors: {org: "*"}}
    algorithm: gcra
    limit: 10
    period: 1s
`

func TestMatch(t *testing.T) {
	s, err := Parse("match.yaml", []byte(matchRules))
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(kv ...string) HeaderLookup {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return HTTPHeader(h)
	}
	tests := []struct {
		name string
		d    Descriptor
		want string // matched rule names, comma-separated
	}{
		{"nothing", Descriptor{}, "any"},
		{"api prefix", Descriptor{Route: "/api/items"}, "any,api"},
		{"api prefix itself", Descriptor{Route: "/api/"}, "any,api"},
		{"no trailing slash is not under /api/", Descriptor{Route: "/api"}, "any"},
		{"exact route", Descriptor{Route: "/health"}, "any,health_or_root"},
		{"exact route only", Descriptor{Route: "/health/x"}, "any"},
		{"method, any case", Descriptor{Method: "post"}, "any,writes"},
		{"other method", Descriptor{Method: "GET"}, "any"},
		{"header value", Descriptor{Header: hdr("X-Tenant", "acme")}, "any,acme"},
		{"header other value", Descriptor{Header: hdr("X-Tenant", "other")}, "any"},
		{"header present", Descriptor{Header: hdr("x-debug", "")}, "any,debug_present"},
		{"ipv4 in cidr", Descriptor{IP: netip.MustParseAddr("10.1.2.3")}, "any,private_nets"},
		{"ipv4-mapped ipv6 in cidr", Descriptor{IP: netip.MustParseAddr("::ffff:10.1.2.3")}, "any,private_nets"},
		{"ipv6 in cidr", Descriptor{IP: netip.MustParseAddr("2001:db8::1")}, "any,private_nets"},
		{"single address", Descriptor{IP: netip.MustParseAddr("192.0.2.7")}, "any,private_nets"},
		{"next address", Descriptor{IP: netip.MustParseAddr("192.0.2.8")}, "any"},
		{"user", Descriptor{User: "alice"}, "any,alice,signed_in"},
		{"other user", Descriptor{User: "carol"}, "any,signed_in"},
		{"descriptor", Descriptor{Values: map[string]string{"plan": "free"}}, "any,free_plan"},
		{"other descriptor value", Descriptor{Values: map[string]string{"plan": "pro"}}, "any"},
		{"all conditions", Descriptor{Route: "/api/x", Method: "GET", User: "bob", Values: map[string]string{"org": "o"}}, "any,api,signed_in,all_of"},
		{"all but one condition", Descriptor{Route: "/api/x", Method: "GET", User: "bob"}, "any,api,signed_in"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var names []string
			for _, r := range s.Match(&tt.d) {
				names = append(names, r.Name)
			}
			if got := strings.Join(names, ","); got != tt.want {
				t.Errorf("matched %s, want %s", got, tt.want)
			}
		})
	}
}

func TestAppendMatchDoesNotAllocate(t *testing.T) {
	s, err := Parse("match.yaml", []byte(matchRules))
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{Route: "/api/x", Method: "GET", User: "bob", IP: netip.MustParseAddr("10.0.0.1"),
		Header: HTTPHeader(http.Header{"X-Tenant": {"acme"}}), Values: map[string]string{"org": "o", "plan": "free"}}
	buf := make([]*Rule, 0, 16)
	if n := testing.AllocsPerRun(100, func() { buf = s.AppendMatch(buf[:0], d) }); n != 0 {
		t.Errorf("AppendMatch allocates %v times", n)
	}
	if len(buf) != 7 { // any, api, acme, private_nets, signed_in, free_plan, all_of
		t.Errorf("matched %d rules", len(buf))
	}
}

func TestRequest(t *testing.T) {
	set, err := NewSet(
		Rule{Name: "global", Algorithm: limiter.TokenBucket, Limit: 10, Period: time.Second, Burst: 20},
		Rule{Name: "per_user", Key: []string{"user"}, Algorithm: limiter.GCRA, Limit: 5, Period: time.Minute},
		Rule{Name: "multi", Key: []string{"ip", "method", "route", "header:x-tenant", "descriptor:plan"}, Algorithm: limiter.FixedWindow, Limit: 3, Calendar: limiter.Day},
	)
	if err != nil {
		t.Fatal(err)
	}
	d := &Descriptor{
		Route: "/a|b", Method: "GET", IP: netip.MustParseAddr("::ffff:10.0.0.1"),
		Header: HTTPHeader(http.Header{"X-Tenant": {"100%"}}), Values: map[string]string{"plan": "free"},
	}
	tests := []struct {
		rule    string
		d       *Descriptor
		wantKey string
		wantOK  bool
	}{
		{"global", d, "*", true},
		{"per_user", d, "", false},
		{"per_user", &Descriptor{User: "alice"}, "user=alice", true},
		{"multi", d, "ip=10.0.0.1|method=GET|route=/a%7Cb|header:X-Tenant=100%25|descriptor:plan=free", true},
		{"multi", &Descriptor{Route: "/", Method: "GET", IP: netip.MustParseAddr("10.0.0.1")}, "", false},
	}
	for _, tt := range tests {
		r, _ := set.Rule(tt.rule)
		req, ok := r.Request(tt.d, 2)
		if ok != tt.wantOK || req.Key != tt.wantKey {
			t.Errorf("%s: key %q, %v; want %q, %v", tt.rule, req.Key, ok, tt.wantKey, tt.wantOK)
			continue
		}
		if !ok {
			continue
		}
		if req.Name != r.Name || req.Hits != 2 || req.Limit != r.Limit || req.Algorithm != r.Algorithm || req.Burst != r.Burst || req.Calendar != r.Calendar {
			t.Errorf("%s: request %+v", tt.rule, req)
		}
		if err := req.Validate(); err != nil {
			t.Errorf("%s: %v", tt.rule, err)
		}
	}
	// Values that would collide without escaping do not.
	r, _ := set.Rule("multi")
	a, _ := r.Request(&Descriptor{Route: "x|method=y", Method: "z", IP: d.IP, Header: d.Header, Values: d.Values}, 1)
	b, _ := r.Request(&Descriptor{Route: "x", Method: "y|method=z", IP: d.IP, Header: d.Header, Values: d.Values}, 1)
	if a.Key == b.Key {
		t.Errorf("distinct descriptors share key %q", a.Key)
	}
	// A key over the limiter's bound becomes a hash that is still valid.
	long, ok := r.Request(&Descriptor{Route: strings.Repeat("r", 2000), Method: "GET", IP: d.IP, Header: d.Header, Values: d.Values}, 1)
	if !ok || !strings.HasPrefix(long.Key, "sha256:") || long.Validate() != nil {
		t.Errorf("long key: %q, %v", long.Key, long.Validate())
	}
	// A Rule built by hand, not from a Set, still builds requests.
	hand := Rule{Name: "hand", Key: []string{"user"}, Algorithm: limiter.GCRA, Limit: 1, Period: time.Second}
	if req, ok := hand.Request(&Descriptor{User: "u"}, 1); !ok || req.Key != "user=u" {
		t.Errorf("hand-built rule: %+v, %v", req, ok)
	}
	if names := setNames(set); !slices.Equal(names, []string{"global", "per_user", "multi"}) {
		t.Errorf("Rules() = %v", names)
	}
}

func setNames(s *Set) []string {
	var out []string
	for _, r := range s.Rules() {
		out = append(out, r.Name)
	}
	return out
}

func TestNilSet(t *testing.T) {
	var s *Set
	if s.Len() != 0 || s.Match(&Descriptor{}) != nil || s.Rules() != nil || s.Origin() != "" {
		t.Fatal("nil set is not empty")
	}
	if _, ok := s.Rule("x"); ok {
		t.Fatal("nil set has a rule")
	}
}
