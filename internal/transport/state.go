package transport

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// MaxTransferStates is the most key states one Transfer carries.
const MaxTransferStates = 1000

// TransferReason says why key states are sent to a node.
type TransferReason uint8

const (
	// Handoff: the sender no longer owns the keys; the receiver does.
	Handoff TransferReason = iota + 1
	// Replica: the sender owns the keys; the receiver keeps a copy.
	Replica
	// HandoffDone carries no states: the sender has adopted a membership
	// and handed the receiver every key it decided that the membership
	// gives the receiver (see HandoverSink).
	HandoffDone
	// Reset: the sender owns the keys and has reset them; the receiver
	// drops its copies. The states carry only Name and Key, and the
	// reset's mark (Snapshot.MarkOnly) when the sender's store holds one.
	Reset
)

func (r TransferReason) String() string {
	switch r {
	case Handoff:
		return "handoff"
	case Replica:
		return "replica"
	case HandoffDone:
		return "handoff-done"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// StateSink takes key states sent to this node. The states have been
// converted but not validated: Store.Merge validates each. With reason
// Reset they carry only a name and a key, both valid: the keys whose
// copies to drop, and a valid reset mark alone (Snapshot.MarkOnly) when
// the sender sent one. An error refuses the states, none of them taken: the
// sender is answered codes.Unavailable and keeps them, to send again or
// elsewhere. Safe for concurrent use.
type StateSink interface {
	TakeStates(ctx context.Context, from string, reason TransferReason, states []limiter.Snapshot) (merged, rejected int, err error)
}

// HandoverSink is implemented by a StateSink that takes hand-over
// confirmations: the node named from has adopted the membership whose
// fingerprint is given, decides only the keys that membership gives it, and
// has delivered every key state it owed this node under it; wantBack says
// the sender still waits for this node's confirmation of that membership.
// A StateSink without it answers HandoffDone transfers as Unimplemented.
//
// cut is what the sender holds cut off with it; entries the receiver could
// not read (too long, or beyond MaxCutOff) are left out.
type HandoverSink interface {
	HandoffDone(ctx context.Context, from string, fingerprint uint64, wantBack bool, cut CutOff)
}

// MaxCutOff bounds the members and the newcomers one CutOff carries.
const MaxCutOff = 1024

// CutOff is what a node sending a hand-over confirmation holds cut off: a
// member it joined meanwhile never knew those members, and learns them so.
type CutOff struct {
	// Members are the members cut off, with their gRPC addresses.
	Members []CutOffMember
	// Newcomers are the members of the sender's ring that joined while
	// members were cut off: those cut off do not know them.
	Newcomers []string
}

// CutOffMember is a member cut off. Learned is set when the sender holds
// it only because another member's report named it.
type CutOffMember struct {
	Name, GRPCAddr string
	Learned        bool
}

// CutOffToProto sets the cut-off members and newcomers of in, a hand-over
// confirmation, to c's, at most MaxCutOff of each.
func CutOffToProto(c CutOff, in *pb.TransferRequest) {
	for _, m := range c.Members[:min(len(c.Members), MaxCutOff)] {
		in.CutOff = append(in.CutOff, &pb.CutOffMember{Name: m.Name, GrpcAddr: m.GRPCAddr, Learned: m.Learned})
	}
	in.Newcomers = c.Newcomers[:min(len(c.Newcomers), MaxCutOff)]
}

// cutOffFromProto reads the cut-off members of in, leaving out names
// empty or longer than limiter.MaxNameLen and addresses longer than 256
// bytes, and everything past MaxCutOff.
func cutOffFromProto(in *pb.TransferRequest) CutOff {
	var c CutOff
	for _, m := range in.CutOff {
		if len(c.Members) >= MaxCutOff {
			break
		}
		if m == nil || m.Name == "" || len(m.Name) > limiter.MaxNameLen || len(m.GrpcAddr) > maxAddrLen {
			continue
		}
		c.Members = append(c.Members, CutOffMember{Name: m.Name, GRPCAddr: m.GrpcAddr, Learned: m.Learned})
	}
	for _, name := range in.Newcomers {
		if len(c.Newcomers) >= MaxCutOff {
			break
		}
		if name == "" || len(name) > limiter.MaxNameLen {
			continue
		}
		c.Newcomers = append(c.Newcomers, name)
	}
	return c
}

// maxAddrLen bounds a cut-off member's address as read.
const maxAddrLen = 256

// Lease is a share of a key's remaining hits, granted by its owner.
type Lease struct {
	// Granted hits, already consumed on the owner; 0 when none were left.
	Granted int64
	// ExpiresAt is when the lease is void, on the owner's clock. Holders
	// go by ValidFor when it is set: ExpiresAt compares two hosts' clocks.
	ExpiresAt time.Time
	// ValidFor is how long the lease lasts from when the owner granted it.
	// The holder counts it from when it sent the request, on its own
	// clock, which ends the lease no later than the owner does, whatever
	// the offset between their clocks. 0 from owners that predate it.
	ValidFor time.Duration
	// Decision is the owner's for the hits taken (for one hit when none
	// were).
	Decision limiter.Decision
}

// LeaseReturner takes back unused hits of leases a Leaser granted: hits of
// the key of req (validated with Hits 0) that the node named from was
// granted and did not use; hits is at least 1. Safe for concurrent use.
type LeaseReturner interface {
	ReturnLease(ctx context.Context, from string, req limiter.Request, hits int64) error
}

// Leaser grants leases on the keys this node owns. req has been validated
// with Hits 0 and no behavior; want is at least 1 and ttl positive. Safe for
// concurrent use.
type Leaser interface {
	Lease(ctx context.Context, from string, req limiter.Request, want int64, ttl time.Duration) (Lease, error)
}

// WithStateSink serves Transfer with sink (Unimplemented without one).
func WithStateSink(sink StateSink) ServerOption {
	return func(s *serverConfig) { s.sink = sink }
}

// WithLeaser serves Lease with l (Unimplemented without one).
func WithLeaser(l Leaser) ServerOption {
	return func(s *serverConfig) { s.leaser = l }
}

// SnapshotToProto returns the wire form of s: its state format
// (limiter.Snapshot.AppendBinary) and, for members that read only the
// earlier form, its words and log. A calendar window's rate, which format
// version 1 does not hold, goes beside the state, written in version 1
// without it, so that members of the previous release read the state
// (see KeyState.rate_calendar). A reset's mark, which only format version
// 3 holds, goes beside the state too (KeyState.reset_at_unix_nano). The
// receiver refuses an invalid s: where the state format refuses it, it
// carries only the earlier form.
func SnapshotToProto(s *limiter.Snapshot) *pb.KeyState {
	inState := *s
	if s.RateCalendar != limiter.NoCalendar {
		inState.RateLimit, inState.RateBurst, inState.RateCalendar, inState.RateLocation = 0, 0, limiter.NoCalendar, nil
	}
	inState.ResetAt, inState.ResetUntil = 0, 0
	state, err := inState.MarshalBinary()
	if err != nil {
		state = nil
	}
	m := &pb.KeyState{
		State:              state,
		Name:               s.Name,
		Key:                s.Key,
		Algorithm:          algorithmToProto(s.Algorithm),
		ExpireAtUnixNano:   s.ExpireAt,
		Words:              []int64{s.Words[0], s.Words[1], s.Words[2]},
		RateLimit:          s.RateLimit,
		RateBurst:          s.RateBurst,
		RatePeriodNanos:    int64(s.RatePeriod),
		RateCalendar:       calendarToProto(s.RateCalendar),
		ResetAtUnixNano:    s.ResetAt,
		ResetUntilUnixNano: s.ResetUntil,
	}
	if s.RateLocation != nil && s.RateLocation != time.UTC {
		m.RateTimeZone = s.RateLocation.String()
	}
	if len(s.Log) > 0 {
		m.Log = make([]*pb.LogEntry, len(s.Log))
		for i, e := range s.Log {
			m.Log[i] = &pb.LogEntry{AtUnixNano: e.At, Hits: e.Hits}
		}
	}
	if st := s.Settle; st != nil {
		r := st.Request
		r.Hits, r.Behavior = 0, 0
		m.SettleRequest = RequestToProto(r)
		m.SettleParts = make([]*pb.SettlePart, len(st.Parts))
		for i, p := range st.Parts {
			m.SettleParts[i] = &pb.SettlePart{Origin: p.Origin, Gen: p.Gen, Hits: p.Hits}
		}
	}
	return m
}

// settlementFromProto reads m's settlement into s (limiter.Settlement),
// with c's zone cache, and validates it against s. A state without one is
// left as it is. Errors wrap ErrInvalidArgument or
// limiter.ErrInvalidSnapshot.
func (c *Codec) settlementFromProto(m *pb.KeyState, s *limiter.Snapshot) error {
	if len(m.SettleParts) == 0 && m.SettleRequest == nil {
		return nil
	}
	if len(m.SettleParts) > limiter.MaxSettleParts {
		return fmt.Errorf("%w: KeyState has %d settle_parts, more than %d", ErrInvalidArgument, len(m.SettleParts), limiter.MaxSettleParts)
	}
	if m.SettleRequest == nil || len(m.SettleParts) == 0 {
		return fmt.Errorf("%w: KeyState has settle_parts or settle_request without the other", ErrInvalidArgument)
	}
	req, err := c.RequestFromProto(m.SettleRequest)
	if err != nil {
		return fmt.Errorf("%w: settle_request: %w", limiter.ErrInvalidSnapshot, err)
	}
	req.Hits, req.Behavior = 0, 0
	st := &limiter.Settlement{Request: req, Parts: make([]limiter.SettlePart, len(m.SettleParts))}
	for i, p := range m.SettleParts {
		if p == nil {
			return fmt.Errorf("%w: settle_parts %d is nil", ErrInvalidArgument, i)
		}
		st.Parts[i] = limiter.SettlePart{Origin: p.Origin, Gen: p.Gen, Hits: p.Hits}
	}
	if err := st.Validate(s); err != nil {
		return err
	}
	s.Settle = st
	return nil
}

// SnapshotFromProto converts m and validates it (limiter.Snapshot.Validate).
// With m.State set it reads that (limiter.Snapshot.UnmarshalBinary), and
// its name, key and algorithm must match the fields beside it; without it,
// the earlier form of words and log. With m.RateCalendar set, the rate is
// the calendar window's of the rate fields, and a state must carry none of
// its own. With m.ResetAtUnixNano or m.ResetUntilUnixNano set, the mark
// is theirs, and a state must carry none of its own either. The settlement
// fields are not read (a Transfer's server reads them). Errors wrap
// ErrInvalidArgument, limiter.ErrStateFormat or limiter.ErrInvalidSnapshot.
func SnapshotFromProto(m *pb.KeyState) (limiter.Snapshot, error) {
	if m == nil {
		return limiter.Snapshot{}, fmt.Errorf("%w: nil KeyState", ErrInvalidArgument)
	}
	if len(m.State) == 0 {
		return snapshotFromWords(m)
	}
	var s limiter.Snapshot
	if err := s.UnmarshalBinary(m.State); err != nil {
		return limiter.Snapshot{}, err
	}
	if a, _ := algorithmFromProto(m.Algorithm); s.Name != m.Name || s.Key != m.Key || s.Algorithm != a {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState state is of %q/%q (%s), its fields say %q/%q (%s)",
			ErrInvalidArgument, s.Name, s.Key, s.Algorithm, m.Name, m.Key, a)
	}
	if m.ResetAtUnixNano != 0 || m.ResetUntilUnixNano != 0 {
		if s.HasResetMark() {
			return limiter.Snapshot{}, fmt.Errorf("%w: KeyState carries a reset mark in its state and another beside it", ErrInvalidArgument)
		}
		s.ResetAt, s.ResetUntil = m.ResetAtUnixNano, m.ResetUntilUnixNano
		if m.RateCalendar == pb.Calendar_CALENDAR_NONE && m.RateTimeZone == "" {
			if err := s.Validate(); err != nil {
				return limiter.Snapshot{}, err
			}
			return s, nil
		}
	}
	if m.RateCalendar == pb.Calendar_CALENDAR_NONE && m.RateTimeZone == "" {
		return s, nil
	}
	if s.RateLimit != 0 || s.RateBurst != 0 || s.RatePeriod != 0 || s.RateCalendar != limiter.NoCalendar {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState carries a rate in its state and a calendar rate beside it", ErrInvalidArgument)
	}
	if err := calendarRate(&s, m); err != nil {
		return limiter.Snapshot{}, err
	}
	if err := s.Validate(); err != nil {
		return limiter.Snapshot{}, err
	}
	return s, nil
}

// calendarRate sets the rate of s to the calendar window's rate of m's
// fields, when m.RateCalendar is set: a known unit, a zone name that
// limiter.LoadZone accepts (checked before it is loaded). The caller
// validates the rate with s.
func calendarRate(s *limiter.Snapshot, m *pb.KeyState) error {
	if m.RateCalendar == pb.Calendar_CALENDAR_NONE {
		if m.RateTimeZone != "" {
			return fmt.Errorf("%w: KeyState rate_time_zone without a rate_calendar", ErrInvalidArgument)
		}
		return nil
	}
	c, ok := calendarFromProto(m.RateCalendar)
	if !ok {
		return fmt.Errorf("%w: KeyState rate_calendar %d", ErrInvalidArgument, m.RateCalendar)
	}
	loc, err := limiter.LoadZone(m.RateTimeZone)
	if err != nil {
		return fmt.Errorf("%w: KeyState rate_time_zone: %w", ErrInvalidArgument, err)
	}
	s.RateLimit, s.RateBurst, s.RatePeriod = m.RateLimit, m.RateBurst, time.Duration(m.RatePeriodNanos)
	s.RateCalendar, s.RateLocation = c, loc
	return nil
}

// snapshotFromWords reads the earlier form of m: its words and log, the
// layout of limiter.Snapshot.Words that nodes without the state format
// send.
func snapshotFromWords(m *pb.KeyState) (limiter.Snapshot, error) {
	a, ok := algorithmFromProto(m.Algorithm)
	if !ok {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState algorithm %d", ErrInvalidArgument, m.Algorithm)
	}
	if len(m.Words) != 3 {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState has %d words, want 3", ErrInvalidArgument, len(m.Words))
	}
	if len(m.Log) > limiter.MaxSnapshotLog {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState log of %d entries, more than %d", ErrInvalidArgument, len(m.Log), limiter.MaxSnapshotLog)
	}
	s := limiter.Snapshot{
		Name:      m.Name,
		Key:       m.Key,
		Algorithm: a,
		ExpireAt:  m.ExpireAtUnixNano,
		Words:     [3]int64{m.Words[0], m.Words[1], m.Words[2]},
		RateLimit: m.RateLimit,
		RateBurst: m.RateBurst,
		// Validate refuses a period outside a request's bounds.
		RatePeriod: time.Duration(m.RatePeriodNanos),
		ResetAt:    m.ResetAtUnixNano,
		ResetUntil: m.ResetUntilUnixNano,
	}
	if err := calendarRate(&s, m); err != nil {
		return limiter.Snapshot{}, err
	}
	if len(m.Log) > 0 {
		s.Log = make([]limiter.LogEntry, len(m.Log))
		for i, e := range m.Log {
			if e == nil {
				return limiter.Snapshot{}, fmt.Errorf("%w: KeyState log entry %d is nil", ErrInvalidArgument, i)
			}
			s.Log[i] = limiter.LogEntry{At: e.AtUnixNano, Hits: e.Hits}
		}
	}
	if err := s.Validate(); err != nil {
		return limiter.Snapshot{}, err
	}
	return s, nil
}

// resetKeyFromProto reads the name and key of m, a key that its owner
// reset, and checks them (limiter.ValidateKey), with the reset's mark
// when m carries one (reset_at_unix_nano, reset_until_unix_nano, and
// the algorithm), validated as a mark alone.
func resetKeyFromProto(m *pb.KeyState) (limiter.Snapshot, error) {
	if m == nil {
		return limiter.Snapshot{}, fmt.Errorf("%w: nil KeyState", ErrInvalidArgument)
	}
	if err := limiter.ValidateKey(m.Name, m.Key); err != nil {
		return limiter.Snapshot{}, err
	}
	s := limiter.Snapshot{Name: m.Name, Key: m.Key}
	if m.ResetAtUnixNano == 0 && m.ResetUntilUnixNano == 0 {
		return s, nil
	}
	a, ok := algorithmFromProto(m.Algorithm)
	if !ok {
		return limiter.Snapshot{}, fmt.Errorf("%w: KeyState algorithm %d", ErrInvalidArgument, m.Algorithm)
	}
	s.Algorithm, s.ResetAt, s.ResetUntil = a, m.ResetAtUnixNano, m.ResetUntilUnixNano
	if err := s.Validate(); err != nil {
		return limiter.Snapshot{}, err
	}
	return s, nil
}

func reasonFromProto(r pb.TransferReason) (TransferReason, bool) {
	switch r {
	case pb.TransferReason_TRANSFER_REASON_HANDOFF:
		return Handoff, true
	case pb.TransferReason_TRANSFER_REASON_REPLICA:
		return Replica, true
	case pb.TransferReason_TRANSFER_REASON_HANDOFF_DONE:
		return HandoffDone, true
	case pb.TransferReason_TRANSFER_REASON_RESET:
		return Reset, true
	}
	return 0, false
}

// ReasonToProto returns the wire form of r.
func ReasonToProto(r TransferReason) pb.TransferReason {
	switch r {
	case Handoff:
		return pb.TransferReason_TRANSFER_REASON_HANDOFF
	case Replica:
		return pb.TransferReason_TRANSFER_REASON_REPLICA
	case HandoffDone:
		return pb.TransferReason_TRANSFER_REASON_HANDOFF_DONE
	case Reset:
		return pb.TransferReason_TRANSFER_REASON_RESET
	}
	return pb.TransferReason_TRANSFER_REASON_UNSPECIFIED
}

// Transfer converts the states of in, rejecting the invalid ones, and gives
// the rest to the sink.
func (p *peerServer) Transfer(ctx context.Context, in *pb.TransferRequest) (*pb.TransferResponse, error) {
	if err := p.authorize(ctx); err != nil {
		return nil, err
	}
	if p.cfg.sink == nil {
		return nil, status.Error(codes.Unimplemented, "transport: Transfer is not served")
	}
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: nil TransferRequest")
	}
	if len(in.States) > MaxTransferStates {
		return nil, status.Errorf(codes.InvalidArgument, "transport: transfer of %d states is more than the maximum %d", len(in.States), MaxTransferStates)
	}
	reason, ok := reasonFromProto(in.Reason)
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "transport: unknown transfer reason %d", in.Reason)
	}
	if reason == HandoffDone {
		hs, ok := p.cfg.sink.(HandoverSink)
		switch {
		case !ok:
			return nil, status.Error(codes.Unimplemented, "transport: hand-over confirmations are not served")
		case len(in.States) > 0:
			return nil, status.Errorf(codes.InvalidArgument, "transport: a hand-over confirmation carries %d states, want none", len(in.States))
		}
		hs.HandoffDone(ctx, cleanText(in.From, limiter.MaxNameLen), in.RingFingerprint, in.WantConfirmation, cutOffFromProto(in))
		return &pb.TransferResponse{}, nil
	}
	states := make([]limiter.Snapshot, 0, len(in.States))
	rejected := 0
	shift, shifted := p.transferShift(in.SentUnixNano)
	for _, m := range in.States {
		s, err := SnapshotFromProto(m)
		if reason == Reset {
			s, err = resetKeyFromProto(m)
			if err == nil && shifted && s.HasResetMark() {
				s.ShiftTimes(shift)
			}
		} else if err == nil {
			err = p.cfg.codec.settlementFromProto(m, &s)
			if err == nil && shifted {
				s.ShiftTimes(shift)
			}
			if err == nil && in.SentUnixNano > 0 {
				if p.cfg.codec.leaseGrantsFromProto(m, &s, p.clock().UnixNano()) != nil {
					s.Grants = nil // the state without them: fewer hits freed, never more
				}
			}
		}
		if err != nil {
			rejected++
			continue
		}
		states = append(states, s)
	}
	merged, bad, err := p.cfg.sink.TakeStates(ctx, cleanText(in.From, limiter.MaxNameLen), reason, states)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "transport: key states refused: %v", err)
	}
	return &pb.TransferResponse{Merged: int32(merged), Rejected: int32(rejected + bad)}, nil
}

