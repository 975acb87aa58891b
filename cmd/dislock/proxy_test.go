package main

// The TCP proxies the outage tests put between dislock and its store: one
// that cuts every connection, one that stalls the replies on some.

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// cutProxy forwards TCP connections to target until cut, which closes the
// listener and every connection.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{}
	p.ln = forward(t, target, func(c, s net.Conn) {
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { io.Copy(s, c); s.Close() }()
		go func() { io.Copy(c, s); c.Close() }()
	})
	t.Cleanup(p.cut)
	return p
}

// forward listens on a loopback port and, for every connection to it, dials
// target and hands both connections to serve (the client's first), until
// the listener is closed.
func forward(t *testing.T, target string, serve func(client, server net.Conn)) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			serve(c, s)
		}
	}()
	return ln
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// stallProxy forwards TCP connections to target. stall holds back every
// byte the server sends on the connections open at that moment, while
// requests still reach the server and new connections work normally: a
// store that is reachable but answers some connections too slowly.
type stallProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []*stallConn
	closed bool
}

type stallConn struct {
	client, server net.Conn
	gate           chan struct{} // non-nil while stalled; closed to let replies through
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	p := &stallProxy{}
	p.ln = forward(t, target, func(c, s net.Conn) {
		sc := &stallConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, sc)
		p.mu.Unlock()
		go func() {
			io.Copy(s, c)
			// The client hung up: nothing waits for its replies.
			p.open(sc)
			s.Close()
		}()
		go func() { p.replies(sc); c.Close() }()
	})
	t.Cleanup(p.close)
	return p
}

// replies copies the server's bytes to the client, holding them back while
// the connection is stalled. When the server hangs up, the client's
// connection is closed at once, replies held back or not.
func (p *stallProxy) replies(sc *stallConn) {
	chunks := make(chan []byte, 256)
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		buf := make([]byte, 32<<10)
		for {
			n, err := sc.server.Read(buf)
			if n > 0 {
				select {
				case chunks <- append([]byte(nil), buf[:n]...):
				default: // a test never stalls this much: drop the connection
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case b := <-chunks:
			p.mu.Lock()
			gate := sc.gate
			p.mu.Unlock()
			if gate != nil {
				select {
				case <-gate:
				case <-eof:
					return
				}
			}
			if _, err := sc.client.Write(b); err != nil {
				return
			}
		case <-eof:
			if len(chunks) == 0 {
				return
			}
		}
	}
}

// stall holds back the replies on every connection open now.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sc := range p.conns {
		if sc.gate == nil {
			sc.gate = make(chan struct{})
		}
	}
}

// open lets the replies on sc through.
func (p *stallProxy) open(sc *stallConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sc.gate != nil {
		close(sc.gate)
		sc.gate = nil
	}
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, sc := range p.conns {
		if sc.gate != nil {
			close(sc.gate)
			sc.gate = nil
		}
		sc.client.Close()
		sc.server.Close()
	}
}

// viaProxy is the fixture's URL with the host replaced by the proxy's.
// go-redis retries a command that timed out on a new connection after its
// read timeout (3s by default), which would (rightly) keep the lease; the
// Redis URL gets a read timeout above the tests' renew deadline and no
// retries, so that a stalled renewal stays stalled until the deadline, as a
// PostgreSQL one does.
func (f *fixture) viaProxy(t *testing.T, newProxy func(target string) string) string {
	t.Helper()
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = newProxy(u.Host)
	if f.name == "redis" {
		q := u.Query()
		q.Set("read_timeout", "8s")
		q.Set("max_retries", "-1")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
