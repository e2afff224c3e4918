package envoyrls

import (
	"slices"
	"testing"
	"time"
)

// The tests of this file reproduce the examples of envoyproxy/ratelimit's
// README, each with the outcome its text describes. The clock stands
// still unless a step advances it, so every value is exact.

// Example 1: two limits of one key, told apart by value; other values
// have no limit.
func TestReadmeExample1(t *testing.T) {
	e := newEnv(t, []string{`
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`})
	e.run("mongo_cps", []step{
		{name: "499 users", hits: 499, descs: descs(desc("database=users")), want: "OK; OK 1/500/second t=1s"},
		{name: "the 500th", descs: descs(desc("database=users")), want: "OK; OK 0/500/second t=1s"},
		{name: "the 501st", descs: descs(desc("database=users")), want: "OVER_LIMIT; OVER 0/500/second t=1s"},
		{name: "default has its own 500", descs: descs(desc("database=default")), want: "OK; OK 499/500/second t=1s"},
		{name: "another database has no limit", descs: descs(desc("database=orders")), want: "OK; OK"},
		{name: "the next second", advance: time.Second, descs: descs(desc("database=users")), want: "OK; OK 499/500/second t=1s"},
	})
}

// Example 2: 5 marketing messages a day to each number, and 100 messages
// of any kind; one request with both descriptors is over when either is.
func TestReadmeExample2(t *testing.T) {
	e := newEnv(t, []string{`
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`})
	both := func(number string) []step {
		return []step{{descs: descs(desc("message_type=marketing", "to_number="+number), desc("to_number="+number))}}
	}
	const day = "t=1h46m40s"
	steps := []step{{name: "first marketing message to 2061111111", descs: both("2061111111")[0].descs,
		want: "OK; OK 4/5/day " + day + "; OK 99/100/day " + day}}
	steps = append(steps, repeat(3, step{name: "three more", descs: both("2061111111")[0].descs})...)
	steps = append(steps,
		step{name: "the fifth", descs: both("2061111111")[0].descs, want: "OK; OK 0/5/day " + day + "; OK 95/100/day " + day},
		step{name: "the sixth is over: the logical OR of both", descs: both("2061111111")[0].descs,
			want: "OVER_LIMIT; OVER 0/5/day " + day + "; OK 94/100/day " + day},
		step{name: "another number has its own 5", descs: both("2062222222")[0].descs,
			want: "OK; OK 4/5/day " + day + "; OK 99/100/day " + day},
		step{name: "a message of another type to the first number counts in its 100",
			descs: descs(desc("message_type=transactional", "to_number=2061111111"), desc("to_number=2061111111")),
			want:  "OK; OK; OK 93/100/day " + day},
	)
	e.run("messaging", steps)
}

// Example 3: the most specific match wins: 10 a second per address, and
// none for a blocked one.
func TestReadmeExample3(t *testing.T) {
	e := newEnv(t, []string{`
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`})
	ip := func(a string) []*rlDesc { return descs(desc("remote_address=" + a)) }
	e.run("edge_proxy_per_ip", []step{
		{name: "nine from 50.0.0.1", hits: 9, descs: ip("50.0.0.1"), want: "OK; OK 1/10/second t=1s"},
		{name: "the tenth", descs: ip("50.0.0.1"), want: "OK; OK 0/10/second t=1s"},
		{name: "the eleventh", descs: ip("50.0.0.1"), want: "OVER_LIMIT; OVER 0/10/second t=1s"},
		{name: "another address has its own 10", descs: ip("50.0.0.2"), want: "OK; OK 9/10/second t=1s"},
		{name: "the blocked address", descs: ip("50.0.0.5"), want: "OVER_LIMIT; OVER 0/0/second t=1s"},
		{name: "the next second", advance: time.Second, descs: ip("50.0.0.1"), want: "OK; OK 9/10/second t=1s"},
		{name: "still blocked", descs: ip("50.0.0.5"), want: "OVER_LIMIT; OVER 0/0/second t=1s"},
	})
}

