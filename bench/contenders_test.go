package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
)

// unlockFunc releases a lock a contender took.
type unlockFunc func(ctx context.Context) error

// contender is one lock implementation as a benchmark drives it.
type contender struct {
	// try makes one attempt; errBusy when the lock is held elsewhere.
	try func(ctx context.Context, key string) (unlockFunc, error)
	// wait blocks until the lock is held, the way the library's users
	// wait; nil when the library has no way to wait.
	wait func(ctx context.Context, key string) (unlockFunc, error)
	// lease takes a lock of the given TTL for a caller that extends it
	// itself, lock by lock (libraries without batched renewal); nil for
	// dislock, which renews on its own.
	lease func(ctx context.Context, key string, ttl time.Duration) (refresh func(ctx context.Context) error, err error)
}

// store is what the contenders of one server share in one benchmark.
type store struct {
	name string // "pg", "redis", "mysql", "etcd" or "zk"
	url  string
	rt   roundTrip
	pool *pgxpool.Pool
	db   *sql.DB // MySQL
	// newDB opens another MySQL pool of the same size on the same
	// counters, of mysqllock.Connector (as mysqllock.Open makes its pool):
	// a dislock contender's own, as a process of its own has (its waiters
	// pin two connections each, see mysqllock's doc).
	newDB func() *sql.DB
	rdb   *redis.Client
	// serverCPU returns the server's CPU time so far: Redis's (INFO cpu),
	// or that of the PostgreSQL processes serving the pool's connections
	// (from /proc, when the server runs on this machine; else nil).
	serverCPU func(ctx context.Context) (time.Duration, error)
	// commands returns INFO commandstats (Redis only), and sent the
	// commands the counting client has sent, by name (Redis only; set by
	// counted).
	commands func(ctx context.Context) (map[string]cmdStat, error)
	sent     func() map[string]int64
	// writes returns the server's write transactions so far (ZooKeeper:
	// the zxid; etcd: the Raft entries applied; nil elsewhere).
	writes func() int64
	zk     *zktest.Counter   // ZooKeeper: counts the contenders' sessions
	etcd   *etcdtest.Counter // etcd: counts the contenders' clients
}

// redisStore connects to the benchmark's Redis; hook may be nil.
func redisStore(tb testing.TB, hook redis.Hook) *store {
	tb.Helper()
	url := serverURL(tb, "redis")
	cleanRedisAtExit(url)
	c := newRedis(tb, url, hook)
	plain := newRedis(tb, url, nil) // for INFO, outside the counts
	return &store{name: "redis", url: url, rt: redisPing(c), rdb: c,
		serverCPU: func(ctx context.Context) (time.Duration, error) { return serverCPU(ctx, plain) },
		commands:  func(ctx context.Context) (map[string]cmdStat, error) { return commandStats(ctx, plain) }}
}

// pgStore connects to the benchmark's PostgreSQL database; tracer may be nil.
func pgStore(tb testing.TB, url string, tracer pgx.QueryTracer) *store {
	tb.Helper()
	p := newPool(tb, url, pgConns, tracer)
	st := &store{name: "pg", url: url, rt: pgSelect1(p), pool: p}
	if _, ok := pgServerCPU(p); ok {
		st.serverCPU = func(context.Context) (time.Duration, error) {
			d, _ := pgServerCPU(p)
			return d, nil
		}
	}
	return st
}

// Names of the contenders, by store.
var (
	redisContenders = []string{"dislock", "bsm", "redsync", "raw"}
	pgContenders    = []string{"dislock", "dislock-async", "dislock-nonotify", "ttlrow", "advisory"}
	mysqlContenders = []string{"dislock", "ttlrow", "getlock"}
)

