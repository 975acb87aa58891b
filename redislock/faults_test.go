package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

func newBackend(t testing.TB, c redis.UniversalClient, prefix string) *redislock.Backend {
	t.Helper()
	b, err := redislock.NewBackend(c, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newLocker(t testing.TB, c redis.UniversalClient, prefix string, opts ...core.Option) *core.Client {
	t.Helper()
	l, err := redislock.New(c, redislock.WithPrefix(prefix),
		redislock.WithClientOptions(core.WithDefaults(opts...)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ownerToken(i int) string { return fmt.Sprintf("owner-token-%d", i) }

// scriptFlushRule: scripts are run by SHA; after SCRIPT FLUSH (as after a
// restart or failover) every operation, single or pipelined, still works.
func testScriptFlush(t *testing.T, c redis.UniversalClient, flush func(ctx context.Context) error) {
	const rule = "SCRIPT FLUSH between acquire and renew/release changes nothing"
	ctx := testenv.Context(t, 30*time.Second)
	prefix := testenv.Name("dislocktest-")
	b := newBackend(t, c, prefix)

	// More leases than one renew script call takes, so that renewal is a
	// pipeline even on one server.
	const n = 300
	reqs := make([]core.RenewRequest, n)
	for i := range n {
		key := fmt.Sprintf("flush/%d", i)
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "t", OwnerToken: ownerToken(i), TTL: 5 * time.Second}); err != nil {
			t.Fatalf("acquire %q: %v", key, err)
		}
		reqs[i] = core.RenewRequest{Key: key, OwnerToken: ownerToken(i), TTL: time.Minute}
	}
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatalf("rule %q: Renew: %v", rule, err)
	}
	for i, e := range res {
		if e != nil {
			t.Fatalf("rule %q: Renew[%d]: %v", rule, i, e)
		}
	}
	info, ok, err := b.Inspect(ctx, "flush/7")
	if err != nil || !ok || info.Remaining < 30*time.Second {
		t.Fatalf("rule %q: after renew, Inspect = %+v %v %v", rule, info, ok, err)
	}
	// A stale owner token is still refused after the flush.
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = b.Renew(ctx, []core.RenewRequest{{Key: "flush/1", OwnerToken: "stale", TTL: time.Minute}})
	if err != nil || !errors.Is(res[0], core.ErrLeaseLost) {
		t.Fatalf("rule %q: stale Renew = %v %v", rule, res, err)
	}
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := fmt.Sprintf("flush/%d", i)
		if err := b.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: ownerToken(i)}); err != nil {
			t.Fatalf("rule %q: release %q: %v", rule, key, err)
		}
	}
	if list, err := b.List(ctx, "flush/"); err != nil || len(list) != 0 {
		t.Fatalf("rule %q: after release, List = %d locks, %v", rule, len(list), err)
	}

	// Through the engine: a session survives flushes across its renewals.
	l := newLocker(t, c, prefix, core.TTL(600*time.Millisecond))
	s := testenv.Hold(t, ctx, l, "flush/session")
	for range 3 {
		if err := flush(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.Done():
			t.Fatalf("rule %q: session lost: %v", rule, s.Err())
		case <-time.After(400 * time.Millisecond):
		}
	}
	if err := flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("rule %q: Release: %v", rule, err)
	}
	if _, ok, _ := b.Inspect(ctx, "flush/session"); ok {
		t.Fatalf("rule %q: lock still held after Release", rule)
	}
}

func TestScriptFlush(t *testing.T) {
	c := privateClient(t)
	testScriptFlush(t, c, func(ctx context.Context) error { return c.ScriptFlush(ctx).Err() })
}

// dropConn is a net.Conn that, when armed, lets the next command that
// contains match reach the server, reads the server's reply and throws it
// away, then breaks the connection: the reply to an applied command is lost.
type dropConn struct {
	net.Conn
	match   []byte
	armed   *atomic.Bool
	dropped *atomic.Int32
	onDrop  func() // when set, called once the reply is thrown away
	mu      sync.Mutex
	drop    bool
}

func (c *dropConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.match) && c.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.drop = true
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *dropConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	drop := c.drop
	c.mu.Unlock()
	if !drop {
		return c.Conn.Read(p)
	}
	// The reply arriving proves the server applied the command.
	buf := make([]byte, 4096)
	c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Conn.Read(buf); err != nil {
		return 0, err
	}
	c.dropped.Add(1)
	if c.onDrop != nil {
		c.onDrop()
	}
	c.Conn.Close()
	return 0, io.EOF
}

// lostReply is a Locker whose client's connections, once armed, drop the
// reply to the acquire script (dropConn). With refuse, every dial after the
// drop is refused until refuse is cleared.
type lostReply struct {
	armed, refuse atomic.Bool
	dropped       atomic.Int32
	prefix        string
	l             *core.Client
}

func newLostReply(t *testing.T, o redis.Options, refuse bool) *lostReply {
	r := &lostReply{prefix: testenv.Name("dislocktest-")}
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if r.refuse.Load() {
			addr = "127.0.0.1:1" // connection refused
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dc := &dropConn{Conn: nc, match: []byte(redislock.AcquireSHA), armed: &r.armed, dropped: &r.dropped}
		if refuse {
			dc.onDrop = func() { r.refuse.Store(true) }
		}
		return dc, nil
	}
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	r.l = newLocker(t, c, r.prefix, core.TTL(30*time.Second))
	return r
}

