package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// mysqlConns is the MySQL pool size, as pgConns for PostgreSQL.
const mysqlConns = pgConns

// mysqlStore connects to the benchmark's MySQL server (DISLOCK_BENCH_MYSQL,
// else DISLOCK_TEST_MYSQL); a non-nil n counts the round trips the pool
// makes (statements executed and prepared).
func mysqlStore(tb testing.TB, n *atomic.Int64) *store {
	return mysqlStoreKinds(tb, n, nil)
}

// mysqlStoreKinds is mysqlStore that also counts, in a non-nil kinds, the
// statements by kind (see statementKind).
func mysqlStoreKinds(tb testing.TB, n *atomic.Int64, kinds *statementKinds) *store {
	tb.Helper()
	raw := os.Getenv("DISLOCK_BENCH_MYSQL")
	if raw == "" {
		raw = testenv.MySQL(tb)
	}
	cfg, err := mysqllock.ParseDSN(raw)
	if err != nil {
		tb.Fatal(err)
	}
	// Statements with arguments in one round trip (the driver's default
	// prepares each, two round trips): the peers' statements get the
	// lowest cost the driver offers. dislock's own are prepared once per
	// connection either way.
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	// dislock's pools are made as mysqllock.Open makes its own: with
	// mysqllock.Connector, whose statements end with their ctx by a cut of
	// their socket instead of the driver's watcher goroutine.
	own, err := mysqllock.Connector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var c, ownC driver.Connector = conn, own
	if n != nil {
		c = countingConnector{Connector: conn, n: n, kinds: kinds}
		ownC = countingConnector{Connector: own, n: n, kinds: kinds}
	}
	open := func(c driver.Connector) *sql.DB {
		db := sql.OpenDB(c)
		db.SetMaxOpenConns(mysqlConns)
		db.SetMaxIdleConns(mysqlConns)
		tb.Cleanup(func() { _ = db.Close() })
		return db
	}
	newDB := func() *sql.DB { return open(ownC) }
	db := open(c)
	if err := db.Ping(); err != nil {
		tb.Fatalf("mysql ping: %v", err)
	}
	dropMySQLAtExit(cfg)
	return &store{name: "mysql", url: raw, db: db, newDB: newDB, rt: func(ctx context.Context) error {
		var one int
		return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	}}
}

// dropMySQLAtExit drops this run's tables and procedures at exit.
func dropMySQLAtExit(cfg *mysql.Config) {
	cleanAtExit("mysql", func(ctx context.Context) {
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return
		}
		db := sql.OpenDB(conn)
		defer db.Close()
		// run.id is letters, digits and '_': written into the statement,
		// which go-sql-driver then sends as a plain query, not a
		// server-side prepared statement.
		like := "'" + run.id + "%'"
		for _, q := range []struct{ list, drop string }{
			{"SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE " + like, "DROP PROCEDURE IF EXISTS "},
			{"SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE " + like, "DROP TABLE IF EXISTS "},
		} {
			names, err := mysqltest.Names(ctx, db, q.list)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: list mysql objects: %v\n", err)
				return
			}
			for _, n := range names {
				if _, err := db.ExecContext(ctx, q.drop+"`"+n+"`"); err != nil {
					fmt.Fprintf(os.Stderr, "bench: drop %s: %v\n", n, err)
				}
			}
		}
	})
}

// ---- a database/sql driver wrapper that counts round trips ----

type countingConnector struct {
	driver.Connector
	n     *atomic.Int64
	kinds *statementKinds // nil: not by kind
}

// statementKinds counts statements by kind.
type statementKinds struct {
	mu sync.Mutex
	m  map[string]int64
}

func (k *statementKinds) add(q string) {
	if k == nil {
		return
	}
	kind := statementKind(q)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]int64{}
	}
	k.m[kind]++
}

// snapshot returns a copy of the counts.
func (k *statementKinds) snapshot() map[string]int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.m)
}

// statementKind names a statement by its first word, and a CALL by its
// procedure's suffix (the procedures of a table are <table>_<suffix>):
// "CALL acquire", "SELECT", "DELETE" (a prepare is "PREPARE").
func statementKind(q string) string {
	q = strings.TrimSpace(q)
	verb, rest, _ := strings.Cut(q, " ")
	verb = strings.ToUpper(verb)
	if verb != "CALL" {
		return verb
	}
	proc, _, _ := strings.Cut(rest, "(")
	proc = strings.Trim(strings.TrimSpace(proc), "`")
	if i := strings.LastIndexByte(proc, '_'); i >= 0 {
		proc = proc[i+1:]
	}
	return "CALL " + proc
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn: conn, n: c.n, kinds: c.kinds}, nil
}

// countingConn passes everything to the driver's connection (which has
// every optional interface used here) and counts each statement executed
// or prepared (a driver.ErrSkip answer, "prepare it first", makes no round
// trip and is not counted).
type countingConn struct {
	conn  driver.Conn
	n     *atomic.Int64
	kinds *statementKinds
}

func (c *countingConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.n.Add(1)
	c.kinds.add("PREPARE " + q)
	st, err := c.conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, n: c.n, kinds: c.kinds, q: q}, nil
}

