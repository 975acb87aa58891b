//go:build !linux

package testenv

import "os/exec"

// DieWithParent does nothing here: only Linux has a parent-death signal.
// A test stops its servers itself (Cleanup, TestMain).
func DieWithParent(*exec.Cmd) {}
