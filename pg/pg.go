package pg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/ownclient"
	"github.com/dislock/dislock/internal/prune"
	"github.com/dislock/dislock/internal/sqlbackend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Backend is the PostgreSQL store. It implements core.Backend, core.Watcher,
// core.Queuer (waiters wait in line on the lock row; see the package doc),
// core.Admin and core.SemaphoreBackend and is safe for concurrent use. On
// the legacy table (WithLegacyTable), which keeps no queue, it says so
// (core.QueueKeeper), and the engine runs it as a core.Watcher that is not
// a core.Queuer.
type Backend struct {
	pool    *pgxpool.Pool
	ownPool bool // Open created the pool; Close closes it
	cfg     config
	table   string // quoted, as written in statements
	channel string // pg_notify channel of this table
	stmt    statements
	listen  listenState // see pooler.go
	sem     *semaphores // see semaphore.go

	pruneDue prune.Schedule       // see prune
	hints    sqlbackend.BusyHints // keys found held by others (peek.go)
	released sqlbackend.Released  // keys claimed first by claimFree's UPDATE
	claims   sqlbackend.Claims    // the plain tries' claims on their way, by key
	prompt   bool                 // the pool's connections cut a call when its ctx ends (cut.go)
}

var (
	_ core.Backend      = (*Backend)(nil)
	_ core.Watcher      = (*Backend)(nil)
	_ core.Admin        = (*Backend)(nil)
	_ core.ClaimBounder = (*Backend)(nil)
	_ core.ContextBound = (*Backend)(nil)
	_ core.Queuer       = (*Backend)(nil)
	_ core.QueueKeeper  = (*Backend)(nil) // queue.go

	_ core.SemaphoreBackend = (*Backend)(nil) // semaphore_admin.go
)

// NewBackend returns a Backend on pool, which stays the caller's: Close does
// not close it. It checks the lock table now (creating it first under
// WithAutoMigrate), so a missing table, column or privilege is reported here
// with an error matching ErrSchema that names the table and the fix.
func NewBackend(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Backend, error) {
	cfg, err := poolConfig(pool, opts)
	if err != nil {
		return nil, err
	}
	b := &Backend{pool: pool, cfg: cfg, table: cfg.table.Sanitize(), prompt: cutsPromptly(pool)}
	b.stmt = buildStatements(b.table, cfg.legacy, cfg.asyncCommit)
	b.sem = newSemaphores(cfg, b.table) // semaphore.go
	if cfg.AutoMigrate {
		if err := b.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	oid, err := b.checkSchema(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.sem.check(ctx, b.pool, b.table); err != nil { // semaphore.go
		return nil, err
	}
	// Every process that uses the table derives the same channel from the
	// table's identity, however each one spelled the name.
	b.channel = "dislock_" + strconv.FormatUint(uint64(oid), 10)
	return b, nil
}

// New returns a Locker on pool: core.New over NewBackend, with the options
// given by WithClientOptions. The pool stays the caller's. The lock table
// must exist: on a new database add WithAutoMigrate, or create it first
// (pg.Migrate, SchemaSQL).
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*core.Client, error) {
	b, err := NewBackend(ctx, pool, opts...)
	if err != nil {
		return nil, err
	}
	return core.New(b, b.cfg.ClientOpts...)
}

// Open connects to the database at connString with a pool of its own and
// returns a Locker on it: core.New over OpenBackend, with the options given
// by WithClientOptions. Client.Close closes the pool. Neither the connection
// string nor its password appears in an error it returns. On a new
// database add WithAutoMigrate, or create the table first (pg.Migrate,
// SchemaSQL).
func Open(ctx context.Context, connString string, opts ...Option) (*core.Client, error) {
	b, err := OpenBackend(ctx, connString, opts...)
	if err != nil {
		return nil, err
	}
	return ownclient.New(b, b.cfg.ClientOpts)
}

// OpenBackend connects to the database at connString with a pool of its own
// and returns a Backend on it; Backend.Close closes that pool. Neither the
// connection string nor its password appears in an error it returns (a
// connection failure names the user, database and host, as pgx reports it).
func OpenBackend(ctx context.Context, connString string, opts ...Option) (*Backend, error) {
	pcfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// The parser's message quotes the connection string: say only
		// that it is invalid.
		return nil, fmt.Errorf("%w: connection string: cannot be parsed", core.ErrInvalidOption)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pg: open pool: %w", err)
	}
	b, err := NewBackend(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	b.ownPool = true
	return b, nil
}

// Table returns the lock table's name as quoted in statements.
func (b *Backend) Table() string { return b.table }

// Name implements core.Backend.
func (b *Backend) Name() string { return "pg" }

// Close implements core.Backend. It closes the pool only when Open made it.
func (b *Backend) Close() error {
	if b.ownPool {
		b.pool.Close()
	}
	return nil
}

func micro(d time.Duration) int64 { return d.Microseconds() }

// claimConn takes a pool connection for a claim (mutex or permit) that
// started at start, and returns it with what is left of the claim timeout:
// the claim must be over on the server within the claim timeout of the
// call, and the wait for the connection (and a plain try's wait for this
// Backend's claim of the key on its way, see sqlbackend.Claims) counts
// against it. When that wait left less than half of it, the claim is not
// sent. Either failure sent
// nothing, so it is core.Unclaimed: the engine owes it no undo.
func (b *Backend) claimConn(ctx context.Context, start time.Time) (*pgxpool.Conn, time.Duration, error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, 0, core.Unclaimed(err)
	}
	left := b.cfg.ClaimTimeout - time.Since(start)
	if left < b.cfg.ClaimTimeout/2 {
		conn.Release()
		return nil, 0, core.Unclaimed(fmt.Errorf("not sent: %v passed before it could be (the wait for a pool connection, or for this Backend's claim of the key on its way), more than half the claim timeout (%v, WithClaimTimeout)",
			time.Since(start).Round(time.Millisecond), b.cfg.ClaimTimeout))
	}
	return conn, left, nil
}

