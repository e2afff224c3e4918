package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// exampleBodies returns the JSON bodies of the daemon's example: those
// run.sh sends with curl and the README's JSON blocks.
func exampleBodies(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for path, re := range map[string]*regexp.Regexp{
		"../../../../examples/daemon/run.sh":    regexp.MustCompile(`-d '(\{[^']*\})'`),
		"../../../../examples/daemon/README.md": regexp.MustCompile("(?s)```json\n(.*?)```"),
	} {
		src, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(src, -1) {
			out = append(out, m[1])
		}
	}
	if len(out) < 3 {
		tb.Fatalf("%d example bodies", len(out))
	}
	return out
}

// replacementsIn counts what may decode to U+FFFD in a JSON text: the
// character itself and its \u escapes.
func replacementsIn(body []byte) int {
	n := bytes.Count(body, []byte("\uFFFD"))
	for i := 0; ; {
		j := bytes.Index(body[i:], []byte(`\u`))
		if j < 0 {
			return n
		}
		i += j + 2
		if len(body) >= i+4 && strings.EqualFold(string(body[i:i+4]), "fffd") {
			n++
		}
	}
}

// FuzzDecodeCheckJSON decodes arbitrary bytes as the HTTP API's check
// and batch bodies. Decoding must never panic; an accepted request must
// pass limiter validation, hold no U+FFFD the body did not write, and
// come back the same from its JSON form: its name and key bytes exactly.
func FuzzDecodeCheckJSON(f *testing.F) {
	for _, b := range exampleBodies(f) {
		f.Add(b)
	}
	for _, s := range []string{
		`{"name":"n","key":"k","limit":1,"period":60000000000,"algorithm":"gcra","hits":0,"unreachable":"deny"}`,
		`{"name":"day","key":"c","limit":5,"algorithm":"fixed_window","calendar":"day","time_zone":"Europe/Paris"}`,
		`{"name":"n","key":"\ud83d\ude00\ufffd","limit":1,"period":"1s","algorithm":"token_bucket","reset":true,"drain_over_limit":true}`,
		`{"name":"n","key":"\ud800","limit":1,"period":"1s","algorithm":"gcra"}`,
		`{"name":"n","key":"a` + "\xff" + `","limit":1,"period":"1s","algorithm":"gcra"}`,
		`{"requests":[{"name":"n","key":"k","limit":2,"period":"1m","algorithm":"sliding_window_log"},"x",{}]}`,
		`{"name":"n","key":"k","key":"\\ud800","limit":1,"period":"1s","algorithm":"gcra"}`,
		`[]`, `null`, `{"name":`,
	} {
		f.Add([]byte(s))
	}
	d := &Daemon{}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(raw []byte) {
			req, policy, ierr := d.decodeCheck(raw)
			if ierr != nil {
				if ierr.Code == "" || ierr.Message == "" {
					t.Fatalf("refusal without a code or message: %+v", ierr)
				}
				return
			}
			if err := req.Validate(); err != nil {
				t.Fatalf("accepted an invalid request: %v", err)
			}
			for _, s := range []string{req.Name, req.Key} {
				if n := strings.Count(s, "\uFFFD"); n > replacementsIn(raw) {
					t.Fatalf("%q holds %d U+FFFD, the body writes %d: %q", s, n, replacementsIn(raw), raw)
				}
			}
			again, policy2, ierr := d.decodeCheck(encodeCheck(t, req, policy))
			if ierr != nil {
				t.Fatalf("the JSON form of an accepted request is refused: %+v", ierr)
			}
			if again.Name != req.Name || again.Key != req.Key || policy2 != policy || again.Location.String() != req.Location.String() {
				t.Fatalf("round trip: %q %q %v, want %q %q %v", again.Name, again.Key, policy2, req.Name, req.Key, policy)
			}
			again.Location, req.Location = nil, nil
			if again != req {
				t.Fatalf("round trip: %+v, want %+v", again, req)
			}
		}
		check(body)
		for _, b := range [][]byte{body, append(append([]byte(`{"requests":[`), body...), "]}"...)} {
			var batch BatchRequest
			if err := decodeStrict(b, &batch); err != nil {
				continue
			}
			for _, raw := range batch.Requests {
				check(raw)
			}
		}
	})
}

