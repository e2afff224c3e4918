package limiter

import (
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// The state format: how a Snapshot crosses a process, to another node or to
// disk. It is typed per algorithm: each field is one of the state's named
// accessors (a bucket's level and levelTime, a window's start and counts,
// GCRA's TAT and interval, a log's entries), never the memory layout of
// Snapshot.Words, so the layout can change without changing the format.
//
// Version 3, every integer a Go varint (signed, zig-zag) or uvarint:
//
//	uvarint  format version: 1, 2 or 3
//	byte     algorithm: 1 token bucket, 2 leaky bucket, 3 fixed window,
//	         4 sliding window log, 5 sliding window counter, 6 GCRA
//	uvarint  length of Name, then Name's bytes
//	uvarint  length of Key, then Key's bytes
//	varint   ExpireAt (Unix ns)
//	uvarint  RateLimit, uvarint RateBurst, varint RatePeriod (ns): the
//	         rate the state was last charged under, all 0 when unknown
//	version 2 only:
//	  byte     RateCalendar: 0 none, 1 minute, 2 hour, 3 day, 4 week,
//	           5 month, 6 year (RatePeriod 0 with one)
//	  uvarint  length of RateLocation's IANA name, at most MaxZoneNameLen,
//	           then its bytes; 0 for UTC
//	version 3 only:
//	  varint   ResetAt, varint ResetUntil (Unix ns): a Reset's mark, both
//	           0 when none
//	then per algorithm (all zero for a mark alone, Snapshot.MarkOnly):
//	  buckets:  8 bytes level (IEEE 754 float64, little endian), varint levelTime
//	  fixed:    varint windowStart, uvarint windowHits
//	  counter:  varint windowStart, uvarint windowHits, uvarint prevWindowHits
//	  GCRA:     varint tat, uvarint interval
//	  log:      uvarint entries, then per entry varint At (the first) or
//	            uvarint At minus the previous At (the others), uvarint Hits
//
// Nothing may follow. Version 2 is version 3 without the reset mark's
// fields, version 1 version 2 without the calendar fields: it carries no
// calendar window's rate. A writer writes the oldest version that holds
// the snapshot: version 1 unless it carries a calendar window's rate
// (version 2) or a reset mark (version 3), so that readers of the older
// versions read every other state. A decoder
// reads every version from 1 up to its own and refuses a newer one, with
// ErrStateFormat, rather than guess.

// StateFormatVersion is the newest version of the state format, which
// Snapshot.AppendBinary writes for a reset mark and UnmarshalBinary reads
// with every older one.
const StateFormatVersion = 3

const (
	// stateFormatCalendar is the first version with the calendar fields.
	stateFormatCalendar = 2
	// stateFormatResetMark is the first version with the reset mark's.
	stateFormatResetMark = 3
)

// ErrStateFormat wraps every error of Snapshot.UnmarshalBinary: the bytes
// are not a state in a format version this package reads.
var ErrStateFormat = errors.New("limiter: bad state encoding")

// The algorithms' codes in the state format. They are part of the format:
// they never change, whatever the Algorithm constants become.
var algorithmCodes = [...]Algorithm{1: TokenBucket, 2: LeakyBucket, 3: FixedWindow, 4: SlidingWindowLog, 5: SlidingWindowCounter, 6: GCRA}

// The calendar units' codes in the state format, which never change
// either; 0 is none.
var calendarCodes = [...]Calendar{1: Minute, 2: Hour, 3: Day, 4: Week, 5: Month, 6: Year}

func calendarCode(c Calendar) byte {
	for code, u := range calendarCodes {
		if u == c && code > 0 {
			return byte(code)
		}
	}
	return 0
}

func algorithmCode(a Algorithm) byte {
	for c, b := range algorithmCodes {
		if b == a && c > 0 {
			return byte(c)
		}
	}
	return 0
}

var (
	_ encoding.BinaryAppender    = (*Snapshot)(nil)
	_ encoding.BinaryMarshaler   = (*Snapshot)(nil)
	_ encoding.BinaryUnmarshaler = (*Snapshot)(nil)
)

// MaxEncodedState bounds the length of one encoded state: a log of
// MaxSnapshotLog entries with the longest name, key and zone name, and a
// reset mark.
const MaxEncodedState = 64 + 5*binary.MaxVarintLen64 + MaxNameLen + MaxKeyLen + MaxZoneNameLen + MaxSnapshotLog*2*binary.MaxVarintLen64

// AppendBinary appends s in the state format to b: version 1 unless s
// carries a calendar window's rate (version 2) or a reset mark (version
// 3). s must be valid (Validate); an invalid one is an error.
func (s *Snapshot) AppendBinary(b []byte) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return b, err
	}
	version := uint64(1)
	if s.RateCalendar != NoCalendar {
		version = stateFormatCalendar
	}
	if s.HasResetMark() {
		version = stateFormatResetMark
	}
	b = binary.AppendUvarint(b, version)
	b = append(b, algorithmCode(s.Algorithm))
	b = binary.AppendUvarint(b, uint64(len(s.Name)))
	b = append(b, s.Name...)
	b = binary.AppendUvarint(b, uint64(len(s.Key)))
	b = append(b, s.Key...)
	b = binary.AppendVarint(b, s.ExpireAt)
	b = binary.AppendUvarint(b, uint64(s.RateLimit))
	b = binary.AppendUvarint(b, uint64(s.RateBurst))
	b = binary.AppendVarint(b, int64(s.RatePeriod))
	if version >= stateFormatCalendar {
		b = append(b, calendarCode(s.RateCalendar))
		zone := ""
		if s.RateLocation != nil && s.RateLocation != time.UTC {
			zone = s.RateLocation.String()
		}
		b = binary.AppendUvarint(b, uint64(len(zone)))
		b = append(b, zone...)
	}
	if version >= stateFormatResetMark {
		b = binary.AppendVarint(b, s.ResetAt)
		b = binary.AppendVarint(b, s.ResetUntil)
	}
	st := snapshotState(s)
	switch s.Algorithm {
	case TokenBucket, LeakyBucket:
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(st.level()))
		b = binary.AppendVarint(b, st.levelTime())
	case FixedWindow:
		b = binary.AppendVarint(b, st.windowStart())
		b = binary.AppendUvarint(b, uint64(st.windowHits()))
	case SlidingWindowCounter:
		b = binary.AppendVarint(b, st.windowStart())
		b = binary.AppendUvarint(b, uint64(st.windowHits()))
		b = binary.AppendUvarint(b, uint64(st.prevWindowHits()))
	case GCRA:
		b = binary.AppendVarint(b, st.tat())
		b = binary.AppendUvarint(b, uint64(st.interval()))
	case SlidingWindowLog:
		b = binary.AppendUvarint(b, uint64(len(s.Log)))
		for i, e := range s.Log {
			if i == 0 {
				b = binary.AppendVarint(b, e.At)
			} else {
				b = binary.AppendUvarint(b, uint64(e.At-s.Log[i-1].At))
			}
			b = binary.AppendUvarint(b, uint64(e.Hits))
		}
	}
	return b, nil
}

