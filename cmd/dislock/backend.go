package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
)

// locker is what the CLI needs of a backend: locks, the operator calls, and
// the holders of a semaphore.
type locker interface {
	core.Locker
	core.Admin
	Holders(ctx context.Context, key string) ([]core.Info, error)
	Backend() core.Backend
}

// hasSemaphores reports whether l's backend holds semaphores (LOCK_LIMIT).
func hasSemaphores(l locker) bool {
	_, ok := l.Backend().(core.SemaphoreBackend)
	return ok
}

var _ locker = (*core.Client)(nil)

// badURL is the configuration error (exit 2) for a URL that cannot be
// used; msg never quotes the URL.
func badURL(urlEnv, msg string, args ...any) error {
	return usagef("the URL in %s: %s", urlEnv, fmt.Sprintf(msg, args...))
}

// scheme returns the lower-cased scheme of rawURL without parsing the rest,
// so that no parser error can quote the URL.
func scheme(rawURL string) string {
	i := strings.Index(rawURL, "://")
	if i <= 0 {
		return ""
	}
	return strings.ToLower(rawURL[:i])
}

// tableUse says what openPG may do about a missing lock table.
type tableUse int

const (
	tableRun    tableUse = iota // a run: create the default table when missing
	tableCreate                 // a run with --create-table: create any missing table
	tableAdmin                  // an operator subcommand: create nothing
)

// openLocker connects to the backend the URL's scheme names. permits says
// that the run takes a semaphore (LOCK_LIMIT above 1). The returned close
// function closes the Locker, then the connections. Errors never contain the
// URL; configuration errors are *usageError.
func openLocker(ctx context.Context, urlEnv, rawURL, table string, use tableUse, permits bool, releaseTimeout time.Duration, log *slog.Logger) (locker, func() error, error) {
	copts := []core.ClientOption{core.WithReleaseTimeout(releaseTimeout)}
	switch s := scheme(rawURL); s {
	case "postgres", "postgresql":
		return openPG(ctx, urlEnv, rawURL, table, use, permits, copts, log)
	case "mysql", "mariadb":
		return openMySQL(ctx, urlEnv, rawURL, table, use, copts, log)
	case "redis", "rediss",
		"redis+sentinel", "rediss+sentinel", "redis-sentinel", "rediss-sentinel",
		"redis+cluster", "rediss+cluster", "redis-cluster", "rediss-cluster":
		if table != "" {
			log.Debug("LOCK_TABLE is ignored by the Redis backend")
		}
		// go-redis logs connection problems on its own: send them through
		// the redacting logger.
		redis.SetLogger(redisLogger{log})
		return openRedis(urlEnv, rawURL, s, copts)
	case "zk":
		return openZK(ctx, urlEnv, rawURL, table, copts, log)
	case "etcd", "etcds":
		return openEtcd(urlEnv, rawURL, table, copts, log)
	case "":
		return nil, nil, badURL(urlEnv, "not a URL (expected postgres://, postgresql://, mysql://, mariadb://, redis://, rediss://, redis+sentinel://, redis+cluster://, zk://, etcd:// or etcds://)")
	default:
		if len(s) > 32 || strings.ContainsAny(s, "@:/ ") {
			s = "?"
		}
		return nil, nil, badURL(urlEnv, "unknown scheme %q (expected postgres://, postgresql://, mysql://, mariadb://, redis://, rediss://, redis+sentinel://, redis+cluster://, zk://, etcd:// or etcds://)", s)
	}
}

// openPG opens a pool and a Locker on the lock table. A table in the older
// 3-column layout (key, value, expire_at) is used as such. A missing table
// is created only by a run, and only when it is the default table or
// --create-table says so: a mistyped LOCK_TABLE must not split the locks
// between two tables. A run that takes a semaphore (permits) and may create
// its table also creates what the semaphores need beside an existing table.
func openPG(ctx context.Context, urlEnv, rawURL, table string, use tableUse, permits bool, copts []core.ClientOption, log *slog.Logger) (locker, func() error, error) {
	pcfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, nil, badURL(urlEnv, "the PostgreSQL URL cannot be parsed: %s", parseReason(err))
	}
	if noHost(rawURL) && !strings.Contains(rawURL, "host=") {
		// pgx would fall back to localhost or a local socket.
		return nil, nil, badURL(urlEnv, "the PostgreSQL URL names no host (postgres://[user[:password]@]host[:port]/db)")
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("pg: connect: %w", err)
	}
	var opts []pg.Option
	name := pg.DefaultTable
	if table != "" {
		opts = append(opts, pg.WithTable(table))
		name = table
	}
	b, err := openTable(ctx, pool, name, table != "", use, permits, opts, log)
	if err != nil {
		pool.Close()
		if errors.Is(err, core.ErrInvalidOption) {
			return nil, nil, badSetting(specTable, "%v", err)
		}
		return nil, nil, err
	}
	c, err := core.New(b, copts...)
	if err != nil {
		b.Close()
	}
	return onClient(c, err, func() error { pool.Close(); return nil })
}

