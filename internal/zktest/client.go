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
	nc, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countConn{Conn: nc, c: c}, nil
}

type countConn struct {
	net.Conn
	c *Counter
}

func (cc *countConn) Write(p []byte) (int, error) {
	if len(p) >= 8 {
		if int32(binary.BigEndian.Uint32(p[4:8])) == -2 {
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
