package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// zkSession is the session timeout of the ZooKeeper contenders: the TTL
// (1.5 s in the short tier) must be at most 2/3 of it.
const zkSession = 3 * time.Second

type zkLogger struct{}

func (zkLogger) Printf(format string, v ...any) { fmt.Fprintf(libLogs, format+"\n", v...) }

// zkSetup runs the contenders on a private standalone ZooKeeper server
// (Debian's zookeeper package), stopped by PID when the test ends. Its own
// fault: the server is killed with SIGKILL and restarted from its data.
func zkSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	ens := zktest.ForTest(t, false)
	node := ens.Nodes[0]
	px := addProxy(t, h, "zookeeper", node.Addr())
	ctx := context.Background()
	root := "/dislock-chaos-" + strings.TrimSuffix(prefix, "-")
	admin, err := zklock.New(ctx, node.Addr(), zklock.WithRoot(root), zklock.WithSessionTimeout(10*time.Second),
		zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	direct := admin.Backend().(*zklock.Backend).Conn()
	env := &backendEnv{name: "zookeeper", proxy: px, admin: admin, keyPrefix: prefix}
	if u, ok := optionalPG(); ok {
		pool := directPool(t, u, "dislock-chaos-direct")
		reg, err := newRegister(ctx, pool, keys)
		if err != nil {
			t.Fatal(err)
		}
		env.reg = reg
	}
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		l, err := zklock.New(ctx, px.Addr(), zklock.WithRoot(root), zklock.WithSessionTimeout(zkSession),
			zklock.WithLogger(zkLogger{}), zklock.WithClientOptions(opts...))
		if err != nil {
			return nil, nil, err
		}
		return l, l.Close, nil
	}
	layout := admin.Backend().(*zklock.Backend)
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		var out []removal
		for _, k := range keys {
			// Each child's fencing token (zklock.ClaimToken) before it is
			// deleted; a sequential node's name is never reused under its
			// parent, so a delete that succeeds removed that node. One
			// record per node, with the time of its own deletion: the
			// waiter behind a deleted claim may be granted before the
			// next child's deletion is sent.
			parent := layout.KeyPath(k)
			names, _, err := direct.Children(parent)
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return out, err
			}
			for _, n := range names {
				rm := removal{key: k, sent: time.Now()}
				data, st, err := direct.Get(parent + "/" + n)
				if errors.Is(err, zk.ErrNoNode) {
					continue
				}
				if err != nil {
					return out, err
				}
				err = direct.Delete(parent+"/"+n, -1)
				if err == nil {
					rm.tokens = append(rm.tokens, zklock.ClaimToken(data, st))
				} else if !errors.Is(err, zk.ErrNoNode) {
					return out, err
				}
				rm.done = time.Now()
				out = append(out, rm)
			}
		}
		return out, nil
	}
	probeB, err := zklock.NewBackend(ctx, px.Addr(), zklock.WithRoot(root), zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	env.probe = func(ctx context.Context) error {
		_, err := probeB.Now(ctx, "")
		return err
	}
	env.faults = []faultDef{killRestart("zookeeper-kill-restart", false, node.Kill, func() error {
		if err := node.Restart(); err != nil {
			return err
		}
		if err := ens.WaitServing(30 * time.Second); err != nil {
			return err
		}
		return awaitSession(direct, root, 30*time.Second)
	})}
	env.close = func() {
		_ = admin.Close()
		_ = probeB.Close()
		if env.reg != nil {
			env.reg.pool.Close()
		}
	}
	return env
}

// awaitSession returns once conn, the harness's own connection to the
// server (not through the proxy), answers a read again: after a restart the
// client redials only every second, and a request queued before it has
// redialled fails with zk.ErrNoServer, so a delete-locks fault right after
// the restart would find no server. A read that fails for the dial only is
// sent again until timeout.
func awaitSession(conn *zk.Conn, path string, timeout time.Duration) error {
	var err error
	testenv.WaitFor(timeout, func() bool {
		_, _, err = conn.Exists(path)
		return !errors.Is(err, zk.ErrNoServer) && !errors.Is(err, zk.ErrConnectionClosed)
	})
	if err != nil {
		return fmt.Errorf("the harness's connection after the restart: %w", err)
	}
	return nil
}

func TestChaosZooKeeper(t *testing.T) {
	chaosSeeds(t, zkSetup)
}

// zkSlowRenewals stalls the renewals of one ZooKeeper Locker (see
// renewStall); the engine polls instead of watching through it.
type zkSlowRenewals struct {
	core.Backend
	renewStall
}

func (b *zkSlowRenewals) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	return b.renew(ctx, reqs, b.Backend.Renew)
}