// ErrClaimTimeout is matched (errors.Is) by the error of a TryAcquire that
// the server refused because its write came later than the claim timeout
// (WithClaimTimeout) allows: it was held up on the server, waiting for
// another transaction's lock on its row, say. Nothing was claimed (the
// error is core.Unclaimed: the engine owes it no undo).
var ErrClaimTimeout = errors.New("pg: the claim timeout passed on the server")

// claimErr is the error of a claim's statement: ErrClaimTimeout when the
// server refused the claim past its bound (inBound), else other(err).
func (b *Backend) claimErr(err error, other func(error) error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, boundPassed) {
		return core.Unclaimed(fmt.Errorf("%w (WithClaimTimeout, %v) before the claim could take effect: refused, nothing claimed [%w]",
			ErrClaimTimeout, b.cfg.ClaimTimeout, err))
	}
	return other(err)
}

// TryAcquire implements core.Backend with one statement (see
// buildStatements), which refuses on the server a write that comes later
// than what is left of the claim timeout (inBound; see WithClaimTimeout):
// one round trip, one transaction. A claim without a waiter of a key this
// Backend lately released is first claimFree's UPDATE, with the same
// bound; the claim follows only when that took nothing. A plain try of a
// key whose claim by another plain try of this Backend is on its way
// waits for that claim instead (sqlbackend.Claims).
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	start := time.Now()
	if err := sqlbackend.CheckAcquire(req); err != nil {
		return core.Lease{}, err
	}
	var expireAt any
	if !req.ExpireAt.IsZero() {
		expireAt = req.ExpireAt
	}
	if req.Limit > 1 {
		return b.tryAcquirePermit(ctx, req, start, expireAt) // semaphore_lease.go
	}
	for {
		conn, left, err := b.claimConn(ctx, start)
		if err != nil {
			return core.Lease{}, err
		}
		if req.Waiter == "" && b.hints.Held(req.Key) {
			if err := b.peek(ctx, conn, req); err != nil {
				conn.Release()
				return core.Lease{}, err
			}
		}
		if req.Waiter != "" || expireAt != nil {
			defer conn.Release()
			return b.claim(ctx, conn, req, left, expireAt)
		}
		// A plain try: one claim of a key per Backend at a time
		// (sqlbackend.Claims).
		cl, lead := b.claims.Begin(req.Key)
		if !lead {
			conn.Release()
			if err := cl.Wait(ctx, req.Key); err != nil {
				return core.Lease{}, err
			}
			continue
		}
		return b.claims.Lead(req.Key, cl, req.Owner, func() (core.Lease, error) {
			defer conn.Release()
			return b.claim(ctx, conn, req, left, expireAt)
		})
	}
}

