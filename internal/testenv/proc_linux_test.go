//go:build linux

package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDieWithParent: a server started with DieWithParent does not outlive
// the test process that started it, even when that process ends without
// stopping it (here: it exits at once, as after a panic or a timeout).
func TestDieWithParent(t *testing.T) {
	if os.Getenv("DISLOCK_TESTENV_PARENT") != "" {
		// The test process: start a long "server", say its pid, and die
		// without stopping it.
		cmd := exec.Command("sleep", "60")
		DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("server:", cmd.Process.Pid)
		os.Exit(0)
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestDieWithParent$", "-test.count=1")
	parent.Env = append(os.Environ(), "DISLOCK_TESTENV_PARENT=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	pid := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "server: "); ok {
			pid, _ = strconv.Atoi(s)
		}
	}
	if err := parent.Wait(); err != nil || pid == 0 {
		t.Fatalf("the test process: %v, server pid %d", err, pid)
	}
	// The server is the child of a process that has exited: the kernel
	// sends it SIGKILL, and init reaps it.
	gone := WaitFor(10*time.Second, func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
	if !gone {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("server %d still running 10s after its test process exited", pid)
	}
}
