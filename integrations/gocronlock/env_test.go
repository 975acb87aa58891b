package gocronlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/gocronlock"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
)

// env is one lock store shared by the simulated processes of a test.
type env struct {
	name string
	// backend returns a new handle on the store: one process's connection.
	backend func(t *testing.T) core.Backend
	// recorder returns a run recorder kept in (or next to) the store.
	recorder func(t *testing.T) recorder
}

// forEachStore runs fn against memlock, PostgreSQL, MySQL and Redis, in
// parallel.
// The real servers come from internal/testenv: missing servers fail the
// test under CI and skip it elsewhere.
func forEachStore(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, name := range []string{"memlock", "pg", "mysql", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newEnv(t, name))
		})
	}
}

func newEnv(t *testing.T, name string) *env {
	t.Helper()
	switch name {
	case "memlock":
		store := memlock.NewStore()
		return &env{name: name,
			backend:  func(*testing.T) core.Backend { return store.Backend() },
			recorder: func(*testing.T) recorder { return &memRecorder{} },
		}
	case "pg":
		url := testenv.PG(t)
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatalf("pgxpool: %v", err)
		}
		table := testenv.Name("gocronlock_")
		t.Cleanup(func() {
			// WithAutoMigrate also creates the permits table semaphores
			// keep beside the lock table, where the backend has them.
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_permits"}.Sanitize())
			pool.Close()
		})
		return &env{name: name,
			backend: func(t *testing.T) core.Backend {
				return closedAtEnd(t, "pg.NewBackend")(pg.NewBackend(ctx, pool, pg.WithTable(table), pg.WithAutoMigrate()))
			},
			recorder: func(t *testing.T) recorder { return newPGRecorder(t, pool, testenv.Name("gocronlock_runs_")) },
		}
	case "mysql":
		_, db := mysqltest.DB(t)
		table := mysqltest.Table(t, db, "gocronlock_")
		return &env{name: name,
			backend: func(t *testing.T) core.Backend {
				return closedAtEnd(t, "mysqllock.NewBackend")(mysqllock.NewBackend(context.Background(), db, mysqllock.WithTable(table)))
			},
			recorder: func(t *testing.T) recorder { return newMySQLRecorder(t, db, testenv.Name("gocronlock_runs_")) },
		}
	case "redis":
		url := testenv.Redis(t)
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatalf("redis URL: %v", err)
		}
		client := redis.NewClient(opt)
		prefix := testenv.Name("gocronlocktest")
		t.Cleanup(func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				client.Del(ctx, iter.Val())
			}
			_ = client.Close()
		})
		return &env{name: name,
			backend: func(t *testing.T) core.Backend {
				return closedAtEnd(t, "redislock.NewBackend")(redislock.NewBackend(client, redislock.WithPrefix(prefix)))
			},
			recorder: func(*testing.T) recorder { return &redisRecorder{c: client, key: testenv.Name(prefix + ":runs:")} },
		}
	}
	t.Fatalf("unknown store %q", name)
	return nil
}

// locker returns a Locker acting as a separate process; it is closed when
// the test ends.
func (e *env) locker(t *testing.T, opts ...core.ClientOption) *core.Client {
	t.Helper()
	return testenv.Client(t, e.backend(t), opts...)
}

// closedAtEnd returns a function that takes a constructor's results: it
// fails t, naming what, on the constructor's error, and otherwise returns
// the Backend, closed when t ends.
func closedAtEnd(t *testing.T, what string) func(core.Backend, error) core.Backend {
	return func(b core.Backend, err error) core.Backend {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
}

// killable returns a Locker whose access to the store can be cut, like a
// process that froze or lost its network: it neither renews nor releases.
func (e *env) killable(t *testing.T) (*core.Client, *cutBackend) {
	t.Helper()
	cb := &cutBackend{Backend: e.backend(t)}
	return testenv.Client(t, cb), cb
}

var errCut = errors.New("test: store unreachable")

// cutBackend wraps a Backend; once cut, every call fails.
type cutBackend struct {
	core.Backend
	cut atomic.Bool
}

func (b *cutBackend) Cut() { b.cut.Store(true) }

func (b *cutBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if b.cut.Load() {
		return core.Lease{}, errCut
	}
	return b.Backend.TryAcquire(ctx, req)
}

func (b *cutBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if b.cut.Load() {
		return nil, errCut
	}
	return b.Backend.Renew(ctx, reqs)
}

func (b *cutBackend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if b.cut.Load() {
		return errCut
	}
	return b.Backend.Release(ctx, req)
}

func (b *cutBackend) Now(ctx context.Context, key string) (time.Time, error) {
	if b.cut.Load() {
		return time.Time{}, errCut
	}
	return b.Backend.Now(ctx, key)
}

func (b *cutBackend) Watch(ctx context.Context, ready func(), fn func(string)) error {
	w, ok := b.Backend.(core.Watcher)
	if !ok {
		return core.ErrUnsupported
	}
	return w.Watch(ctx, ready, fn)
}

func (b *cutBackend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	return b.Backend.(core.Admin).Inspect(ctx, key)
}

func (b *cutBackend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	return b.Backend.(core.Admin).List(ctx, prefix)
}

func (b *cutBackend) ForceRelease(ctx context.Context, key string) (bool, error) {
	return b.Backend.(core.Admin).ForceRelease(ctx, key)
}

// run is one job run.
type run struct {
	node int
	at   time.Time // wall clock of the store (or of this machine, for memlock and Redis)
}

// recorder counts job runs where every simulated process can see them.
type recorder interface {
	record(ctx context.Context, node int) error
	runs(ctx context.Context) ([]run, error)
}

type memRecorder struct {
	mu   sync.Mutex
	list []run
}

func (r *memRecorder) record(_ context.Context, node int) error {
	r.mu.Lock()
	r.list = append(r.list, run{node: node, at: time.Now()})
	r.mu.Unlock()
	return nil
}

func (r *memRecorder) runs(context.Context) ([]run, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]run(nil), r.list...), nil
}

