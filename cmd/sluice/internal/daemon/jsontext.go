package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// checkText refuses a JSON body whose strings encoding/json would decode
// to U+FFFD although the sender wrote something else: bytes of invalid
// UTF-8, and \u escapes of lone UTF-16 surrogates ("\ud800", a high
// surrogate not followed by an escaped low one, a low one alone). Either
// would let two distinct keys share one counter, and the gRPC API cannot
// carry them at all. The error names the field that holds the text, as a
// path ("key", "requests[2].name") when the body is JSON up to there, and
// the byte. Both scans are linear and allocate nothing unless they fail.
func checkText(data []byte) *itemError {
	at, what := -1, ""
	if !utf8.Valid(data) {
		at = invalidUTF8At(data)
		what = "is not valid UTF-8"
	} else if i := loneSurrogateAt(data); i >= 0 {
		at = i
		what = fmt.Sprintf("holds the escape %s, a lone UTF-16 surrogate, which is no character (it would decode as U+FFFD)", data[i:i+6])
	}
	if at < 0 {
		return nil
	}
	path, inName := fieldAt(data, at)
	e := &itemError{Code: "invalid_argument", Field: path}
	switch {
	case path == "" && inName:
		e.Message = fmt.Sprintf("a field name %s (byte %d)", what, at)
	case path == "":
		e.Message = fmt.Sprintf("the body %s (byte %d)", what, at)
	case inName:
		e.Message = fmt.Sprintf("%s: a field name %s (byte %d)", path, what, at)
	default:
		e.Message = fmt.Sprintf("%s %s (byte %d)", path, what, at)
		if code := fieldCodes[path[strings.LastIndexAny(path, ".]")+1:]]; code != "" {
			e.Code = code
		}
	}
	return e
}

// invalidUTF8At returns the offset of the first byte of data that is not
// valid UTF-8, or len(data).
func invalidUTF8At(data []byte) int {
	at := 0
	for at < len(data) {
		r, size := utf8.DecodeRune(data[at:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		at += size
	}
	return at
}

// loneSurrogateAt returns the offset of the first \u escape of data that
// is a lone UTF-16 surrogate, or -1. In JSON every backslash is in a
// string and starts an escape, so escapes are found without tracking
// strings: "\\u" is an escaped backslash and a 'u'. Malformed escapes are
// left to the JSON decoder.
func loneSurrogateAt(data []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(data[i:], '\\')
		if j < 0 || i+j+1 >= len(data) {
			return -1
		}
		i += j
		if data[i+1] != 'u' {
			i += 2 // a two-byte escape
			continue
		}
		u, ok := hex4(data[i+2:])
		switch {
		case !ok:
			i += 2
		case u >= 0xdc00 && u <= 0xdfff:
			return i // a low surrogate with no high one before it
		case u >= 0xd800 && u <= 0xdbff:
			if len(data) >= i+12 && data[i+6] == '\\' && data[i+7] == 'u' {
				if lo, ok := hex4(data[i+8:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
					i += 12 // a pair
					continue
				}
			}
			return i
		default:
			i += 6
		}
	}
}

// hex4 decodes the four hex digits that begin b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// fieldAt returns the path of the JSON value that holds byte at of data
// ("key", "requests[2].name"), or, with inName, the path of the object
// whose field name holds it ("" for the top level). It reads tokens up to
// that byte and returns "" when data is not JSON up to there. It is for
// error messages: it allocates per token.
func fieldAt(data []byte, at int) (path string, inName bool) {
	type frame struct {
		object  bool
		wantKey bool // in an object: the next string is a field name
		key     string
		index   int // in an array: the index of the next value
	}
	var stack []frame
	name := func(upto int) string {
		var b strings.Builder
		for _, f := range stack[:upto] {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
			}
		}
		return b.String()
	}
	// valueDone moves the innermost container past a value.
	valueDone := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].object {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].index++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		end := int(dec.InputOffset())
		top := len(stack) - 1
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, frame{object: tok == json.Delim('{'), wantKey: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			valueDone()
			continue
		}
		if top >= 0 && stack[top].object && stack[top].wantKey {
			stack[top].key, _ = tok.(string)
			stack[top].wantKey = false
			if at < end {
				return name(top), true
			}
			continue
		}
		if at < end {
			return name(len(stack)), false
		}
		valueDone()
	}
}