// claim sends req's claim on conn: claimFree's UPDATE first for a plain try
// of a key this Backend lately released, else (or when that took nothing)
// the claim or, for a waiter, the acquire statement.
func (b *Backend) claim(ctx context.Context, conn *pgxpool.Conn, req core.AcquireRequest, left time.Duration, expireAt any) (core.Lease, error) {
	if req.Waiter == "" && expireAt == nil && b.stmt.claimFree != "" {
		if b.released.Has(req.Key) {
			lease, err := b.claimFree(ctx, conn, req, left)
			if !errors.Is(err, pgx.ErrNoRows) {
				return lease, err
			}
			b.released.Forget(req.Key)
		}
	}
	var row pgx.Row
	if b.stmt.queue && req.Waiter != "" {
		row = conn.QueryRow(ctx, b.stmt.acquire, req.Key, req.Owner, req.OwnerToken, micro(req.TTL), expireAt, req.Waiter, micro(req.WaiterTTL), micro(left))
	} else {
		// No waiter, or the legacy table, which has no queue.
		row = conn.QueryRow(ctx, b.stmt.claim, req.Key, req.Owner, req.OwnerToken, micro(req.TTL), expireAt, micro(left))
	}
	lease, err := b.readAcquire(row, req)
	b.hints.NoteBusy(req, err)
	return lease, err
}

// claimFree runs the claimFree statement: the lease, or pgx.ErrNoRows when
// it took nothing (the claim decides then).
func (b *Backend) claimFree(ctx context.Context, conn *pgxpool.Conn, req core.AcquireRequest, left time.Duration) (core.Lease, error) {
	var (
		token    int64
		acq, exp pgtype.Timestamptz
		bound    int
	)
	err := conn.QueryRow(ctx, b.stmt.claimFree, req.Key, req.Owner, req.OwnerToken, micro(req.TTL), micro(left)).Scan(&token, &acq, &exp, &bound)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Lease{}, err
	}
	if err != nil {
		return core.Lease{}, b.claimErr(err, poolerHint)
	}
	return core.Lease{Token: uint64(token), AcquiredAt: acq.Time, ExpiresAt: exp.Time}, nil
}

// readAcquire reads the acquire's answer. Its Scan reads the statement to
// its end, the commit included: only then has the claim taken effect. (A
// busy answer wrote nothing.)
func (b *Backend) readAcquire(row pgx.Row, req core.AcquireRequest) (core.Lease, error) {
	// One row: the write's outcome, then what the statement's read found
	// (all NULL when the key had no row).
	var (
		won              bool
		wToken           *int64
		wAcq, wExp       pgtype.Timestamptz
		live, mine       *bool
		owner            *string
		token, left      *int64
		acquired, expire pgtype.Timestamptz
	)
	if err := row.Scan(&won, &wToken, &wAcq, &wExp, &live, &mine, &owner, &token, &acquired, &expire, &left); err != nil {
		return core.Lease{}, b.claimErr(err, poolerHint)
	}
	switch {
	case won:
		l := core.Lease{ExpiresAt: wExp.Time, AcquiredAt: wAcq.Time}
		if wToken != nil {
			l.Token = uint64(*wToken)
		}
		return l, nil
	case live == nil || !*live:
		// Free when read, but taken by a concurrent acquirer, or someone
		// else's turn, or the slot is over.
		return core.Lease{}, core.Busy(req.Key, nil)
	case *mine:
		return core.Lease{Token: uint64(deref(token)), AcquiredAt: acquired.Time, ExpiresAt: expire.Time}, nil
	case semLimit(deref(owner)) > 0:
		// A semaphore's header (semaphore.go); the acquire queued no
		// waiter on it.
		return core.Lease{}, core.LimitMismatch(req.Key, semLimit(deref(owner)), 1)
	}
	return core.Lease{}, heldBy(req.Key, deref(owner), deref(token), acquired, expire, deref(left))
}

func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

// EndsWithContext implements core.ContextBound: with pgx's default
// context watcher, which sets a connection's deadline as soon as its call's
// ctx ends, a call returns soon after its ctx ends, whatever the server
// does (and the wait for a pool connection watches ctx too), so the engine
// makes claims on the caller's goroutine. A pool whose
// ConnConfig.BuildContextWatcherHandler waits longer before it cuts a
// connection (a pgconn.CancelRequestContextWatcherHandler with a
// DeadlineDelay above 20ms, or a handler of its own) reports false, and
// the engine hands its claims to a call worker that it can leave behind.
func (b *Backend) EndsWithContext() bool { return b.prompt }

