package testenv

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
)

// StallProxy forwards TCP connections from a loopback port to a server,
// and can hold back every byte the server sends: a store that is reachable
// but does not answer. Requests still reach the server. It closes, with
// every connection, when the test ends.
type StallProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []*stallConn
	stalled bool // new connections are stalled too (Stall)
	closed  bool
}

type stallConn struct {
	client, server net.Conn
	gate           chan struct{} // non-nil while stalled; closed to let replies through
}

// NewStallProxy returns a proxy to the server at address on network ("tcp"
// or "unix", as net.Dial takes them), not stalled. It listens on TCP.
func NewStallProxy(t testing.TB, network, address string) *StallProxy {
	t.Helper()
	p := &StallProxy{}
	p.ln = Forward(t, network, address, p.serve)
	t.Cleanup(p.close)
	return p
}

// Forward listens on a loopback TCP port and, for every connection to it,
// dials address on network and hands both connections to serve (the
// client's first), until the listener is closed: the caller closes it.
// serve runs on the accepting goroutine; it starts its own to copy.
func Forward(t testing.TB, network, address string, serve func(client, server net.Conn)) net.Listener {
	t.Helper()
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
			s, err := net.Dial(network, address)
			if err != nil {
				c.Close()
				continue
			}
			serve(c, s)
		}
	}()
	return ln
}

// Addr is the host:port clients connect to.
func (p *StallProxy) Addr() string { return p.ln.Addr().String() }

// StallOpen holds back the replies on every connection open now; new
// connections work normally.
func (p *StallProxy) StallOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sc := range p.conns {
		if sc.gate == nil {
			sc.gate = make(chan struct{})
		}
	}
}

// Stall holds back the replies on every connection, open now or made
// later, until Resume.
func (p *StallProxy) Stall() {
	p.StallOpen()
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Resume lets every reply through again, those held back first.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = false
	for _, sc := range p.conns {
		p.openLocked(sc)
	}
}

func (p *StallProxy) serve(c, s net.Conn) {
	sc := &stallConn{client: c, server: s}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	if p.stalled {
		sc.gate = make(chan struct{})
	}
	p.conns = append(p.conns, sc)
	p.mu.Unlock()
	go func() {
		io.Copy(s, c)
		// The client hung up: nothing waits for its replies.
		p.mu.Lock()
		p.openLocked(sc)
		p.mu.Unlock()
		s.Close()
	}()
	go func() { p.replies(sc); c.Close() }()
}

// replies copies the server's bytes to the client, holding them back while
// the connection is stalled. When the server hangs up, the client's
// connection is closed at once, replies held back or not.
func (p *StallProxy) replies(sc *stallConn) {
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

// openLocked lets the replies on sc through; p.mu is held.
func (p *StallProxy) openLocked(sc *stallConn) {
	if sc.gate != nil {
		close(sc.gate)
		sc.gate = nil
	}
}

func (p *StallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, sc := range p.conns {
		p.openLocked(sc)
		sc.client.Close()
		sc.server.Close()
	}
}

// StallProxies are proxies stalled and resumed together: one in front of
// each server of a cluster.
type StallProxies []*StallProxy

// Stall stalls each proxy (StallProxy.Stall).
func (ps StallProxies) Stall() {
	for _, p := range ps {
		p.Stall()
	}
}

// Resume resumes each proxy.
func (ps StallProxies) Resume() {
	for _, p := range ps {
		p.Resume()
	}
}

// StallDialer dials every address through a StallProxy of its own, made on
// the first dial of that address: for a client that finds its servers
// itself (a Redis Cluster or Sentinel client). Stall and Resume act on
// every proxy, those made later too.
type StallDialer struct {
	t       testing.TB
	mu      sync.Mutex
	proxies map[string]*StallProxy // by network and address
	all     StallProxies
	stalled bool
}

// NewStallDialer returns a StallDialer whose proxies close when the test
// ends.
func NewStallDialer(t testing.TB) *StallDialer {
	return &StallDialer{t: t, proxies: map[string]*StallProxy{}}
}

// Dial connects to address's proxy.
func (d *StallDialer) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	p := d.proxies[network+" "+address]
	if p == nil {
		p = NewStallProxy(d.t, network, address)
		if d.stalled {
			p.Stall()
		}
		d.proxies[network+" "+address] = p
		d.all = append(d.all, p)
	}
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", p.Addr())
}

// Stall stalls every proxy, and those made later (StallProxy.Stall).
func (d *StallDialer) Stall() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stalled = true
	d.all.Stall()
}

// Resume resumes every proxy.
func (d *StallDialer) Resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stalled = false
	d.all.Resume()
}
