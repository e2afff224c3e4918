package daemon

import (
	"log/slog"
	"math"
	"strconv"
)

// readableAttr is the loggers' ReplaceAttr: durations print as "1.5s"
// rather than nanoseconds (JSON), floats rounded as ReadableFloat does.
func readableAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindFloat64:
		a.Value = slog.Float64Value(roundForPeople(a.Value.Float64()))
	}
	return a
}

// ReadableFloat formats f for people: three decimals at most from 1 up
// (9.273093861500001 prints 9.273), three significant digits below 1,
// and no trailing zeros.
func ReadableFloat(f float64) string {
	return strconv.FormatFloat(roundForPeople(f), 'f', -1, 64)
}

func roundForPeople(f float64) float64 {
	if f == 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return f
	}
	if math.Abs(f) >= 1 {
		if r := math.Round(f*1000) / 1000; !math.IsInf(r, 0) {
			return r
		}
		return f
	}
	r, err := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 3, 64), 64)
	if err != nil {
		return f
	}
	return r
}