// claimSlack is what ClaimBound adds to the claim timeout: the time an
// acquire's packets may take to reach the server after they are sent, and
// its commit after its statement.
const claimSlack = time.Second

// ClaimBound implements core.ClaimBounder: the claim timeout (see
// WithClaimTimeout) plus one second for the statement's way to the server and
// its commit. An acquire that has not taken effect by then, counted from the
// call to TryAcquire, never will.
func (b *Backend) ClaimBound() time.Duration { return b.cfg.ClaimTimeout + claimSlack }

// Renew implements core.Backend: one statement for the whole batch.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if hasPermits(reqs) {
		return b.renewWithPermits(ctx, reqs) // semaphore_lease.go
	}
	keys := make([]string, len(reqs))
	holders := make([]string, len(reqs))
	ttls := make([]int64, len(reqs))
	for i, r := range reqs {
		keys[i], holders[i], ttls[i] = r.Key, r.OwnerToken, micro(r.TTL)
	}
	rows, err := b.pool.Query(ctx, b.stmt.renew, keys, holders, ttls)
	if err != nil {
		return nil, fmt.Errorf("pg: renew: %w", poolerHint(err))
	}
	defer rows.Close()
	type kh struct{ key, holder string }
	renewed := make(map[kh]bool, len(reqs))
	for rows.Next() {
		var k kh
		if err := rows.Scan(&k.key, &k.holder); err != nil {
			return nil, fmt.Errorf("pg: renew: %w", err)
		}
		renewed[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg: renew: %w", poolerHint(err))
	}
	results := make([]error, len(reqs))
	for i, r := range reqs {
		if !renewed[kh{r.Key, r.OwnerToken}] {
			results[i] = core.Gone(r.Key, "held by another owner, expired or deleted")
		}
	}
	return results, nil
}

// Release implements core.Backend: an owner-checked update that ends the
// row, keeping the key's last token and, when waiters are queued, their
// queue, and notifies the first of them in the same statement (on the legacy
// table, which has no tokens: a delete that notifies every release); or with
// Keep > 0 an owner-checked update of the expiry. When no live lease of the
// owner token was found (an expired one is ended all the same) it answers
// core.Gone. A live lease is ended by releaseLive's plain UPDATE; the
// release statement follows only when that found none. A prune of old
// ended rows follows it when one is due (see pruneAfter).
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if req.Limit > 1 {
		return b.releasePermit(ctx, req) // semaphore_lease.go
	}
	if req.Keep > 0 {
		tag, err := b.pool.Exec(ctx, b.stmt.keep, req.Key, req.OwnerToken, micro(req.Keep))
		if err != nil {
			return poolerHint(err)
		}
		return released(req.Key, tag.RowsAffected() > 0)
	}
	live := true
	var quiet bool
	err := pgx.ErrNoRows
	if b.stmt.releaseLive != "" {
		err = b.pool.QueryRow(ctx, b.stmt.releaseLive, req.Key, req.OwnerToken, b.notifyChannel()).Scan(&quiet)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		var n int64
		err = b.pool.QueryRow(ctx, b.stmt.release, req.Key, req.OwnerToken, b.notifyChannel()).Scan(&live, &n)
	}
	if err != nil {
		return poolerHint(err)
	}
	if b.stmt.claimFree != "" {
		b.released.Note(req.Key)
	}
	b.prune(ctx)
	return released(req.Key, live)
}

// released is a release's answer: nil when a live lease of the owner token
// was released (or kept), else core.Gone.
func released(key string, live bool) error {
	if !live {
		return core.Gone(key, "held by another owner, expired or deleted")
	}
	return nil
}

// Pruning of ended rows. A release ends its row rather than deleting it, so
// that the key's last token stays for the claims still on their way (see
// buildStatements); a key used once (a task ID) would leave its row forever.
// So a Backend deletes the ended rows whose token is older than pruneAfter,
// at most pruneBatch of them, in a statement of its own after its first
// release and then after a release at most every pruneEvery (at once again
// when the batch was full). The releases in between, and every acquire, pay
// nothing.
const (
	// pruneAfter is longer than any claim can take to take effect on the
	// server: a claim's write is refused past its bound (inBound), at most
	// the longest claim timeout WithClaimTimeout accepts after its
	// transaction started, whatever the timeout of the process that
	// prunes. claimSlack is the margin.
	pruneAfter = sqlbackend.MaxClaimTimeout + claimSlack
	pruneEvery = time.Minute
	pruneBatch = 10000
)

