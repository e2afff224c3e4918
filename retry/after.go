package retry

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// ParseRetryAfter reads the value of a Retry-After header: a number of
// seconds, or an HTTP date, which is turned into the time left after now
// (0 when it has passed). ok is false when v is neither.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > math.MaxInt64/int64(time.Second) {
			return time.Duration(math.MaxInt64), true // too many digits: forever
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// HTTPRetryAfter returns the wait resp's Retry-After header asks for, as
// ParseRetryAfter reads it. ok is false when resp is nil or has no valid
// Retry-After.
func HTTPRetryAfter(resp *http.Response, now time.Time) (d time.Duration, ok bool) {
	if resp == nil {
		return 0, false
	}
	return ParseRetryAfter(resp.Header.Get("Retry-After"), now)
}

// GRPCRetryAfter returns the retry delay of the google.rpc.RetryInfo detail
// of err's gRPC status (err may wrap it). ok is false when err carries no
// status or no RetryInfo. A negative delay is returned as 0.
func GRPCRetryAfter(err error) (d time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		return 0, false
	}
	for _, det := range st.Details() {
		if ri, isRI := det.(*errdetails.RetryInfo); isRI && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
