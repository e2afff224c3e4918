package sluice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Errors of the vocabulary; test with errors.Is.
var (
	// ErrNilContext is returned for a call made with a nil context.
	ErrNilContext = errors.New("sluice: nil context")
	// ErrInvalidPolicy wraps an unknown Policy value or name.
	ErrInvalidPolicy = errors.New("sluice: invalid policy")
)

// Limiter decides rate-limit requests. Implementations are safe for
// concurrent use.
//
// Check returns an error wrapping a limiter sentinel (limiter.ErrInvalidKey
// and the rest) for an invalid request, ErrNilContext for a nil ctx, and
// ctx's error when ctx ends first; an unreachable owner is not an error
// (the Policy decides, and Decision.WithoutOwner says so). CheckMany
// decides every request, in order, one Result each, with the errors Check
// would return in each Result's Err.
type Limiter interface {
	Check(ctx context.Context, req limiter.Request, opts ...CheckOption) (Decision, error)
	CheckMany(ctx context.Context, reqs []limiter.Request, opts ...CheckOption) []Result
}

// Decision is a limiter decision and where it was made.
type Decision struct {
	limiter.Decision
	// Owner names the node that decided; "" for a Local limiter.
	Owner string
	// WithoutOwner is true when the key's owner could not be reached and
	// the decision came from the unreachable Policy.
	WithoutOwner bool
}

// Result is one outcome of CheckMany: a Decision, or the error of that
// request.
type Result struct {
	Decision
	Err error
}

// Inspection is one key's state as its owner holds it, for operators: what
// an admin's inspect returns. Reading it changes nothing.
type Inspection struct {
	// State is the key's state when Found; Found is false when the owner
	// holds no live state, so that the key is fresh.
	State limiter.Snapshot
	Found bool
	// Owner names the node whose store was read: the key's owner, or the
	// node asked when WithoutOwner is set.
	Owner string
	// Replicas names the nodes that hold copies of the key's state, in
	// ring order after the owner; empty without replication.
	Replicas []string
	// WithoutOwner is true when the owner could not be reached and the
	// state is the one the node asked holds.
	WithoutOwner bool
	// At is when the state was read, on the reading node's clock.
	At time.Time
}

// Policy says how a check is decided when its key's owner cannot be
// reached. A Local limiter owns every key and never applies one.
type Policy uint8

// The policies.
const (
	// PolicyDefault uses the backend's configured policy.
	PolicyDefault Policy = iota
	// PolicyLocal decides on the node that received the check, as if it
	// owned the key: the limit holds per node until the owner is back.
	PolicyLocal
	// PolicyAllow admits the check (fail open).
	PolicyAllow
	// PolicyDeny rejects the check (fail closed).
	PolicyDeny
	numPolicies = iota
)

var policyNames = [...]string{PolicyDefault: "default", PolicyLocal: "local", PolicyAllow: "allow", PolicyDeny: "deny"}

// String returns the policy's name, as ParsePolicy reads it.
func (p Policy) String() string {
	if !p.Valid() {
		return fmt.Sprintf("policy(%d)", uint8(p))
	}
	return policyNames[p]
}

// Valid reports whether p is one of the policies.
func (p Policy) Valid() bool { return p < numPolicies }

// ParsePolicy returns the policy named s: "local", "allow", "deny", or
// "default" or "" for PolicyDefault. Case and surrounding space do not
// matter. Other names return an error wrapping ErrInvalidPolicy.
func ParsePolicy(s string) (Policy, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	if n == "" {
		return PolicyDefault, nil
	}
	for p := PolicyDefault; p < numPolicies; p++ {
		if policyNames[p] == n {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown policy %q (want local, allow or deny)", ErrInvalidPolicy, s)
}

// CheckOption changes how one Check or CheckMany call is made.
type CheckOption func(*CheckOptions)

// CheckOptions are the settings of one call, as its CheckOptions leave
// them. Backends read them with Options.
type CheckOptions struct {
	// Unreachable is the policy for checks whose owner cannot be reached;
	// PolicyDefault leaves the backend's own.
	Unreachable Policy
}

// OnUnreachable sets the policy of this call's checks whose owner cannot
// be reached, instead of the backend's default.
func OnUnreachable(p Policy) CheckOption { return func(o *CheckOptions) { o.Unreachable = p } }

// Options applies opts in order and returns the settings they leave; nil
// options are skipped.
func Options(opts []CheckOption) CheckOptions {
	if len(opts) == 0 {
		// Most calls have none: the settings an option writes to are on
		// the heap (an option is a call through a pointer), these not.
		return CheckOptions{}
	}
	return applyOptions(opts)
}

func applyOptions(opts []CheckOption) CheckOptions {
	var o CheckOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}