// Example 4: a request descriptor matches a configuration with as many
// levels as it has entries.
func TestReadmeExample4(t *testing.T) {
	flat := newEnv(t, []string{`
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`})
	flat.run("example4", []step{
		{name: "two entries do not match one level", descs: descs(desc("key=value", "subkey=subvalue")), want: "OK; OK"},
		{name: "one entry does", descs: descs(desc("key=value")), want: "OK; OK 299/300/second t=1s"},
	})
	nested := newEnv(t, []string{`
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`})
	nested.run("example4", []step{
		{name: "two entries match two levels", descs: descs(desc("key=value", "subkey=subvalue")), want: "OK; OK 299/300/second t=1s"},
		{name: "one entry stops at a level without a limit", descs: descs(desc("key=value")), want: "OK; OK"},
	})
}

// Example 5: an unlimited descriptor is OK with limit_remaining at its
// maximum and no current_limit, and counts nothing.
func TestReadmeExample5(t *testing.T) {
	e := newEnv(t, []string{`
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`})
	e.run("internal", []step{
		{name: "ldap", hits: 1000, descs: descs(desc("ldap=any")), want: "OK; OK unlimited"},
		{name: "azure", descs: descs(desc("azure=any"), desc("ldap=x")), want: "OK; OK 99/100/minute t=40s; OK unlimited"},
	})
	if hits := e.takeHits(); len(hits) != 1 || hits[0].Key != "internal.azure" {
		t.Errorf("hits %+v, want azure's alone", hits)
	}
}

// Example 6: a shadow-mode limit never makes a request over, but its hits
// over the limit are counted.
func TestReadmeExample6(t *testing.T) {
	e := newEnv(t, []string{`
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`})
	user := func(u string) []*rlDesc { return descs(desc("service=auth-service", "user="+u)) }
	e.run("example6", []step{
		{name: "ten of user-a", hits: 10, descs: user("user-a"), want: "OK; OK 0/10/second t=1s"},
		{name: "user-a over, in shadow mode", hits: 5, descs: user("user-a"), want: "OK; OK 0/10/second t=1s"},
		{name: "twenty of user-b", hits: 20, descs: user("user-b"), want: "OK; OK 0/20/second t=1s"},
		{name: "user-b over", descs: user("user-b"), want: "OVER_LIMIT; OVER 0/20/second t=1s"},
	})
	hits := e.takeHits()
	if want := (Hit{Domain: "example6", Key: "example6.service.user_user-a", TotalHits: 5, OverLimit: 5, ShadowMode: 5}); hits[1] != want {
		t.Errorf("user-a's shadow hit %+v, want %+v", hits[1], want)
	}
	if want := (Hit{Domain: "example6", Key: "example6.service.user_user-b", TotalHits: 1, OverLimit: 1}); hits[3] != want {
		t.Errorf("user-b's hit over %+v, want %+v", hits[3], want)
	}
}

// Example 7: a limit that replaces another where both match leaves the
// replaced one neither counted nor reported.
func TestReadmeExample7(t *testing.T) {
	e := newEnv(t, []string{`
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`})
	one := desc("key_1=value_1", "user=bkthomps")
	two := desc("key_2=value_2", "user=bkthomps")
	e.run("example7", []step{
		{name: "both: 10 a second", hits: 9, descs: descs(one, two), want: "OK; OK; OK 1/10/second t=1s"},
		{name: "the tenth", descs: descs(one, two), want: "OK; OK; OK 0/10/second t=1s"},
		{name: "the eleventh", descs: descs(one, two), want: "OVER_LIMIT; OK; OVER 0/10/second t=1s"},
		{name: "the 5 a second limit was not touched", descs: descs(one), want: "OK; OK 4/5/second specific_limit t=1s"},
	})
}

