package breaker

import (
	"testing"
	"time"
)

func TestBreakerSteps(t *testing.T) {
	const threshold, cooldown = 3, time.Second
	var b Breaker
	at := func(d time.Duration) int64 { return time.Unix(1000, 0).Add(d).UnixNano() }
	steps := []struct {
		at        time.Duration
		outcome   string // "ok", "fail", or "" to only ask allow
		wantAllow bool
	}{
		{0, "fail", true},
		{1, "fail", true},
		{2, "ok", true}, // a success resets the count
		{3, "fail", true},
		{4, "fail", true},
		{5, "fail", true}, // third consecutive failure: open
		{6, "", false},
		{cooldown, "", false},          // still open: opened at 5ns
		{cooldown + 5, "fail", true},   // half-open: one probe, which fails
		{cooldown + 6, "", false},      // open again
		{2*cooldown + 5, "", true},     // probe allowed...
		{2*cooldown + 5, "", false},    // ...but only one at a time
		{2*cooldown + 6, "ok", false},  // the probe succeeds (allow not asked again)
		{2*cooldown + 7, "", true},     // closed
		{2*cooldown + 8, "fail", true}, // one failure does not open it
		{2*cooldown + 9, "", true},
		{2*cooldown + 10, "fail", true},
		{2*cooldown + 11, "fail", true}, // third consecutive failure: open until 3*cooldown+11
		// The clock steps back an hour: open for a cooldown from then.
		{-time.Hour, "", false},
		{-time.Hour + cooldown - 1, "", false},
		{-time.Hour + cooldown, "", true}, // a probe
	}
	probe := false // the last call allowed was the half-open probe
	for i, s := range steps {
		now := at(s.at)
		if s.outcome == "ok" && !s.wantAllow {
			b.Done(probe, true, now, threshold, cooldown)
			continue
		}
		open := !b.Closed()
		got := b.Allow(now, cooldown)
		if got != s.wantAllow {
			t.Fatalf("step %d at %v: allow = %v, want %v", i, s.at, got, s.wantAllow)
		}
		if got {
			probe = open
		}
		if s.outcome != "" {
			b.Done(probe, s.outcome == "ok", now, threshold, cooldown)
		}
	}
}
