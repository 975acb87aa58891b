package pg_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimMode is a way a pool can talk to the server, or a table variant.
type claimMode struct {
	name      string
	edit      func(*pgxpool.Config)
	opts      []pg.Option // for the Backend under test
	tableOpts []pg.Option // for the table
}

// claimModes are the claim modes: the claim bound must hold in each.
var claimModes = []claimMode{
	{name: "cache"},
	{name: "exec", edit: queryMode(pgx.QueryExecModeExec),
		opts: []pg.Option{pg.WithoutNotify(), pg.WithoutListen()}},
	{name: "simple-async", edit: queryMode(pgx.QueryExecModeSimpleProtocol),
		opts: []pg.Option{pg.WithAsyncCommit()}},
	{name: "describe-exec", edit: queryMode(pgx.QueryExecModeDescribeExec)},
	{name: "legacy", opts: []pg.Option{pg.WithLegacyTable()}, tableOpts: []pg.Option{pg.WithLegacyTable()}},
	// A higher statement_timeout of the session does not lengthen the
	// claim bound (a lower one applies: TestStatementTimeout).
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
	return running(t, admin, app, true)
}

// running counts the statements of connections named app that run on the
// server, or with lock only those that wait for a lock.
func running(t *testing.T, admin *pgxpool.Pool, app string, lock bool) int {
	t.Helper()
	var n int
	err := admin.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'active' AND (NOT $2 OR wait_event_type = 'Lock')`, app, lock).Scan(&n)
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

// eachClaimMode runs test for each of claimModes, in a subtest with a table
// of its own (made by admin) whose expired row "k" another transaction
// locks until unblock is called.
func eachClaimMode(t *testing.T, admin *pgxpool.Pool, test func(t *testing.T, m claimMode, table string, legacy bool, unblock func())) {
	for _, m := range claimModes {
		t.Run(m.name, func(t *testing.T) {
			if m.name == "session-timeout-10s" {
				needDirect(t, "it sets statement_timeout as a startup parameter")
			}
			legacy := len(m.tableOpts) > 0
			table := newTable(t, admin, m.tableOpts...)
			test(t, m, table, legacy, blockExpiredRow(t, admin, table, "k", legacy))
		})
	}
}

// claimPastBound runs claim, which another transaction's row lock holds up
// on the server, lets that lock go (unblock) once the claim timeout and a
// margin have passed, and checks that the server refused the claim then: it
// fails with pg.ErrClaimTimeout, naming WithClaimTimeout, and is not busy.
func claimPastBound(t *testing.T, claimTimeout time.Duration, unblock func(), claim func() error) {
	t.Helper()
	done := make(chan struct{})
	timer := time.AfterFunc(claimTimeout+300*time.Millisecond, func() { defer close(done); unblock() })
	err := claim()
	if !timer.Stop() {
		<-done
	}
	if !errors.Is(err, pg.ErrClaimTimeout) || errors.Is(err, core.ErrNotAcquired) || !strings.Contains(err.Error(), "WithClaimTimeout") {
		t.Fatalf("a claim held up past the claim timeout, then let through = %v, want pg.ErrClaimTimeout naming WithClaimTimeout", err)
	}
}

// claimLeftNothing checks that a refused claim of "k" on table (made by
// blockExpiredRow) took no effect and that the key is free for others.
func claimLeftNothing(t *testing.T, admin *pgxpool.Pool, table string, legacy bool, opts []pg.Option) {
	t.Helper()
	if h := rowHolder(t, admin, table, "k", legacy); h != "old-token" {
		t.Fatalf("the refused claim took effect: the row's holder is %q", h)
	}
	ctx := ctxT(t)
	s, err := newClient(t, newBackend(t, table, opts...)).TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("the key is not free for others: %v", err)
	}
	_ = s.Release(ctx)
}

// Rule: an acquire held up on the server (here by another transaction's lock
// on the expired row it takes over) past the claim timeout is refused by the
// server when the wait ends: it fails with pg.ErrClaimTimeout and takes no
// effect, and the key is free for others. In every exec mode and on the
// legacy table.
func TestClaimRefusedPastBound(t *testing.T) { refusedPastBound(t, nil) }

// The same, for the claim of a key this Backend lately released (one
// UPDATE of its row).
func TestFreeClaimRefusedPastBound(t *testing.T) {
	refusedPastBound(t, func(b *pg.Backend) { pg.NoteReleased(b, "k") })
}

// refusedPastBound checks the rule of TestClaimRefusedPastBound with a
// Backend that prepare (when not nil) has readied for the claim.
func refusedPastBound(t *testing.T, prepare func(*pg.Backend)) {
	const claimTimeout = 300 * time.Millisecond
	admin := newPool(t, nil)
	eachClaimMode(t, admin, func(t *testing.T, m claimMode, table string, legacy bool, unblock func()) {
		b := newBackendPool(t, table, m.edit, append([]pg.Option{pg.WithClaimTimeout(claimTimeout)}, m.opts...)...)
		if prepare != nil {
			prepare(b)
		}
		ctx := ctxT(t)
		claimPastBound(t, claimTimeout, unblock, func() error {
			_, err := newClient(t, b).TryAcquire(ctx, "k", core.TTL(time.Minute))
			return err
		})
		claimLeftNothing(t, admin, table, legacy, m.opts)
	})
}

// Rule: an acquire held up on the server (here by another transaction's lock
// on the expired row it takes over) past its caller's ctx, whose cancel
// request is lost, cannot take effect after the claim bound: when the
// blocker leaves after ClaimBound, the server refuses the claim, and nothing
// is held. In every exec mode and on the legacy table.
func TestHeldUpClaimAbortedByServer(t *testing.T) {
	const claimTimeout = time.Second
	admin := newPool(t, nil)
	eachClaimMode(t, admin, func(t *testing.T, m claimMode, table string, legacy bool, unblock func()) {
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
			t.Fatalf("%d claims wait on the server after the caller's ctx ended, want 1", n)
		}
		// ...past the claim bound, when the blocker leaves.
		time.Sleep(time.Until(start.Add(b.ClaimBound())))
		down.Store(false)
		unblock()
		if !testenv.WaitFor(5*time.Second, func() bool { return running(t, admin, app, false) == 0 }) {
			t.Fatalf("the claim still runs on the server %v after the blocker left", time.Since(start).Round(time.Millisecond))
		}
		if info, held, err := b.Inspect(ctx, "k"); err != nil || held {
			t.Fatalf("Inspect after the blocker left = %+v %v %v, want free", info, held, err)
		}
		claimLeftNothing(t, admin, table, legacy, m.opts)
	})
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

// tracedBackend returns a Backend on table with a pool of its own, and the
// log of the statements that pool sends.
func tracedBackend(t testing.TB, table string, opts ...pg.Option) (sqlLog, *pg.Backend) {
	log := make(sqlLog, 1000)
	return log, newBackendPool(t, table, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log }, opts...)
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

// Rule: a key this Backend released is claimed by one UPDATE of its row, and a
// live lease is released by one UPDATE: no read before, no CTE. The
// tokens still grow. A key another process took since costs that UPDATE
// once more, then the claim answers busy.
func TestKeyReleasedHereIsOneUpdateEach(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	log, b := tracedBackend(t, table)
	ctx := ctxT(t)
	plainUpdate := func(what string, sent []string) {
		t.Helper()
		sent = slices.DeleteFunc(sent, func(q string) bool { return strings.Contains(q, "DELETE FROM") }) // the prune after a first release
		if len(sent) != 1 || !strings.HasPrefix(sent[0], "UPDATE") || strings.Contains(sent[0], "WITH") || strings.Contains(sent[0], "FOR UPDATE") {
			t.Fatalf("%s sent %q, want one plain UPDATE", what, sent)
		}
	}
	log.drain() // NewBackend's checks of the table
	var last uint64
	for i := range 3 {
		tok := rand.Text()
		lease, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: tok, TTL: time.Minute})
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if lease.Token <= last {
			t.Fatalf("claim %d: token %d, not above the last one, %d", i, lease.Token, last)
		}
		last = lease.Token
		sent := log.drain()
		if i == 0 {
			if len(sent) != 1 || !strings.HasPrefix(sent[0], "WITH") {
				t.Fatalf("the first claim of a key sent %q, want the claim", sent)
			}
		} else {
			plainUpdate(fmt.Sprintf("claim %d of a key released here", i), sent)
		}
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: tok}); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		plainUpdate(fmt.Sprintf("release %d of a live lease", i), log.drain())
	}
	if _, err := newBackend(t, table).TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "other", OwnerToken: rand.Text(), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: rand.Text(), TTL: time.Minute})
	var busy *core.NotAcquiredError
	if !errors.As(err, &busy) || busy.Holder == nil || busy.Holder.Owner != "other" {
		t.Fatalf("a claim of a key another process took since: %v, want busy, held by other", err)
	}
	if sent := log.drain(); len(sent) != 2 || !strings.HasPrefix(sent[0], "UPDATE") || !strings.HasPrefix(sent[1], "WITH") {
		t.Fatalf("a claim of a key another process took since sent %q, want the UPDATE, then the claim", sent)
	}
}

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
	if sent := log.drain(); len(sent) != 2 {
		t.Fatalf("try after the release sent %d statements, want 2 (the read, then the claim)", len(sent))
	}
}

// Rule: while a plain try's claim of a key is on its way, a later plain try
// of that key in the same Backend sends nothing: it waits for that claim,
// answers busy with the winner's lease when it won, and asks the store
// itself when it did not, so that a failure is never passed on as busy
// (here: the server refused the claim).
func TestPlainTriesShareTheClaimOnItsWay(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	log, b := tracedBackend(t, table)
	ctx := ctxT(t)
	req := func(owner string) core.AcquireRequest {
		return core.AcquireRequest{Key: "k", Owner: owner, OwnerToken: rand.Text(), TTL: time.Minute}
	}
	try := func(ctx context.Context, r core.AcquireRequest) <-chan testenv.Result[core.Lease] {
		return testenv.Async(func() (core.Lease, error) { return b.TryAcquire(ctx, r) })
	}
	// race starts a try of "k", whose row on table another transaction
	// locks until unblock, and once its claim is on its way (held up by
	// that lock on the server) a second try, which must wait for it.
	race := func(t *testing.T, table string) (first, second <-chan testenv.Result[core.Lease], unblock func()) {
		t.Helper()
		unblock = blockExpiredRow(t, admin, table, "k", false)
		log.drain()
		first = try(ctx, req("first"))
		if !testenv.WaitFor(10*time.Second, func() bool { return len(log) >= 1 }) {
			t.Fatal("the first try sent nothing")
		}
		second = try(ctx, req("second"))
		if !testenv.WaitFor(10*time.Second, func() bool { return pg.ClaimWaiters(b, "k") == 1 }) {
			t.Fatal("the second try does not wait for the first one's claim")
		}
		return first, second, unblock
	}

	t.Run("won", func(t *testing.T) {
		first, second, unblock := race(t, table)
		unblock()
		a1, a2 := <-first, <-second
		if a1.Err != nil {
			t.Fatalf("the first try: %v", a1.Err)
		}
		var busy *core.NotAcquiredError
		if !errors.As(a2.Err, &busy) || busy.Holder == nil || busy.Holder.Owner != "first" || busy.Holder.Token != a1.V.Token {
			t.Fatalf("the second try = %v, want busy, held by first with token %d", a2.Err, a1.V.Token)
		}
		if sent := log.drain(); len(sent) != 1 {
			t.Fatalf("the two tries sent %q, want the first one's claim alone", sent)
		}
	})

	t.Run("refused", func(t *testing.T) {
		// The first claim waits for the row past its claim timeout,
		// and the server refuses it: the second try must not take
		// that for busy.
		const claimTimeout = 300 * time.Millisecond
		table := newTable(t, admin)
		log, b = tracedBackend(t, table, pg.WithClaimTimeout(claimTimeout))
		first, second, unblock := race(t, table)
		unblocked := make(chan struct{})
		time.AfterFunc(claimTimeout+300*time.Millisecond, func() { defer close(unblocked); unblock() })
		a1, a2 := <-first, <-second
		<-unblocked
		if !errors.Is(a1.Err, pg.ErrClaimTimeout) {
			t.Fatalf("the first try, held up past its claim timeout = %v, want pg.ErrClaimTimeout", a1.Err)
		}
		if errors.Is(a2.Err, core.ErrNotAcquired) {
			t.Fatalf("the second try = %v: the first claim's refusal passed on as busy", a2.Err)
		}
	})
}
