package daemon

import (
	"encoding/json"
	"strings"
	"testing"
)

// checkText finds every text encoding/json would turn into U+FFFD, names
// the field that holds it, and lets every other escape through.
func TestCheckText(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantField string // "-": accepted
		wantCode  string
		wantAt    string // in the message
	}{
		{"plain", `{"key":"abc"}`, "-", "", ""},
		{"escapes", `{"key":"a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u20ac"}`, "-", "", ""},
		{"surrogate pair", `{"key":"\ud83d\ude00"}`, "-", "", ""},
		{"surrogate pair, upper case", `{"key":"\uD83D\uDE00"}`, "-", "", ""},
		{"U+FFFD written as such", `{"key":"\ufffd"}`, "-", "", ""},
		{"escaped backslash then u", `{"key":"\\ud800"}`, "-", "", ""},
		{"escaped backslashes then an escape", `{"key":"\\\\\u0041"}`, "-", "", ""},
		{"last code points before and after the surrogates", `{"key":"\ud7ff\ue000"}`, "-", "", ""},
		{"lone high surrogate", `{"key":"\ud800"}`, "key", "invalid_key", `\ud800`},
		{"high surrogate at the end of the string", `{"name":"n","key":"ab\udbff"}`, "key", "invalid_key", `\udbff`},
		{"high surrogate before a letter", `{"key":"\ud800x"}`, "key", "invalid_key", "byte 8"},
		{"high surrogate before another escape", `{"key":"\ud800\n"}`, "key", "invalid_key", "byte 8"},
		{"two high surrogates", `{"key":"\ud800\ud800"}`, "key", "invalid_key", "byte 8"},
		{"high surrogate before a low one unescaped", `{"key":"\ud800` + "\xed\xb0\x80" + `"}`, "key", "invalid_key", "UTF-8"},
		{"lone low surrogate", `{"name":"\udc00"}`, "name", "invalid_name", `\udc00`},
		{"low then high", `{"key":"\udc00\ud800"}`, "key", "invalid_key", "byte 8"},
		{"second of two pairs broken", `{"key":"\ud83d\ude00\ud83d"}`, "key", "invalid_key", "byte 20"},
		{"in another field", `{"algorithm":"\ud800"}`, "algorithm", "unknown_algorithm", ""},
		{"in an unknown field", `{"extra":"\ud800"}`, "extra", "invalid_argument", ""},
		{"in a field name", `{"k\ud800ey":"x"}`, "", "invalid_argument", "a field name"},
		{"in a batch item", `{"requests":[{"key":"a"},{"name":"n","key":"\udfff"}]}`, "requests[1].key", "invalid_key", "requests[1].key"},
		{"in a batch item's field name", `{"requests":[{},{"k\udfff":1}]}`, "requests[1]", "invalid_argument", "a field name"},
		{"at the top level", `"\ud800"`, "", "invalid_argument", "the body"},
		{"invalid UTF-8 in a key", `{"name":"n","key":"a` + "\xff" + `"}`, "key", "invalid_key", "not valid UTF-8 (byte 20)"},
		{"invalid UTF-8 in a batch item", `{"requests":[{"name":"` + "\xc3\x28" + `"}]}`, "requests[0].name", "invalid_name", "not valid UTF-8"},
		{"invalid UTF-8 outside JSON", `{"key":` + "\xff", "", "invalid_argument", "the body is not valid UTF-8"},
		{"surrogate in malformed JSON", `{"key" "\ud800"}`, "", "invalid_argument", "the body holds"},
		{"truncated escapes", `{"key":"\u12`, "-", "", ""},
		{"backslash at the end", `{"key":"\`, "-", "", ""},
		{"malformed escape", `{"key":"\uzzzz"}`, "-", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := checkText([]byte(tt.body))
			if tt.wantField == "-" {
				if e != nil {
					t.Fatalf("refused: %+v", e)
				}
				return
			}
			if e == nil {
				t.Fatal("accepted")
			}
			if e.Field != tt.wantField || e.Code != tt.wantCode || !strings.Contains(e.Message, tt.wantAt) {
				t.Errorf("error %+v, want field %q code %q and %q in the message", e, tt.wantField, tt.wantCode, tt.wantAt)
			}
		})
	}
}

// Whatever checkText accepts decodes to the same strings with or without
// U+FFFD: encoding/json replaces nothing in it.
func TestCheckTextAcceptsWhatDecodesExactly(t *testing.T) {
	for _, s := range []string{"a", "é", "\U0001F600", "\ufffd", "\x00", `\`, `"`} {
		b, err := json.Marshal(map[string]string{"key": s})
		if err != nil {
			t.Fatal(err)
		}
		if e := checkText(b); e != nil {
			t.Errorf("%q refused: %+v", s, e)
		}
	}
}

// The scans are linear and allocate nothing for a body they accept.
// AllocsPerRun counts the whole process's allocations, and nodes of
// earlier tests may still be winding down: the least of a few
// measurements counts.
func TestCheckTextAllocations(t *testing.T) {
	body := []byte(`{"name":"n","key":"` + strings.Repeat(`\ud83d\ude00\\u\"`, 1<<14) + `"}`)
	least := -1.0
	for range 10 {
		n := testing.AllocsPerRun(10, func() { checkText(body) })
		if least < 0 || n < least {
			least = n
		}
		if least == 0 {
			return
		}
	}
	t.Fatalf("%v allocations for an accepted body", least)
}
