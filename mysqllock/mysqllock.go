package mysqllock

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/core"
	shared "github.com/dislock/dislock/internal/lane"
	"github.com/dislock/dislock/internal/ownclient"
	"github.com/dislock/dislock/internal/prune"
	"github.com/dislock/dislock/internal/sqlbackend"
	"github.com/go-sql-driver/mysql"
)

// Backend is the MySQL / MariaDB store. It implements core.Backend,
// core.Watcher, core.Queuer, core.Admin, core.ClaimBounder and
// core.SemaphoreBackend and is safe for concurrent use.
type Backend struct {
	db    *sql.DB
	ownDB bool // Open created the pool; Close closes it
	cfg   config
	n     names

	acquire, release, renew *sql.Stmt
	// claimFree and releaseFree are the plain statements of a free key
	// nobody waits on (see freeClaimSQL): no CALL, no result set.
	claimFree, releaseFree *sql.Stmt
	peekRow                *sql.Stmt // peekSQL
	batch                  *sql.Stmt // the batch procedure's CALL (lane.go)
	// lane sends claimFree's and releaseFree's statements: those that
	// meet share a CALL of the batch procedure (lane.go).
	lane    *shared.Lane[laneCall]
	batches atomic.Int64 // CALLs of the batch procedure (for tests)
	// released: keys claimed first by freeClaimSQL's UPDATE; the others
	// go to the acquire procedure at once.
	released sqlbackend.Released
	hints    sqlbackend.BusyHints // keys found held by other owners (peek)
	claims   sqlbackend.Claims    // the plain tries' claims on their way, by key
	// fast holds the leases that freeClaimSQL claimed and that are not
	// released yet, by key: the owner token (see releaseFast). A lease
	// it no longer holds (it was full) is released by the procedure.
	fast sqlbackend.Keys[string]

	// watching is the named lock of the Backend's running watcher (see
	// WatchTurns), nil while none runs: a waiter's place names it, so
	// that its turn wakes this watcher only.
	watching atomic.Pointer[string]
	// watchCalls counts the CALLs of watch this Backend's watchers made
	// (for tests: a wake-up costs none on MariaDB).
	watchCalls atomic.Int64

	pruneDue  prune.Schedule // see prune
	closeOnce sync.Once
}

var (
	_ core.Backend          = (*Backend)(nil)
	_ core.Watcher          = (*Backend)(nil)
	_ core.Queuer           = (*Backend)(nil)
	_ core.Admin            = (*Backend)(nil)
	_ core.ClaimBounder     = (*Backend)(nil)
	_ core.ContextBound     = (*Backend)(nil)
	_ core.SemaphoreBackend = (*Backend)(nil)
)

// NewBackend returns a Backend on db, which stays the caller's: Close does
// not close it. While anyone waits in Acquire, the Backend's watcher holds
// two of db's connections (see WatchTurns): leave room for them in
// db.SetMaxOpenConns, or use WithoutListen. It checks the lock table and its procedures now (creating
// them first under WithAutoMigrate), so a missing table or procedure is
// reported here with an error matching ErrSchema that names the fix.
func NewBackend(ctx context.Context, db *sql.DB, opts ...Option) (*Backend, error) {
	cfg, err := dbConfig(db, opts)
	if err != nil {
		return nil, err
	}
	b := &Backend{db: db, cfg: cfg, n: newNames(cfg.schema, cfg.table)}
	b.lane = b.newLane()
	if cfg.AutoMigrate {
		if err := b.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if err := b.checkSchema(ctx); err != nil {
		return nil, err
	}
	// Prepared once here; database/sql prepares each again on every pool
	// connection at its first use there, after which a call is one round
	// trip (COM_STMT_EXECUTE).
	for _, s := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&b.acquire, "CALL " + b.n.proc("acquire") + "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"},
		{&b.release, "CALL " + b.n.proc("release") + "(?, ?, ?, ?)"},
		{&b.renew, "CALL " + b.n.proc("renew") + "(?)"},
		{&b.claimFree, freeClaimSQL(b.n)},
		{&b.releaseFree, freeReleaseSQL(b.n)},
		{&b.peekRow, peekSQL(b.n)},
		{&b.batch, "CALL " + b.n.proc("batch") + "(?, ?)"},
	} {
		st, err := db.PrepareContext(ctx, s.sql)
		if err != nil {
			b.closeStmts()
			return nil, fmt.Errorf("mysqllock: prepare: %w", err)
		}
		*s.stmt = st
	}
	return b, nil
}

