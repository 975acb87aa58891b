package pg_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bouncerPool returns a small pool through bn, closed at cleanup. edit may
// change its config first.
func bouncerPool(t testing.TB, bn *bouncer, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return openPool(t, bn.url, edit)
}

// directConfig is the test server's own connection config, for
// WithListenConfig.
func directConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	cc, err := pgx.ParseConfig(testenv.PG(t))
	if err != nil {
		t.Fatal("DISLOCK_TEST_PG cannot be parsed")
	}
	return cc
}

// bouncerBackend returns a Backend on a pool of its own through bn.
func bouncerBackend(t testing.TB, bn *bouncer, table string, edit func(*pgxpool.Config), opts ...pg.Option) *pg.Backend {
	t.Helper()
	return backendOn(t, bouncerPool(t, bn, edit), table, opts...)
}

// TestPgBouncerConformance runs the conformance suite through a private
// PgBouncer in transaction mode, in the two documented configurations:
// exec mode without LISTEN (waiters poll), and the simple protocol with a
// direct LISTEN connection (WithListenConfig: waiters are notified). The
// suite's own admin statements go through the pooler too.
func TestPgBouncerConformance(t *testing.T) {
	t.Parallel() // each has its own pgbouncer; the suites mostly wait on timers
	bn := startBouncer(t)
	admin := bouncerPool(t, bn, execMode)
	for _, v := range []struct {
		name    string
		edit    func(*pgxpool.Config)
		opts    []pg.Option
		noWatch bool
	}{
		{"exec-without-listen", execMode, []pg.Option{pg.WithoutListen()}, true},
		// DISLOCK_TEST_PG is the direct connection, unless it is itself
		// a pooler (then LISTEN falls back and waiters poll).
		{"simple-listen-direct", queryMode(pgx.QueryExecModeSimpleProtocol),
			[]pg.Option{pg.WithListenConfig(directConfig(t))}, throughPooler(t)},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			table := newTable(t, admin)
			h := harness(t, admin, table)
			h.NoWatch = v.noWatch
			h.NewBackend = func(tb testing.TB) core.Backend {
				return bouncerBackend(tb, bn, table, v.edit, v.opts...)
			}
			locktest.Run(t, h)
		})
	}
}

// listenEvents records ListenUnavailable events.
type listenEvents struct {
	core.NopObserver
	mu     sync.Mutex
	events []pg.ListenUnavailableEvent
	got    chan struct{}
}

func (o *listenEvents) ListenUnavailable(_ context.Context, e pg.ListenUnavailableEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
	if len(o.events) == 1 {
		close(o.got)
	}
}

func (o *listenEvents) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events)
}

// listenConns tracks the connections of a pool's config (which Watch's
// own connection copies) that sent a LISTEN, and whether they are closed.
type listenConns struct {
	mu    sync.Mutex
	conns []*trackedConn
}

type trackedConn struct {
	net.Conn
	listened, closed atomic.Bool
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("LISTEN ")) {
		c.listened.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *trackedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

func (l *listenConns) install(cc *pgx.ConnConfig) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := &trackedConn{Conn: nc}
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
		return c, nil
	}
}

// count returns how many connections sent a LISTEN and how many of those
// are still open.
func (l *listenConns) count() (listened, open int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if c.listened.Load() {
			listened++
			if !c.closed.Load() {
				open++
			}
		}
	}
	return listened, open
}

// watchProbe wraps a Backend and records when its Watch (or WatchTurns) is subscribed and
// how many busy answers it gave.
type watchProbe struct {
	busyCounter
	ready chan struct{}
	once  sync.Once
}

// busyCounter counts the busy answers a Backend gives.
type busyCounter struct {
	*pg.Backend
	busy atomic.Int64
}

func (c *busyCounter) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	l, err := c.Backend.TryAcquire(ctx, req)
	if errors.Is(err, core.ErrNotAcquired) {
		c.busy.Add(1)
	}
	return l, err
}

func (w *watchProbe) Watch(ctx context.Context, ready func(), fn func(string)) error {
	return w.Backend.Watch(ctx, func() { w.once.Do(func() { close(w.ready) }); ready() }, fn)
}

// WatchTurns is what the engine subscribes with on a Queuer.
func (w *watchProbe) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	return w.Backend.WatchTurns(ctx, func() { w.once.Do(func() { close(w.ready) }); ready() }, fn)
}

