package ring

import "errors"

// Errors returned by this package. They are wrapped with detail; test for
// them with errors.Is.
var (
	// ErrInvalidConfig reports a Config field outside its allowed range.
	ErrInvalidConfig = errors.New("ring: invalid config")
	// ErrEmptyName reports a Member whose Name is empty.
	ErrEmptyName = errors.New("ring: member has an empty Name")
	// ErrDuplicateName reports two members with the same Name.
	ErrDuplicateName = errors.New("ring: duplicate member Name")
	// ErrTooManyMembers reports more members than partitions: some member
	// would own nothing, and the bounded-load assignment cannot be built.
	ErrTooManyMembers = errors.New("ring: more members than partitions")
	// ErrRebuild reports that building the partition table failed
	// unexpectedly (a panic inside the consistent hashing library). The ring
	// keeps its previous members.
	ErrRebuild = errors.New("ring: rebuilding the partition table failed")
)