// New returns a Locker on db: core.New over NewBackend, with the options
// given by WithClientOptions. db stays the caller's. The lock table must
// exist: on a new database add WithAutoMigrate, or create it first
// (mysqllock.Migrate, SchemaSQL).
func New(ctx context.Context, db *sql.DB, opts ...Option) (*core.Client, error) {
	return client(NewBackend(ctx, db, opts...))
}

// client is core.New over b, with the options of WithClientOptions.
func client(b *Backend, err error) (*core.Client, error) {
	if err != nil {
		return nil, err
	}
	return ownclient.New(b, b.cfg.ClientOpts)
}

// Open connects to the server at dsn with a pool of its own and returns a
// Locker on it: core.New over OpenBackend, with the options given by
// WithClientOptions. Client.Close closes the pool. dsn is a URL,
// mysql://user:password@host:port/dbname?param=value (port 3306 by
// default; the parameters are go-sql-driver's), or a go-sql-driver DSN,
// user:password@tcp(host:port)/dbname?param=value. Neither the DSN nor its
// password appears in an error it returns. The pool's connections come
// from Connector: a statement whose ctx ends is cut short by closing its
// socket, without a goroutine hand-off per statement.
func Open(ctx context.Context, dsn string, opts ...Option) (*core.Client, error) {
	return client(OpenBackend(ctx, dsn, opts...))
}

// OpenBackend is Open's Backend: its Close closes the pool it made.
func OpenBackend(ctx context.Context, dsn string, opts ...Option) (*Backend, error) {
	mc, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := Connector(mc)
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: cannot be used", core.ErrInvalidOption)
	}
	db := sql.OpenDB(conn)
	// Keep connections (and the statements prepared on them) for the
	// renewer and the waiters instead of reconnecting.
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	b, err := NewBackend(ctx, db, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	b.ownDB = true
	return b, nil
}

// ParseDSN reads a mysql:// (or mariadb://) URL or a go-sql-driver DSN into
// the driver's config, for a program that builds its own pool the way
// Open does. Its errors never quote dsn.
func ParseDSN(dsn string) (*mysql.Config, error) {
	bad := fmt.Errorf("%w: DSN: cannot be parsed (want mysql://user:password@host:port/dbname or user:password@tcp(host:port)/dbname)", core.ErrInvalidOption)
	if !strings.HasPrefix(dsn, "mysql://") && !strings.HasPrefix(dsn, "mariadb://") {
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, bad
		}
		return mc, nil
	}
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return nil, bad
	}
	mc, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, bad
	}
	mc.User = u.User.Username()
	mc.Passwd, _ = u.User.Password()
	mc.Net = "tcp"
	mc.Addr = u.Host
	if u.Port() == "" {
		mc.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	mc.DBName = strings.TrimPrefix(u.Path, "/")
	return mc, nil
}

// Table returns the lock table's name as quoted in statements.
func (b *Backend) Table() string { return b.n.table }

// Name implements core.Backend.
func (b *Backend) Name() string { return "mysql" }

// Close implements core.Backend. It closes the pool only when Open made it.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.lane.Close()
		b.closeStmts()
		if b.ownDB {
			b.db.Close()
		}
	})
	return nil
}

func (b *Backend) closeStmts() {
	for _, s := range []*sql.Stmt{b.acquire, b.release, b.renew, b.claimFree, b.releaseFree, b.peekRow, b.batch} {
		if s != nil {
			s.Close()
		}
	}
}

func micro(d time.Duration) int64 { return d.Microseconds() }

func fromMicro(us int64) time.Time { return time.UnixMicro(us) }

// unclaimed marks a failure to reach the server at all, or a statement its
// caller left in the lane before it was sent: nothing was sent.
func unclaimed(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, shared.ErrUnsent) {
		return core.Unclaimed(err)
	}
	return err
}

