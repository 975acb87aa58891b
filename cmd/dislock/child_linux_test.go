//go:build linux

package main

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// The parent-death signal fires when the forking thread exits. A goroutine
// that starts the command from a thread it locked, then ends without
// unlocking it, makes the runtime end that thread: the command must survive.
func TestStartChildSurvivesThreadExit(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	type result struct {
		mainThread bool
		waited     <-chan struct{}
		err        error
	}
	res := make(chan result)
	held := make(chan struct{})
	defer close(held)
	var r result
	for range 10 {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if syscall.Gettid() == syscall.Getpid() {
				// The runtime never ends the main thread: keep it busy
				// until the test ends, and try again on another thread.
				res <- result{mainThread: true}
				<-held
				runtime.UnlockOSThread()
				return
			}
			waited, err := startChild(cmd, false)
			res <- result{waited: waited, err: err}
		}()
		if r = <-res; !r.mainThread {
			break
		}
	}
	if r.mainThread {
		t.Fatal("every attempt ran on the main thread")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() {
		cmd.Process.Kill()
		<-r.waited
	}()
	select {
	case <-r.waited:
		t.Fatalf("the command died after the starting goroutine's thread ended: %v", cmd.ProcessState)
	case <-time.After(500 * time.Millisecond):
	}
	if pgid, err := syscall.Getpgid(cmd.Process.Pid); err != nil || pgid != cmd.Process.Pid {
		t.Errorf("the command is not in its own process group: pgid %d, %v", pgid, err)
	}
}
