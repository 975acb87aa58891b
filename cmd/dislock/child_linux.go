//go:build linux

package main

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"unsafe"

	"github.com/dislock/dislock/internal/deathsig"
)

// startChild starts cmd in its own process group, with SIGKILL as its
// parent-death signal, and returns a channel closed once the command has
// exited and been reaped.
//
// If dislock is killed outright (SIGKILL, the OOM killer), nothing it runs
// could stop the command, and the lease would expire under a command that
// still works. The parent-death signal lets the kernel kill the command
// instead. It goes to the command only, not to the rest of its process
// group: a shell that execs its last command passes it on, but processes the
// command started in the background survive (see the package doc). The
// fork happens on a thread that no goroutine can retire meanwhile (see
// deathsig.Start).
//
// With fg, the command's group becomes the foreground group of the terminal
// on standard input (see foregroundTerminal).
func startChild(cmd *exec.Cmd, fg bool) (<-chan struct{}, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Foreground: fg, Ctty: 0}
	waited, err := deathsig.Start(cmd)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		<-waited
		close(done)
	}()
	return done, nil
}

// becomeSubreaper makes dislock the reaper of the command's orphans: a
// process that leaves the command's group (setsid) and whose parent exits
// is reparented to dislock rather than to init, so that strays can find it
// before the locks are released.
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// strays returns the live descendants of dislock outside the process group
// pgid (processes that left the command's group, with setsid or setpgid),
// and reaps those of dislock's children that have exited, other than the
// command itself (its own waiter reaps it).
func strays(pgid int) []int {
	procs := readProcs()
	self := os.Getpid()
	children := map[int][]procStat{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []int
	queue := []int{self}
	for len(queue) > 0 {
		parent := queue[0]
		queue = queue[1:]
		for _, p := range children[parent] {
			queue = append(queue, p.pid)
			switch {
			case p.zombie():
				if parent == self && p.pid != pgid {
					var ws syscall.WaitStatus
					syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
				}
			case p.pgrp != pgid:
				out = append(out, p.pid)
			}
		}
	}
	return out
}

// foregroundTerminal reports whether standard input is a terminal whose
// foreground process group is dislock's: dislock was started in the
// foreground of an interactive shell. The command then gets the terminal's
// foreground, as it would without dislock: in a group of its own in the
// background, reading the terminal would stop it with SIGTTIN (and Ctrl-C
// would not reach it) while dislock kept renewing its lease.
func foregroundTerminal() bool {
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return false // not a terminal, or not ours
	}
	return int(pgrp) == syscall.Getpgrp()
}

// reclaimTerminal gives the terminal's foreground back to dislock's group
// once the command's group is gone, as a shell does when a job ends.
// SIGTTOU, which the kernel sends to a background group that sets the
// foreground, is ignored meanwhile; the caller catches it again.
func reclaimTerminal() {
	signal.Ignore(syscall.SIGTTOU)
	pgrp := int32(syscall.Getpgrp())
	syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&pgrp)))
}
