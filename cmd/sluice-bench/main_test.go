package main

import (
	"math/rand/v2"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the run when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every duration falls in a bucket that holds it and is at most 1/64 of
// it wide, and buckets follow each other without gaps.
func TestHistogramBuckets(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(d time.Duration) {
		t.Helper()
		i := bucketOf(d)
		lo := time.Duration(-1)
		if i > 0 {
			lo = upper(i - 1)
		}
		if hi := upper(i); d > hi || d <= lo || hi-lo > max(d/64, 1) {
			t.Fatalf("%d ns in bucket %d of (%d, %d]", d, i, lo, hi)
		}
	}
	for d := range time.Duration(5000) {
		check(d)
	}
	for range 100_000 {
		check(time.Duration(rng.Int64N(int64(time.Hour))))
	}
	check(time.Duration(1<<63 - 1))
}

func TestHistogramQuantile(t *testing.T) {
	var h, o histogram
	for i := 1; i <= 100; i++ {
		h.record(time.Duration(i))
		o.record(time.Duration(i) * time.Millisecond)
	}
	h.merge(&o)
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.25, 51}, {0.5, time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		got := h.quantile(tt.q)
		if got < tt.want || got > tt.want+tt.want/64 {
			t.Errorf("quantile(%v) = %v, want %v within 1/64", tt.q, got, tt.want)
		}
	}
	if (&histogram{}).quantile(0.5) != 0 {
		t.Error("quantile of an empty histogram")
	}
}

// The loopback baseline makes real round trips on every link, each
// carrying the whole message, and stops at its count bound.
func TestLoopbackRoundTrips(t *testing.T) {
	r, err := loopback(3, 100, time.Minute, 200)
	if err != nil {
		t.Fatal(err)
	}
	if r.checks != 3*200 {
		t.Fatalf("%d round trips, want 600", r.checks)
	}
	if r.lat.quantile(0.5) <= 0 {
		t.Fatalf("median round trip %v", r.lat.quantile(0.5))
	}
}

// The Redis scenario runs every scheme on a redis-server it starts, and
// sluice's cluster, each admitting every check of a limit never reached.
func TestRedisScenario(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not found on PATH")
	}
	if err := redisBench("", "redis-server", 1, 4, 10, 50*time.Millisecond, 400); err != nil {
		t.Fatal(err)
	}
}

// /proc/pid/stat's times are found after the last ')' of the command
// name, whatever it holds; malformed lines are errors, not panics.
func TestParseProcStat(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0"
	for _, c := range []struct {
		line    string
		want    time.Duration
		wantErr bool
	}{
		{line: "42 (sluice)" + tail, want: 2670 * time.Millisecond},
		{line: "42 (a) b (c))" + tail, want: 2670 * time.Millisecond},
		{line: "42 (x y)" + tail, want: 2670 * time.Millisecond},
		{line: "42 sluice" + tail, wantErr: true},
		{line: "42 (sluice) S 1 2", wantErr: true},
		{line: "42 (sluice) S 1 2 3 4 5 6 7 8 9 10 -1 17", wantErr: true},
		{line: "42 (sluice) S 1 2 3 4 5 6 7 8 9 10 x 17", wantErr: true},
		{line: "", wantErr: true},
	} {
		got, err := parseProcStat(c.line)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("parseProcStat(%q) = %v, %v; want %v, error %v", c.line, got, err, c.want, c.wantErr)
		}
	}
}

func TestParseRLSTargets(t *testing.T) {
	ts, err := parseRLSTargets("a=127.0.0.1:1@10,b=127.0.0.1:2@11+12")
	if err != nil || len(ts) != 2 || ts[1].name != "b" || ts[1].addr != "127.0.0.1:2" || len(ts[1].pids) != 2 || ts[1].pids[1] != 12 {
		t.Fatalf("got %+v, %v", ts, err)
	}
	for _, bad := range []string{"", "a", "a=127.0.0.1:1", "=x@1", "a=@1", "a=x@0", "a=x@1+", "a=x@y"} {
		if _, err := parseRLSTargets(bad); err == nil {
			t.Errorf("parseRLSTargets(%q): no error", bad)
		}
	}
}