// openRedis builds a client for a single server (redis://, rediss://),
// Sentinel (redis+sentinel://host:port,…/db?master_name=NAME) or Cluster
// (redis+cluster://host:port?addr=host2:port2…).
func openRedis(urlEnv, rawURL, s string, copts []core.ClientOption) (locker, func() error, error) {
	base := "redis"
	if strings.HasPrefix(s, "rediss") {
		base = "rediss"
	}
	if noHost(rawURL) {
		// go-redis would fall back to localhost:6379.
		return nil, nil, badURL(urlEnv, "the Redis URL names no host (%s://[user:password@]host[:port][/db])", s)
	}
	u := base + rawURL[len(s):]
	var client redis.UniversalClient
	switch {
	case strings.HasSuffix(s, "sentinel"):
		u = commaHosts(u)
		o, err := redis.ParseFailoverURL(u)
		if err != nil {
			return nil, nil, badURL(urlEnv, "the Redis Sentinel URL cannot be parsed (it needs master_name=NAME): %s", parseReason(err))
		}
		if o.MasterName == "" {
			return nil, nil, badURL(urlEnv, "the Redis Sentinel URL needs master_name=NAME")
		}
		bounded(&o.ContextTimeoutEnabled, &o.DialerRetries)
		client = redis.NewFailoverClient(o)
	case strings.HasSuffix(s, "cluster"):
		o, err := redis.ParseClusterURL(commaHosts(u))
		if err != nil {
			return nil, nil, badURL(urlEnv, "the Redis Cluster URL cannot be parsed: %s", parseReason(err))
		}
		bounded(&o.ContextTimeoutEnabled, &o.DialerRetries)
		client = redis.NewClusterClient(o)
	default:
		o, err := redis.ParseURL(u)
		if err != nil {
			return nil, nil, badURL(urlEnv, "the Redis URL cannot be parsed: %s", parseReason(err))
		}
		bounded(&o.ContextTimeoutEnabled, &o.DialerRetries)
		client = redis.NewClient(o)
	}
	c, err := redislock.New(client, redislock.WithClientOptions(copts...))
	return onClient(c, err, client.Close)
}

// bounded sets a go-redis client's options so that every call is bounded
// by its ctx (DISLOCK_TIMEOUT_SECONDS, the renew deadline), not only by the
// socket timeouts and retries, and a refused connection fails fast
// (dialer_retries=N in the URL to change it).
func bounded(contextTimeoutEnabled *bool, dialerRetries *int) {
	*contextTimeoutEnabled = true
	if *dialerRetries == 0 {
		*dialerRetries = 1
	}
}

// onClient returns the Locker c built on a store client (or pool) of its
// own, with a close that closes c and then the client (closeClient); when c
// could not be built (err), the client is closed at once.
func onClient(c *core.Client, err error, closeClient func() error) (locker, func() error, error) {
	if err != nil {
		closeClient()
		return nil, nil, err
	}
	return c, func() error {
		err := c.Close()
		return errors.Join(err, closeClient())
	}, nil
}

// noHost reports whether rawURL (scheme://…) names no host: nothing, or only
// user information, between "://" and the path.
func noHost(rawURL string) bool {
	rest := rawURL[strings.Index(rawURL, "://")+3:]
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	return rest == "" || strings.HasPrefix(rest, ":")
}

// parseReason is why a URL parser refused a URL, without the URL it quotes.
func parseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s := err.Error()
	// pgconn: "cannot parse `<connection string>`: reason".
	if i := strings.LastIndex(s, "`: "); i >= 0 {
		s = s[i+3:]
	}
	return strings.TrimPrefix(s, "redis: ")
}

// errNoTable is the error of an operator subcommand on a database where the
// default lock table does not exist yet: no lock has been taken there.
var errNoTable = errors.New("the lock table does not exist")

// maxTTLer is a backend whose sessions bound the TTL (ZooKeeper).
type maxTTLer interface {
	MaxTTL() time.Duration
	SessionTimeout() time.Duration
}

