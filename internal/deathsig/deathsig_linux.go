//go:build linux

// Package deathsig starts a process that the kernel kills when the process
// that started it dies.
package deathsig

import (
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with SIGKILL as its parent-death signal (keeping cmd's
// other process attributes) and returns a channel that receives the
// result of cmd.Wait once cmd has exited and been reaped, and is then
// closed.
//
// Linux sends the parent-death signal when the thread that forked the
// process exits, not when the process does, and the Go runtime ends a
// thread when a goroutine locked to it returns without unlocking it, so a
// goroutine of the program or of a library could retire the forking thread
// long before the program exits, and the kernel would kill a healthy
// process. So the fork happens on a thread locked to a goroutine that
// waits for the process and stays locked until it has been reaped: no
// other goroutine runs on that thread meanwhile, and the runtime never
// retires it.
func Start(cmd *exec.Cmd) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
		close(waited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}
