package daemon

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadableFloat(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{9.273093861500001, "9.273"},
		{100, "100"},
		{-2.5, "-2.5"},
		{0.000123456, "0.000123"},
		{0.5, "0.5"},
		{0, "0"},
		{1e300, "1" + strings.Repeat("0", 300)},
		{math.Inf(1), "+Inf"},
		{math.NaN(), "NaN"},
	} {
		if got := ReadableFloat(tc.in); got != tc.want {
			t.Errorf("ReadableFloat(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The daemon's logs print durations as people write them and floats
// rounded, in both formats, inside groups too.
func TestLogsPrintForPeople(t *testing.T) {
	for _, tc := range []struct {
		format string
		want   []string
	}{
		{"json", []string{`"wait":"1.5s"`, `"level":9.273`, `"g":{"interval":"250ms"}`, `"n":3`}},
		{"text", []string{"wait=1.5s", "level=9.273", "g.interval=250ms", "n=3"}},
	} {
		var buf bytes.Buffer
		l := newLogger(&buf, tc.format, slog.LevelInfo)
		l.Info("m", "wait", 1500*time.Millisecond, "level", 9.273093861500001,
			slog.Group("g", "interval", 250*time.Millisecond), "n", 3)
		out := buf.String()
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q lacks %q", tc.format, out, w)
			}
		}
		if tc.format == "json" && !json.Valid(bytes.TrimSpace(buf.Bytes())) {
			t.Errorf("json: invalid line %q", out)
		}
	}
}
