package zklock_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// holder's connections hand the client what they read only once open
// lets them: a server that has the reply but holds it back.
type holder struct {
	mu   sync.Mutex
	gate chan struct{} // nil: open
	sent chan struct{} // a request (not a ping) was written while held
}

func (h *holder) hold() {
	h.mu.Lock()
	h.gate = make(chan struct{})
	h.sent = make(chan struct{}, 16)
	h.mu.Unlock()
}

func (h *holder) open() {
	h.mu.Lock()
	if h.gate != nil {
		close(h.gate)
		h.gate = nil
	}
	h.mu.Unlock()
}

func (h *holder) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	return zktest.DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn { return &heldConn{Conn: nc, h: h} })
}

type heldConn struct {
	net.Conn
	h *holder
}

func (c *heldConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.h.mu.Lock()
	if c.h.gate != nil && len(p) >= 8 && !zktest.IsPing(p) {
		select {
		case c.h.sent <- struct{}{}:
		default:
		}
	}
	c.h.mu.Unlock()
	return n, err
}

func (c *heldConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.h.mu.Lock()
	gate := c.h.gate
	c.h.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return n, err
}

// TestCallNudgesAServerThatHoldsItsReply: a call whose reply has not come
// after a quarter of a second sends a read on the same session, and again
// at doubling intervals. ZooKeeper 3.8.0 can hold a committed write until
// another request reaches it (ZOOKEEPER-4537); on a quiet server nothing
// else would wake it before the next ping.
func TestCallNudgesAServerThatHoldsItsReply(t *testing.T) {
	t.Parallel()
	h := &holder{}
	b := newBackend(t, singleConnect(t), testRoot(), zklock.WithDialer(h.dial), zklock.WithSessionTimeout(20*time.Second))
	ctx := ctxT(t, 10*time.Second)
	if _, err := b.Now(ctx, "k"); err != nil { // the clock node exists from here on
		t.Fatal(err)
	}
	h.hold()
	done := make(chan error, 1)
	go func() {
		_, err := b.Now(ctx, "k")
		done <- err
	}()
	// The call's request, then a nudge on the same connection while the
	// reply is held.
	sent := h.sent
	for i := range 2 {
		select {
		case <-sent:
		case err := <-done:
			t.Fatalf("the call returned while its reply was held: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d requests written in 5s while the reply was held, want the call's and a nudge", i)
		}
	}
	h.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