// contenderFor builds the named contender on st. Its locks live under keys
// of this run only; everything it opens closes at the end of tb.
func contenderFor(tb testing.TB, st *store, which string) *contender {
	tb.Helper()
	if base, ok := strings.CutSuffix(which, "-deadline"); ok {
		return withDeadline(contenderFor(tb, st, base))
	}
	if st.name == "zk" {
		return zkContenderFor(tb, st, which)
	}
	if st.name == "etcd" {
		return etcdContenderFor(tb, st, which, 1)
	}
	switch st.name + "/" + which {
	case "redis/dislock":
		return dislockContender(tb, newDislockRedis(tb, st.rdb, ""))
	case "redis/bsm":
		return bsmContender(st.rdb)
	case "redis/redsync":
		return redsyncContender(st.rdb)
	case "redis/raw":
		return rawRedisContender(st.rdb)
	case "pg/dislock":
		return dislockContender(tb, newDislockPG(tb, st.pool))
	case "pg/dislock-async":
		return dislockContender(tb, newDislockPG(tb, st.pool, pg.WithAsyncCommit()))
	case "pg/dislock-nonotify":
		return dislockContender(tb, newDislockPG(tb, st.pool, pg.WithoutNotify(), pg.WithoutListen()))
	case "pg/ttlrow":
		return pgTTLRowContender(tb, st.pool)
	case "pg/advisory":
		return advisoryContender(st.pool)
	case "mysql/dislock":
		return dislockContender(tb, newDislockMySQL(tb, st.newDB()))
	case "mysql/ttlrow":
		return mysqlTTLRowContender(tb, st.db)
	case "mysql/getlock":
		return getLockContender(st.db)
	}
	tb.Fatalf("no contender %s/%s", st.name, which)
	return nil
}

// callDeadline is the timeout withDeadline gives each call.
const callDeadline = 10 * time.Second

// withDeadline is c with each call (a try, an unlock) made under a ctx
// that ends callDeadline after it starts, as a caller that bounds every
// store call writes it: "<contender>-deadline" in contenderFor. Its figure
// beside c's is what the driver charges for a call whose ctx can end
// (go-sql-driver/mysql hands such a ctx to a goroutine of the connection
// that watches it, and takes it back when the call returns).
func withDeadline(c *contender) *contender {
	bounded := func(ctx context.Context, fn func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, callDeadline)
		defer cancel()
		return fn(ctx)
	}
	return &contender{try: func(ctx context.Context, key string) (unlockFunc, error) {
		var u unlockFunc
		err := bounded(ctx, func(ctx context.Context) (err error) {
			u, err = c.try(ctx, key)
			return err
		})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return bounded(ctx, u) }, nil
	}}
}

// parallelContenderFor is contenderFor for a contender that many goroutines
// (parallelism) drive at once: an etcd Mutex gets a session for each (see
// mutexContender).
func parallelContenderFor(tb testing.TB, st *store, which string) *contender {
	tb.Helper()
	if st.name == "etcd" {
		return etcdContenderFor(tb, st, which, parallelism)
	}
	return contenderFor(tb, st, which)
}

// ---- dislock ----

// newDislockRedis returns a dislock Locker on c. Lockers made with the same
// tag in one run see each other's locks.
func newDislockRedis(tb testing.TB, c redis.UniversalClient, tag string) *core.Client {
	tb.Helper()
	l, err := redislock.New(c, redislock.WithPrefix(name("dislock", tag)))
	return kept(tb, "redislock.New", l, err)
}

// kept is the end of the newDislock functions: it fails tb with the error
// of the constructor named what, or returns l, closed when tb ends.
func kept(tb testing.TB, what string, l *core.Client, err error) *core.Client {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

// newDislockPG returns a dislock Locker on pool, on a table of this run
// (created on first use; the run's database is dropped at exit).
func newDislockPG(tb testing.TB, pool *pgxpool.Pool, extra ...pg.Option) *core.Client {
	tb.Helper()
	table := name("dislock_locks")
	opts := append([]pg.Option{pg.WithTable(table), pg.WithAutoMigrate()}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := pg.New(ctx, pool, opts...)
	l = kept(tb, "pg.New", l, err)
	dropTableAtExit(pool.Config().ConnString(), table)
	return l
}

func dislockContender(tb testing.TB, l core.Locker) *contender {
	tb.Helper()
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) {
			s, err := l.TryAcquire(ctx, key, core.TTL(ttl))
			return held(s, err, core.ErrNotAcquired, core.Session.Release)
		},
		wait: func(ctx context.Context, key string) (unlockFunc, error) {
			s, err := l.Acquire(ctx, key, core.TTL(ttl))
			return held(s, err, core.ErrNotAcquired, core.Session.Release)
		},
	}
}

// held is a contender's answer to a library's claim that returned lock l
// and err: errBusy when err is the library's busy, err, or the release of
// l.
func held[L any](l L, err, busy error, release func(L, context.Context) error) (unlockFunc, error) {
	if errors.Is(err, busy) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return release(l, ctx) }, nil
}

