//go:build linux

package deathsig_test

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/internal/deathsig"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSurvivesThreadExit: a process started from a goroutine that locked
// its thread and ends without unlocking it (the runtime then ends the
// thread, which fires a parent-death signal set on a fork from it) keeps
// running.
func TestSurvivesThreadExit(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	type result struct {
		waited <-chan error
		err    error
	}
	res := make(chan result)
	held := make(chan struct{})
	defer close(held)
	mainThread := errors.New("main thread")
	var r result
	for range 10 {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if syscall.Gettid() == syscall.Getpid() {
				// The runtime never ends the main thread: keep it busy
				// until the test ends, and try again on another thread.
				res <- result{err: mainThread}
				<-held
				runtime.UnlockOSThread()
				return
			}
			waited, err := deathsig.Start(cmd)
			res <- result{waited, err}
		}()
		if r = <-res; r.err != mainThread {
			break
		}
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() {
		cmd.Process.Kill()
		<-r.waited
	}()
	select {
	case err := <-r.waited:
		t.Fatalf("the process died after the starting goroutine's thread ended: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL {
		t.Errorf("parent-death signal %v, want SIGKILL", cmd.SysProcAttr.Pdeathsig)
	}
}

// TestWaitResult: the channel gives cmd.Wait's result, then is closed.
func TestWaitResult(t *testing.T) {
	waited, err := deathsig.Start(exec.Command("sh", "-c", "exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := <-waited; !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("wait: %v, want exit status 3", err)
	}
	if _, ok := <-waited; ok {
		t.Fatal("the channel gave a second result")
	}
	if _, err := deathsig.Start(exec.Command("/nonexistent/program")); err == nil {
		t.Fatal("a program that does not exist started")
	}
}