func (c *countingConn) Close() error { return c.conn.Close() }
func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *countingConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	c.kinds.add("BEGIN")
	return c.conn.(driver.ConnBeginTx).BeginTx(ctx, o)
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.conn.(driver.ExecerContext).ExecContext(ctx, q, args)
	c.count(q, err)
	return r, err
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	c.count(q, err)
	return r, err
}

func (c *countingConn) count(q string, err error) {
	if !errors.Is(err, driver.ErrSkip) {
		c.n.Add(1)
		c.kinds.add(q)
	}
}

func (c *countingConn) Ping(ctx context.Context) error { return c.conn.(driver.Pinger).Ping(ctx) }
func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.conn.(driver.SessionResetter).ResetSession(ctx)
}
func (c *countingConn) IsValid() bool { return c.conn.(driver.Validator).IsValid() }
func (c *countingConn) CheckNamedValue(v *driver.NamedValue) error {
	return c.conn.(driver.NamedValueChecker).CheckNamedValue(v)
}

type countingStmt struct {
	driver.Stmt
	n     *atomic.Int64
	kinds *statementKinds
	q     string
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.n.Add(1)
	s.kinds.add(s.q)
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.n.Add(1)
	s.kinds.add(s.q)
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *countingStmt) CheckNamedValue(v *driver.NamedValue) error {
	if c, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

// ---- dislock mysql ----

// newDislockMySQL returns a dislock Locker on db, on a table of this run.
func newDislockMySQL(tb testing.TB, db *sql.DB) *core.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := mysqllock.New(ctx, db, mysqllock.WithTable(name("dislock")), mysqllock.WithAutoMigrate())
	return kept(tb, "mysqllock.New", l, err)
}

// ---- plain TTL row: INSERT … ON DUPLICATE KEY UPDATE … IF(expired); DELETE ----

func mysqlTTLRowContender(tb testing.TB, db *sql.DB) *contender {
	tb.Helper()
	table := "`" + name("ttl_row") + "`"
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS ` + table + ` (
	` + "`key`" + ` VARBINARY(255) PRIMARY KEY,
	owner     VARBINARY(64) NOT NULL,
	expire_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`); err != nil {
		tb.Fatalf("create TTL-row table: %v", err)
	}
	// The owner is assigned first, from the row's old expiry; then the
	// expiry. 1 row affected: inserted; 2: taken over; 0: busy.
	acquire := `INSERT INTO ` + table + " (`key`, owner, expire_at) VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND)" + `
ON DUPLICATE KEY UPDATE owner = IF(expire_at < NOW(6), VALUES(owner), owner),
	expire_at = IF(owner = VALUES(owner), VALUES(expire_at), expire_at)`
	release := `DELETE FROM ` + table + " WHERE `key` = ? AND owner = ?"
	extend := `UPDATE ` + table + " SET expire_at = NOW(6) + INTERVAL ? MICROSECOND WHERE `key` = ? AND owner = ?"
	take := func(ctx context.Context, key string, ttl time.Duration) (string, error) {
		owner := rand.Text()
		res, err := db.ExecContext(ctx, acquire, key, owner, ttl.Microseconds())
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1213 {
			// InnoDB's deadlock between concurrent upserts of one key
			// (their next-key locks): the other one won.
			return "", errBusy
		}
		if err != nil {
			return "", err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return "", errBusy
		}
		return owner, nil
	}
	return ttlRowContender(take,
		func(ctx context.Context, key, owner string) error {
			_, err := db.ExecContext(ctx, release, key, owner)
			return err
		},
		func(ctx context.Context, key, owner string, ttl time.Duration) (int64, error) {
			res, err := db.ExecContext(ctx, extend, ttl.Microseconds(), key, owner)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		})
}

// ---- GET_LOCK / RELEASE_LOCK on a pinned connection ----

// getLockName is key as a GET_LOCK name (at most 64 characters).
func getLockName(key string) string {
	if len(key) <= 64 {
		return key
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return fmt.Sprintf("%s%016x", key[:48], h.Sum64())
}

func getLockContender(db *sql.DB) *contender {
	take := func(ctx context.Context, key string, timeout int) (unlockFunc, error) {
		lock := getLockName(key)
		return connLock(ctx, db.Conn, func(conn *sql.Conn) { conn.Close() },
			func(conn *sql.Conn) (bool, error) {
				var ok sql.NullInt64
				err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lock, timeout).Scan(&ok)
				return ok.Int64 == 1, err
			},
			func(ctx context.Context, conn *sql.Conn) error {
				var released sql.NullInt64
				if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", lock).Scan(&released); err != nil {
					return err
				}
				if released.Int64 != 1 {
					return fmt.Errorf("GET_LOCK %q was not held", strings.TrimSpace(lock))
				}
				return nil
			})
	}
	return &contender{
		try:  func(ctx context.Context, key string) (unlockFunc, error) { return take(ctx, key, 0) },
		wait: func(ctx context.Context, key string) (unlockFunc, error) { return take(ctx, key, 60) },
	}
}