// Rule: a LISTEN connection through a transaction pooler, where LISTEN is
// accepted and notifications are dropped, is detected: the Locker warns
// once, through the logger and the Observer, naming the fix, closes it and
// polls; waiters still get the lock after a release.
func TestPgBouncerListenFallback(t *testing.T) {
	t.Parallel() // each has its own pgbouncer; the suites mostly wait on timers
	bn := startBouncer(t)
	table := newTable(t, bouncerPool(t, bn, execMode))
	var logs testenv.SyncBuffer
	obs := &listenEvents{got: make(chan struct{})}
	ctx := ctxT(t)
	conns := &listenConns{}
	pool := bouncerPool(t, bn, func(c *pgxpool.Config) { execMode(c); conns.install(c.ConnConfig) })
	l, err := pg.New(ctx, pool, pg.WithTable(table),
		pg.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), pg.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	holder := newClient(t, bouncerBackend(t, bn, table, execMode, pg.WithoutListen()))
	s := testenv.Hold(t, ctx, holder, "k")
	// A waiter makes the Locker subscribe.
	got := testenv.AcquireAsync(ctx, l, "k", core.Backoff(20*time.Millisecond, 100*time.Millisecond))
	select {
	case <-obs.got:
	case <-time.After(15 * time.Second):
		t.Fatalf("no ListenUnavailable event 15s after a wait began through pgbouncer; log: %q", logs.String())
	}
	obs.mu.Lock()
	e := obs.events[0]
	obs.mu.Unlock()
	if e.Backend != "pg" || e.Table != (pgx.Identifier{table}).Sanitize() {
		t.Errorf("event = %+v, want backend pg and table %s", e, table)
	}
	if !errors.Is(e.Err, pg.ErrListenUnavailable) || !errors.Is(e.Err, core.ErrUnsupported) {
		t.Errorf("event error %v matches neither ErrListenUnavailable nor core.ErrUnsupported", e.Err)
	}
	for _, want := range []string{"PgBouncer", "WithListenConfig", "WithoutListen"} {
		if !strings.Contains(e.Err.Error(), want) {
			t.Errorf("event error %q does not name %s", e.Err, want)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("%d warnings logged, want 1: %q", n, out)
	}
	for _, want := range []string{"poll", "PgBouncer", "WithListenConfig", "WithoutListen", "table="} {
		if !strings.Contains(out, want) {
			t.Errorf("warning %q does not mention %s", out, want)
		}
	}
	if strings.Contains(out, bn.url) || strings.Contains(out, "127.0.0.1") {
		t.Errorf("warning names the connection: %q", out)
	}
	// The useless LISTEN connection is closed.
	if !testenv.WaitFor(5*time.Second, func() bool { n, open := conns.count(); return n > 0 && open == 0 }) {
		n, open := conns.count()
		t.Errorf("%d connections sent LISTEN, %d of them still open after the fallback", n, open)
	}
	// The waiter polls and gets the lock once it is released.
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := testenv.Receive(t, got, 10*time.Second, "waiter never acquired after the release"); r.Err != nil {
		t.Fatalf("waiter after the fallback: %v", r.Err)
	}
	// A later subscription of the same Backend fails at once, silently.
	b := l.Backend().(*pg.Backend)
	start := time.Now()
	if err := b.Watch(ctx, func() { t.Error("ready called") }, func(string) {}); !errors.Is(err, pg.ErrListenUnavailable) {
		t.Fatalf("Watch after the fallback = %v", err)
	} else if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Watch after the fallback took %v: it connected again", d)
	}
	if n := obs.count(); n != 1 {
		t.Errorf("%d ListenUnavailable events, want 1", n)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings after a second Watch, want 1", n)
	}
}

