package testenv

import (
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a loopback TCP port for a server a test starts (see
// LoopbackPorts).
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := LoopbackPorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// LoopbackPorts returns n distinct loopback TCP ports that were free a
// moment ago, for servers a test starts, stops and starts again on the
// same port. They come from outside the range the kernel hands out for the
// local end of outgoing connections (and for port 0) when the machine
// leaves room for that: a port from that range, free while its server is
// down, can be taken meanwhile by any connection of any process, and the
// restart then fails ("address already in use"). A port is never handed
// out twice on one machine while the process that got it runs: test
// processes (go test runs packages at once) reserve each port they take
// (reservePort), so that two of them never pick the same one in the moment
// between the check and the server's bind.
func LoopbackPorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := outsideEphemeral()
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := pickPort(lo, hi)
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
	reserved  []io.Closer // the locks of the ports this process took (reservePort)
)

// pickPort returns a port of [lo, hi) (or, when that is empty, one the
// kernel chooses) that a listener could bind just now and that no process
// has handed out: this one (portsUsed) or another that still runs
// (reservePort). The caller holds portsMu.
func pickPort(lo, hi int) (int, error) {
	if hi-lo >= 1000 {
		for range 200 {
			p := lo + rand.IntN(hi-lo)
			if !portsUsed[p] && take(p) {
				return p, nil
			}
		}
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portsUsed[p] && take(p) {
			return p, nil
		}
	}
}

// take reserves port p for this process and reports whether a listener
// could bind it just now; a port it cannot bind is let go again. The
// caller holds portsMu.
func take(p int) bool {
	lock, ok := reservePort(p)
	if !ok {
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return false
	}
	l.Close()
	portsUsed[p] = true
	if lock != nil {
		reserved = append(reserved, lock) // kept open: p stays this process's
	}
	return true
}

// outsideEphemeral returns the ports below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range) and above 10000, or those above it when
// that is the larger part; an empty range when the kernel's range is not
// known.
func outsideEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0
	}
	if below, above := first-10000, 65536-(last+1); below >= above {
		return 10000, first
	}
	return last + 1, 65536
}

// ClosedAddr returns a loopback host:port on which nothing listens: a dial
// is refused.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	return listen(t).Addr().String()
}

// listen returns a closed listener on a free loopback port.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return ln
}

// SilentServer accepts connections on a loopback port and never answers
// (a server that lost its quorum, a firewall that holds the packets); it
// returns its address. The listener and every connection close when the
// test ends.
func SilentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