// ---- github.com/bsm/redislock ----

// bsmRetry is the polling interval of waiting bsm/redislock callers.
const bsmRetry = 10 * time.Millisecond

func bsmContender(c *redis.Client) *contender {
	cl := bsm.New(c)
	prefix := name("bsm") + ":"
	obtain := func(ctx context.Context, key string, opt *bsm.Options) (unlockFunc, error) {
		l, err := cl.Obtain(ctx, prefix+key, ttl, opt)
		return held(l, err, bsm.ErrNotObtained, (*bsm.Lock).Release)
	}
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) {
			return obtain(ctx, key, nil)
		},
		wait: func(ctx context.Context, key string) (unlockFunc, error) {
			// Obtain retries until ctx's deadline (or the TTL without one).
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			return obtain(ctx, key, &bsm.Options{RetryStrategy: bsm.LinearBackoff(bsmRetry)})
		},
		lease: func(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
			l, err := cl.Obtain(ctx, prefix+key, ttl, nil)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return l.Refresh(ctx, ttl, nil) }, nil
		},
	}
}

// ---- github.com/go-redsync/redsync/v4 ----

func redsyncContender(c *redis.Client) *contender {
	rs := redsync.New(goredis.NewPool(c))
	prefix := name("redsync") + ":"
	lock := func(ctx context.Context, m *redsync.Mutex, tries int) (unlockFunc, error) {
		var err error
		if tries == 1 {
			err = m.TryLockContext(ctx)
		} else {
			err = m.LockContext(ctx)
		}
		if err != nil {
			if redsyncBusy(err) {
				return nil, errBusy
			}
			return nil, err
		}
		return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
	}
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) {
			return lock(ctx, rs.NewMutex(prefix+key, redsync.WithExpiry(ttl), redsync.WithTries(1)), 1)
		},
		wait: func(ctx context.Context, key string) (unlockFunc, error) {
			// The library's defaults: 32 tries, 50–250 ms apart; callers
			// that must get the lock call Lock again when they run out.
			for {
				u, err := lock(ctx, rs.NewMutex(prefix+key, redsync.WithExpiry(ttl)), 0)
				if !errors.Is(err, errBusy) || ctx.Err() != nil {
					return u, err
				}
			}
		},
		lease: func(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
			m := rs.NewMutex(prefix+key, redsync.WithExpiry(ttl), redsync.WithTries(1))
			if err := m.TryLockContext(ctx); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				ok, err := m.ExtendContext(ctx)
				if err == nil && !ok {
					err = redsync.ErrExtendFailed
				}
				return err
			}, nil
		},
	}
}

func redsyncBusy(err error) bool {
	var taken *redsync.ErrTaken
	var nodeTaken *redsync.ErrNodeTaken
	return errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken)
}

// ---- raw SET NX PX + DEL ----

func rawRedisContender(c *redis.Client) *contender {
	prefix := name("raw") + ":"
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) {
			k := prefix + key
			ok, err := c.SetNX(ctx, k, "1", ttl).Result()
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, errBusy
			}
			// Not owner-checked: the floor a lock could reach, not a lock.
			return func(ctx context.Context) error { return c.Del(ctx, k).Err() }, nil
		},
	}
}

// ---- plain TTL row: INSERT … ON CONFLICT DO UPDATE … WHERE expired; DELETE ----

// ttlRowPoll is the polling interval of waiting TTL-row callers.
const ttlRowPoll = 10 * time.Millisecond