// TestLostAcquireReply: go-redis sends a command again when its connection
// breaks before the reply (MaxRetries); the acquire script sent again finds
// its own owner token and answers the lease it claimed. A lost reply that
// nothing sends again is the engine's to undo (locktest's
// AmbiguousAcquireIsReconciled).
func TestLostAcquireReply(t *testing.T) {
	const rule = "an acquire that go-redis sends again after a lost reply returns the lease its first sending claimed"
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	o := *opt
	o.MaxRetries = 3
	r := newLostReply(t, o, false)
	l := r.l
	ctx := testenv.Context(t, 20*time.Second)
	const key = "lost-reply"
	r.armed.Store(true)
	s, err := l.TryAcquire(ctx, key)
	if r.dropped.Load() != 1 {
		t.Fatalf("no reply was dropped (dropped=%d, err=%v)", r.dropped.Load(), err)
	}
	if err != nil {
		t.Fatalf("rule %q: TryAcquire = %v", rule, err)
	}
	info, held, err := l.Inspect(ctx, key)
	if err != nil || !held || info.Token != s.Token() {
		t.Fatalf("rule %q: session %d but Inspect = %+v held=%v %v", rule, s.Token(), info, held, err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, held, err := l.Inspect(ctx, key); err != nil || held {
		t.Fatalf("rule %q: held after Release: %v %v", rule, held, err)
	}
}

// A claim whose reply was lost is not taken for one that never left when
// the connection is refused afterwards: go-redis's retry of the claim fails
// to dial, yet the claim was applied, so it is undone (here by Close's last
// attempt, once the server can be reached again), never left held.
func TestLostAcquireReplyThenRefused(t *testing.T) {
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	o := *opt
	o.MaxRetries, o.DialerRetries = 1, 1 // few refused dials: a short test
	r := newLostReply(t, o, true)
	ctx := testenv.Context(t, 20*time.Second)
	const key = "lost-reply-refused"

	r.armed.Store(true)
	_, err = r.l.TryAcquire(ctx, key)
	if r.dropped.Load() != 1 || err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("TryAcquire = %v (dropped=%d), want a refused retry after the lost reply", err, r.dropped.Load())
	}
	r.refuse.Store(false)
	if err := r.l.Close(); err != nil {
		t.Fatal(err)
	}
	info, held, err := newBackend(t, sharedRedis(t), r.prefix).Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if held {
		t.Fatalf("the claim whose reply was lost is held until its TTL: %+v", info)
	}
}

func TestOddKeys(t *testing.T) {
	c := sharedRedis(t)
	testOddKeys(t, c, nil)
}

// testOddKeys: any key core accepts round-trips through acquire, Inspect,
// List and ForceRelease; a key past the limit is a clear error. slotOf,
// when set, reports the server's hash slot of a Redis key.
func testOddKeys(t *testing.T, c redis.UniversalClient, slotOf func(string) int64) {
	const rule = "keys of any valid bytes round-trip; all Redis keys of a lock share a hash slot"
	ctx := testenv.Context(t, 30*time.Second)
	prefix := testenv.Name("dislocktest-")
	l := newLocker(t, c, prefix)
	base := "odd/"
	keys := []string{
		"}", "{", "{}", "}{", "{a}", "a}b{c", "}}}", "%", "%7D", "%25", "%7d}",
		"with space", "tab\tand\r\nCRLF", "*3\r\n$3\r\nDEL\r\n$1\r\nx\r\n",
		"glob*?[a-z]\\", "ünïcødé-鍵-🔒", ":fence", "x}:fence", ":q", "x}:qd",
	}
	for i := range keys {
		keys[i] = base + keys[i]
	}
	keys = append(keys, base+strings.Repeat("}", core.MaxKeyLen-len(base)))
	keys = append(keys, base+strings.Repeat("é", (core.MaxKeyLen-len(base))/2))
	for _, k := range keys {
		if len(k) > core.MaxKeyLen {
			t.Fatalf("test key too long: %d", len(k))
		}
	}
	held := map[string]core.Session{}
	for _, k := range keys {
		s, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("rule %q: TryAcquire(%q): %v", rule, k, err)
		}
		held[k] = s
		info, ok, err := l.Inspect(ctx, k)
		if err != nil || !ok || info.Key != k || info.Token != s.Token() {
			t.Fatalf("rule %q: Inspect(%q) = %+v %v %v", rule, k, info, ok, err)
		}
		if doc := redistest.LockKey(prefix, k); doc != redislock.LockKey(prefix, k) {
			t.Fatalf("the Redis key of %q is %q, not %q as documented", k, redislock.LockKey(prefix, k), doc)
		}
		if slotOf != nil {
			lock := redislock.LockKey(prefix, k)
			q, qd := redislock.QueueKeys(prefix, k)
			a := slotOf(lock)
			if a != slotOf(q) || a != slotOf(qd) || a != int64(redislock.HashSlot(lock[len(prefix)+2:len(lock)-1])) {
				t.Fatalf("rule %q: %q: lock slot %d, queue slots %d, %d", rule, k, a, slotOf(q), slotOf(qd))
			}
		}
	}
	list, err := l.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(keys) {
		t.Fatalf("rule %q: List(%q) has %d locks, want %d", rule, base, len(list), len(keys))
	}
	for _, info := range list {
		if s := held[info.Key]; s == nil || s.Token() != info.Token {
			t.Fatalf("rule %q: List returned %q (token %d), not a held key", rule, info.Key, info.Token)
		}
	}
	// Prefixes with glob and brace characters select exactly their keys.
	for _, p := range []string{base + "glob*", base + "}", base + "{", base + "%", base + "*"} {
		list, err := l.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, k := range keys {
			if strings.HasPrefix(k, p) {
				want++
			}
		}
		if len(list) != want {
			t.Fatalf("rule %q: List(%q) = %d locks, want %d", rule, p, len(list), want)
		}
	}
	for _, k := range keys {
		if ok, err := l.ForceRelease(ctx, k); err != nil || !ok {
			t.Fatalf("rule %q: ForceRelease(%q) = %v %v", rule, k, ok, err)
		}
	}
	for _, bad := range []string{base + strings.Repeat("x", core.MaxKeyLen), "", "nul\x00", "\xff"} {
		_, err := l.TryAcquire(ctx, bad)
		if !errors.Is(err, core.ErrInvalidKey) {
			t.Fatalf("TryAcquire(%d-byte key) = %v, want ErrInvalidKey", len(bad), err)
		}
	}
	_, err = l.TryAcquire(ctx, base+strings.Repeat("x", core.MaxKeyLen))
	if !strings.Contains(err.Error(), "limit is 1024") {
		t.Fatalf("oversize key error does not say the limit: %v", err)
	}
}

