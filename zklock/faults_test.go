package zklock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// dropper records the connections it dialed, so that a test can drop them.
type dropper struct {
	mu    sync.Mutex
	conns []net.Conn
	dials atomic.Int32
}

func (d *dropper) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	return zktest.DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn {
		d.mu.Lock()
		d.conns = append(d.conns, nc)
		d.mu.Unlock()
		d.dials.Add(1)
		return nc
	})
}

func (d *dropper) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

// cutter pauses the network of the connections it dialed: while cut,
// nothing is sent or received (the TCP connections stay open, as behind a
// partition), deadlines still apply, and new connections cannot be made.
type cutter struct {
	cut atomic.Bool
}

// expireSession cuts b's connections until the server expired b's session
// (admin sees no claim left under key), then heals the cut and waits until
// b has a new session, all within within.
func (c *cutter) expireSession(t *testing.T, b *zklock.Backend, admin *zk.Conn, key string, within time.Duration) {
	t.Helper()
	sid := b.Conn().SessionID()
	c.cut.Store(true)
	deadline := time.Now().Add(within)
	for {
		names, _, err := admin.Children(b.KeyPath(key))
		if err == nil && len(names) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claims of the cut session still there: %v %v", names, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.cut.Store(false)
	for b.Conn().SessionID() == sid || b.Conn().State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatal("no new session after the cut healed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *cutter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	if c.cut.Load() {
		time.Sleep(timeout)
		return nil, errors.New("cutter: network cut")
	}
	return zktest.DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn { return &cutConn{Conn: nc, c: c} })
}

type cutConn struct {
	net.Conn
	c      *cutter
	mu     sync.Mutex
	rd, wd time.Time
}

func (cc *cutConn) SetReadDeadline(t time.Time) error {
	cc.mu.Lock()
	cc.rd = t
	cc.mu.Unlock()
	return cc.Conn.SetReadDeadline(t)
}

func (cc *cutConn) SetWriteDeadline(t time.Time) error {
	cc.mu.Lock()
	cc.wd = t
	cc.mu.Unlock()
	return cc.Conn.SetWriteDeadline(t)
}

func (cc *cutConn) SetDeadline(t time.Time) error {
	cc.SetReadDeadline(t)
	return cc.SetWriteDeadline(t)
}

