package pg_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// renewCounter reports every renewal outcome on a channel.
type renewCounter struct {
	core.NopObserver
	ok, failed chan struct{}
}

func newRenewCounter() *renewCounter {
	return &renewCounter{ok: make(chan struct{}, 1024), failed: make(chan struct{}, 1024)}
}

func (r *renewCounter) RenewEnd(_ context.Context, e core.RenewEndEvent) {
	ch := r.ok
	if e.Err != nil {
		ch = r.failed
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

func drain(ch chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// terminate ends every server connection whose application_name is app.
func terminate(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	err := admin.QueryRow(ctxT(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// faultPool is a pool tagged with a unique application_name whose new
// connections fail while down is set; so do pgx's cancel requests, which
// open a connection of their own. edit may change its config first.
func faultPool(t *testing.T, edit ...func(*pgxpool.Config)) (pool *pgxpool.Pool, app string, down *atomic.Bool) {
	app = testenv.Name("dislock_fault_")
	down = new(atomic.Bool)
	pool = newPool(t, func(c *pgxpool.Config) {
		for _, e := range edit {
			e(c)
		}
		c.ConnConfig.RuntimeParams["application_name"] = app
		d := &net.Dialer{Timeout: 2 * time.Second}
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				return nil, errors.New("test: network down")
			}
			return d.DialContext(ctx, network, addr)
		}
	})
	return pool, app, down
}

// Rule: pg_terminate_backend on the Locker's connections while locks are
// held: the leases survive when reconnecting works within the renew
// deadline.
func TestTerminateBackendSurvives(t *testing.T) {
	needDirect(t, "it finds its connections by application_name")
	admin, table := adminAndTable(t)
	pool, app, _ := faultPool(t)
	b := backendOn(t, pool, table)
	obs := newRenewCounter()
	l := newClient(t, b, core.WithObserver(obs))
	ctx := ctxT(t)
	var sessions []core.Session
	for _, k := range []string{"a", "b", "c"} {
		s := testenv.Hold(t, ctx, l, k, core.TTL(3*time.Second))
		sessions = append(sessions, s)
	}
	if n := terminate(t, admin, app); n == 0 {
		t.Fatal("no connection to terminate")
	}
	drain(obs.ok)
	// Two successful renewal rounds after the cut prove recovery.
	for i := 0; i < 2*len(sessions); i++ {
		select {
		case <-obs.ok:
		case <-time.After(5 * time.Second):
			t.Fatal("renewals did not recover after pg_terminate_backend")
		}
	}
	for _, s := range sessions {
		if err := s.Err(); err != nil {
			t.Fatalf("%s lost although the reconnect was quick: %v", s.Key(), err)
		}
		info, held, err := l.Inspect(ctx, s.Key())
		if err != nil || !held || info.Token != s.Token() {
			t.Fatalf("Inspect %s = %+v %v %v", s.Key(), info, held, err)
		}
		_ = s.Release(ctx)
	}
}

// Rule: when the connections are cut and cannot come back within the renew
// deadline, the loss is signalled before the server could give the lock to
// anyone else.
func TestTerminateBackendLossSignalled(t *testing.T) {
	needDirect(t, "it finds its connections by application_name")
	admin, table := adminAndTable(t)
	pool, app, down := faultPool(t)
	b := backendOn(t, pool, table)
	l := newClient(t, b)
	other := newClient(t, newBackend(t, table))
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	s := testenv.Hold(t, ctx, l, "k", core.TTL(ttl))
	down.Store(true)
	terminate(t, admin, app)
	cut := time.Now()
	select {
	case <-s.Done():
	case <-time.After(2 * ttl):
		t.Fatal("loss not signalled")
	}
	lostAfter := time.Since(cut)
	if !errors.Is(s.Err(), core.ErrLeaseLost) {
		t.Fatalf("Err = %v", s.Err())
	}
	// The server still holds it until its expiry: the holder knew first.
	_, err := other.TryAcquire(ctx, "k")
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("lock free at the moment of loss (%v after the cut): %v", lostAfter, err)
	}
	s2, err := other.Acquire(ctx, "k")
	if err != nil {
		t.Fatalf("lock never freed: %v", err)
	}
	_ = s2.Release(ctx)
}

// Rule: statement_timeout firing is a typed error and leaves nothing half
// done; a session's statement_timeout lower than the claim timeout is kept.
func TestStatementTimeout(t *testing.T) {
	needDirect(t, "it sets statement_timeout as a startup parameter")
	admin, table := adminAndTable(t)
	ident := quoted(table)
	ctx := ctxT(t)
	// An expired row whose lock another transaction holds: the acquire's
	// takeover has to wait for it.
	if _, err := admin.Exec(ctx, `INSERT INTO `+ident+` (key, owner, holder, acquired_at, expire_at)
		VALUES ('k', 'old', 'old-token', now() - interval '1 minute', now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+ident+` WHERE key = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	b := newBackendPool(t, table, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = "200"
	})
	l := newClient(t, b)
	start := time.Now()
	_, err = l.TryAcquire(ctx, "k")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire = %v, want a wrapped *pgconn.PgError 57014", err)
	}
	// The session's statement_timeout is lower than the claim timeout: it
	// is kept.
	if d := time.Since(start); d >= pg.DefaultClaimTimeout {
		t.Errorf("TryAcquire failed after %v: the session's statement_timeout (200ms) was raised to the claim timeout", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var holder string
	if err := admin.QueryRow(ctx, `SELECT holder FROM `+ident+` WHERE key = 'k'`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != "old-token" {
		t.Fatalf("row changed by a timed-out acquire: holder %q", holder)
	}
	s, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("after the blocker left: %v", err)
	}
	_ = s.Release(ctx)
}

// lostReply commits every acquire on the server and then reports a failure,
// as when the connection drops between the commit and the reply.
type lostReply struct{ *pg.Backend }

func (b lostReply) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if _, err := b.Backend.TryAcquire(ctx, req); err != nil {
		return core.Lease{}, err
	}
	return core.Lease{}, &pgconn.ConnectError{}
}

// lateClaim reports every acquire as failed at once and applies it on the
// server only after the engine's first undo of it: a statement that goes on
// on the server after its client gave up, and takes effect after the undo.
type lateClaim struct {
	*pg.Backend
	mu      sync.Mutex
	pending map[string]core.AcquireRequest // by owner token
	landed  chan error                     // the result of each late claim
}

func (b *lateClaim) TryAcquire(_ context.Context, req core.AcquireRequest) (core.Lease, error) {
	b.mu.Lock()
	b.pending[req.OwnerToken] = req
	b.mu.Unlock()
	return core.Lease{}, &pgconn.ConnectError{}
}

func (b *lateClaim) Release(ctx context.Context, req core.ReleaseRequest) error {
	err := b.Backend.Release(ctx, req)
	b.mu.Lock()
	claim, ok := b.pending[req.OwnerToken]
	delete(b.pending, req.OwnerToken)
	b.mu.Unlock()
	if ok {
		_, cerr := b.Backend.TryAcquire(ctx, claim)
		b.landed <- cerr
	}
	return err
}

// Rule: a reply lost after the server committed an acquire is reconciled:
// the lock is released by owner token before the error is returned, not left
// held until its TTL. A claim that takes effect after that undo (within the
// claim bound) is undone again once the bound has passed; so is a claim
// whose caller's ctx ended while the statement waited on the server and
// that took effect when the wait ended.
func TestLostReplyReconciled(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	l := newClient(t, lostReply{b})
	ctx := ctxT(t)
	if _, err := l.TryAcquire(ctx, "k", core.TTL(time.Minute)); err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire = %v, want a backend failure", err)
	}
	if info, held, err := b.Inspect(ctx, "k"); err != nil || held {
		t.Fatalf("orphan lock left until its TTL: %+v %v %v", info, held, err)
	}

	// The claim lands after the first undo.
	bounded := newBackend(t, table, pg.WithClaimTimeout(500*time.Millisecond))
	late := &lateClaim{Backend: bounded, pending: make(map[string]core.AcquireRequest), landed: make(chan error, 1)}
	ll := newClient(t, late)
	sent := time.Now()
	if _, err := ll.TryAcquire(ctx, "late", core.TTL(time.Minute)); err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire = %v, want a backend failure", err)
	}
	if err := <-late.landed; err != nil {
		t.Fatalf("the late claim failed: %v", err)
	}
	if _, held, err := b.Inspect(ctx, "late"); err != nil || !held {
		t.Fatalf("the claim applied after the first undo is not held (%v %v): the case is not tested", held, err)
	}
	if !testenv.WaitFor(bounded.ClaimBound()+3*time.Second, func() bool {
		_, held, err := b.Inspect(ctx, "late")
		return err == nil && !held
	}) {
		t.Fatalf("a claim that took effect after its undo is still held %v after it was sent (ClaimBound %v): left until its TTL",
			time.Since(sent).Round(time.Millisecond), bounded.ClaimBound())
	}

	// The caller's ctx ends while the statement waits for another
	// transaction's row lock, and pgx's cancel request cannot get through;
	// the wait ends before the claim timeout, so the claim takes effect
	// after the first undo.
	unblock := blockExpiredRow(t, admin, table, "c", false)
	pool, _, down := faultPool(t)
	cut, err := pg.NewBackend(ctx, pool, pg.WithTable(table), pg.WithClaimTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l2 := newClient(t, cut)
	t.Cleanup(unblock) // before the pool closes: it waits for the claim's connection
	warm(t, pool, 2)   // the undo gets an idle connection: only the cancel is lost
	down.Store(true)
	sent = time.Now()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := l2.TryAcquire(cctx, "c", core.TTL(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire with expiring ctx = %v", err)
	}
	unblock()
	if !testenv.WaitFor(time.Second, func() bool {
		h := rowHolder(t, admin, table, "c", false)
		return h != "old-token" && h != ""
	}) {
		t.Fatalf("the cancelled claim did not take effect when the blocker left: the case is not tested")
	}
	if !testenv.WaitFor(cut.ClaimBound()+3*time.Second, func() bool {
		_, held, err := b.Inspect(ctx, "c")
		return err == nil && !held
	}) {
		t.Fatalf("the cancelled claim is still held %v after it was sent (ClaimBound %v): left until its TTL",
			time.Since(sent).Round(time.Millisecond), cut.ClaimBound())
	}
}
