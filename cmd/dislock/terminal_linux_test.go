//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY opens a pseudo-terminal: its controller and its terminal end.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return ptmx, tty
}

// Run from an interactive shell (in the foreground of a terminal), the
// command gets the terminal's foreground: it reads the terminal instead of
// being stopped by SIGTTIN while dislock keeps renewing.
func TestCommandReadsTheTerminal(t *testing.T) {
	t.Parallel()
	f := redisFixture(t)
	ptmx, tty := openPTY(t)
	got := filepath.Join(t.TempDir(), "got")
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease")
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(binary, urlVar, "sh", "-c", "read line; echo $line > "+got)
	p.cmd.Env = env
	p.cmd.Stdin = tty
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// A session of its own with the terminal as its controlling terminal,
	// and dislock's group in its foreground, as a login shell leaves it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	startProc(t, p)
	go func() {
		// The terminal's line discipline delivers the line once the
		// command reads; a read that is stopped never sees it.
		ptmx.Write([]byte("hello\n"))
	}()
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d: %s", code, p.output())
	}
	if b, _ := os.ReadFile(got); string(b) != "hello\n" {
		t.Fatalf("the command read %q from the terminal", b)
	}
}
