package pg

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
	"github.com/dislock/dislock/internal/sqlbackend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultTable is the lock table used when WithTable is not given.
const DefaultTable = sqlbackend.DefaultTable

// DefaultClaimTimeout is the claim timeout used when WithClaimTimeout is not
// given: far above what a healthy acquire takes, well below the TTLs locks
// usually have.
const DefaultClaimTimeout = sqlbackend.DefaultClaimTimeout

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN-1); longer names
// would be truncated silently by the server.
const maxIdentLen = 63

// Option configures a Backend. Invalid values make NewBackend fail with an
// error matching core.ErrInvalidOption that names the option.
type Option func(*config)

type config struct {
	sqlbackend.Config // the options pg shares with mysqllock
	table             pgx.Identifier
	asyncCommit       bool
	unlogged          bool
	legacy            bool
	noNotify          bool
	listenConfig      *pgx.ConnConfig
	pooler            poolerConfig // see pooler.go
}

// newConfig applies opts and reports the first invalid one.
func newConfig(opts []Option) (config, error) {
	c := config{Config: sqlbackend.Config{ClaimTimeout: DefaultClaimTimeout}, table: pgx.Identifier{DefaultTable}}
	err := optcheck.Apply(&c, opts)
	return c, err
}

// poolConfig is newConfig for NewBackend and Migrate, which need a pool.
func poolConfig(pool *pgxpool.Pool, opts []Option) (config, error) {
	if pool == nil {
		return config{}, sqlbackend.InvalidOption("pool", "nil")
	}
	return newConfig(opts)
}

// WithTable sets the lock table (default "dislock_locks"). A name with a dot
// is "schema.table"; the part after the first dot is the table name. Each
// part is quoted as an identifier, so it is used exactly as written (case
// included) and never interpreted as SQL. Empty parts, parts longer than 63
// bytes, invalid UTF-8 and NUL bytes are rejected.
func WithTable(name string) Option {
	return func(c *config) {
		parts := strings.SplitN(name, ".", 2)
		for _, p := range parts {
			switch {
			case p == "":
				c.Invalid("WithTable", "empty name or schema")
				return
			case len(p) > maxIdentLen:
				c.Invalid("WithTable", "%d bytes, the limit is %d", len(p), maxIdentLen)
				return
			case !utf8.ValidString(p):
				c.Invalid("WithTable", "not valid UTF-8")
				return
			case strings.IndexByte(p, 0) >= 0:
				c.Invalid("WithTable", "contains a NUL byte")
				return
			}
		}
		c.table = pgx.Identifier(parts)
	}
}

// WithAutoMigrate makes NewBackend create the lock table when it is missing
// (as Migrate does). Off by default: the table is then expected to exist, and
// its absence is an error naming the fix.
func WithAutoMigrate() Option {
	return func(c *config) { c.AutoMigrate = true }
}

// WithAsyncCommit commits every acquire and renewal (releases always are,
// see the package doc) with synchronous_commit = off, set for that statement's own transaction only
// (set_config(..., true) inside the statement; no session state). A write no
// longer waits for the WAL flush, which makes it about as fast as a read.
//
// The cost: if the database server crashes (not merely a client or a
// connection), the commits of roughly the last 3×wal_writer_delay (600 ms by
// default) can be lost although they were reported as done. An acquisition
// may then vanish while its holder still runs, so the lock can be granted
// twice; fencing tokens still grow (they come from the server's clock, on
// tables Migrate creates). Use it only where that is acceptable.
func WithAsyncCommit() Option {
	return func(c *config) { c.asyncCommit = true }
}

// WithUnlogged makes Migrate (and WithAutoMigrate) create the table UNLOGGED:
// writes skip the WAL entirely. After a database crash PostgreSQL empties an
// unlogged table, so every lock held at that moment is dropped and can be
// granted again while its holders still run (they learn of the loss at their
// next renewal). It has no effect on an existing table.
func WithUnlogged() Option {
	return func(c *config) { c.unlogged = true }
}

// WithLegacyTable uses the 3-column table of the older Python tool,
// key_value(key text primary key, value text not null, expire_at timestamptz
// not null), so that old and new deployments can share it. value holds the
// owner token followed by a space and the human-readable owner; the token
// alone guards renewals and releases, and a row written by the older tool
// (whose value never starts with this session's random token) is simply a
// lock held by someone else. There are no fencing tokens (Session.Token is
// 0) and no acquisition time (Info.AcquiredAt is zero).
func WithLegacyTable() Option {
	return func(c *config) { c.legacy = true }
}

// WithoutListen turns release notifications off: waiters poll. Use it when
// the pool goes through a transaction pooler (PgBouncer pool_mode =
// transaction), where LISTEN is accepted but notifications never arrive, and
// no direct connection is available for WithListenConfig.
func WithoutListen() Option {
	return func(c *config) { c.NoListen = true }
}

// WithoutNotify stops releases (and ForceRelease, and Leave) from sending
// pg_notify; waiters in every process then poll (core.Backoff, never past
// the holder's expiry, and at least every third of the queue TTL), still in
// the queue's order. Only releases of keys with queued waiters notify, and
// releases wait for no WAL flush (see the package doc), so notifications
// cost little; WithoutNotify saves the notify lock's brief hold and the
// LISTEN connections, at the price of slower hand-offs. Use it with
// WithoutListen.
func WithoutNotify() Option {
	return func(c *config) { c.noNotify = true }
}

// WithListenConfig sets the connection used for LISTEN (default: a separate
// connection made from the pool's own ConnConfig). Point it at the database
// server directly when the pool goes through a transaction pooler.
func WithListenConfig(cfg *pgx.ConnConfig) Option {
	return func(c *config) {
		if cfg == nil {
			c.Invalid("WithListenConfig", "nil config")
			return
		}
		c.listenConfig = cfg.Copy()
	}
}

// WithClaimTimeout sets how long after TryAcquire is called an acquire may
// still take effect on the server (default DefaultClaimTimeout, 2s; from 10ms
// to 24h). The acquire's statement is given what is left of d once a pool
// connection is in hand, and the server refuses its write when its clock,
// read after the write, is later than that past the start of the
// statement's transaction, so a claim held up that long (waiting for a row
// or table lock, say) fails with ErrClaimTimeout, nothing claimed, instead
// of applying after its caller gave up and undid it. The server does not
// cut the wait short: the refusal comes when the lock is granted. When the
// wait for a pool connection leaves less than half of d, the acquire fails
// without sending anything. A statement_timeout of the role or session
// still applies. Backend.ClaimBound tells the engine when an ambiguous
// claim can no longer take effect.
//
// Choose d well above the longest healthy acquire (a row read and a write,
// plus any wait for a concurrent claim of the same key) and below the TTLs in
// use: the engine repeats the undo of an ambiguous claim only when the
// claim would outlive the bound.
func WithClaimTimeout(d time.Duration) Option {
	return func(c *config) { c.SetClaimTimeout(d) }
}

// WithClientOptions passes options to core.New when the Locker is built by
// New. NewBackend ignores them.
func WithClientOptions(opts ...core.ClientOption) Option {
	return func(c *config) { c.ClientOpts = append(c.ClientOpts, opts...) }
}