// commaHosts rewrites scheme://user@h1:p1,h2:p2/… into the addr= query
// parameters the go-redis parsers expect.
func commaHosts(u string) string {
	i := strings.Index(u, "://") + 3
	end := len(u)
	if j := strings.IndexAny(u[i:], "/?"); j >= 0 {
		end = i + j
	}
	at := strings.LastIndex(u[i:end], "@")
	hostStart := i
	if at >= 0 {
		hostStart = i + at + 1
	}
	hosts := strings.Split(u[hostStart:end], ",")
	if len(hosts) < 2 {
		return u
	}
	rest := u[end:]
	var extra []string
	for _, h := range hosts[1:] {
		extra = append(extra, "addr="+h)
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	if hasQuery && query != "" {
		query += "&" + strings.Join(extra, "&")
	} else {
		query = strings.Join(extra, "&")
	}
	return u[:hostStart] + hosts[0] + path + "?" + query
}

// redisLogger passes go-redis's internal log lines to slog at debug level;
// the errors that matter reach the user through the calls that failed.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	driverSaid.Store(strings.TrimPrefix(msg, "redis: "))
	l.log.DebugContext(ctx, "redis: "+msg)
}

// driverSaid is the driver's last log line (go-redis says why it could not
// dial only there): an error cut short by a timeout names it as its cause.
var driverSaid atomic.Value // string

// openTable returns a Backend on the table name (opts name it when named is
// set). A table in the 3-column layout is used as such; a missing one is
// created when use allows it, and is otherwise a configuration error that
// shows the statement creating it.
func openTable(ctx context.Context, pool *pgxpool.Pool, name string, named bool, use tableUse, permits bool, opts []pg.Option, log *slog.Logger) (*pg.Backend, error) {
	ddl, err := pg.SchemaSQL(name, false, false)
	if err != nil {
		return nil, badSetting(specTable, "%v", err)
	}
	ddl = strings.NewReplacer("( ", "(", " )", ")").Replace(strings.Join(strings.Fields(ddl), " "))
	var exists bool
	parts := strings.SplitN(name, ".", 2)
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1::text) IS NOT NULL", pgx.Identifier(parts).Sanitize()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("pg: look up table %s: %w", name, err)
	}
	if !exists {
		switch {
		case use == tableAdmin && !named:
			return nil, errNoTable
		case use == tableAdmin:
			return nil, usagef("the lock table %s does not exist (no run has used it yet, or %s names another table); status, list and release create nothing",
				pgx.Identifier(parts).Sanitize(), specTable.name())
		case use == tableRun && named:
			return nil, badSetting(specTable, "the table %s does not exist; create it with: %s; or let dislock create it with %s=1 (--%s)",
				pgx.Identifier(parts).Sanitize(), ddl, specCreate.env, specCreate.flag)
		}
		return pg.NewBackend(ctx, pool, append(opts, pg.WithAutoMigrate())...)
	}
	mayCreate := use == tableCreate || use == tableRun && !named
	if permits && mayCreate {
		// The table exists, but perhaps not what the semaphores keep
		// beside it: a run that may create the table creates that too
		// (Migrate only creates what is missing).
		opts = append(opts, pg.WithAutoMigrate())
	}
	b, err := pg.NewBackend(ctx, pool, opts...)
	if errors.Is(err, pg.ErrSchema) && !permits {
		// A table of an earlier version lacks the waiter queue's column
		// (never a table in the 3-column layout, which has no queue): a
		// run that may create the table adds it (Migrate adds only what is
		// missing); any other run says how.
		var modern, queue bool
		if qerr := pool.QueryRow(ctx, `SELECT
	EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1::text) AND attname = 'holder' AND NOT attisdropped),
	EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1::text) AND attname = 'waiters' AND NOT attisdropped)`,
			pgx.Identifier(parts).Sanitize()).Scan(&modern, &queue); qerr == nil && modern && !queue {
			if !mayCreate {
				return nil, badSetting(specTable, "%v; or let dislock add it with %s=1 (--%s)", err, specCreate.env, specCreate.flag)
			}
			log.Debug("lock table of an earlier version; adding what is missing", "err", err)
			b, err = pg.NewBackend(ctx, pool, append(opts, pg.WithAutoMigrate())...)
		}
	}
	if errors.Is(err, pg.ErrSchema) {
		log.Debug("lock table not usable as is; trying the 3-column layout", "err", err)
		if lb, lerr := pg.NewBackend(ctx, pool, append(opts, pg.WithLegacyTable())...); lerr == nil {
			return lb, nil
		}
	}
	return b, err
}
