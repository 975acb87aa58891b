package etcdtest_test

import (
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestWatchReadsItsOwnStream: a waiter's Locker on a client whose Watcher
// is clientv3's reads its watch as one gRPC stream of its own, with none
// of clientv3's Watcher goroutines between the stream and the Locker;
// on a client whose Watcher wraps clientv3's (a namespace), the watch goes
// through the wrapper. Either way the waiter is told its turn. (Not
// parallel: it reads every goroutine's stack.)
func TestWatchReadsItsOwnStream(t *testing.T) {
	c := etcdtest.Start(t, 1)
	for _, wrapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "clientv3", true: "wrapped"}[wrapped], func(t *testing.T) {
			prefix := uniquePrefix("own-stream")
			var cnt etcdtest.Counter
			cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: cnt.DialOptions()})
			if wrapped {
				cli.Watcher = namespace.NewWatcher(cli.Watcher, "")
			}
			holder, waiter := newLocker(t, c.Client(t), prefix), newLocker(t, cli, prefix)
			ctx := testenv.Context(t, 20*time.Second)
			s := testenv.Hold(t, ctx, holder, "k")
			got := make(chan error, 1)
			go func() {
				// Polls every 20 s: only the watch tells it in time.
				w, err := waiter.Acquire(ctx, "k", core.Backoff(20*time.Second, 20*time.Second))
				if err == nil {
					err = w.Release(ctx)
				}
				got <- err
			}()
			if !testenv.WaitFor(10*time.Second, func() bool { return cnt.Watches.Load() > 0 }) {
				t.Fatal("the waiter's watch not up within 10s")
			}
			if n := clientWatchers(); (n > 0) != wrapped {
				t.Errorf("goroutines of clientv3's Watcher: %d, want them only with a wrapped Watcher", n)
			}
			if err := s.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("the waiter after the release: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter was not told its turn within 5s")
			}
		})
	}
}

// clientWatchers counts the goroutines running clientv3's Watcher streams.
func clientWatchers() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "etcd/client/v3.(*watchGRPCStream)") {
			n++
		}
	}
	return n
}

// TestWatchResumesAfterAReset: a Locker's watch stream whose connection
// breaks is opened again from the revision after the last event it read,
// so that what happened meanwhile is not missed: here the release that
// grants the key to the waiter while its client cannot reach the server.
// (Its attempts poll every 20 s, and a missed grant is not read by an
// attempt: only the resumed watch gets the waiter the key in time.)
func TestWatchResumesAfterAReset(t *testing.T) {
	c := etcdtest.Start(t, 1)
	prefix := uniquePrefix("resume")
	proxy := newResetProxy(t, strings.TrimPrefix(c.DirectEndpoints()[0], "http://"))
	var cnt etcdtest.Counter
	cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: []string{proxy.addr()}, DialOptions: cnt.DialOptions()})
	admin := c.Client(t)
	var hcnt etcdtest.Counter
	hcli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: hcnt.DialOptions()})
	holder, waiter, third := newLocker(t, hcli, prefix), newLocker(t, cli, prefix), newLocker(t, c.Client(t), prefix)
	ctx := testenv.Context(t, 30*time.Second)
	s := testenv.Hold(t, ctx, holder, "k")
	// The holder's Locker waits on another key too: its watch follows the
	// lines under the prefix, and its release grants k to k's first waiter.
	s2 := testenv.Hold(t, ctx, third, "other")
	defer s2.Release(ctx)
	go func() {
		if o, err := holder.Acquire(ctx, "other"); err == nil {
			o.Release(ctx)
		}
	}()
	got := make(chan error, 1)
	var token atomic.Uint64
	go func() {
		w, err := waiter.Acquire(ctx, "k", core.Backoff(20*time.Second, 20*time.Second))
		if err == nil {
			token.Store(w.Token())
			err = w.Release(ctx)
		}
		got <- err
	}()
	// The waiter is in line (its key written) and both watches are up.
	if !testenv.WaitFor(10*time.Second, func() bool {
		resp, err := admin.Get(ctx, prefix+"\x00q\x00k\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return cnt.Watches.Load() > 0 && hcnt.Watches.Load() > 0 && err == nil && resp.Count == 1
	}) {
		t.Fatal("the waiter not in line with the watches up within 10s")
	}
	proxy.setDown(true)
	proxy.reset()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.setDown(false)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter after the release: %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the waiter did not get the key within 8s of a release made while its connection was down")
	}
	// The release granted the key: it wrote over it, and the waiter's
	// token is that write's revision.
	hist, err := admin.Get(ctx, prefix+"k", clientv3.WithRev(int64(token.Load())))
	if err != nil || len(hist.Kvs) != 1 || hist.Kvs[0].CreateRevision != int64(s.Token()) {
		t.Fatalf("the key as the waiter got it: %v %v, want the holder's key written over", hist, err)
	}
	if n := cnt.Watches.Load(); n < 2 {
		t.Errorf("%d watches created, want the first and the one that resumed it", n)
	}
}

// resetProxy is a TCP proxy to upstream whose connections a test can reset
// and which can refuse new ones meanwhile.
type resetProxy struct {
	l     net.Listener
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func newResetProxy(t *testing.T, upstream string) *resetProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{l: l}
	t.Cleanup(func() { l.Close(); p.reset() })
	go func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				down.Close()
				continue
			}
			p.mu.Unlock()
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, down, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(down, up); down.Close() }()
			go func() { _, _ = io.Copy(up, down); up.Close() }()
		}
	}()
	return p
}

func (p *resetProxy) addr() string { return p.l.Addr().String() }

func (p *resetProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

// reset closes every connection open now.
func (p *resetProxy) reset() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
