package peer

import (
	"fmt"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/transport"
)

// MaxMaxInFlight bounds Config.MaxInFlight.
const MaxMaxInFlight = 64

// Config configures a Client, and every Client of a Pool.
type Config struct {
	// MaxBatch is the most checks one batch carries, in
	// [1, transport.MaxBatchItems]. Default 500.
	MaxBatch int
	// MaxInFlight is the most batches in flight (sent and not yet
	// answered) to one peer at once, in [1, MaxMaxInFlight]. Checks wait
	// for a free slot. Default 1: a check goes out at once when nothing is
	// in flight, and gathers with others while a batch is.
	MaxInFlight int
	// Timeout is how long a forwarded check waits at most, from when it
	// is queued (Check, CheckMany) to its answer, whether it waits for a
	// batch in flight, for the stream to open, or for its own answer. A
	// check still queued when it ends fails without being sent; a batch
	// fails when the Timeout of its earliest check ends, and so does the
	// stream it is on: the next batch opens a new one. Either way the
	// error wraps ErrUnavailable with the gRPC status DeadlineExceeded.
	// Transfer, HandoffDone, Lease and ReturnLease, which queue nothing
	// here, have it from their start. Default 1s.
	Timeout time.Duration
	// Self is this node's name, sent to the peer as the batches' sender.
	// Optional.
	Self string
	// DialOptions are added to the client's. Transport credentials default
	// to insecure; an option here overrides them.
	DialOptions []grpc.DialOption
	// Observer, when not nil, is called once per batch, for metrics, when
	// its checks have their results: with the peer's name, the number of
	// checks, the time from sending to the answer (or to the failure), and
	// nil or the error that failed the whole batch (an owner's per-item
	// errors do not count). It is called on the goroutine that completes
	// the batch, usually the client's receiver, whose next answers wait
	// for it; possibly concurrently, for several batches and clients. It
	// must be fast, must not block, and must be safe for concurrent use.
	// Default nil: none.
	Observer func(peer string, items int, latency time.Duration, err error)
	// Clock is the time every deadline of the client is measured and
	// waited on: the checks' (the watchdog that enforces them waits with
	// Clock's AfterFunc for the time Clock says is left, then looks
	// again), the Observer's latencies, and the Timeout of the calls of
	// Transfer, HandoffDone, Lease, ReturnLease and Inspect. A cluster
	// node gives its peer clients its own clock. Tests set it to move
	// time by hand: ClockFunc reads a function and waits on the system's
	// timer, so a clock moved by hand is seen within Timeout. Default nil:
	// the system's clock. The field's type spells out Clock's methods so
	// that cluster.PeerConfig, which users set, names no internal type;
	// a cluster.Clock or a Clock fits it.
	Clock interface {
		Now() time.Time
		AfterFunc(d time.Duration, f func()) (stop func() bool)
	}
	// SendClock is the clock of the node whose states Transfer sends: each
	// transfer carries its reading, so that the peer reads the states'
	// times on its own clock (transport's Transfer). Default nil: Clock.
	SendClock func() time.Time
	// TracerProvider, when set, traces forwarded checks: each Check and
	// CheckMany is a client span ("sluice.peer.Forward") under the
	// caller's context, and each check carries its W3C traceparent to the
	// owner, in its own item of the batch (see trace.go). Default nil: no
	// spans, no traceparent, nothing added to the path of a check.
	TracerProvider trace.TracerProvider
}

// Clock is the time a client reads and waits on; cluster.Clock has the
// same methods. Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on the
	// clock, unless stop is called first; stop reports whether it
	// stopped the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// ClockFunc is a Clock that reads the time from the function and waits
// on the system's timer.
type ClockFunc func() time.Time

func (c ClockFunc) Now() time.Time { return c() }

func (c ClockFunc) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

var _ Clock = ClockFunc(nil)

// DefaultConfig returns the default configuration.
func DefaultConfig() Config {
	return Config{MaxBatch: 500, MaxInFlight: 1, Timeout: time.Second}
}

// Validate returns nil or an error wrapping ErrInvalidConfig that names the
// field. Zero values are invalid: start from DefaultConfig.
func (c Config) Validate() error {
	switch {
	case c.MaxBatch < 1 || c.MaxBatch > transport.MaxBatchItems:
		return fmt.Errorf("%w: MaxBatch %d is outside [1, %d]", ErrInvalidConfig, c.MaxBatch, transport.MaxBatchItems)
	case c.MaxInFlight < 1 || c.MaxInFlight > MaxMaxInFlight:
		return fmt.Errorf("%w: MaxInFlight %d is outside [1, %d]", ErrInvalidConfig, c.MaxInFlight, MaxMaxInFlight)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: Timeout %v is not positive", ErrInvalidConfig, c.Timeout)
	case !utf8.ValidString(c.Self):
		return fmt.Errorf("%w: Self is not valid UTF-8", ErrInvalidConfig)
	}
	for i, o := range c.DialOptions {
		if o == nil {
			return fmt.Errorf("%w: DialOptions[%d] is nil", ErrInvalidConfig, i)
		}
	}
	return nil
}

// clone returns c with its own DialOptions slice.
func (c Config) clone() Config {
	c.DialOptions = append([]grpc.DialOption(nil), c.DialOptions...)
	return c
}