func TestRestartWithoutPersistence(t *testing.T) {
	const rule = "a restart without persistence: the holder is told of its loss, later tokens are still larger"
	p := startPrivateRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer c.Close()
	prefix := testenv.Name("dislocktest-")
	ttl := 1500 * time.Millisecond
	l := newLocker(t, c, prefix, core.TTL(ttl))
	ctx := testenv.Context(t, 30*time.Second)
	s := testenv.Hold(t, ctx, l, "restart")
	old := s.Token()
	p.Restart()
	select {
	case <-s.Done():
	case <-time.After(3 * ttl):
		t.Fatalf("rule %q: holder not told within %v", rule, 3*ttl)
	}
	if !errors.Is(s.Err(), core.ErrLeaseLost) {
		t.Fatalf("rule %q: session ended with %v", rule, s.Err())
	}
	s2 := testenv.Hold(t, ctx, l, "restart")
	defer s2.Release(ctx)
	if s2.Token() <= old {
		t.Fatalf("rule %q: token %d after restart, %d before", rule, s2.Token(), old)
	}
}

func TestWatchFailsWithoutPubSub(t *testing.T) {
	const rule = "Watch returns an error, not hang, when pub/sub is unavailable; waiters then poll"
	p := startPrivateRedis(t, "--rename-command", "SUBSCRIBE", "")
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	defer c.Close()
	prefix := testenv.Name("dislocktest-")
	b, err := redislock.NewBackend(c, redislock.WithPrefix(prefix), redislock.WithSubscribeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Watch(testenv.Context(t, 10*time.Second), func() {}, func(string) {}) }()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rule %q: Watch = %v", rule, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("rule %q: Watch hangs", rule)
	}

	// A waiter still gets the lock soon after a release, by polling.
	l1 := newLocker(t, c, prefix, core.TTL(10*time.Second), core.Backoff(10*time.Millisecond, 50*time.Millisecond))
	l2 := newLocker(t, c, prefix, core.TTL(10*time.Second), core.Backoff(10*time.Millisecond, 50*time.Millisecond))
	ctx := testenv.Context(t, 10*time.Second)
	s := testenv.Hold(t, ctx, l1, "poll")
	got := testenv.AcquireAsync(ctx, l2, "poll")
	// The waiter finds the lock busy and takes its place in line.
	queue, _ := redislock.QueueKeys(prefix, "poll")
	if !testenv.WaitFor(5*time.Second, func() bool { return c.ZCard(ctx, queue).Val() > 0 }) {
		t.Fatalf("rule %q: the waiter not in line within 5s", rule)
	}
	start := time.Now()
	s.Release(ctx)
	if r := <-got; r.Err != nil {
		t.Fatalf("rule %q: waiter: %v", rule, r.Err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("rule %q: waiter took %v", rule, d)
	}
}

func TestWatchBlackHole(t *testing.T) {
	const rule = "Watch returns an error, not hang, when the server never confirms the subscription"
	addr := testenv.SilentServer(t)
	// go-redis bounds the set-up of a pub/sub connection by its dial and
	// read timeouts, not by the context.
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})
	defer c.Close()
	b, err := redislock.NewBackend(c, redislock.WithSubscribeTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = b.Watch(testenv.Context(t, 20*time.Second), func() { t.Error("ready called") }, func(string) {})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("rule %q: Watch = %v after %v", rule, err, time.Since(start))
	}
}
