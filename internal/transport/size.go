package transport

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/limiter"
)

// MaxTransferLogEntries is the most sliding window log entries one Transfer
// carries over all its states: 16 full logs (limiter.MaxSnapshotLog). A log
// entry takes 2 bytes on the wire at the least and about 100 bytes once
// decoded (1.3 MB of empty entries would decode to 68 MB). A
// Transfer with more is refused with InvalidArgument before it is decoded;
// TransferSplit keeps below it.
const MaxTransferLogEntries = 16 * limiter.MaxSnapshotLog

// Upper bounds on the encoded size of the messages, from the bounds of their
// fields; MaxMessageSize is the largest. Every field number is below 16
// (a 1-byte tag) but RateLimitRequest's charged_end_unix_nano and
// KeyState's reset_until_unix_nano (16, a 2-byte tag), and every string and item is shorter than 16 KiB (a
// length of at most 2 bytes). A test encodes the largest of each message
// and checks it against these.
const (
	varintField = 1 + binary.MaxVarintLen64 // any integer, enum or bool
	lenField    = 1 + 2                     // the tag and length of a string or an item

	// A RateLimitRequest with name, key and time_zone at their longest,
	// a traceparent and every number at its longest varint (the last,
	// charged_end_unix_nano, with a 2-byte tag).
	maxRequestItem = lenField + limiter.MaxNameLen + lenField + limiter.MaxKeyLen +
		lenField + MaxTimeZoneLen + lenField + TraceParentLen + 12*varintField + 1
	maxPeerRequest  = lenField + limiter.MaxNameLen + MaxBatchItems*(lenField+maxRequestItem) + varintField
	maxBatchRequest = MaxBatchItems * (lenField + maxRequestItem)

	// A RateLimitResponse with an owner named as long as a limit and the
	// longest error message.
	maxResponseItem  = 10*varintField + lenField + limiter.MaxNameLen + lenField + MaxErrorMessageLen
	maxPeerResponse  = MaxBatchItems*(lenField+maxResponseItem) + varintField + lenField + limiter.MaxNameLen
	maxBatchResponse = MaxBatchItems * (lenField + maxResponseItem)

	// A RulesCheckRequest with every string at its longest (ip as long
	// as a name: longer is no address) and as many headers and
	// descriptors as it may carry; a RulesCheckResponse listing as many
	// rules as it may, each with its name, key and owner at their longest.
	maxRulesEntry   = lenField + limiter.MaxNameLen + lenField + limiter.MaxKeyLen
	maxRulesRequest = 2*(lenField+limiter.MaxKeyLen) + 2*(lenField+limiter.MaxNameLen) +
		2*MaxRulesEntries*(lenField+maxRulesEntry) + varintField
	maxRuleResult    = 2*(lenField+limiter.MaxNameLen) + lenField + limiter.MaxKeyLen + 8*varintField
	maxRulesResponse = MaxRulesResults*(lenField+maxRuleResult) + 4*varintField

	// The fields of a TransferRequest but its states (from, reason,
	// ring_fingerprint), and one log entry of a KeyState.
	transferOverhead = lenField + limiter.MaxNameLen + varintField + 1 + 8
	maxLogEntry      = 2 + 2*varintField
)

// TransferSplit returns how many of the first states one Transfer carries:
// as many as fit in MaxTransferStates states, MaxTransferLogEntries log
// entries in all and MaxMessageSize bytes, and at least one when there are
// any (one state with a log of limiter.MaxSnapshotLog entries takes about
// 200 KB: the log goes in both the state format and the earlier form). The
// peer package sends states in calls of this size.
func TransferSplit(states []limiter.Snapshot) int {
	size, logs := transferOverhead, 0
	for i := range states {
		size += stateSize(&states[i])
		logs += len(states[i].Log)
		if i > 0 && (i >= MaxTransferStates || size > MaxMessageSize || logs > MaxTransferLogEntries) {
			return i
		}
	}
	return len(states)
}

// stateSize bounds the size of s as a state of a TransferRequest (field,
// length and KeyState).
func stateSize(s *limiter.Snapshot) int {
	n := 1 + protowire.SizeBytes(len(s.Name)) + 1 + protowire.SizeBytes(len(s.Key)) +
		8*varintField + 1 + // algorithm, expire_at_unix_nano, rate_limit, rate_burst, rate_period_nanos, rate_calendar, reset_at_unix_nano, reset_until_unix_nano (a 2-byte tag)
		lenField + len(s.Words)*binary.MaxVarintLen64 + // words, packed
		len(s.Log)*maxLogEntry +
		stateFieldSize(s) +
		settleSize(s.Settle) +
		grantsSize(s.Grants)
	if s.RateLocation != nil {
		n += lenField + len(s.RateLocation.String()) // rate_time_zone
	}
	return 1 + protowire.SizeBytes(n)
}

// settleSize bounds the size of a KeyState's settlement fields: the
// request, and per part its origin and two integers.
func settleSize(st *limiter.Settlement) int {
	if st == nil {
		return 0
	}
	n := lenField + maxRequestItem
	for _, p := range st.Parts {
		n += lenField + 1 + protowire.SizeBytes(len(p.Origin)) + 2*varintField
	}
	return n
}

// grantsSize bounds the size of a KeyState's lease grants (field 17, a
// 2-byte tag): per grant its holder, request and four integers.
func grantsSize(gs []limiter.LeaseGrant) int {
	n := 0
	for _, g := range gs {
		n += 2 + 2 + 1 + protowire.SizeBytes(len(g.Holder)) + lenField + maxRequestItem + 4*varintField
	}
	return n
}

// stateFieldSize bounds the size of s's state field (the state format,
// limiter.Snapshot.AppendBinary): its tag and length, the version and
// algorithm, name and key with their lengths, at most four integers and
// two per log entry.
func stateFieldSize(s *limiter.Snapshot) int {
	return 1 + 3 + 2 + 2*2 + len(s.Name) + len(s.Key) + (4+2*len(s.Log))*binary.MaxVarintLen64
}
