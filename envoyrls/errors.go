package envoyrls

import (
	"errors"
	"fmt"
)

// Errors of the envoyrls package. Every problem of a configuration file
// wraps ErrInvalidConfig in a [*ConfigError] that names the file and line;
// test with errors.Is, and get the position with errors.As.
var (
	// ErrInvalidConfig wraps every error of a configuration file or
	// directory.
	ErrInvalidConfig = errors.New("envoyrls: invalid configuration")
	// ErrDuplicateDomain is a domain that two files of one directory
	// configure. It wraps ErrInvalidConfig too.
	ErrDuplicateDomain error = &childError{"envoyrls: domain configured twice", ErrInvalidConfig}
	// ErrInvalidServiceConfig wraps every error of Config.Validate, and
	// ErrInvalidWatchConfig every error of WatchConfig.Validate.
	ErrInvalidServiceConfig = errors.New("envoyrls: invalid service config")
	ErrInvalidWatchConfig   = errors.New("envoyrls: invalid watch config")
)

// childError is a sentinel that wraps a broader one.
type childError struct {
	msg    string
	parent error
}

func (e *childError) Error() string { return e.msg }
func (e *childError) Unwrap() error { return e.parent }

// ConfigError is one problem of a configuration file: where it is, and
// what. Its Error reads "envoyrls: file:line: message".
type ConfigError struct {
	File string // as given to ParseDomain, or the path LoadDir read
	Line int    // 1-based; 0 for the file as a whole
	// Column is 1-based; 0 when unknown (YAML syntax errors name only
	// their line).
	Column int
	// Err is ErrInvalidConfig or ErrDuplicateDomain.
	Err     error
	Message string
}

func (e *ConfigError) Error() string {
	if e.Line > 0 && e.Column > 0 {
		return fmt.Sprintf("envoyrls: %s:%d:%d: %s", e.File, e.Line, e.Column, e.Message)
	}
	if e.Line > 0 {
		return fmt.Sprintf("envoyrls: %s:%d: %s", e.File, e.Line, e.Message)
	}
	return fmt.Sprintf("envoyrls: %s: %s", e.File, e.Message)
}

// Unwrap returns the sentinel, for errors.Is.
func (e *ConfigError) Unwrap() error { return e.Err }