// Example 8: detailed_metric names the metric after the request's value.
func TestReadmeExample8(t *testing.T) {
	e := newEnv(t, []string{`
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`})
	e.run("example8", []step{
		{descs: descs(desc("key1=unspecified_value")), want: "OK; OK 9/10/minute t=40s"},
		{descs: descs(desc("key1=unspecified_value2")), want: "OK; OK 9/10/minute t=40s"},
		{descs: descs(desc("key1=value1")), want: "OK; OK 19/20/minute t=40s"},
	})
	if got, want := hitKeys(e.takeHits()), []string{"example8.key1_unspecified_value", "example8.key1_unspecified_value2", "example8.key1_value1"}; !slices.Equal(got, want) {
		t.Errorf("metric keys %q, want %q", got, want)
	}
}

// Example 9: '*' matches any run of characters, at the end, in the middle
// or several times.
func TestReadmeExample9(t *testing.T) {
	e := newEnv(t, []string{`
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
`})
	const hit, none = "OK; OK 19/20/minute t=40s", "OK; OK"
	e.run("example9", []step{
		{descs: descs(desc("key1=value1")), want: hit},
		{name: "each value its own counter", descs: descs(desc("key1=value2")), want: hit},
		{descs: descs(desc("key1=valueXYZ")), want: hit},
		{descs: descs(desc("key1=other")), want: none},
		{descs: descs(desc("path=/api/123/action")), want: hit},
		{descs: descs(desc("path=/api/user-id/action")), want: hit},
		{descs: descs(desc("path=/api/123/other")), want: none},
		{descs: descs(desc("route=/api/v1/resource/123/action")), want: hit},
		{descs: descs(desc("route=/api/v2/resource/456/action")), want: hit},
		{descs: descs(desc("route=/api/v2/resource/456/other")), want: none},
	})
}

// Example 10: value_to_metric puts the request's values into the metric
// key where the configuration has none, or a pattern.
func TestReadmeExample10(t *testing.T) {
	e := newEnv(t, []string{`
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`, `
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
`})
	e.call("example10", 0, desc("route=api", "http_method=GET", "subject_id=123"))
	e.call("example10", 0, desc("route=web", "http_method=POST", "subject_id=456"))
	e.call("example10_wildcard", 0, desc("user=alice", "action=readfile", "resource=documents"))
	want := []string{"example10.route_api.http_method_GET.subject_id", "example10.route_web.http_method_POST.subject_id",
		"example10_wildcard.user_alice.action_readfile.resource"}
	if got := hitKeys(e.takeHits()); !slices.Equal(got, want) {
		t.Errorf("metric keys %q, want %q", got, want)
	}
}

// Example 11: with share_threshold every value a pattern matches shares
// one counter; without, each has its own.
func TestReadmeExample11(t *testing.T) {
	e := newEnv(t, []string{`
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
`})
	const hour = " t=46m40s"
	e.run("example11", []step{
		{name: "5 for a.pdf", hits: 5, descs: descs(desc("files=files/a.pdf")), want: "OK; OK 5/10/hour" + hour},
		{name: "5 for b.csv", hits: 5, descs: descs(desc("files=files/b.csv")), want: "OK; OK 0/10/hour" + hour},
		{name: "c.txt is over", descs: descs(desc("files=files/c.txt")), want: "OVER_LIMIT; OVER 0/10/hour" + hour},
		{name: "10 for files_no_share/a.pdf", hits: 10, descs: descs(desc("files_no_share=files_no_share/a.pdf")), want: "OK; OK 0/10/hour" + hour},
		{name: "b.csv has its own 10", descs: descs(desc("files_no_share=files_no_share/b.csv")), want: "OK; OK 9/10/hour" + hour},
	})
	if got, want := hitKeys(e.takeHits())[:1], []string{"example11.files_files/*"}; !slices.Equal(got, want) {
		t.Errorf("metric keys %q, want %q", got, want)
	}
}

func hitKeys(hits []Hit) []string {
	out := make([]string, len(hits))
	for i, h := range hits {
		out[i] = h.Key
	}
	return out
}