// encodeCheck is r in the HTTP API's JSON form.
func encodeCheck(t *testing.T, r limiter.Request, policy sluice.Policy) []byte {
	t.Helper()
	in := CheckRequest{
		Name: r.Name, Key: r.Key, Hits: &r.Hits, Limit: r.Limit, Period: Duration(r.Period), Burst: r.Burst,
		Algorithm: r.Algorithm.String(), Calendar: r.Calendar.String(),
		Reset: r.Behavior&limiter.Reset != 0, DrainOverLimit: r.Behavior&limiter.DrainOverLimit != 0,
		Unreachable: policy.String(),
	}
	if r.Location != nil {
		in.TimeZone = r.Location.String()
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDaemonConfig reads arbitrary bytes as the daemon's config file, the
// way Load does: over DefaultConfig, then validated. It must never panic;
// a refusal is a *ConfigError, naming the file when one setting of it is
// at fault; an accepted config validates, and the text form of each
// setting (what flags and --help show) reads back to the same config.
func FuzzDaemonConfig(f *testing.F) {
	example, err := os.ReadFile("../../../../examples/daemon/sluice.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(example),
		"node_name: from-file\nhttp_addr: 127.0.0.1:1001\nunreachable: deny\njoin:\n  - 10.0.0.1:7946\n  - 10.0.0.2:7946\nshutdown_timeout: 3s\n",
		"lease_threshold: 10\nlease_share: 0.5\nlease_ttl: 50ms\nreplicas: 3\n",
		"log_level: debug+2\nlog_format: text\nmax_body_bytes: 2048\nmax_batch_items: 7\n",
		"tls_cert_file: a.pem\ntls_key_file: a.key\ntls_ca_file: ca.pem\npeer_identities: [spiffe://x/node]\n",
		"destructive_behaviors: admins\nadmin_identities: [a]\ntls_ca_file: ca.pem\ntls_cert_file: c\ntls_key_file: k\n",
		"gossip_keys: [MDEyMzQ1Njc4OWFiY2RlZg==]\n",
		"x: &a 1\nnode_name: *a\n", "- a\n", "node_name: a\nnode_name: b\n", "", "# c\n",
		"lease_share: NaN\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := DefaultConfig()
		cfg.NodeName = "fuzz" // what Load takes from the host name when the file sets none
		err := applyYAML(&cfg, "sluice.yaml", data)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || ce.Err == nil || ce.Source != "sluice.yaml" && ce.Source != "" {
				t.Fatalf("refusal %T %v is not a *ConfigError", err, err)
			}
			return
		}
		// What the daemon hands the node validates too.
		d := &Daemon{cfg: cfg, logger: slog.New(slog.DiscardHandler), opts: options{now: time.Now}}
		cc := d.clusterConfig()
		if cc.GossipKeys, err = decodeGossipKeys(cfg.GossipKeys); err != nil {
			t.Fatalf("gossip keys of an accepted config: %v", err)
		}
		if err := cc.Validate(); err != nil {
			t.Fatalf("the node's config of an accepted config does not validate: %v", err)
		}
		if c := cfg.clone(); !reflect.DeepEqual(c, cfg) {
			t.Fatalf("clone %+v, want %+v", c, cfg)
		}
		again := DefaultConfig()
		for i := range fields {
			f := &fields[i]
			if f.key == "gossip_keys" { // shown as placeholders
				again.GossipKeys = cfg.GossipKeys
				continue
			}
			text := f.show(&cfg)
			if err := f.parse(&again, text); err != nil {
				t.Fatalf("%s: its text %q does not load: %v", f.key, text, err)
			}
		}
		if err := again.Validate(); err != nil || !reflect.DeepEqual(again, cfg) {
			t.Fatalf("from its text form: %+v (%v), want %+v", again, err, cfg)
		}
	})
}

// Lease settings are checked while leases are off too, so that a bad
// value is not found only once lease_threshold turns them on.
func TestLeaseSettingsCheckedWhileOff(t *testing.T) {
	for _, text := range []string{"lease_share: NaN\n", "lease_share: 0\n", "lease_share: 1.5\n", "lease_ttl: 0s\n", "lease_ttl: 999h\n"} {
		cfg := DefaultConfig()
		err := applyYAML(&cfg, "sluice.yaml", []byte(text))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Line != 1 || ce.Field != strings.TrimSpace(strings.Split(text, ":")[0]) {
			t.Errorf("%q: %v, want a *ConfigError of its line", text, err)
		}
	}
	cfg := DefaultConfig()
	if err := applyYAML(&cfg, "sluice.yaml", []byte("lease_share: 0.5\nlease_ttl: 20ms\n")); err != nil || cfg.Lease.Threshold != 0 {
		t.Errorf("good settings while off: %v", err)
	}
}