// pause waits while the network is cut, until the deadline.
func (cc *cutConn) pause(read bool) error {
	for cc.c.cut.Load() {
		cc.mu.Lock()
		d := cc.wd
		if read {
			d = cc.rd
		}
		cc.mu.Unlock()
		if !d.IsZero() && time.Now().After(d) {
			return os.ErrDeadlineExceeded
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func (cc *cutConn) Read(p []byte) (int, error) {
	if err := cc.pause(true); err != nil {
		return 0, err
	}
	return cc.Conn.Read(p)
}

func (cc *cutConn) Write(p []byte) (int, error) {
	if err := cc.pause(false); err != nil {
		return 0, err
	}
	return cc.Conn.Write(p)
}

func newLocker(t testing.TB, b *zklock.Backend, opts ...core.Option) *core.Client {
	t.Helper()
	c, err := core.New(b, core.WithDefaults(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSessionTimeoutAndTTL(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	root := testRoot()
	b := newBackend(t, connect, root, zklock.WithSessionTimeout(3*time.Second))
	if got := b.SessionTimeout(); got != 3*time.Second {
		t.Fatalf("negotiated session timeout = %v, want 3s (captured from the client's log line)", got)
	}
	if got := b.MaxTTL(); got != 2*time.Second {
		t.Fatalf("MaxTTL = %v, want 2s", got)
	}
	// The server clamps: the private servers allow at most 120 s.
	if got := newBackend(t, connect, root, zklock.WithSessionTimeout(10*time.Minute)).SessionTimeout(); got != 120*time.Second {
		t.Fatalf("clamped session timeout = %v, want 120s", got)
	}
	_, err := b.TryAcquire(ctxT(t, 10*time.Second), core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "tok", TTL: 2100 * time.Millisecond})
	if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "TTL") || !strings.Contains(err.Error(), "session timeout 3s") {
		t.Fatalf("a TTL above 2/3 of the session timeout: got %v, want ErrInvalidOption naming the TTL and the session timeout", err)
	}
	// New's default TTL is 2/3 of the granted session timeout.
	l, err := zklock.New(ctxT(t, 10*time.Second), connect, zklock.WithRoot(root), zklock.WithSessionTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before := time.Now()
	s, err := l.TryAcquire(ctxT(t, 10*time.Second), "default-ttl")
	if err != nil {
		t.Fatal(err)
	}
	// The renew deadline is 2/3 of the TTL: 2/3 × 2 s.
	if d := s.Deadline().Sub(before); d < 1200*time.Millisecond || d > 1400*time.Millisecond {
		t.Errorf("deadline %v after acquire, want about 1.33s (TTL 2s)", d)
	}
	s.Release(context.Background())
	if _, err := zklock.NewBackend(ctxT(t, time.Second), "", zklock.WithRoot(root)); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("empty connect string: %v", err)
	}
	if _, err := zklock.NewBackend(ctxT(t, time.Second), connect, zklock.WithRoot("relative")); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithRoot") {
		t.Errorf("bad root: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, k := range []string{"plain", "a/b", ".", "..", "%", "zookeeper", "ünï 鍵 🔒", "crlf\r\n", strings.Repeat("x", 1024)} {
		enc := zklock.EncodeName(k)
		if strings.ContainsAny(enc, "/.") || enc == "" {
			t.Errorf("EncodeName(%q) = %q: not a safe znode name", k, enc)
		}
		if got, err := zklock.DecodeName(enc); err != nil || got != k {
			t.Errorf("DecodeName(EncodeName(%q)) = %q, %v", k, got, err)
		}
	}
}

// TestConnectionCut: the holder's network is cut. Its session is suspended,
// not yet lost; the engine's renew deadline ends it, and that loss is
// signalled before another client can acquire the key.
func TestConnectionCut(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	root := testRoot()
	var cut cutter
	const ttl = time.Second
	hb := newBackend(t, connect, root, zklock.WithSessionTimeout(1500*time.Millisecond), zklock.WithDialer(cut.dial))
	holder := newLocker(t, hb, core.TTL(ttl))
	other := newLocker(t, newBackend(t, connect, root), core.TTL(ttl))

	t.Run("ShortCutIsNotALoss", func(t *testing.T) {
		s, err := holder.TryAcquire(ctxT(t, 10*time.Second), "short")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release(context.Background())
		cut.cut.Store(true)
		time.Sleep(ttl / 4)
		cut.cut.Store(false)
		select {
		case <-s.Done():
			t.Fatalf("a cut shorter than the renew deadline ended the session: %v", s.Err())
		case <-time.After(2 * ttl):
		}
		if _, err := other.TryAcquire(ctxT(t, 10*time.Second), "short"); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("the lock must still be held after the cut healed: %v", err)
		}
	})

	t.Run("LossBeforeTakeover", func(t *testing.T) {
		s, err := holder.TryAcquire(ctxT(t, 10*time.Second), "long")
		if err != nil {
			t.Fatal(err)
		}
		lost := make(chan time.Time, 1)
		go func() { <-s.Done(); lost <- time.Now() }()
		cutAt := time.Now()
		cut.cut.Store(true)
		defer cut.cut.Store(false)
		s2, err := other.Acquire(ctxT(t, 20*time.Second), "long", core.Backoff(5*time.Millisecond, 50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		acquiredAt := time.Now()
		defer s2.Release(context.Background())
		select {
		case <-s.Done():
		default:
			t.Fatalf("another client acquired %v after the cut while the holder's session was not ended", acquiredAt.Sub(cutAt))
		}
		lostAt := <-lost // when a goroutine saw Done: for the log only
		if !errors.Is(s.Err(), core.ErrLeaseLost) {
			t.Fatalf("holder ended with %v, want ErrLeaseLost", s.Err())
		}
		if s2.Token() <= s.Token() {
			t.Errorf("token %d after %d", s2.Token(), s.Token())
		}
		t.Logf("cut at 0, loss signalled at %v, taken over at %v (TTL %v, session %v)",
			lostAt.Sub(cutAt).Round(time.Millisecond), acquiredAt.Sub(cutAt).Round(time.Millisecond), ttl, hb.SessionTimeout())
		s.Release(context.Background())
	})
}

// TestSessionExpiry: a cut longer than the session timeout expires the
// session; go-zookeeper then opens a new one without telling. No lease of
// the old session may be reported held in the new one.
func TestSessionExpiry(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	root := testRoot()
	var cut cutter
	b := newBackend(t, connect, root, zklock.WithSessionTimeout(1200*time.Millisecond), zklock.WithDialer(cut.dial))
	admin := rawConn(t, connect)
	ctx := ctxT(t, 30*time.Second)
	var reqs []core.RenewRequest
	for _, k := range []string{"e1", "e2", "e3"} {
		tok := "tok-" + k
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: k, Owner: "o", OwnerToken: tok, TTL: 700 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, core.RenewRequest{Key: k, OwnerToken: tok, TTL: 700 * time.Millisecond})
	}
	if res, err := b.Renew(ctx, reqs); err != nil || errors.Join(res...) != nil {
		t.Fatalf("renew before the cut: %v %v", res, err)
	}
	cut.expireSession(t, b, admin, "e1", 10*time.Second)
	res, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range res {
		if !errors.Is(e, core.ErrLeaseLost) {
			t.Errorf("lease %s of the expired session renewed in the new one: %v", reqs[i].Key, e)
		}
	}
	// The backend works on in the new session.
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "e1", Owner: "o", OwnerToken: "after", TTL: 700 * time.Millisecond}); err != nil {
		t.Fatalf("acquire in the new session: %v", err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "e1", OwnerToken: "after"}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaderKill: the leader of a 3-node ensemble is killed with SIGKILL
// while a lock is held. The holder keeps its lease or learns it lost it;
// tokens keep increasing across the new epoch.
func TestLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills an ensemble's leader")
	}
	e := ensemble(t, 3)
	connect := e.Connect()
	root := testRoot()
	const ttl = 2 * time.Second
	a := newLocker(t, newBackend(t, connect, root, zklock.WithSessionTimeout(4*time.Second)), core.TTL(ttl))
	bb := newBackend(t, connect, root, zklock.WithSessionTimeout(4*time.Second))
	b := newLocker(t, bb, core.TTL(ttl))
	s, err := a.TryAcquire(ctxT(t, 10*time.Second), "leader")
	if err != nil {
		t.Fatal(err)
	}
	leader := e.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Kill()
	t.Cleanup(func() {
		if err := leader.Restart(); err != nil {
			t.Error(err)
		}
		if err := e.WaitServing(60 * time.Second); err != nil {
			t.Error(err)
		}
	})
	// Until the holder's session ends, nobody else gets the lock.
	start := time.Now()
	for time.Since(start) < 2*ttl {
		s2, err := b.TryAcquire(ctxT(t, 10*time.Second), "leader")
		if err == nil {
			if s.Err() == nil {
				t.Fatalf("two holders after the leader died (tokens %d, %d)", s.Token(), s2.Token())
			}
			s2.Release(context.Background())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("holder after the failover: err=%v", s.Err())
	old := s.Token()
	if err := s.Release(context.Background()); err != nil {
		t.Logf("release after the failover: %v", err)
	}
	s2, err := b.Acquire(ctxT(t, 30*time.Second), "leader", core.Backoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(context.Background())
	if s2.Token() <= old {
		t.Fatalf("token %#x after the failover is not above %#x", s2.Token(), old)
	}
	if s2.Token()>>32 <= old>>32 {
		t.Errorf("token %#x is not of a later epoch than %#x", s2.Token(), old)
	}
	t.Logf("tokens %#x -> %#x", old, s2.Token())
}

// TestFromConn: a Backend on the caller's connection works and leaves the
// connection open at Close.
func TestFromConn(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	conn := rawConn(t, connect)
	root := testRoot()
	l, err := zklock.NewFromConn(conn, 5*time.Second, zklock.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.TryAcquire(ctxT(t, 10*time.Second), "from-conn")
	if err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, newBackend(t, connect, root), core.TTL(time.Second))
	if _, err := other.TryAcquire(ctxT(t, 10*time.Second), "from-conn"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("second holder: %v", err)
	}
	// The default TTL is 2/3 of the stated session timeout.
	if info, ok, err := l.Inspect(ctxT(t, 10*time.Second), "from-conn"); err != nil || !ok ||
		info.ExpiresAt.Sub(info.AcquiredAt) < 3200*time.Millisecond || info.ExpiresAt.Sub(info.AcquiredAt) > 3500*time.Millisecond {
		t.Fatalf("Inspect = %+v %v %v, want a TTL of about 3.33s", info, ok, err)
	}
	if err := l.Close(); err != nil { // releases s
		t.Fatal(err)
	}
	if s.Err() == nil {
		t.Fatal("session still held after Close")
	}
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatalf("Close closed the caller's connection: %v", err)
	}
	s2, err := other.TryAcquire(ctxT(t, 10*time.Second), "from-conn")
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	s2.Release(context.Background())
	if _, err := zklock.NewBackendFromConn(nil, time.Second); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("nil conn: %v", err)
	}
	if _, err := zklock.NewBackendFromConn(conn, 0); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("zero session timeout: %v", err)
	}
}

// TestCallsBoundedByContext: go-zookeeper's calls take no context, but the
// backend's do: with the network cut, each returns when its ctx ends.
func TestCallsBoundedByContext(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	var cut cutter
	b := newBackend(t, connect, testRoot(), zklock.WithSessionTimeout(10*time.Second), zklock.WithDialer(cut.dial))
	if _, err := b.Now(ctxT(t, 10*time.Second), "k"); err != nil {
		t.Fatal(err)
	}
	cut.cut.Store(true)
	defer cut.cut.Store(false)
	calls := map[string]func(ctx context.Context) error{
		"TryAcquire": func(ctx context.Context) error {
			_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "t", TTL: time.Second})
			return err
		},
		"Renew": func(ctx context.Context) error {
			_, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: "t", TTL: time.Second}})
			return err
		},
		"Release": func(ctx context.Context) error { return b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t"}) },
		"Now":     func(ctx context.Context) error { _, err := b.Now(ctx, "k"); return err },
		"Inspect": func(ctx context.Context) error { _, _, err := b.Inspect(ctx, "k"); return err },
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s returned %v after its ctx ended", name, d-200*time.Millisecond)
		}
		if name != "Renew" && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with the network cut: %v, want the ctx's error", name, err)
		}
	}
}