// transferShift is how far to move the times of states sent at sent, on
// the sender's clock, to read them on this server's (WithClock): this
// clock's reading now less sent, which is the offset between the clocks
// plus the transit, so the states read as written later than they were,
// never earlier. ok is false without a stamp (a sender that predates it)
// or beyond limiter.MaxClockSkew, where the states are read as they are
// (and the store bounds their times).
func (p *peerServer) transferShift(sent int64) (d time.Duration, ok bool) {
	if sent <= 0 {
		return 0, false
	}
	d = time.Duration(p.clock().UnixNano() - sent)
	if d > limiter.MaxClockSkew || d < -limiter.MaxClockSkew {
		return 0, false
	}
	return d, true
}

// MaxLeaseTTL bounds the TTL a Lease may ask for.
const MaxLeaseTTL = time.Minute

// Lease validates in and asks the leaser for a lease.
func (p *peerServer) Lease(ctx context.Context, in *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	if err := p.authorize(ctx); err != nil {
		return nil, err
	}
	if p.cfg.leaser == nil {
		return nil, status.Error(codes.Unimplemented, "transport: Lease is not served")
	}
	if in == nil || in.Request == nil {
		return nil, status.Error(codes.InvalidArgument, "transport: LeaseRequest without a request")
	}
	req, err := p.cfg.codec.RequestFromProto(in.Request)
	if err == nil {
		req.Hits, req.Behavior = 0, 0
		req.Charged = limiter.Window{}
		err = req.Validate()
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "transport: lease request: %v", err)
	}
	if in.GiveBack != 0 {
		lr, ok := p.cfg.leaser.(LeaseReturner)
		switch {
		case !ok:
			return nil, status.Error(codes.Unimplemented, "transport: lease returns are not served")
		case in.Want != 0:
			return nil, status.Errorf(codes.InvalidArgument, "transport: a lease return asks for %d hits, want 0", in.Want)
		case in.GiveBack < 1 || in.GiveBack > limiter.MaxLimit:
			return nil, status.Errorf(codes.InvalidArgument, "transport: lease give_back %d is outside [1, %d]", in.GiveBack, int64(limiter.MaxLimit))
		}
		if err := lr.ReturnLease(ctx, cleanText(in.From, limiter.MaxNameLen), req, in.GiveBack); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "transport: lease return: %v", err)
		}
		return &pb.LeaseResponse{Decision: DecisionToProto(limiter.Decision{Limit: req.Limit})}, nil
	}
	if in.Want < 1 || in.Want > limiter.MaxLimit {
		return nil, status.Errorf(codes.InvalidArgument, "transport: lease want %d is outside [1, %d]", in.Want, int64(limiter.MaxLimit))
	}
	if in.TtlNanos < 1 || in.TtlNanos > int64(MaxLeaseTTL) {
		return nil, status.Errorf(codes.InvalidArgument, "transport: lease ttl %v is outside (0, %v]", time.Duration(in.TtlNanos), MaxLeaseTTL)
	}
	l, err := p.cfg.leaser.Lease(ctx, cleanText(in.From, limiter.MaxNameLen), req, in.Want, time.Duration(in.TtlNanos))
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "transport: lease: %v", err)
	}
	return &pb.LeaseResponse{
		Granted:           l.Granted,
		ExpiresAtUnixNano: unixNano(l.ExpiresAt),
		ValidForNanos:     int64(l.ValidFor),
		Decision:          DecisionToProto(l.Decision),
	}, nil
}