// TryAcquire implements core.Backend: one CALL of the acquire procedure
// (see procs.go), one round trip and one transaction. A TTL claim of a
// mutex by a caller that does not wait is first the one UPDATE of
// freeClaimSQL, which claims the key when it is free and nobody waits on
// it, when the key is one this Backend lately released (sqlbackend.Released);
// the CALL follows only when it did not. Such a try of a key found held by
// another owner lately reads the key's row first (peek), and a try of a
// key whose claim by another such try of this Backend is on its way waits
// for that claim (sqlbackend.Claims).
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := sqlbackend.CheckAcquire(req); err != nil {
		return core.Lease{}, err
	}
	var expire int64
	if !req.ExpireAt.IsZero() {
		expire = max(req.ExpireAt.UnixMicro(), 1)
	}
	limit := max(req.Limit, 1)
	// The claim must be over on the server within the claim timeout of
	// this call: half of it for the wait for a pool connection and the
	// way to the server (past that, the call is abandoned), half for the
	// procedure, which checks it on the server's clock once it holds the
	// row's lock.
	half := b.cfg.ClaimTimeout / 2
	cctx, cancel := context.WithTimeout(ctx, half)
	defer cancel()
	if req.Waiter != "" || limit > 1 || expire != 0 {
		return b.claim(cctx, req, limit, expire, half)
	}
	// A plain try: a key found held by another owner lately is read
	// first (sqlbackend.BusyHints), and one claim of a key per Backend is
	// on its way at a time (sqlbackend.Claims).
	for {
		if b.hints.Held(req.Key) {
			if err := b.peek(cctx, req); err != nil {
				return core.Lease{}, err
			}
		}
		cl, lead := b.claims.Begin(req.Key)
		if lead {
			return b.claims.Lead(req.Key, cl, req.Owner, func() (core.Lease, error) { return b.claim(cctx, req, limit, expire, half) })
		}
		if err := cl.Wait(cctx, req.Key); err != nil {
			return core.Lease{}, err
		}
	}
}

// claim sends req's claim: freeClaimSQL's UPDATE first for a plain try of
// a key this Backend lately released, else (or when that took nothing) the
// acquire procedure's CALL.
func (b *Backend) claim(ctx context.Context, req core.AcquireRequest, limit int, expire int64, half time.Duration) (core.Lease, error) {
	var (
		status          string
		token, acq, exp sql.NullInt64
		owner           []byte
		left            sql.NullInt64
		have            int64
	)
	if req.Waiter == "" && limit == 1 && expire == 0 && b.released.Has(req.Key) {
		n, tok, err := b.exec(ctx, laneCall{key: req.Key, owner: req.Owner, holder: req.OwnerToken, ttl: micro(req.TTL), half: micro(half)})
		switch {
		case err != nil:
			return core.Lease{}, unclaimed(err)
		case n == 1 && tok > 0:
			// The token is the server's clock of the claim.
			b.fast.Put(req.Key, req.OwnerToken, nil)
			return core.Lease{Token: uint64(tok), AcquiredAt: fromMicro(tok), ExpiresAt: fromMicro(tok + micro(req.TTL))}, nil
		}
	}
	watcher := "" // not NULL: the column is NOT NULL
	if w := b.watching.Load(); w != nil && req.Waiter != "" {
		watcher = *w
	}
	err := b.acquire.QueryRowContext(ctx, []byte(req.Key), []byte(req.Owner), []byte(req.OwnerToken), micro(req.TTL), expire,
		limit, []byte(req.Waiter), micro(req.WaiterTTL), micro(half), watcher).
		Scan(&status, &token, &acq, &exp, &owner, &left, &have)
	if err != nil {
		return core.Lease{}, unclaimed(err)
	}
	switch status {
	case "won":
		return core.Lease{Token: uint64(token.Int64), AcquiredAt: fromMicro(acq.Int64), ExpiresAt: fromMicro(exp.Int64)}, nil
	case "limit":
		return core.Lease{}, core.LimitMismatch(req.Key, int(have), limit)
	}
	if !token.Valid {
		return core.Lease{}, core.Busy(req.Key, nil)
	}
	info := &core.Info{Key: req.Key, Owner: string(owner), Token: uint64(token.Int64), AcquiredAt: fromMicro(acq.Int64),
		ExpiresAt: fromMicro(exp.Int64), Remaining: time.Duration(left.Int64) * time.Microsecond}
	if have > 1 {
		info.Limit = int(have)
	}
	b.released.Forget(req.Key)
	busy := core.Busy(req.Key, info)
	if req.Waiter == "" && have <= 1 {
		b.hints.NoteBusy(req, busy)
	}
	return core.Lease{}, busy
}

// peekSQL reads a key's row alone (no lock, no write): live, whether the
// holder is the second argument's owner token, the owner, token, times,
// the time left (µs) and the limit. The key is the first argument.
func peekSQL(n names) string {
	return "SELECT expire_at > " + nowSQL + ", holder = ?, owner, token, acquired_at, expire_at, expire_at - " + nowSQL +
		", lim FROM " + n.table + " WHERE `key` = ?"
}