// Rule: a direct LISTEN connection (WithListenConfig) behind a pool that goes
// through PgBouncer restores notification wake-ups: no warning, and a waiter
// whose poll timer is seconds away takes over within moments of a release.
func TestPgBouncerListenConfig(t *testing.T) {
	t.Parallel() // each has its own pgbouncer; the suites mostly wait on timers
	needDirect(t, "WithListenConfig gets DISLOCK_TEST_PG as the direct connection")
	bn := startBouncer(t)
	table := newTable(t, bouncerPool(t, bn, execMode))
	var logs testenv.SyncBuffer
	obs := &listenEvents{got: make(chan struct{})}
	ctx := ctxT(t)
	be := bouncerBackend(t, bn, table, execMode, pg.WithListenConfig(directConfig(t)),
		pg.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), pg.WithObserver(obs))
	w := &watchProbe{busyCounter: busyCounter{Backend: be}, ready: make(chan struct{})}
	waiter := newClient(t, w)
	holder := newClient(t, bouncerBackend(t, bn, table, execMode, pg.WithoutListen()))
	for i := range 3 {
		s := testenv.Hold(t, ctx, holder, "k")
		busy := w.busy.Load()
		got := testenv.AcquireAsync(ctx, waiter, "k", core.Backoff(5*time.Second, 10*time.Second))
		select {
		case <-w.ready:
		case <-time.After(10 * time.Second):
			t.Fatalf("the direct LISTEN connection never subscribed; log: %q", logs.String())
		}
		// The waiter's first attempt is answered busy before the release,
		// so only a notification (or its poll, 5s later) can wake it.
		if !testenv.WaitFor(10*time.Second, func() bool { return w.busy.Load() > busy }) {
			t.Fatal("the waiter's first attempt never came back busy")
		}
		released := time.Now()
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := testenv.Receive(t, got, 15*time.Second, "waiter never acquired")
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if d := r.V.Sub(released); d > 2*time.Second {
			t.Errorf("round %d: hand-off took %v with a 5s poll: the waiter was not notified", i, d)
		}
	}
	if obs.count() != 0 || strings.Contains(logs.String(), "WARN") {
		t.Errorf("a working direct LISTEN was reported unavailable: %q", logs.String())
	}
}

// Rule: the default statement cache behind a transaction pooler fails with
// an error that says what to set, keeping the server's error.
func TestPgBouncerPreparedStatementHint(t *testing.T) {
	t.Parallel() // each has its own pgbouncer; the suites mostly wait on timers
	bn := startBouncer(t)
	table := newTable(t, bouncerPool(t, bn, execMode))
	ctx := ctxT(t)
	pool := bouncerPool(t, bn, func(c *pgxpool.Config) { c.MaxConns = 8 }) // pgx's default: cached prepared statements
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		found error
	)
	hinted := func(err error) bool {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "42P05" || pe.Code == "26000") {
			mu.Lock()
			defer mu.Unlock()
			if found == nil {
				found = err
			}
			return true
		}
		return false
	}
	// The schema check may meet the conflict already; then its error must
	// say what to set.
	b, err := pg.NewBackend(ctx, pool, pg.WithTable(table), pg.WithoutListen())
	if err != nil && !hinted(err) {
		t.Fatal(err)
	}
	for g := range 8 {
		if b == nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				key := "k" + string(rune('a'+g))
				tok := testenv.Name("t")
				_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "me", OwnerToken: tok, TTL: time.Minute})
				if err == nil {
					err = b.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: tok})
				}
				if hinted(err) {
					return
				}
				if err != nil {
					t.Errorf("op %d: unexpected error %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if found == nil {
		t.Fatal("400 operations with cached prepared statements through pgbouncer never failed on one: the test proves nothing")
	}
	for _, want := range []string{"QueryExecModeExec", "default_query_exec_mode=exec", "PgBouncer"} {
		if !strings.Contains(found.Error(), want) {
			t.Errorf("error %q does not name %s", found, want)
		}
	}
}

