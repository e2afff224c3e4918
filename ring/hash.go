package ring

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// RouteHash is the 64-bit hash that places the key of the limit called name
// on the ring: xxhash (seed 0) of the name's length as 8 little-endian bytes,
// then the name, then the key. The length prefix keeps the join unambiguous:
// ("a", "bc") and ("ab", "c") hash differently. It allocates nothing.
//
// Every node must compute the same value, so this encoding is part of the
// wire contract of a cluster and must not change.
func RouteHash(name, key string) uint64 {
	if n := 8 + len(name) + len(key); n <= routeBufLen {
		// Short inputs, the common case, are hashed in one call from a
		// stack buffer, faster than streaming through a Digest.
		var buf [routeBufLen]byte
		binary.LittleEndian.PutUint64(buf[:8], uint64(len(name)))
		copy(buf[8+copy(buf[8:], name):], key)
		return xxhash.Sum64(buf[:n])
	}
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(name)))
	var d xxhash.Digest
	d.Reset()
	d.Write(prefix[:])
	d.WriteString(name)
	d.WriteString(key)
	return d.Sum64()
}

// routeBufLen is the longest encoded (name, key) RouteHash hashes from a
// stack buffer.
const routeBufLen = 64

// xxHasher is the consistent.Hasher the ring hands to the consistent
// hashing library.
type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }
