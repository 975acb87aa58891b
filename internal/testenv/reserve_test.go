//go:build unix

package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestPortsReservedAcrossProcesses: a port this process handed out cannot
// be handed out by another test process while this one runs (two
// packages' tests that pick ports at once would otherwise race for the
// same one, and one server's bind fails); a port it let go can.
func TestPortsReservedAcrossProcesses(t *testing.T) {
	if arg := os.Getenv("DISLOCK_TESTENV_RESERVE"); arg != "" {
		// The other process: try each port and say which it got.
		var out []string
		for _, f := range strings.Split(arg, ",") {
			p, _ := strconv.Atoi(f)
			_, ok := reservePort(p)
			out = append(out, fmt.Sprintf("%d=%v", p, ok))
		}
		fmt.Println("reserved:", strings.Join(out, " "))
		return
	}
	ports, err := LoopbackPorts(3)
	if err != nil {
		t.Fatal(err)
	}
	portsMu.Lock()
	var spare int
	for p := ports[2] + 1; p < 65536 && spare == 0; p++ {
		if lock, ok := reservePort(p); ok && !portsUsed[p] {
			if lock != nil {
				lock.Close() // reserved once, let go again
			}
			spare = p
		}
	}
	portsMu.Unlock()
	var args []string
	for _, p := range append(ports, spare) {
		args = append(args, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPortsReservedAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DISLOCK_TESTENV_RESERVE="+strings.Join(args, ","))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the other process: %v\n%s", err, b)
	}
	var want []string
	for _, p := range ports {
		want = append(want, fmt.Sprintf("%d=false", p))
	}
	want = append(want, fmt.Sprintf("%d=true", spare))
	if line := "reserved: " + strings.Join(want, " "); !strings.Contains(string(b), line) {
		t.Fatalf("the other process said:\n%s\nwant the line %q: this process's ports held, the one it let go free", b, line)
	}
}
