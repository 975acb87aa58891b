//go:build linux

package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the process that cmd starts get SIGKILL when the
// process that starts it dies, whatever ends it (a panic, a test's
// timeout, a kill): a test's server is never left running after its
// test process, holding its port and its data. Call it before cmd.Start;
// other fields of cmd.SysProcAttr are kept.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
