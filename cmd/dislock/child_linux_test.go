//go:build linux

package main

// The command as a child of dislock on Linux (child_linux.go): it runs in
// its own group, gets the terminal's foreground, and is the one the
// shell's job control (SIGTSTP, SIGCONT) pauses and resumes.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The command runs in a process group of its own, with SIGKILL as its
// parent-death signal (which survives the forking thread's end: see
// internal/deathsig).
func TestStartChildOwnGroup(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	waited, err := startChild(cmd, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		<-waited
	}()
	if pgid, err := syscall.Getpgid(cmd.Process.Pid); err != nil || pgid != cmd.Process.Pid {
		t.Errorf("the command is not in its own process group: pgid %d, %v", pgid, err)
	}
	if sig := cmd.SysProcAttr.Pdeathsig; sig != syscall.SIGKILL {
		t.Errorf("parent-death signal %v, want SIGKILL", sig)
	}
}

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

// procState is the state letter of pid in /proc (R, S, T, Z, …).
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("read the state of %d: %v", pid, err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[0]
}

// waitState waits until pid is in state want, for at most timeout of the
// time pid spends outside state D. A process in D (an uninterruptible wait,
// such as disk I/O on a busy machine) takes a stop or a kill only once the
// wait ends: that time does not count, up to a minute in all.
func waitState(t *testing.T, pid int, want string, timeout time.Duration) {
	t.Helper()
	const poll = 20 * time.Millisecond
	deadline, last := time.Now().Add(timeout), time.Now().Add(time.Minute)
	for st := procState(t, pid); st != want; st = procState(t, pid) {
		if st == "D" {
			deadline = deadline.Add(poll)
		}
		if now := time.Now(); now.After(deadline) || now.After(last) {
			t.Fatalf("process %d in state %s, want %s", pid, st, want)
		}
		time.Sleep(poll)
	}
}

// SIGTSTP sent to dislock pauses the command, not dislock: the lease stays
// renewed past its TTL, so no other run starts; SIGCONT resumes the command.
//
// The command waits without forking: it reads a line from a named pipe.
// (A shell that polls with sleep vforks it: a stop that catches the child
// between its vfork and its exec leaves the shell waiting for it in state
// D, not T, until SIGCONT.)
func TestStopSignalKeepsLease(t *testing.T) {
	const ttl = 3 * time.Second
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		ready, resume, finished, second := filepath.Join(dir, "ready"), filepath.Join(dir, "resume"), filepath.Join(dir, "finished"), filepath.Join(dir, "second")
		if err := syscall.Mkfifo(resume, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// A writer still waiting for the command to open the pipe
			// (the test failed before it did) gets a reader.
			if r, err := os.OpenFile(resume, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
				r.Close()
			}
		})
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", fmt.Sprintf("RUN_LOCK_TTL_SECONDS=%d", int(ttl/time.Second)))
		p := start(t, env, urlVar, "sh", "-c", fmt.Sprintf("echo $$ > %s; read line < %s; echo done > %s", ready, resume, finished))
		pid, err := strconv.Atoi(waitFile(t, ready, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		p.cmd.Process.Signal(syscall.SIGTSTP)
		waitState(t, pid, "T", 5*time.Second)
		if st := procState(t, p.cmd.Process.Pid); st == "T" {
			t.Fatal("dislock itself stopped on SIGTSTP")
		}
		// Well past the TTL: a stopped dislock would have let the lease expire.
		time.Sleep(2 * ttl)
		if st := procState(t, p.cmd.Process.Pid); st == "T" {
			t.Fatal("dislock itself stopped on SIGTSTP")
		}
		q := run(t, env, "--busy-exit-code", "9", urlVar, "touch", second)
		expectCode(t, q, 9)
		if exists(second) {
			t.Fatal("another run started while the command was paused")
		}
		p.cmd.Process.Signal(syscall.SIGCONT)
		// The command, resumed, opens the pipe: it gets its line.
		wrote := make(chan error, 1)
		go func() {
			w, err := os.OpenFile(resume, os.O_WRONLY, 0)
			if err == nil {
				_, err = w.WriteString("go\n")
				w.Close()
			}
			wrote <- err
		}()
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d, want 0: %s", code, p.output())
		}
		if err := <-wrote; err != nil {
			t.Fatalf("write the command its line: %v", err)
		}
		if waitFile(t, finished, time.Second) != "done" {
			t.Fatal("the command did not finish after SIGCONT")
		}
	})
}