// LeaseFromProto converts and checks a LeaseResponse to a request for want
// hits: granted in [0, want], a decision that DecisionFromProto accepts.
func LeaseFromProto(m *pb.LeaseResponse, want int64) (Lease, error) {
	if m == nil {
		return Lease{}, fmt.Errorf("%w: nil LeaseResponse", ErrMalformedResponse)
	}
	if m.Granted < 0 || m.Granted > want {
		return Lease{}, fmt.Errorf("%w: lease granted %d of %d", ErrMalformedResponse, m.Granted, want)
	}
	if m.Granted > 0 && m.ExpiresAtUnixNano <= 0 && m.ValidForNanos <= 0 {
		return Lease{}, fmt.Errorf("%w: lease of %d hits without an expiry", ErrMalformedResponse, m.Granted)
	}
	if m.ValidForNanos < 0 || m.ValidForNanos > int64(MaxLeaseTTL) {
		return Lease{}, fmt.Errorf("%w: lease valid for %v, outside [0, %v]", ErrMalformedResponse, time.Duration(m.ValidForNanos), MaxLeaseTTL)
	}
	d, err := DecisionFromProto(m.Decision)
	if err != nil {
		return Lease{}, err
	}
	l := Lease{Granted: m.Granted, Decision: d, ValidFor: time.Duration(m.ValidForNanos)}
	if m.ExpiresAtUnixNano > 0 {
		l.ExpiresAt = time.Unix(0, m.ExpiresAtUnixNano)
	}
	return l, nil
}
