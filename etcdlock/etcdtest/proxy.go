package etcdtest

import (
	"io"
	"net"
	"sync"
)

// front is a TCP proxy in front of a member's client port. Clients connect
// through it, so that Kill can do to their connections what a crash does:
// reset them at once. (An embedded server that stops keeps serving open
// connections for up to its request timeout.)
type front struct {
	l        net.Listener
	upstream string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newFront(upstream string) (*front, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &front{l: l, upstream: upstream, conns: make(map[net.Conn]struct{})}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

func (f *front) addr() string { return f.l.Addr().String() }

func (f *front) accept() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.down {
			f.mu.Unlock()
			reset(c)
			continue
		}
		f.conns[c] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go f.serve(c)
	}
}

func (f *front) serve(c net.Conn) {
	defer f.wg.Done()
	up, err := net.Dial("tcp", f.upstream)
	if err != nil {
		f.drop(c)
		reset(c)
		return
	}
	f.mu.Lock()
	if f.down {
		f.mu.Unlock()
		up.Close()
		f.drop(c)
		reset(c)
		return
	}
	f.conns[up] = struct{}{}
	f.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	f.drop(c)
	f.drop(up)
	c.Close()
	up.Close()
	<-done
}

func (f *front) drop(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// reset closes c with a TCP reset, as a crashed server's kernel would.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// setDown makes the front refuse connections (down) and reset the open
// ones, or pass connections again.
func (f *front) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	var open []net.Conn
	if down {
		for c := range f.conns {
			open = append(open, c)
		}
	}
	f.mu.Unlock()
	for _, c := range open {
		reset(c)
	}
}

func (f *front) close() {
	f.setDown(true)
	f.l.Close()
	f.wg.Wait()
}
