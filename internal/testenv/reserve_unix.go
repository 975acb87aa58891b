//go:build unix

package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// reserved keeps open the files whose locks hold this process's ports.
var reserved []*os.File

// reservePort takes port p for this process among the processes of the
// machine that pick their ports here: an exclusive lock on a file named
// after it, in the temporary directory, which the kernel drops when the
// process exits. It reports false when another running process holds p;
// release lets p go again. Where no lock file can be made, it takes p
// unreserved: the check that a listener can bind p is then all there is.
func reservePort(p int) (release func(), ok bool) {
	dir := filepath.Join(os.TempDir(), "dislock-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return func() {}, true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return func() {}, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	reserved = append(reserved, f)
	return func() {
		for i, g := range reserved {
			if g == f {
				reserved = append(reserved[:i], reserved[i+1:]...)
				break
			}
		}
		f.Close()
	}, true
}