// FuzzDecodeRulesCheck decodes arbitrary bytes as a POST /v1/rules/check
// body. Decoding must never panic; a refusal names a code and says why;
// an accepted request stays within the bounds, holds no U+FFFD the body
// did not write, gives back the headers and descriptors the body holds,
// and comes back the same from its JSON form.
func FuzzDecodeRulesCheck(f *testing.F) {
	for _, b := range exampleBodies(f) {
		f.Add(b)
	}
	for _, s := range []string{
		`{"user":"u1","descriptors":{"plan":"free","org":"o1"},"hits":2}`,
		`{"route":"/login","method":"POST","ip":"::ffff:192.0.2.7","headers":{"x-client":"app","X-Tenant":"acme"}}`,
		`{"ip":"fe80::1%eth0","hits":0,"descriptors":null,"headers":{}}`,
		`{"descriptors":{"plan":"free","plan":"pro"}}`,
		`{"headers":{"x-a":"1","X-A":"2"}}`,
		`{"descriptors":{"\ud800":"x"}}`,
		`{"descriptors":{"k":"a` + "\xff" + `"}}`,
		`{"descriptors":{"k":{"a":"b"}},"hits":-1}`,
		`{"descriptors":["a"],"route":5}`,
		`{"HEADERS":{"a":"b"},"Descriptors":{"c":"\ufffd"}}`,
		`[]`, `null`, `{"user":`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		desc, hits, ierr := parseRulesCheck(body)
		if ierr != nil {
			if ierr.Code == "" || ierr.Message == "" {
				t.Fatalf("refusal without a code or message: %+v", ierr)
			}
			return
		}
		switch {
		case hits < 0, len(desc.Route) > limiter.MaxKeyLen, len(desc.User) > limiter.MaxKeyLen,
			len(desc.Method) > limiter.MaxNameLen, len(desc.Values) > MaxRulesDescriptors:
			t.Fatalf("accepted out of bounds: %+v, hits %d", desc, hits)
		}
		for name, v := range desc.Values {
			if name == "" || len(name) > limiter.MaxNameLen || len(v) > limiter.MaxKeyLen {
				t.Fatalf("accepted descriptor %q=%q", name, v)
			}
		}
		for _, s := range []string{desc.Route, desc.User, desc.Method} {
			if n := strings.Count(s, "\uFFFD"); n > replacementsIn(body) {
				t.Fatalf("%q holds %d U+FFFD, the body writes %d", s, n, replacementsIn(body))
			}
		}
		// What encoding/json makes of the same body.
		var in struct {
			Headers     map[string]string `json:"headers"`
			Descriptors map[string]string `json:"descriptors"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("accepted a body encoding/json refuses: %v", err)
		}
		if len(in.Headers) > MaxRulesHeaders || len(in.Headers) > 0 && desc.Header == nil {
			t.Fatalf("headers %v, accepted as %v", in.Headers, desc.Header != nil)
		}
		for name, v := range in.Headers {
			if got, ok := desc.Header(http.CanonicalHeaderKey(name)); !ok || got != v {
				t.Fatalf("header %q: %q %v, want %q", name, got, ok, v)
			}
		}
		if !maps.Equal(in.Descriptors, desc.Values) {
			t.Fatalf("descriptors %v, want %v", desc.Values, in.Descriptors)
		}
		out := map[string]any{"route": desc.Route, "method": desc.Method, "user": desc.User,
			"hits": hits, "headers": in.Headers, "descriptors": desc.Values}
		if desc.IP.IsValid() {
			out["ip"] = desc.IP.String()
		}
		b, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		again, hits2, ierr := parseRulesCheck(b)
		if ierr != nil {
			t.Fatalf("the JSON form %s of an accepted request is refused: %+v", b, ierr)
		}
		if again.Route != desc.Route || again.Method != desc.Method || again.User != desc.User || again.IP != desc.IP ||
			hits2 != hits || !maps.Equal(again.Values, desc.Values) {
			t.Fatalf("round trip: %+v %d, want %+v %d", again, hits2, desc, hits)
		}
	})
}
