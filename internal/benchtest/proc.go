package benchtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcCPU returns the CPU time (user + system) of process pid, read from
// /proc (10 ms ticks); ok is false when it has no such process.
func ProcCPU(pid int) (d time.Duration, ok bool) {
	const tick = 10 * time.Millisecond // USER_HZ on Linux
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false // closed, or not on this machine
	}
	// Fields after the command name (which may hold spaces): state is
	// the 3rd field, utime the 14th and stime the 15th.
	_, rest, cut := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !cut || len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+s) * tick, true
}
