// Package yamlfile holds what the readers of sluice's YAML files share:
// reading a file up to a bound, and the line of a YAML syntax error.
//
// It imports only the standard library.
package yamlfile

import (
	"io"
	"os"
	"strconv"
	"strings"
)

// Read reads the file at path, up to max bytes: tooLarge reports a file
// longer than max, of which it reads no more than one byte beyond max.
func Read(path string, max int64) (data []byte, tooLarge bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	data, err = io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > max {
		return nil, true, nil
	}
	return data, false, nil
}

// ErrorLine splits the text of a YAML decoder's error ("yaml: line 3: did
// not find...") into its line (0 when it names none) and the rest.
func ErrorLine(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return 0, msg
	}
	num, text, ok := strings.Cut(rest, ": ")
	n, err := strconv.Atoi(num)
	if !ok || err != nil {
		return 0, msg
	}
	return n, text
}
