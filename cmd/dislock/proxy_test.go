package main

// The TCP proxy the outage tests put between dislock and its store to cut
// every connection (testenv.StallProxy stalls the replies on some).

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/dislock/dislock/internal/testenv"
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
	p.ln = testenv.Forward(t, "tcp", target, func(c, s net.Conn) {
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { io.Copy(s, c); s.Close() }()
		go func() { io.Copy(c, s); c.Close() }()
	})
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
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
