package testenv

import (
	"net"
	"testing"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return listen(t).Addr().(*net.TCPAddr).Port
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
