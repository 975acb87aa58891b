package pg_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimModes are the ways a pool can talk to the server, with the table
// variants: the claim bound must hold in each.
var claimModes = []struct {
	name      string
	edit      func(*pgxpool.Config)
	opts      []pg.Option // for the Backend under test
	tableOpts []pg.Option // for the table
}{
	{name: "cache"},
	{name: "exec", edit: queryMode(pgx.QueryExecModeExec),
		opts: []pg.Option{pg.WithoutNotify(), pg.WithoutListen()}},
	{name: "simple-async", edit: queryMode(pgx.QueryExecModeSimpleProtocol),
		opts: []pg.Option{pg.WithAsyncCommit()}},
	{name: "describe-exec", edit: queryMode(pgx.QueryExecModeDescribeExec)},
	{name: "legacy", opts: []pg.Option{pg.WithLegacyTable()}, tableOpts: []pg.Option{pg.WithLegacyTable()}},
	// A higher statement_timeout of the session gives way to the claim
	// timeout (a lower one is kept: TestStatementTimeout).
	{name: "session-timeout-10s", edit: func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "10s" }},
}

// blockExpiredRow writes an expired row for key, held by "old-token", and
// has another transaction lock it until the returned rollback is called (or
// the test ends): an acquire's takeover of the row waits for that lock.
func blockExpiredRow(t *testing.T, admin *pgxpool.Pool, table, key string, legacy bool) (rollback func()) {
	t.Helper()
	ctx := ctxT(t)
	ident := quoted(table)
	ins := `INSERT INTO ` + ident + ` (key, owner, holder, acquired_at, expire_at)
		VALUES ($1, 'old', 'old-token', now() - interval '1 minute', now() - interval '1 second')`
	if legacy {
		ins = `INSERT INTO ` + ident + ` (key, value, expire_at) VALUES ($1, 'old-token old', now() - interval '1 second')`
	}
	if _, err := admin.Exec(ctx, ins, key); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rollback = func() {
		if err := tx.Rollback(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Error(err)
		}
	}
	t.Cleanup(rollback)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+ident+` WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	return rollback
}

// rowHolder returns the owner token in key's row, live or not ("" when
// there is no row).
func rowHolder(t *testing.T, admin *pgxpool.Pool, table, key string, legacy bool) string {
	t.Helper()
	col := "holder"
	if legacy {
		col = "split_part(value, ' ', 1)"
	}
	var holder string
	err := admin.QueryRow(ctxT(t), `SELECT `+col+` FROM `+quoted(table)+` WHERE key = $1`, key).Scan(&holder)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return holder
}

// lockWaiters counts the statements of connections named app that wait for
// a lock on the server.
func lockWaiters(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	err := admin.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'active' AND wait_event_type = 'Lock'`, app).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// warm makes pool open n connections and leaves them idle in it.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// waitFor polls cond every 10ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Rule: an acquire held up on the server (here by another transaction's lock
// on the expired row it takes over) past its caller's ctx is aborted by the
// server within the claim timeout, so it cannot take effect after the
// engine's undo: nothing is held once the blocker is gone. In every exec
// mode and on the legacy table.
func TestHeldUpClaimAbortedByServer(t *testing.T) {
	const claimTimeout = time.Second
	admin := newPool(t, nil)
	for _, m := range claimModes {
		t.Run(m.name, func(t *testing.T) {
			if m.name == "session-timeout-10s" {
				needDirect(t, "it sets statement_timeout as a startup parameter")
			}
			legacy := len(m.tableOpts) > 0
			table := newTable(t, admin, m.tableOpts...)
			unblock := blockExpiredRow(t, admin, table, "k", legacy)
			var edits []func(*pgxpool.Config)
			if m.edit != nil {
				edits = append(edits, m.edit)
			}
			pool, app, down := faultPool(t, edits...)
			ctx := ctxT(t)
			b, err := pg.NewBackend(ctx, pool, append([]pg.Option{pg.WithTable(table), pg.WithClaimTimeout(claimTimeout)}, m.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			l := newClient(t, b)
			t.Cleanup(unblock) // before the pool closes: it waits for the claim's connection
			// pgx cancels a statement whose ctx ends with a cancel request
			// on a new connection: that is lost here, as when the network
			// fails. The pool's idle connections still work.
			warm(t, pool, 2)
			down.Store(true)
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = l.TryAcquire(cctx, "k", core.TTL(time.Minute))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("TryAcquire with a ctx that ends while the claim waits = %v", err)
			}
			// The claim outlived its caller's ctx on the server...
			if n := lockWaiters(t, admin, app); n != 1 {
				if seen := time.Since(start); seen >= claimTimeout {
					// The server may rightly have aborted it by then.
					t.Skipf("machine too slow: the waiting claims were counted %v after the claim was sent, past the claim timeout %v", seen.Round(time.Millisecond), claimTimeout)
				}
				t.Fatalf("%d claims wait on the server after the caller's ctx ended, want 1", n)
			}
			// ...until the server aborted it.
			if !waitFor(claimTimeout+5*time.Second, func() bool { return lockWaiters(t, admin, app) == 0 }) {
				t.Fatalf("the claim still waits on the server %v after it was sent: no server-side bound", time.Since(start).Round(time.Millisecond))
			}
			if d := time.Since(start); d > b.ClaimBound() {
				t.Errorf("the claim was aborted %v after it was sent, past ClaimBound %v", d.Round(time.Millisecond), b.ClaimBound())
			}
			down.Store(false)
			unblock()
			if h := rowHolder(t, admin, table, "k", legacy); h != "old-token" {
				t.Fatalf("the aborted claim took effect when the blocker left: the row's holder is %q", h)
			}
			if info, held, err := b.Inspect(ctx, "k"); err != nil || held {
				t.Fatalf("Inspect after the blocker left = %+v %v %v, want free", info, held, err)
			}
			s, err := newClient(t, newBackend(t, table, m.opts...)).TryAcquire(ctx, "k")
			if err != nil {
				t.Fatalf("the key is not free for others: %v", err)
			}
			_ = s.Release(ctx)
		})
	}
}

// Rule: the wait for a pool connection counts against the claim timeout: an
// acquire left with less than half of it is not sent (a clear error naming
// the option), a shorter wait is fine.
func TestClaimNotSentAfterLongPoolWait(t *testing.T) {
	const claimTimeout = time.Second
	admin, table := adminAndTable(t)
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	b, err := pg.NewBackend(ctxT(t), pool, pg.WithTable(table), pg.WithClaimTimeout(claimTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	busy := func(d time.Duration) { // hold the pool's only connection for d
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(d, c.Release)
	}
	busy(claimTimeout * 3 / 4)
	_, err = b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: "t1", TTL: time.Minute})
	if err == nil || errors.Is(err, core.ErrNotAcquired) || !strings.Contains(err.Error(), "WithClaimTimeout") {
		t.Fatalf("TryAcquire after a long pool wait = %v, want an error naming WithClaimTimeout", err)
	}
	if h := rowHolder(t, admin, table, "k", false); h != "" {
		t.Fatalf("an acquire reported as not sent wrote a row held by %q", h)
	}
	busy(claimTimeout / 10)
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: "t2", TTL: time.Minute}); err != nil {
		t.Fatalf("TryAcquire after a short pool wait: %v", err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t2"}); err != nil {
		t.Fatal(err)
	}
}

