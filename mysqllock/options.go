package mysqllock

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
	"github.com/dislock/dislock/internal/sqlbackend"
)

// DefaultTable is the lock table used when WithTable is not given.
const DefaultTable = sqlbackend.DefaultTable

// DefaultClaimTimeout is the claim timeout used when WithClaimTimeout is not
// given: far above what a healthy acquire takes, well below the TTLs locks
// usually have.
const DefaultClaimTimeout = sqlbackend.DefaultClaimTimeout

// maxTableLen leaves room, within MySQL's 64-character identifiers, for
// the suffixes of the tables and procedures made for a lock table
// ("_permits", "_acquire", …).
const maxTableLen = 52

// Option configures a Backend. Invalid values make NewBackend fail with an
// error matching core.ErrInvalidOption that names the option.
type Option func(*config)

type config struct {
	sqlbackend.Config        // the options mysqllock shares with pg
	schema, table     string // unquoted; schema "" is the connection's database
	watchPoll         time.Duration
	watchLife         time.Duration
}

// newConfig applies opts and reports the first invalid one.
func newConfig(opts []Option) (config, error) {
	c := config{Config: sqlbackend.Config{ClaimTimeout: DefaultClaimTimeout}, table: DefaultTable, watchPoll: defaultWatchPoll, watchLife: watchLife}
	err := optcheck.Apply(&c, opts)
	return c, err
}

// dbConfig is newConfig for NewBackend and Migrate, which need db.
func dbConfig(db *sql.DB, opts []Option) (config, error) {
	if db == nil {
		return config{}, sqlbackend.InvalidOption("db", "nil")
	}
	return newConfig(opts)
}

// WithTable sets the lock table (default "dislock_locks"). A name with a dot
// is "database.table". Names are ASCII letters, digits, '_' and '$', the
// table's at most 52 bytes (the tables and procedures made for it add a
// suffix within MySQL's 64), and are quoted in every statement. The
// permits, waiters and turns tables and the procedures Migrate makes are
// named after it (dislock_locks_permits, dislock_locks_acquire, …).
func WithTable(name string) Option {
	return func(c *config) {
		schema, table, ok := strings.Cut(name, ".")
		if !ok {
			schema, table = "", name
		} else if err := checkIdent(schema, 64); err != "" {
			c.Invalid("WithTable", "database name: %s", err)
			return
		}
		if err := checkIdent(table, maxTableLen); err != "" {
			c.Invalid("WithTable", "%s", err)
			return
		}
		c.schema, c.table = schema, table
	}
}

func checkIdent(s string, max int) string {
	switch {
	case s == "":
		return "empty name"
	case len(s) > max:
		return fmt.Sprintf("%d bytes, the limit is %d", len(s), max)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '$') {
			return fmt.Sprintf("%q is not allowed (ASCII letters, digits, '_' and '$')", r)
		}
	}
	return ""
}

// WithAutoMigrate makes NewBackend create the lock table, its companion
// tables and its procedures when they are missing or of another version
// (as Migrate does). Off by default: they are then expected to exist, and
// their absence is an error naming the fix.
func WithAutoMigrate() Option {
	return func(c *config) { c.AutoMigrate = true }
}

// WithoutListen turns wake-ups off: waiters poll (core.Backoff, never past
// the holder's expiry), still in the queue's order. Without it, each
// Locker with a waiter keeps one connection of the pool in a wait that a
// release ends (see the package doc).
func WithoutListen() Option {
	return func(c *config) { c.NoListen = true }
}

// WithClaimTimeout sets how long after TryAcquire is called an acquire may
// still take effect on the server (default DefaultClaimTimeout, 2s; from 10ms
// to 24h). The acquire's procedure checks, on the server, once it holds the
// key's row lock, that no more than what was left of d when it was sent has
// passed since it started, and rolls back otherwise; when the wait for a pool
// connection leaves less than half of d, the acquire fails without sending
// anything. Backend.ClaimBound tells the engine when an ambiguous claim can
// no longer take effect.
func WithClaimTimeout(d time.Duration) Option {
	return func(c *config) { c.SetClaimTimeout(d) }
}

// WithClientOptions passes options to core.New when the Locker is built by
// New or Open. NewBackend ignores them.
func WithClientOptions(opts ...core.ClientOption) Option {
	return func(c *config) { c.ClientOpts = append(c.ClientOpts, opts...) }
}
