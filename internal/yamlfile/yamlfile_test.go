package yamlfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestErrorLine(t *testing.T) {
	for _, tc := range []struct {
		in, msg string
		line    int
	}{
		{"yaml: line 3: did not find expected key", "did not find expected key", 3},
		{"yaml: unmarshal errors", "unmarshal errors", 0},
		{"yaml: line x: odd", "line x: odd", 0},
		{"other", "other", 0},
	} {
		line, msg := ErrorLine(errors.New(tc.in))
		if line != tc.line || msg != tc.msg {
			t.Errorf("%q: %d %q, want %d %q", tc.in, line, msg, tc.line, tc.msg)
		}
	}
}

func TestRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, big, err := Read(path, 5); err != nil || big || string(data) != "12345" {
		t.Errorf("Read at the bound: %q %v %v", data, big, err)
	}
	if data, big, err := Read(path, 4); err != nil || !big || data != nil {
		t.Errorf("Read beyond the bound: %q %v %v", data, big, err)
	}
	if _, _, err := Read(path+"x", 4); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v", err)
	}
}
