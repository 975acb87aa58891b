package zktest

import (
	"encoding/binary"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/zklock"
)

// Counter counts the frames written on the connections it dials:
// requests, and pings (xid -2) apart.
type Counter struct{ Reqs, Pings atomic.Int64 }

// Dial is a zk.Dialer whose connections Counter counts.
func (c *Counter) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	return DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn { return &countConn{Conn: nc, c: c} })
}

// DialWrapped dials as net.DialTimeout does (the zk.Dialer a client uses by
// default) and gives the client the connection wrap makes of the one
// dialed: the body of a test's zk.Dialer that watches or steers what a
// session sends.
func DialWrapped(network, addr string, timeout time.Duration, wrap func(net.Conn) net.Conn) (net.Conn, error) {
	nc, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return wrap(nc), nil
}

// IsPing reports whether p, a frame a client writes (length, xid, …), is a
// ping: xid -2.
func IsPing(p []byte) bool {
	return len(p) >= 8 && int32(binary.BigEndian.Uint32(p[4:8])) == -2
}

type countConn struct {
	net.Conn
	c *Counter
}

func (cc *countConn) Write(p []byte) (int, error) {
	if len(p) >= 8 {
		if IsPing(p) {
			cc.c.Pings.Add(1)
		} else {
			cc.c.Reqs.Add(1)
		}
	}
	return cc.Conn.Write(p)
}

// Quiet is a zk.Logger that drops every line.
type Quiet struct{}

// Printf implements zk.Logger.
func (Quiet) Printf(string, ...any) {}

// Session opens a quiet session on the servers of connect (a zklock
// connect string) with the given session timeout, counted by cnt when not
// nil, waits until it is established and closes it when tb ends.
func Session(tb testing.TB, connect string, timeout time.Duration, cnt *Counter) *zk.Conn {
	tb.Helper()
	servers, _, err := zklock.ParseServers(connect)
	if err != nil {
		tb.Fatal(err)
	}
	dial := net.DialTimeout
	if cnt != nil {
		dial = cnt.Dial
	}
	c, _, err := zk.Connect(servers, timeout, zk.WithLogInfo(false), zk.WithLogger(Quiet{}), zk.WithDialer(dial))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	if _, _, err := c.Exists("/"); err != nil { // wait for the session
		tb.Fatal(err)
	}
	return c
}