// Rule: the acquire (one statement that carries its bound) stays one
// transaction through PgBouncer, in exec mode and over the simple protocol:
// a claim held up on the server past the claim timeout is refused when the
// wait ends (pg.ErrClaimTimeout) and takes no effect, nothing leaks into the
// pooler's shared server connections (their statement_timeout is theirs),
// and the key is free afterwards.
func TestPgBouncerClaimBound(t *testing.T) {
	t.Parallel() // each has its own pgbouncer; the suites mostly wait on timers
	const claimTimeout = 300 * time.Millisecond
	bn := startBouncer(t)
	admin := bouncerPool(t, bn, execMode)
	for _, m := range []struct {
		name string
		edit func(*pgxpool.Config)
	}{
		{"exec", execMode},
		{"simple", queryMode(pgx.QueryExecModeSimpleProtocol)},
	} {
		t.Run(m.name, func(t *testing.T) {
			table := newTable(t, admin)
			unblock := blockExpiredRow(t, admin, table, "k", false)
			ctx := ctxT(t)
			pool := bouncerPool(t, bn, m.edit)
			b, err := pg.NewBackend(ctx, pool, pg.WithTable(table), pg.WithClaimTimeout(claimTimeout), pg.WithoutListen())
			if err != nil {
				t.Fatal(err)
			}
			var before string
			if err := pool.QueryRow(ctx, "SHOW statement_timeout").Scan(&before); err != nil {
				t.Fatal(err)
			}
			claimPastBound(t, claimTimeout, unblock, func() error {
				_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: "mine", TTL: time.Minute})
				return err
			})
			if h := rowHolder(t, admin, table, "k", false); h != "old-token" {
				t.Fatalf("the refused claim took effect: holder %q", h)
			}
			// The pooler's server connections keep their own
			// statement_timeout.
			for range 8 {
				var st string
				if err := pool.QueryRow(ctx, "SHOW statement_timeout").Scan(&st); err != nil {
					t.Fatal(err)
				}
				if st != before {
					t.Fatalf("statement_timeout on a pooled server connection is %q after a claim, %q before: the setting leaked", st, before)
				}
			}
			if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: "mine", TTL: time.Minute}); err != nil {
				t.Fatalf("TryAcquire once the row is free: %v", err)
			}
			if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "mine"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// slowConn delays the second read after a LISTEN was written (the first
// wait for a notification, the LISTEN's own reply being the first) by delay.
type slowConn struct {
	net.Conn
	delay  time.Duration
	reads  atomic.Int32 // reads since the LISTEN; -1 before it
	waited atomic.Bool
}

func (c *slowConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("LISTEN ")) {
		c.reads.Store(0)
	}
	return c.Conn.Write(p)
}

func (c *slowConn) Read(p []byte) (int, error) {
	if c.reads.Load() >= 0 && c.reads.Add(1) == 2 {
		time.Sleep(c.delay) // the notification is in the socket by then
		c.waited.Store(true)
	}
	return c.Conn.Read(p)
}

// Rule: a LISTEN connection that is slow (the probe notification is late)
// is not taken for a deaf one: the round trip after the probe's wait finds
// the notification, Watch subscribes and nothing is reported.
func TestListenProbeSlowIsNotDeaf(t *testing.T) {
	t.Parallel()
	table := freshTable(t)
	if throughPooler(t) {
		t.Skip("DISLOCK_TEST_PG goes through a transaction pooler: its LISTEN is deaf, not slow")
	}
	cc := directConfig(t)
	// Wrapped after TLS (when the URL's sslmode leads to it), so that the
	// LISTEN is seen in the clear; every attempt the URL's fallbacks make
	// is wrapped, and the last is the connection kept.
	var slow *slowConn
	cc.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, nc net.Conn) (net.Conn, error) {
		slow = &slowConn{Conn: nc, delay: 2500 * time.Millisecond}
		slow.reads.Store(-1)
		return slow, nil
	}
	var logs testenv.SyncBuffer
	obs := &listenEvents{got: make(chan struct{})}
	b := newBackend(t, table, pg.WithListenConfig(cc),
		pg.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), pg.WithObserver(obs))
	ctx, cancel := context.WithCancel(ctxT(t))
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- b.Watch(ctx, func() { close(ready) }, func(string) {}) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Watch on a slow connection = %v; log: %q", err, logs.String())
	case <-time.After(15 * time.Second):
		t.Fatal("Watch never subscribed")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch after cancel = %v", err)
	}
	if !slow.waited.Load() {
		t.Error("the connection was never slowed: the test proves nothing")
	}
	if obs.count() != 0 || logs.String() != "" {
		t.Errorf("a slow LISTEN was reported unavailable: %q", logs.String())
	}
}

// Rule: WithLogger(nil) is rejected with an error naming the option;
// WithObserver(nil) is ignored.
func TestWithLoggerNil(t *testing.T) {
	admin, table := adminAndTable(t)
	_, err := pg.NewBackend(ctxT(t), admin, pg.WithTable(table), pg.WithLogger(nil))
	if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithLogger") {
		t.Fatalf("WithLogger(nil) = %v, want ErrInvalidOption naming WithLogger", err)
	}
	l, err := pg.New(ctxT(t), admin, pg.WithTable(table), pg.WithObserver(nil))
	if err != nil {
		t.Fatalf("WithObserver(nil): %v", err)
	}
	_ = l.Close()
}