// Rule: WithClaimTimeout rejects values outside 10ms..24h with an error
// naming it; ClaimBound covers the timeout and stays below the default TTL,
// so the engine repeats the undo of an ambiguous claim by default.
func TestClaimTimeoutOption(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	for _, d := range []time.Duration{0, -time.Second, 9 * time.Millisecond, 25 * time.Hour} {
		_, err := pg.NewBackend(ctx, admin, pg.WithTable(table), pg.WithClaimTimeout(d))
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithClaimTimeout") {
			t.Errorf("WithClaimTimeout(%v) = %v, want ErrInvalidOption naming WithClaimTimeout", d, err)
		}
	}
	def := newBackend(t, table)
	if cb := def.ClaimBound(); cb <= pg.DefaultClaimTimeout || cb >= core.DefaultTTL {
		t.Errorf("default ClaimBound = %v, want above the claim timeout %v and below the default TTL %v", cb, pg.DefaultClaimTimeout, core.DefaultTTL)
	}
	if cb := newBackend(t, table, pg.WithClaimTimeout(5*time.Second)).ClaimBound(); cb <= 5*time.Second {
		t.Errorf("ClaimBound with WithClaimTimeout(5s) = %v", cb)
	}
}

// sqlLog receives the SQL of every statement a pool sends, batches
// included (its tracer runs before the call that sends them returns).
type sqlLog chan string

// drain returns the statements sent since the last drain.
func (l sqlLog) drain() (sent []string) {
	for {
		select {
		case sql := <-l:
			sent = append(sent, sql)
		default:
			return sent
		}
	}
}

func (l sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l <- d.SQL
	return ctx
}
func (l sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l sqlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l sqlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l <- d.SQL
}
func (l sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Rule: a TryAcquire of a key the Backend last found held by another owner
// sends one statement, a read that takes no lock, writes nothing and sets
// nothing, while the key stays held; once the holder has released, that
// read finds the key free and the claim follows.
func TestTryOfKeyHeldElsewhereIsOneRead(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	holder := newBackend(t, table)
	log := make(sqlLog, 1000)
	b := newBackendPool(t, table, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log })
	req := func() core.AcquireRequest {
		return core.AcquireRequest{Key: "k", Owner: "tryer", OwnerToken: rand.Text(), TTL: time.Minute}
	}
	held := core.AcquireRequest{Key: "k", Owner: "holder", OwnerToken: rand.Text(), TTL: time.Minute}
	if _, err := holder.TryAcquire(ctxT(t), held); err != nil {
		t.Fatal(err)
	}
	log.drain()
	for i := range 3 {
		_, err := b.TryAcquire(ctxT(t), req())
		var busy *core.NotAcquiredError
		if !errors.As(err, &busy) || busy.Holder == nil || busy.Holder.Owner != "holder" || busy.Holder.Remaining <= 0 {
			t.Fatalf("try %d of a key held elsewhere: %v, want busy, held by holder", i, err)
		}
		sent := log.drain()
		if i == 0 {
			continue // the first try claims: nothing was known of the key
		}
		if len(sent) != 1 || !strings.HasPrefix(sent[0], "SELECT") || strings.Contains(sent[0], "set_config") || strings.Contains(sent[0], "FOR UPDATE") {
			t.Fatalf("try %d of a key found held: sent %q, want one plain SELECT", i, sent)
		}
	}
	if err := holder.Release(ctxT(t), core.ReleaseRequest{Key: "k", OwnerToken: held.OwnerToken}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctxT(t), req()); err != nil {
		t.Fatalf("try after the release: %v", err)
	}
	if sent := log.drain(); len(sent) != 3 {
		t.Fatalf("try after the release sent %d statements, want 3 (the read, then the claim's batch)", len(sent))
	}
}
