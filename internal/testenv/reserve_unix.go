//go:build unix

package testenv

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// reservePort takes port p for this process among the processes of the
// machine that pick their ports here: an exclusive lock on a file named
// after it, in the temporary directory, which the kernel drops when the
// process exits or the file is closed. It reports false when another
// running process holds p. lock is the file to keep open while p is this
// process's; nil where no lock file can be made, which takes p unreserved
// (the check that a listener can bind p is then all there is).
func reservePort(p int) (lock io.Closer, ok bool) {
	dir := filepath.Join(os.TempDir(), "dislock-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}
