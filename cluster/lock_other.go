//go:build !unix

package cluster

import (
	"errors"
	"os"
)

// lockFile is not implemented here: Config.DataDir needs a Unix system.
func lockFile(*os.File) error {
	return errors.New("Config.DataDir needs a Unix system (flock)")
}