// peek reads req's key (a plain try of a key found held lately). It
// returns the busy answer when a live mutex lease of another owner holds
// the key, nil when the claim must be sent (the key is free or missing, a
// semaphore's, or the read found req's own lease), or the read's failure.
func (b *Backend) peek(ctx context.Context, req core.AcquireRequest) error {
	var (
		live, mine                   bool
		owner                        []byte
		token, acq, exp, left, limit int64
	)
	err := b.peekRow.QueryRowContext(ctx, []byte(req.OwnerToken), []byte(req.Key)).Scan(&live, &mine, &owner, &token, &acq, &exp, &left, &limit)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		b.hints.Note(req.Key, 0)
		return nil
	case err != nil:
		return core.Unclaimed(err) // a read: nothing was claimed
	case !live || mine || limit > 1:
		b.hints.Note(req.Key, 0)
		return nil
	}
	busy := core.Busy(req.Key, &core.Info{Key: req.Key, Owner: string(owner), Token: uint64(token), AcquiredAt: fromMicro(acq),
		ExpiresAt: fromMicro(exp), Remaining: time.Duration(left) * time.Microsecond})
	b.hints.NoteBusy(req, busy)
	return busy
}

// freeClaimSQL claims a free mutex key that nobody waits on for a TTL, in
// one statement that reads nothing first and sends no result set (MySQL
// has no RETURNING): the arguments are the owner, the owner token, the TTL
// (µs), the key and the claim timeout's half (µs). It claims only a row
// whose expiry and token are below the statement's clock (read when the
// statement starts, before it waits for the row's lock: a row expired then
// is expired later) and whose waiting flag is 0, and only when it has
// waited for the row's lock no longer than the half (SYSDATE(6) is read
// then, NOW(6) at the start). The token is that clock, so strictly above
// the row's last; it is decided under the row's lock, and the OK packet
// returns it (LAST_INSERT_ID(expr), which the connection keeps as its
// LAST_INSERT_ID()). The lease runs from it for the TTL, as the row says.
// One row affected: claimed; none: the key is missing, held, expired with
// a waiter, a semaphore's, or its token is not below the clock, and the
// acquire procedure decides.
func freeClaimSQL(n names) string {
	return freeClaim(n.table, "?", "?", "?", "?", "TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) <= ?")
}

// freeClaim is freeClaimSQL's UPDATE of table with the expressions of the
// owner, the owner token, the TTL (µs) and the key, and the condition that
// bounds its wait for the row's lock; the batch procedure runs it too.
func freeClaim(table, owner, holder, ttl, key, bound string) string {
	return "UPDATE " + table + " SET owner = " + owner + ", holder = " + holder + ", token = LAST_INSERT_ID(" + nowSQL +
		"), acquired_at = " + nowSQL + ", expire_at = " + nowSQL + " + " + ttl + " WHERE `key` = " + key +
		" AND token < " + nowSQL + " AND expire_at <= " + nowSQL + " AND waiting = 0 AND lim <= 1 AND " + bound
}

// freeReleaseSQL ends the live mutex lease of an owner token (the second
// argument; the key is the first) nobody waits on, keeping the key's
// token, its expiry compared with the clock once the row is locked (the
// statement's start, plus the time SYSDATE says passed since). It sets the
// expiry alone: a fixed-size column, changed in place, where clearing the
// owner and holder too made the server rewrite the row (an expired row is
// free whatever they say, and the next claim sets them). One row
// affected: released; none: the release procedure decides (a lease lost,
// a waiter to tell, a permit).
func freeReleaseSQL(n names) string { return freeRelease(n.table, "?", "?") }

// freeRelease is freeReleaseSQL's UPDATE of table with the expressions of
// the key and the owner token; the batch procedure runs it too.
func freeRelease(table, key, holder string) string {
	return "UPDATE " + table + " SET expire_at = 0 WHERE `key` = " + key + " AND holder = " + holder + " AND waiting = 0" +
		" AND lim <= 1 AND expire_at > " + nowSQL + " + TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))"
}

