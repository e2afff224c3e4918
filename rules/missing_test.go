package rules

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// A rule keyed on a part the request lacks (an anonymous request under a
// rule keyed on user) skips it, denies it or counts it on a counter of its
// own, as the rule's missing setting says; present values never share that
// counter.
func TestEnforceMissingKeyPart(t *testing.T) {
	const file = `
rules:
  - {name: skip_user, key: [user], algorithm: fixed_window, limit: 2, period: 1m}
  - {name: deny_user, key: [user], algorithm: fixed_window, limit: 2, period: 1m, missing: deny}
  - {name: shared_user, key: [user], algorithm: fixed_window, limit: 2, period: 1m, missing: shared}
  - {name: shared_user_ip, key: [user, ip], algorithm: fixed_window, limit: 1, period: 1m, missing: shared}
  - {name: shared_header, key: ["header:X-Api-Key"], algorithm: fixed_window, limit: 1, period: 1m, missing: shared}
`
	type req struct {
		user   string
		ip     string
		header map[string]string
	}
	type reqStep struct {
		req
		wantAllowed bool
		wantLimits  int // limits that applied
		wantMissing bool
	}
	anon, alice := req{}, req{user: "alice"}
	for _, tc := range []struct {
		rule  string
		steps []reqStep
	}{
		{"skip_user", []reqStep{
			{anon, true, 0, false}, {anon, true, 0, false}, {anon, true, 0, false},
			{alice, true, 1, false}, {alice, true, 1, false}, {alice, false, 1, false},
		}},
		{"deny_user", []reqStep{
			{anon, false, 1, true}, {anon, false, 1, true},
			// The denials counted nothing: alice has her two.
			{alice, true, 1, false}, {alice, true, 1, false}, {alice, false, 1, false},
		}},
		{"shared_user", []reqStep{
			{anon, true, 1, false}, {anon, true, 1, false}, {anon, false, 1, false},
			// alice is not on the anonymous counter, nor is a user named
			// after the key part.
			{alice, true, 1, false}, {req{user: "user"}, true, 1, false}, {req{user: "user"}, true, 1, false},
		}},
		{"shared_user_ip", []reqStep{
			{req{ip: "192.0.2.1"}, true, 1, false}, {req{ip: "192.0.2.1"}, false, 1, false},
			{req{ip: "192.0.2.2"}, true, 1, false},            // one counter per address for anonymous requests
			{req{}, true, 1, false}, {req{}, false, 1, false}, // neither part
			{req{user: "alice", ip: "192.0.2.1"}, true, 1, false},
		}},
		{"shared_header", []reqStep{
			{req{}, true, 1, false}, {req{}, false, 1, false},
			// Present and empty is a value of its own, not the absent one.
			{req{header: map[string]string{"X-Api-Key": ""}}, true, 1, false},
			{req{header: map[string]string{"X-Api-Key": "k"}}, true, 1, false},
		}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			clk := newFakeClock()
			n := newNode(t, clk)
			all, err := Parse("missing.yaml", []byte(file))
			if err != nil {
				t.Fatal(err)
			}
			r, _ := all.Rule(tc.rule)
			s, err := NewSet(*r)
			if err != nil {
				t.Fatal(err)
			}
			e := &Enforcer{Limiter: n}
			for i, st := range tc.steps {
				d := &Descriptor{User: st.user}
				if st.ip != "" {
					d.IP = netip.MustParseAddr(st.ip)
				}
				if st.header != nil {
					h := http.Header{}
					for k, v := range st.header {
						h.Set(k, v)
					}
					d.Header = HTTPHeader(h)
				}
				v := e.Enforce(context.Background(), s, d, 1)
				if v.Err != nil {
					t.Fatalf("step %d: %v", i, v.Err)
				}
				missing := len(v.Limits) > 0 && v.Limits[0].MissingKey
				if v.Allowed != st.wantAllowed || len(v.Limits) != st.wantLimits || missing != st.wantMissing {
					t.Fatalf("step %d %+v: allowed %v, %d limits, missing %v; want %v, %d, %v",
						i, st.req, v.Allowed, len(v.Limits), missing, st.wantAllowed, st.wantLimits, st.wantMissing)
				}
			}
		})
	}
}

func TestMissingSetting(t *testing.T) {
	for _, tc := range []struct {
		yaml    string
		want    Missing
		wantErr string
	}{
		{"", MissingSkip, ""},
		{"missing: skip", MissingSkip, ""},
		{"missing: deny", MissingDeny, ""},
		{"missing: shared", MissingShared, ""},
		{"missing: anonymous", 0, `rules[0].missing: missing "anonymous" must be skip, deny or shared`},
		{"missing: [deny]", 0, "rules[0].missing"},
	} {
		file := "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 1, period: 1m}\n"
		if tc.yaml != "" {
			file = strings.Replace(file, "}", ", "+tc.yaml+"}", 1)
		}
		s, err := Parse("f.yaml", []byte(file))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v; want an error with %q", tc.yaml, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.yaml, err)
			continue
		}
		if r, _ := s.Rule("r"); r.Missing != tc.want {
			t.Errorf("%q: %v, want %v", tc.yaml, r.Missing, tc.want)
		}
	}
	if _, err := NewSet(Rule{Name: "r", Key: []string{"user"}, Algorithm: 1, Limit: 1, Period: 1e9, Missing: 7}); !errors.Is(err, ErrInvalidMissing) {
		t.Errorf("Missing(7): %v; want ErrInvalidMissing", err)
	}
	if _, err := ParseMissing("nope"); !errors.Is(err, ErrInvalidMissing) {
		t.Errorf("ParseMissing: %v", err)
	}
}