// TestMinHoldInspect: a release under a min hold leaves a hold that
// Inspect shows until it ends, on the server clock.
func TestMinHoldInspect(t *testing.T) {
	connect := ensemble(t, 1).Connect()
	root := testRoot()
	a := newLocker(t, newBackend(t, connect, root), core.TTL(time.Second))
	b := newLocker(t, newBackend(t, connect, root), core.TTL(time.Second))
	s, err := a.TryAcquire(ctxT(t, 10*time.Second), "held", core.MinHold(1500*time.Millisecond), core.WithOwner("min-hold"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	info, ok, err := b.Inspect(ctxT(t, 10*time.Second), "held")
	if err != nil || !ok || info.Owner != "min-hold" || info.Token != s.Token() {
		t.Fatalf("Inspect after a release under min hold = %+v %v %v", info, ok, err)
	}
	if d := info.ExpiresAt.Sub(info.AcquiredAt); d < 1400*time.Millisecond || d > 1700*time.Millisecond {
		t.Errorf("hold lasts %v from the acquisition, want about 1.5s", d)
	}
	list, err := b.List(ctxT(t, 10*time.Second), "")
	if err != nil || len(list) != 1 || list[0].Key != "held" {
		t.Errorf("List = %+v %v", list, err)
	}
	s2, err := b.Acquire(ctxT(t, 10*time.Second), "held", core.Backoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s.Token() {
		t.Errorf("token %d after %d", s2.Token(), s.Token())
	}
	s2.Release(context.Background())
	if _, ok, err := b.Inspect(ctxT(t, 10*time.Second), "held"); err != nil || ok {
		t.Errorf("Inspect after the last release: held=%v err=%v", ok, err)
	}
}