// zkSlowStore is the slow-store scenario on a private ZooKeeper server.
func zkSlowStore(t *testing.T, slowObs, fastObs core.ClientOption) (core.Locker, core.Locker, func() func()) {
	ens := zktest.ForTest(t, false)
	root := "/dislock-chaos-slow"
	newBackend := func() *zklock.Backend {
		b, err := zklock.NewBackend(context.Background(), ens.Connect(), zklock.WithRoot(root),
			zklock.WithSessionTimeout(1500*time.Millisecond), zklock.WithLogger(zkLogger{}))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sb := &zkSlowRenewals{Backend: newBackend()}
	return handoverLocker(t, sb, slowObs), handoverLocker(t, newBackend(), fastObs), sb.stall
}

// TestSlowStoreNoHandoverZooKeeper is TestSlowStoreNoHandover on ZooKeeper:
// the key passes on only after the slow holder's work stopped (its Release)
// or its claim's TTL ran out on the server.
func TestSlowStoreNoHandoverZooKeeper(t *testing.T) {
	checkSlowStore(t, slowStoreHistory(t, 11, zkSlowStore))
}

// TestZooKeeperReconnectKeepsWatches forces the path of go-zookeeper
// v1.0.4's data race on Conn.lastZxid (upstream PR #35): after a reconnect
// in the same session the client sends its watches again
// (sendSetWatches, which reads lastZxid) while its receive loop already
// handles the replies to requests that waited out the outage (and writes
// lastZxid), with nothing ordering the two. On a loaded machine the watches
// go out late; here the dialer holds that packet back for a moment. Under
// -race the released client fails this test ("race detected"); the chaos
// module builds against the patched copy in third_party/go-zookeeper-zk,
// whose lastZxid is atomic, so that the race detector stays on for
// dislock's own code. The test also checks what the path is for: zklock's
// waiter keeps its watches on the holders' claims across the reconnects,
// and a watch set before the outages fires after them.
func TestZooKeeperReconnectKeepsWatches(t *testing.T) {
	ens := zktest.ForTest(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var d lateWatchesDialer
	sessions := make(chan struct{}, 16) // one per session established or resumed
	conn, _, err := zk.Connect([]string{ens.Nodes[0].Addr()}, 10*time.Second, zk.WithLogger(zkLogger{}), zk.WithDialer(d.dial),
		zk.WithEventCallback(func(e zk.Event) {
			if e.Type == zk.EventSession && e.State == zk.StateHasSession {
				select {
				case sessions <- struct{}{}:
				default:
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitSession := func() {
		t.Helper()
		select {
		case <-sessions:
		case <-ctx.Done():
			t.Fatal("no ZooKeeper session")
		}
	}
	waitSession()
	sid := conn.SessionID()

	root := "/dislock-chaos-zkwatch"
	holder, err := zklock.New(ctx, ens.Nodes[0].Addr(), zklock.WithRoot(root), zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := zklock.NewFromConn(conn, 10*time.Second, zklock.WithRoot(root), zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	// Each busy acquisition leaves a watch on the holder's claim.
	for _, k := range []string{"w0", "w1", "w2"} {
		s, err := holder.TryAcquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release(context.Background())
		if _, err := waiter.TryAcquire(ctx, k); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("waiter on %s: %v, want busy", k, err)
		}
	}
	marker := root + "/marker"
	_, _, created, err := conn.ExistsW(marker)
	if err != nil {
		t.Fatal(err)
	}

	// Requests that wait out every outage.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, _ = conn.Exists(root)
			}
		})
	}
	for range 3 {
		d.cut()
		sleepCtx(ctx, 200*time.Millisecond) // the outage: well inside the session timeout
		d.restore()
		waitSession()
		for { // the requests that waited have their replies
			if _, _, err := conn.Exists(root); err == nil || ctx.Err() != nil {
				break
			}
		}
	}
	close(stop)
	wg.Wait()
	if n := d.resent(); n < 3 {
		t.Fatalf("the client sent its watches again %d times, want one per reconnect (3)", n)
	}
	if conn.SessionID() != sid {
		t.Fatalf("the session changed (%#x, then %#x): the reconnects did not resume it", sid, conn.SessionID())
	}

	// The watch set before the outages was set again on the server.
	hconn := holder.Backend().(*zklock.Backend).Conn()
	if _, err := hconn.Create(marker, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	defer hconn.Delete(marker, -1)
	select {
	case ev := <-created:
		if ev.Type != zk.EventNodeCreated {
			t.Fatalf("watch event %+v, want node created", ev)
		}
	case <-ctx.Done():
		t.Fatal("the watch set before the reconnects never fired")
	}
}

// lateWatchesDialer dials ZooKeeper directly; cut closes its connections
// and refuses new ones until restore. Its connections send the client's
// re-sent watches (a SetWatches packet) 50ms late, as a loaded machine
// does, and drop write deadlines, whose update of the socket would order
// the sender after the receive loop's next read.
type lateWatchesDialer struct {
	mu       sync.Mutex
	down     bool
	conns    []net.Conn
	setWatch int
}

func (d *lateWatchesDialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	down := d.down
	d.mu.Unlock()
	if down {
		return nil, errors.New("network cut")
	}
	return zktest.DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn {
		d.mu.Lock()
		d.conns = append(d.conns, nc)
		d.mu.Unlock()
		return &lateWatchesConn{Conn: nc, d: d}
	})
}

func (d *lateWatchesDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func (d *lateWatchesDialer) restore() {
	d.mu.Lock()
	d.down = false
	d.mu.Unlock()
}

func (d *lateWatchesDialer) resent() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.setWatch
}

type lateWatchesConn struct {
	net.Conn
	d *lateWatchesDialer
}

// opSetWatches is the opcode of ZooKeeper's SetWatches request.
const opSetWatches = 101

func (c *lateWatchesConn) Write(p []byte) (int, error) {
	// length, xid, opcode
	if len(p) >= 12 && int32(binary.BigEndian.Uint32(p[8:12])) == opSetWatches {
		c.d.mu.Lock()
		c.d.setWatch++
		c.d.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return c.Conn.Write(p)
}

func (c *lateWatchesConn) SetWriteDeadline(time.Time) error { return nil }