func ttlRowTable(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	table := pgx.Identifier{name("ttl_row")}.Sanitize()
	_, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS `+table+` (
	key       text PRIMARY KEY,
	owner     text NOT NULL,
	expire_at timestamptz NOT NULL
)`)
	if err != nil {
		tb.Fatalf("create TTL-row table: %v", err)
	}
	dropTableAtExit(pool.Config().ConnString(), name("ttl_row"))
	return table
}

func pgTTLRowContender(tb testing.TB, pool *pgxpool.Pool) *contender {
	tb.Helper()
	table := ttlRowTable(tb, pool)
	acquire := `INSERT INTO ` + table + ` AS t (key, owner, expire_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expire_at = excluded.expire_at
WHERE t.expire_at < now()`
	release := `DELETE FROM ` + table + ` WHERE key = $1 AND owner = $2`
	extend := `UPDATE ` + table + ` SET expire_at = now() + $3 * interval '1 millisecond'
WHERE key = $1 AND owner = $2`
	return ttlRowContender(
		func(ctx context.Context, key string, ttl time.Duration) (string, error) {
			owner := rand.Text()
			tag, err := pool.Exec(ctx, acquire, key, owner, ttl.Milliseconds())
			if err != nil {
				return "", err
			}
			if tag.RowsAffected() != 1 {
				return "", errBusy
			}
			return owner, nil
		},
		func(ctx context.Context, key, owner string) error {
			_, err := pool.Exec(ctx, release, key, owner)
			return err
		},
		func(ctx context.Context, key, owner string, ttl time.Duration) (int64, error) {
			tag, err := pool.Exec(ctx, extend, key, owner, ttl.Milliseconds())
			return tag.RowsAffected(), err
		})
}

// ttlRowContender is a plain TTL-row lock: take claims a key for a new
// owner (errBusy while another owner's row is live), release deletes the
// owner's row and extend renews it, reporting the rows it updated.
func ttlRowContender(take func(ctx context.Context, key string, ttl time.Duration) (owner string, err error),
	release func(ctx context.Context, key, owner string) error,
	extend func(ctx context.Context, key, owner string, ttl time.Duration) (int64, error)) *contender {
	try := func(ctx context.Context, key string) (unlockFunc, error) {
		owner, err := take(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return release(ctx, key, owner) }, nil
	}
	return &contender{
		try: try,
		lease: func(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
			owner, err := take(ctx, key, ttl)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				n, err := extend(ctx, key, owner, ttl)
				if err == nil && n != 1 {
					err = fmt.Errorf("TTL row %q lost", key)
				}
				return err
			}, nil
		},
		wait: pollWait(try),
	}
}

// pollWait waits by calling try every ttlRowPoll while the lock is busy.
func pollWait(try func(ctx context.Context, key string) (unlockFunc, error)) func(ctx context.Context, key string) (unlockFunc, error) {
	return func(ctx context.Context, key string) (unlockFunc, error) {
		for {
			u, err := try(ctx, key)
			if !errors.Is(err, errBusy) {
				return u, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(ttlRowPoll):
			}
		}
	}
}

// ---- pg_try_advisory_lock / pg_advisory_lock (session-level) ----

func advisoryContender(pool *pgxpool.Pool) *contender {
	take := func(ctx context.Context, key, fn string) (unlockFunc, error) {
		return connLock(ctx, pool.Acquire, (*pgxpool.Conn).Release,
			func(conn *pgxpool.Conn) (ok bool, err error) {
				if fn == "pg_advisory_lock" {
					_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key)
					return err == nil, err
				}
				err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key).Scan(&ok)
				return ok, err
			},
			func(ctx context.Context, conn *pgxpool.Conn) error {
				var released bool
				if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key).Scan(&released); err != nil {
					return err
				}
				if !released {
					return fmt.Errorf("advisory lock %q was not held", key)
				}
				return nil
			})
	}
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) {
			return take(ctx, key, "pg_try_advisory_lock")
		},
		wait: func(ctx context.Context, key string) (unlockFunc, error) { return take(ctx, key, "pg_advisory_lock") },
	}
}

// connLock takes a lock that lives as long as the connection that took it,
// so a holder keeps a connection of the pool until it unlocks: open takes
// the connection, lock tries the lock on it (false: busy), unlock gives the
// lock up and put gives the connection back, after the unlock or a lock
// not taken.
func connLock[C any](ctx context.Context, open func(context.Context) (C, error), put func(C),
	lock func(C) (bool, error), unlock func(context.Context, C) error) (unlockFunc, error) {
	conn, err := open(ctx)
	if err != nil {
		return nil, err
	}
	if ok, err := lock(conn); err != nil || !ok {
		put(conn)
		if err == nil {
			err = errBusy
		}
		return nil, err
	}
	return func(ctx context.Context) error {
		defer put(conn)
		return unlock(ctx, conn)
	}, nil
}

// dropTableAtExit drops table (unquoted name) at exit, in case the run's
// private database could not be made.
func dropTableAtExit(connString, table string) {
	cleanAtExit("pg table "+table, func(ctx context.Context) {
		conn, err := pgx.Connect(ctx, connString)
		if err != nil {
			return // the database is gone with the run
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
}
