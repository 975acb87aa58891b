//go:build !linux

package main

import (
	"os/exec"
	"syscall"
)

// startChild starts cmd in its own process group and returns a channel
// closed once the command has exited and been reaped.
//
// There is no parent-death signal here (it is set on Linux only): when
// dislock is killed outright (SIGKILL, the OOM killer) the command keeps
// running while its lease expires, and another instance may start. Run
// dislock under a supervisor that kills the whole process tree, or keep the
// command's own work fenced with DISLOCK_TOKEN.
func startChild(cmd *exec.Cmd, fg bool) (<-chan struct{}, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(waited)
	}()
	return waited, nil
}

// becomeSubreaper does nothing: there are no subreapers here, and a process
// that leaves the command's group (setsid) is not found.
func becomeSubreaper() {}

// strays finds nothing here.
func strays(pgid int) []int { return nil }

// foregroundTerminal reports false here: the command stays in the
// background of a terminal, and a command that reads the terminal is
// stopped by SIGTTIN (crontab jobs have no terminal).
func foregroundTerminal() bool { return false }

// reclaimTerminal does nothing here.
func reclaimTerminal() {}
