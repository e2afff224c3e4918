package transport

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Errors of this package. Errors returned by the conversions wrap one of
// these or one of the limiter's validation sentinels; test with errors.Is.
var (
	// ErrInvalidArgument is a malformed message that no limiter sentinel
	// describes: a nil message, an unknown unreachable policy, an oversized
	// batch, a message refused before decoding for a repeated field with
	// more entries than its limit.
	ErrInvalidArgument = errors.New("transport: invalid argument")
	// ErrMalformedResponse is a response that breaks the protocol: a count
	// of items that differs from the request's, a negative duration.
	ErrMalformedResponse = errors.New("transport: malformed response")
	// ErrUnavailable means the owner of a key could not be reached. Errors
	// of the peer package that mean the same wrap it.
	ErrUnavailable = errors.New("transport: owner unavailable")
	// ErrInternal is a failure of the deciding node that no other error
	// describes.
	ErrInternal = errors.New("transport: internal error")
	// ErrNotOwner means the node asked does not decide the key now: its
	// ring gives the key to another node, or the key has just moved to it
	// and the previous owner's hand-over is not in yet. The sender routes
	// the request again once one of the two rings has moved on.
	ErrNotOwner = errors.New("transport: not the key's owner now")
	// ErrNilContext is a call made with a nil context.Context, refused
	// the same way by every Limiter.
	ErrNilContext = sluice.ErrNilContext
	// ErrInvalidServerLimits is a ServerLimits that Validate refuses.
	ErrInvalidServerLimits = errors.New("transport: invalid server limits")
	// ErrMessageTimeout is the cause of the context of a call cancelled
	// because its first message was not all in within
	// ServerLimits.MessageTimeout.
	ErrMessageTimeout = errors.New("transport: message not received in time")
)

// MaxErrorMessageLen bounds the error text carried per item, in bytes.
const MaxErrorMessageLen = 512

// RemoteError is a per-item error decided on another node and carried over
// the wire. It unwraps to the sentinel its Code names, so that, say,
// errors.Is(err, limiter.ErrInvalidLimit) holds on both sides.
type RemoteError struct {
	Code    pb.ErrorCode
	Message string // the remote error's text
}

// Error returns the remote text prefixed with "transport: remote: ".
func (e *RemoteError) Error() string { return "transport: remote: " + e.Message }

// Unwrap returns the sentinel of e.Code: a limiter sentinel, one of this
// package's, context.DeadlineExceeded or context.Canceled. Unknown codes
// unwrap to ErrInternal.
func (e *RemoteError) Unwrap() error {
	if s := codeSentinel(e.Code); s != nil {
		return s
	}
	return ErrInternal
}

// codeErrors maps error codes to sentinels; the index is the code.
var codeErrors = [...]error{
	pb.ErrorCode_ERROR_CODE_INVALID_NAME:      limiter.ErrInvalidName,
	pb.ErrorCode_ERROR_CODE_INVALID_KEY:       limiter.ErrInvalidKey,
	pb.ErrorCode_ERROR_CODE_INVALID_HITS:      limiter.ErrInvalidHits,
	pb.ErrorCode_ERROR_CODE_HITS_EXCEED_LIMIT: limiter.ErrHitsExceedLimit,
	pb.ErrorCode_ERROR_CODE_INVALID_LIMIT:     limiter.ErrInvalidLimit,
	pb.ErrorCode_ERROR_CODE_INVALID_PERIOD:    limiter.ErrInvalidPeriod,
	pb.ErrorCode_ERROR_CODE_INVALID_BURST:     limiter.ErrInvalidBurst,
	pb.ErrorCode_ERROR_CODE_UNKNOWN_ALGORITHM: limiter.ErrUnknownAlgorithm,
	pb.ErrorCode_ERROR_CODE_INVALID_CALENDAR:  limiter.ErrInvalidCalendar,
	pb.ErrorCode_ERROR_CODE_INVALID_BEHAVIOR:  limiter.ErrInvalidBehavior,
	pb.ErrorCode_ERROR_CODE_INVALID_ARGUMENT:  ErrInvalidArgument,
	pb.ErrorCode_ERROR_CODE_INTERNAL:          ErrInternal,
	pb.ErrorCode_ERROR_CODE_UNAVAILABLE:       ErrUnavailable,
	pb.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED: context.DeadlineExceeded,
	pb.ErrorCode_ERROR_CODE_CANCELED:          context.Canceled,
	pb.ErrorCode_ERROR_CODE_NOT_OWNER:         ErrNotOwner,
}

// codeSentinel returns the sentinel of c, or nil for NONE and unknown codes.
func codeSentinel(c pb.ErrorCode) error {
	if c <= 0 || int(c) >= len(codeErrors) {
		return nil
	}
	return codeErrors[c]
}

// ErrorToProto returns the code and message that carry err over the wire:
// the code of the first sentinel err wraps (ERROR_CODE_INTERNAL when it
// wraps none) and err's text, made valid UTF-8 and cut to
// MaxErrorMessageLen bytes. A nil err gives ERROR_CODE_NONE and "". A
// *RemoteError unwraps to its code's sentinel, so it keeps its code through
// several hops.
func ErrorToProto(err error) (pb.ErrorCode, string) {
	if err == nil {
		return pb.ErrorCode_ERROR_CODE_NONE, ""
	}
	code := pb.ErrorCode_ERROR_CODE_INTERNAL
	for c := 1; c < len(codeErrors); c++ {
		if errors.Is(err, codeErrors[c]) {
			code = pb.ErrorCode(c)
			break
		}
	}
	msg := ""
	if re, ok := err.(*RemoteError); ok {
		msg = re.Message // no prefix per hop
	} else {
		msg = err.Error()
	}
	return code, cleanText(msg, MaxErrorMessageLen)
}

// ErrorFromProto returns the error carried by code and msg: nil for
// ERROR_CODE_NONE, otherwise a *RemoteError that unwraps to the code's
// sentinel. msg is untrusted: it is made valid UTF-8 and cut to
// MaxErrorMessageLen bytes. An empty msg is replaced by the code's name.
func ErrorFromProto(code pb.ErrorCode, msg string) error {
	if code == pb.ErrorCode_ERROR_CODE_NONE {
		return nil
	}
	msg = cleanText(msg, MaxErrorMessageLen)
	if msg == "" {
		msg = code.String()
	}
	return &RemoteError{Code: code, Message: msg}
}

// cleanText returns s as valid UTF-8 of at most max bytes, cut at a rune
// boundary. Strings of proto3 must be valid UTF-8 or the whole message
// fails to encode.
func cleanText(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