// prune deletes ended rows when a prune is due (see pruneAfter).
func (b *Backend) prune(ctx context.Context) {
	if b.stmt.prune == "" {
		return
	}
	b.pruneDue.Run(pruneEvery, pruneBatch, func() (int64, error) { return b.pruneRows(ctx, pruneAfter) })
}

// pruneRows deletes up to pruneBatch ended rows whose token is older than
// horizon, and the expired permits of semaphores whose header is gone, and
// returns how many rows of the lock table it deleted.
func (b *Backend) pruneRows(ctx context.Context, horizon time.Duration) (int64, error) {
	var n int64
	if err := b.pool.QueryRow(ctx, b.stmt.prune, micro(horizon), pruneBatch).Scan(&n); err != nil {
		return 0, poolerHint(err)
	}
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return n, err
	}
	if _, err := b.pool.Exec(ctx, b.sem.stmt.prune); err != nil {
		return n, b.semErr(err)
	}
	return n, nil
}

// notifyChannel is the channel releases notify, or "" under WithoutNotify.
func (b *Backend) notifyChannel() string {
	if b.cfg.noNotify {
		return ""
	}
	return b.channel
}

// Now implements core.Backend: the database's clock.
func (b *Backend) Now(ctx context.Context, _ string) (time.Time, error) {
	var now time.Time
	if err := b.pool.QueryRow(ctx, b.stmt.now).Scan(&now); err != nil {
		return time.Time{}, err
	}
	return now, nil
}

// Inspect implements core.Admin.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	info := core.Info{Key: key}
	var (
		token    int64
		acquired pgtype.Timestamptz
		left     int64
	)
	err := b.pool.QueryRow(ctx, b.stmt.inspect, key).Scan(&info.Owner, &token, &acquired, &info.ExpiresAt, &left)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Info{}, false, nil
	}
	if err != nil {
		return core.Info{}, false, fmt.Errorf("pg: inspect: %w", err)
	}
	info.Token, info.AcquiredAt, info.Remaining = uint64(token), acquired.Time, time.Duration(left)*time.Microsecond
	if semLimit(info.Owner) > 0 {
		return b.inspectPermits(ctx, key) // a semaphore: its oldest permit (semaphore_admin.go)
	}
	return info, true, nil
}

// List implements core.Admin: the held locks whose key starts with prefix,
// ordered by key.
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	rows, err := b.pool.Query(ctx, b.stmt.list, prefix)
	if err != nil {
		return nil, fmt.Errorf("pg: list: %w", err)
	}
	list, err := scanInfos(rows, false)
	if err != nil {
		return nil, fmt.Errorf("pg: list: %w", err)
	}
	return b.listPermits(ctx, prefix, list) // semaphores: one Info per permit (semaphore_admin.go)
}

// scanInfos reads the holders of rows (key, owner, token, acquired_at,
// expire_at, microseconds left, and with limits a semaphore's limit) and
// closes rows.
func scanInfos(rows pgx.Rows, limits bool) ([]core.Info, error) {
	defer rows.Close()
	var list []core.Info
	for rows.Next() {
		var (
			info     core.Info
			token    int64
			acquired pgtype.Timestamptz
			left     int64
			limit    int32
		)
		dest := []any{&info.Key, &info.Owner, &token, &acquired, &info.ExpiresAt, &left}
		if limits {
			dest = append(dest, &limit)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		info.Token, info.AcquiredAt, info.Remaining = uint64(token), acquired.Time, time.Duration(left)*time.Microsecond
		info.Limit = int(limit)
		list = append(list, info)
	}
	return list, rows.Err()
}

// ForceRelease implements core.Admin: ends key's row whoever holds it
// (keeping its token; the legacy table's is deleted) and notifies waiters. The holder learns of it at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	if handled, released, err := b.forceReleasePermits(ctx, key); handled || err != nil { // semaphore_admin.go
		return released, err
	}
	var (
		released bool
		n        int64
	)
	if err := b.pool.QueryRow(ctx, b.stmt.forceRelease, key, b.notifyChannel()).Scan(&released, &n); err != nil {
		return false, fmt.Errorf("pg: force release: %w", err)
	}
	return released, nil
}