// MarshalBinary returns s in the state format (see AppendBinary).
func (s *Snapshot) MarshalBinary() ([]byte, error) { return s.AppendBinary(nil) }

// UnmarshalBinary sets s to the state data encodes, in a state format
// version this package reads, and validates it (Validate). Every error
// wraps ErrStateFormat, or ErrInvalidSnapshot for a well-formed state out
// of range, and names what is wrong; s is unchanged then. Lengths are
// checked before anything is allocated.
func (s *Snapshot) UnmarshalBinary(data []byte) error {
	if len(data) > MaxEncodedState {
		return fmt.Errorf("%w: %d bytes, more than the maximum %d", ErrStateFormat, len(data), MaxEncodedState)
	}
	d := stateDecoder{b: data}
	v := d.uvarint("format version")
	if d.err == nil && (v < 1 || v > StateFormatVersion) {
		return fmt.Errorf("%w: format version %d, this node reads versions 1 to %d", ErrStateFormat, v, StateFormatVersion)
	}
	var out Snapshot
	code := d.u8("algorithm")
	if d.err == nil {
		if int(code) >= len(algorithmCodes) || code == 0 {
			return fmt.Errorf("%w: unknown algorithm code %d", ErrStateFormat, code)
		}
		out.Algorithm = algorithmCodes[code]
	}
	out.Name = d.text("name", MaxNameLen)
	out.Key = d.text("key", MaxKeyLen)
	out.ExpireAt = d.varint("expiry")
	out.RateLimit = d.count("rate limit")
	out.RateBurst = d.count("rate burst")
	out.RatePeriod = time.Duration(d.varint("rate period"))
	if v >= stateFormatCalendar {
		code := d.u8("rate calendar")
		if d.err == nil && int(code) >= len(calendarCodes) {
			return fmt.Errorf("%w: unknown calendar unit code %d", ErrStateFormat, code)
		}
		out.RateCalendar = calendarCodes[code]
		zone := d.text("rate zone", MaxZoneNameLen)
		if d.err == nil {
			loc, err := LoadZone(zone)
			if err != nil {
				return fmt.Errorf("%w: rate zone: %w", ErrStateFormat, err)
			}
			out.RateLocation = loc
		}
	}
	if v >= stateFormatResetMark {
		out.ResetAt = d.varint("reset mark instant")
		out.ResetUntil = d.varint("reset mark end")
	}
	st := freshState(out.Algorithm)
	switch out.Algorithm {
	case TokenBucket, LeakyBucket:
		level := math.Float64frombits(d.fixed64("bucket level"))
		st.setLevel(level, d.varint("bucket level time"))
	case FixedWindow:
		st.setWindow(d.varint("window start"), d.count("window hits"))
	case SlidingWindowCounter:
		st.setWindow(d.varint("window start"), d.count("window hits"))
		st.setPrevWindowHits(d.count("previous window hits"))
	case GCRA:
		st.setTAT(d.varint("GCRA TAT"), d.count("GCRA interval"))
	case SlidingWindowLog:
		n := d.uvarint("log length")
		if d.err == nil && n > MaxSnapshotLog {
			return fmt.Errorf("%w: log of %d entries, more than %d", ErrStateFormat, n, MaxSnapshotLog)
		}
		if n > 0 && d.err == nil {
			out.Log = make([]LogEntry, n)
		}
		for i := range out.Log {
			if i == 0 {
				out.Log[i].At = d.varint("log entry time")
			} else {
				gap := d.count("log entry gap")
				if d.err == nil && out.Log[i-1].At > math.MaxInt64-gap {
					return fmt.Errorf("%w: log entry %d is past the largest time", ErrStateFormat, i)
				}
				out.Log[i].At = out.Log[i-1].At + gap
			}
			out.Log[i].Hits = d.count("log entry hits")
		}
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) > 0 {
		return fmt.Errorf("%w: %d bytes after the state", ErrStateFormat, len(d.b))
	}
	if out.Algorithm != SlidingWindowLog {
		out.Words = st.snapshotWords()
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*s = out
	return nil
}

// stateDecoder reads the fields of an encoded state; after the first error
// it reads zeros and keeps that error, which names the field.
type stateDecoder struct {
	b   []byte
	err error
}

func (d *stateDecoder) fail(field, what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrStateFormat, field, what)
	}
	d.b = nil
}

func (d *stateDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *stateDecoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a uvarint that must fit in an int64.
func (d *stateDecoder) count(field string) int64 {
	v := d.uvarint(field)
	if v > math.MaxInt64 {
		d.fail(field, fmt.Sprintf("%d does not fit in 63 bits", v))
		return 0
	}
	return int64(v)
}

func (d *stateDecoder) u8(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail(field, "truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *stateDecoder) fixed64(field string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(field, "truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// text reads a length-prefixed string of at most limit bytes.
func (d *stateDecoder) text(field string, limit int) string {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) {
		d.fail(field, fmt.Sprintf("%d bytes, more than the maximum %d", n, limit))
		return ""
	}
	if uint64(len(d.b)) < n {
		d.fail(field, "truncated")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
