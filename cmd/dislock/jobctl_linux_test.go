//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

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

// waitState waits until pid is in state want.
func waitState(t *testing.T, pid int, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for procState(t, pid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("process %d in state %s, want %s", pid, procState(t, pid), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SIGTSTP sent to dislock pauses the command, not dislock: the lease stays
// renewed past its TTL, so no other run starts; SIGCONT resumes the command.
func TestStopSignalKeepsLease(t *testing.T) {
	const ttl = 3 * time.Second
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		ready, stop, finished, second := filepath.Join(dir, "ready"), filepath.Join(dir, "stop"), filepath.Join(dir, "finished"), filepath.Join(dir, "second")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", fmt.Sprintf("RUN_LOCK_TTL_SECONDS=%d", int(ttl/time.Second)))
		p := start(t, env, urlVar, "sh", "-c", fmt.Sprintf("echo $$ > %s; while [ ! -e %s ]; do sleep 0.05; done; echo done > %s", ready, stop, finished))
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
		os.WriteFile(stop, nil, 0o600)
		p.cmd.Process.Signal(syscall.SIGCONT)
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d, want 0: %s", code, p.output())
		}
		if waitFile(t, finished, time.Second) != "done" {
			t.Fatal("the command did not finish after SIGCONT")
		}
	})
}