// pgRecorder inserts one row per run, stamped with the database's clock.
type pgRecorder struct {
	pool  *pgxpool.Pool
	table string
}

func newPGRecorder(t *testing.T, pool *pgxpool.Pool, table string) *pgRecorder {
	t.Helper()
	r := &pgRecorder{pool: pool, table: pgx.Identifier{table}.Sanitize()}
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+r.table+
		" (id bigserial PRIMARY KEY, node int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		t.Fatalf("create runs table: %v", err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+r.table) })
	return r
}

func (r *pgRecorder) record(ctx context.Context, node int) error {
	_, err := r.pool.Exec(context.WithoutCancel(ctx), "INSERT INTO "+r.table+" (node) VALUES ($1)", node)
	return err
}

func (r *pgRecorder) runs(ctx context.Context) ([]run, error) {
	rows, err := r.pool.Query(ctx, "SELECT node, at FROM "+r.table+" ORDER BY at")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (run, error) {
		var x run
		err := row.Scan(&x.node, &x.at)
		return x, err
	})
}

// mysqlRecorder inserts one row per run, stamped with the database's clock
// (microseconds).
type mysqlRecorder struct {
	db    *sql.DB
	table string
}

func newMySQLRecorder(t *testing.T, db *sql.DB, table string) *mysqlRecorder {
	t.Helper()
	r := &mysqlRecorder{db: db, table: "`" + table + "`"}
	if _, err := db.Exec("CREATE TABLE " + r.table + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, node INT NOT NULL, at BIGINT NOT NULL)"); err != nil {
		t.Fatalf("create runs table: %v", err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + r.table) })
	return r
}

func (r *mysqlRecorder) record(ctx context.Context, node int) error {
	_, err := r.db.ExecContext(context.WithoutCancel(ctx), "INSERT INTO "+r.table+
		" (node, at) VALUES (?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))", node)
	return err
}

func (r *mysqlRecorder) runs(ctx context.Context) ([]run, error) {
	rows, err := r.db.QueryContext(ctx, "SELECT node, at FROM "+r.table+" ORDER BY at, id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var list []run
	for rows.Next() {
		var x run
		var us int64
		if err := rows.Scan(&x.node, &us); err != nil {
			return nil, err
		}
		x.at = time.UnixMicro(us)
		list = append(list, x)
	}
	return list, rows.Err()
}

// redisRecorder appends one entry per run to a list.
type redisRecorder struct {
	c   *redis.Client
	key string
}

func (r *redisRecorder) record(ctx context.Context, node int) error {
	return r.c.RPush(context.WithoutCancel(ctx), r.key, fmt.Sprintf("%d %d", node, time.Now().UnixNano())).Err()
}

func (r *redisRecorder) runs(ctx context.Context) ([]run, error) {
	vals, err := r.c.LRange(ctx, r.key, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	var list []run
	for _, v := range vals {
		var node int
		var ns int64
		if _, err := fmt.Sscan(v, &node, &ns); err != nil {
			return nil, err
		}
		list = append(list, run{node: node, at: time.Unix(0, ns)})
	}
	return list, nil
}

// memStore is an in-memory store shared by a test's simulated processes.
type memStore struct {
	*memlock.Store
	t *testing.T
}

func newMemStore(t *testing.T) memStore { return memStore{memlock.NewStore(), t} }

// open returns a new Locker on the store, as one process opens it; it is
// closed when the test ends.
func (s memStore) open() *core.Client {
	s.t.Helper()
	l, err := s.Locker()
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { l.Close() })
	return l
}

// logged opens a Locker on the store (open) and returns it with a
// gocronlock Locker on it whose OnError reports go to log.
func (s memStore) logged(log *errorLog) (*core.Client, *gocronlock.Locker) {
	s.t.Helper()
	c := s.open()
	l, err := gocronlock.NewLocker(c, log.option())
	if err != nil {
		s.t.Fatal(err)
	}
	return c, l
}

// errorLog collects what a Locker or Elector reports to OnError.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

// option is the OnError that adds to the log.
func (l *errorLog) option() gocronlock.Option {
	return gocronlock.OnError(func(_ string, err error) {
		l.mu.Lock()
		l.errs = append(l.errs, err)
		l.mu.Unlock()
	})
}

// take returns the errors reported so far and empties the log.
func (l *errorLog) take() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := l.errs
	l.errs = nil
	return errs
}

// quiet is an OnError that fails the test on anything but ErrNoSchedule
// (the plain leases these tests take on purpose).
func quiet(t *testing.T) gocronlock.Option {
	return gocronlock.OnError(func(key string, err error) {
		if !errors.Is(err, gocronlock.ErrNoSchedule) {
			t.Errorf("OnError(%q): %v", key, err)
		}
	})
}

// within returns the next value on ch, failing the test if none comes
// within d (what names the value).
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
		panic("unreachable")
	}
}