// releaseFast runs freeReleaseSQL for a release without a minimum hold of
// a mutex lease that freeClaimSQL claimed, and reports whether it ended
// the lease. The release of a lease claimed by the acquire procedure (a
// waiter's, a new key's) goes to the release procedure at once: a key
// that someone waits on would have the UPDATE change nothing first.
func (b *Backend) releaseFast(ctx context.Context, req core.ReleaseRequest) (bool, error) {
	if !b.fast.CompareAndDelete(req.Key, req.OwnerToken) || req.Keep > 0 || req.Limit > 1 {
		return false, nil
	}
	n, _, err := b.exec(ctx, laneCall{release: true, key: req.Key, holder: req.OwnerToken})
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// claimSlack is what ClaimBound adds to the claim timeout: the time an
// acquire may take to reach the server, and its commit after its check.
const claimSlack = time.Second

// ClaimBound implements core.ClaimBounder: the claim timeout (see
// WithClaimTimeout) plus one second. An acquire that has not taken effect
// by then, counted from the call to TryAcquire, never will.
func (b *Backend) ClaimBound() time.Duration { return b.cfg.ClaimTimeout + claimSlack }

// EndsWithContext implements core.ContextBound: a call returns soon after
// its ctx ends, whatever the server does (go-sql-driver/mysql closes the
// connection of a call whose ctx ended, and database/sql's wait for a
// connection watches ctx), so the engine makes claims on the caller's
// goroutine.
func (b *Backend) EndsWithContext() bool { return true }

// renewItem is one lease in renew's JSON argument.
type renewItem struct {
	Key    string `json:"k"`
	Holder string `json:"h"`
	TTL    int64  `json:"t"`
	Limit  int    `json:"l"`
}

// Renew implements core.Backend: one CALL for the whole batch, mutexes and
// permits alike.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	items := make([]renewItem, len(reqs))
	for i, r := range reqs {
		items[i] = renewItem{r.Key, r.OwnerToken, micro(r.TTL), max(r.Limit, 1)}
	}
	arg, err := json.Marshal(items)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: renew: %w", err)
	}
	var ok sql.NullString
	if err := b.renew.QueryRowContext(ctx, arg).Scan(&ok); err != nil {
		return nil, fmt.Errorf("mysqllock: renew: %w", err)
	}
	var renewed []int
	if ok.Valid {
		if err := json.Unmarshal([]byte(ok.String), &renewed); err != nil {
			return nil, fmt.Errorf("mysqllock: renew: reply: %w", err)
		}
	}
	done := make([]bool, len(reqs))
	for _, i := range renewed {
		if i >= 1 && i <= len(reqs) {
			done[i-1] = true
		}
	}
	results := make([]error, len(reqs))
	for i, r := range reqs {
		if !done[i] {
			results[i] = core.Gone(r.Key, "held by another owner, expired or deleted")
		}
	}
	return results, nil
}

// Release implements core.Backend: one CALL that ends the row (keeping the
// key's last token) or deletes the permit, or with Keep > 0 sets its
// expiry, checked against the owner token, and tells the first live waiter.
// When no live lease of the owner token was found it answers core.Gone. A
// prune of old ended rows follows it when one is due (see pruneAfter).
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if err := b.afterClaims(ctx, req.OwnerToken); err != nil {
		return err
	}
	live, err := b.releaseFast(ctx, req)
	if err == nil && !live {
		err = b.release.QueryRowContext(ctx, []byte(req.Key), []byte(req.OwnerToken), micro(req.Keep), max(req.Limit, 1)).Scan(&live)
	}
	if err != nil {
		return err
	}
	if req.Keep <= 0 && req.Limit <= 1 {
		b.released.Note(req.Key)
	}
	b.prune(ctx)
	if !live {
		return core.Gone(req.Key, "held by another owner, expired or deleted")
	}
	return nil
}

// Pruning. A release ends its row rather than deleting it, so that the
// key's last token stays; a key used once (a task ID) would leave its row
// forever. So a Backend deletes ended rows whose token is older than
// pruneAfter (and expired permits, places and turns), at most pruneBatch
// of each, after its first release and then at most every pruneEvery (at
// once again when the batch was full). A claim of a key whose row is gone
// reads the server's clock after it found no row, so its token is above
// the pruned one as long as the server's clock has not gone back by more
// than pruneAfter.
const (
	pruneAfter = 24 * time.Hour
	pruneEvery = time.Minute
	pruneBatch = 10000
)

func (b *Backend) prune(ctx context.Context) {
	b.pruneDue.Run(pruneEvery, pruneBatch, func() (int64, error) { return b.pruneRows(ctx, pruneAfter) })
}

