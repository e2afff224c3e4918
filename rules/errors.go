package rules

import (
	"errors"
	"fmt"
	"strings"
)

// Errors of the rules package. Every rule problem Parse, Load, NewSet and
// NewStatic report wraps one of them in an [*Error] that says where; test
// with errors.Is, and get the position with errors.As. (A file that cannot
// be read is reported with the os error, wrapped.)
var (
	// ErrFileTooLarge reports a rule file longer than MaxFileBytes, and
	// ErrTooManyRules one of more than MaxRules rules.
	ErrFileTooLarge = errors.New("rules: file too large")
	ErrTooManyRules = errors.New("rules: too many rules")
	// ErrSyntax reports a file that is not valid YAML, or whose aliases
	// expand it beyond a million nodes.
	ErrSyntax = errors.New("rules: invalid YAML")
	// ErrEmptyDocument reports a file with no document at all. An empty
	// file is an error, not an empty set, so that a file caught half
	// written never lifts every limit; write "rules: []" to mean none.
	ErrEmptyDocument = errors.New("rules: empty document")
	// ErrUnknownField reports a mapping key the format does not define.
	ErrUnknownField = errors.New("rules: unknown field")
	// ErrDuplicateField reports a mapping key given twice.
	ErrDuplicateField = errors.New("rules: field given twice")
	// ErrWrongType reports a value of the wrong kind: a list where a
	// string belongs, a string where a number belongs.
	ErrWrongType = errors.New("rules: wrong type")
	// ErrMissingField reports a required field that is absent.
	ErrMissingField = errors.New("rules: missing field")
	// ErrInvalidName reports a rule name that is empty, too long, or uses
	// characters outside [A-Za-z0-9_.:-].
	ErrInvalidName = errors.New("rules: invalid rule name")
	// ErrDuplicateName reports two rules with the same name.
	ErrDuplicateName = errors.New("rules: duplicate rule name")
	// ErrUnknownAlgorithm reports an algorithm limiter.ParseAlgorithm
	// does not know.
	ErrUnknownAlgorithm = errors.New("rules: unknown algorithm")
	// ErrInvalidLimit, ErrInvalidPeriod and ErrInvalidBurst report a rate
	// the limiter would refuse; the limiter's own error is wrapped too.
	ErrInvalidLimit  = errors.New("rules: invalid limit")
	ErrInvalidPeriod = errors.New("rules: invalid period")
	ErrInvalidBurst  = errors.New("rules: invalid burst")
	// ErrInvalidCalendar reports a bad calendar unit or time zone, or a
	// calendar on an algorithm other than fixed_window.
	ErrInvalidCalendar = errors.New("rules: invalid calendar")
	// ErrInvalidMatch reports a bad route pattern, method, header, user or
	// descriptor condition.
	ErrInvalidMatch = errors.New("rules: invalid match condition")
	// ErrInvalidCIDR reports an ips entry that is neither an IP address
	// nor a CIDR prefix.
	ErrInvalidCIDR = errors.New("rules: invalid IP or CIDR")
	// ErrInvalidKey reports an unknown or malformed key part.
	ErrInvalidKey = errors.New("rules: invalid key part")
	// ErrInvalidPolicy reports an unreachable policy other than local,
	// allow or deny.
	ErrInvalidPolicy = errors.New("rules: invalid unreachable policy")
	// ErrInvalidMissing reports a missing setting other than skip, deny
	// or shared.
	ErrInvalidMissing = errors.New("rules: invalid missing setting")
	// ErrInvalidWatchConfig wraps every error of WatchConfig.Validate.
	ErrInvalidWatchConfig = errors.New("rules: invalid watch config")
)

// Error is one problem in a rule set, with where it is. Rules built in code
// have no File, Line or Column.
type Error struct {
	File   string // the file name given to Parse or Load; "" for code
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	// Field is the path of the offending value: "rules[2].match.ips[0]".
	Field   string
	Message string
	// Err is the package sentinel; Cause, when set, is the underlying
	// error (a limiter validation error, say). errors.Is sees both.
	Err   error
	Cause error
}

// Error formats e as "rules: file:line:col: field: message".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("rules: ")
	if e.File != "" || e.Line > 0 {
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteByte(':')
		}
		if e.Line > 0 {
			fmt.Fprintf(&b, "%d:", e.Line)
			if e.Column > 0 {
				fmt.Fprintf(&b, "%d:", e.Column)
			}
		}
		b.WriteByte(' ')
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Unwrap returns the sentinel and the cause, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

// maxErrors bounds how many problems one load reports; loading stops
// collecting problems once it has found that many.
const maxErrors = 20

// joinErrors returns nil, the single error, or all of them joined (first
// first, so errors.As finds the earliest problem).
func joinErrors(errs []*Error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	if len(errs) > maxErrors {
		errs = errs[:maxErrors]
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}
