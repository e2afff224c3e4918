package peer

import (
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/transport"
)

// MaxMaxInFlight bounds Config.MaxInFlight.
const MaxMaxInFlight = 64

// Config configures a Client, and every Client of a Pool.
type Config struct {
	// MaxBatch is the most checks one call carries, in
	// [1, transport.MaxBatchItems]. Default 500.
	MaxBatch int
	// MaxInFlight is the most calls in flight to one peer at once, in
	// [1, MaxMaxInFlight]. Checks wait for a free call. Default 1: a check goes out at once when
	// nothing is in flight, and gathers with others while a call is.
	MaxInFlight int
	// Timeout is every call's deadline. Default 1s.
	Timeout time.Duration
	// Self is this node's name, sent to the peer as the batch's sender.
	// Optional.
	Self string
	// DialOptions are added to the client's. Transport credentials default
	// to insecure; an option here overrides them.
	DialOptions []grpc.DialOption
}

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