func (b *Backend) pruneRows(ctx context.Context, horizon time.Duration) (int64, error) {
	var n int64
	err := b.db.QueryRowContext(ctx, "CALL "+b.n.proc("prune")+"(?, ?)", micro(horizon), pruneBatch).Scan(&n)
	return n, err
}

// Now implements core.Backend: the server's clock.
func (b *Backend) Now(ctx context.Context, _ string) (time.Time, error) {
	var us int64
	if err := b.db.QueryRowContext(ctx, "SELECT "+nowSQL).Scan(&us); err != nil {
		return time.Time{}, err
	}
	return fromMicro(us), nil
}

// holderCols are the columns of a holder read by Inspect, List and Holders.
const holderCols = "owner, token, acquired_at, expire_at, expire_at - " + nowSQL

func scanInfo(rows *sql.Rows, key bool) (core.Info, error) {
	var (
		info          core.Info
		k, owner      []byte
		acq, exp, lft int64
		lim           int
	)
	dest := []any{&owner, &info.Token, &acq, &exp, &lft, &lim}
	if key {
		dest = append([]any{&k}, dest...)
	}
	if err := rows.Scan(dest...); err != nil {
		return info, err
	}
	info.Key, info.Owner = string(k), string(owner)
	info.AcquiredAt, info.ExpiresAt, info.Remaining = fromMicro(acq), fromMicro(exp), time.Duration(lft)*time.Microsecond
	if lim > 1 {
		info.Limit = lim
	}
	return info, nil
}

// holdersSQL selects the live holders of one key (where is the condition
// on the key), oldest first: a mutex's row, or a semaphore's permits.
func (b *Backend) holdersSQL(where string, withKey bool) string {
	k := ""
	if withKey {
		k = "`key`, "
	}
	return "SELECT " + k + holderCols + ", 0 FROM " + b.n.table + " WHERE " + where + " AND lim <= 1 AND expire_at > " + nowSQL + `
UNION ALL
SELECT ` + k + holderCols + ", (SELECT lim FROM " + b.n.table + " AS h WHERE h.`key` = p.`key`) FROM " + b.n.permits + " AS p WHERE " + where +
		" AND expire_at > " + nowSQL + " AND EXISTS (SELECT 1 FROM " + b.n.table + " AS h WHERE h.`key` = p.`key` AND h.lim > 1)"
}

func (b *Backend) holders(ctx context.Context, key string) ([]core.Info, error) {
	rows, err := b.db.QueryContext(ctx, b.holdersSQL("`key` = ?", false)+" ORDER BY 3, 2", []byte(key), []byte(key))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var list []core.Info
	for rows.Next() {
		info, err := scanInfo(rows, false)
		if err != nil {
			return nil, err
		}
		info.Key = key
		list = append(list, info)
	}
	return list, rows.Err()
}

// Holders implements core.SemaphoreBackend: every live permit of key,
// oldest first (Info.Limit set), or the holder of a mutex; empty when the
// key is free.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	list, err := b.holders(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: holders: %w", err)
	}
	return list, nil
}

// Inspect implements core.Admin: the holder of key, or for a semaphore its
// oldest live permit.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	list, err := b.holders(ctx, key)
	if err != nil {
		return core.Info{}, false, fmt.Errorf("mysqllock: inspect: %w", err)
	}
	if len(list) == 0 {
		return core.Info{}, false, nil
	}
	return list[0], true, nil
}

// List implements core.Admin: the held locks whose key starts with prefix,
// ordered by key; a semaphore has one Info per live permit.
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	p := []byte(prefix)
	rows, err := b.db.QueryContext(ctx, b.holdersSQL("`key` >= ? AND LEFT(`key`, ?) = ?", true)+" ORDER BY 1, 4, 3",
		p, len(p), p, p, len(p), p)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: list: %w", err)
	}
	defer rows.Close()
	var list []core.Info
	for rows.Next() {
		info, err := scanInfo(rows, true)
		if err != nil {
			return nil, fmt.Errorf("mysqllock: list: %w", err)
		}
		list = append(list, info)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysqllock: list: %w", err)
	}
	return list, nil
}

// ForceRelease implements core.Admin: one CALL ends key's lease whoever
// holds it (every permit of a semaphore), keeping its token, and tells the
// first live waiter. The holder learns of it at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	var live bool
	if err := b.db.QueryRowContext(ctx, "CALL "+b.n.proc("force")+"(?)", []byte(key)).Scan(&live); err != nil {
		return false, fmt.Errorf("mysqllock: force release: %w", err)
	}
	return live, nil
}
