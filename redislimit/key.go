package redislimit

import "strings"

// keyEscaper escapes what would end a hash tag early ('{', '}'), the
// separator ':' and the escape '%' itself, so that distinct (name, key)
// pairs make distinct Redis keys.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", ":", "%3A")

// Key returns the Redis key of a limit's client key: prefix, then name and
// key inside one hash tag, "{name:key}", escaped. Redis Cluster places a
// key by its hash tag, so every key of a decision is in one slot, and the
// limit keys spread over every shard.
func Key(prefix, name, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(name) + len(key) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	keyEscaper.WriteString(&b, name)
	b.WriteByte(':')
	keyEscaper.WriteString(&b, key)
	b.WriteByte('}')
	return b.String()
}
