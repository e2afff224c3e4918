//go:build unix

package cluster

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on f without waiting; fs.ErrExist when
// another process holds it. The lock goes with the process or f's close.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return fs.ErrExist
	}
	return err
}
