package chaos

import (
	"context"
	"database/sql"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

const (
	defaultMySQL = "mysql://root@127.0.0.1:3306/test"
	mysqlTable   = "dislock_chaos_locks"
)

// mysqlTarget is the MySQL server a run uses: a private mariadbd with the
// sentinel as root's password when the binaries are there (always under
// CI=true), else the shared test server (DISLOCK_TEST_MYSQL; no restart
// fault).
type mysqlTarget struct {
	srv *mysqlServer
	cfg *mysql.Config
}

func newMySQLTarget(t *testing.T) *mysqlTarget {
	t.Helper()
	if srv := startMySQLServer(t, false); srv != nil {
		return &mysqlTarget{srv: srv, cfg: srv.config(sentinelPW)}
	}
	raw, set := os.LookupEnv("DISLOCK_TEST_MYSQL")
	if set && raw == "" {
		t.Skip("DISLOCK_TEST_MYSQL is set empty: MySQL is not tested")
	}
	if !set {
		raw = defaultMySQL
	}
	cfg, err := mysqllock.ParseDSN(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := loopback(cfg.Addr); err != nil {
		t.Fatal("DISLOCK_TEST_MYSQL: the chaos suite only runs against loopback servers")
	}
	cfg.Timeout = time.Second
	return &mysqlTarget{cfg: cfg}
}

// direct is a pool on the server, not through the proxy.
func (mt *mysqlTarget) direct(t testing.TB) *sql.DB {
	conn, err := mysql.NewConnector(mt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(8)
	return db
}

// proxiedDSN is the server's DSN through the proxy at addr.
func (mt *mysqlTarget) proxiedDSN(addr string) string {
	c := mt.cfg.Clone()
	c.Addr = addr
	return c.FormatDSN()
}

// inList is "(?, ?, …)" for n values.
func inList(n int) string { return "(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")" }

// mysqlDeleteLocks deletes the rows of keys from the lock table (and, for a
// semaphore, its permits, after the header rows) in one transaction, and
// returns the tokens of the rows it removed, read under their row locks
// (MySQL has no DELETE … RETURNING).
func mysqlDeleteLocks(ctx context.Context, db *sql.DB, table string, keys []string, limit int) (map[string][]uint64, error) {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	where := " WHERE `key` IN " + inList(len(keys))
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	from := table
	if limit > 1 {
		// A semaphore: its header rows (whose lock every claim of a permit
		// takes), then its permits, whose tokens are the permits' own.
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+table+where, args...); err != nil {
			return nil, err
		}
		from = table + "_permits"
	}
	rows, err := tx.QueryContext(ctx, "SELECT `key`, token FROM "+from+where+" FOR UPDATE", args...)
	if err != nil {
		return nil, err
	}
	removed := map[string][]uint64{}
	if err := eachToken(rows, func(k string, tok uint64) { removed[k] = append(removed[k], tok) }); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+from+where, args...); err != nil {
		return nil, err
	}
	return removed, tx.Commit()
}

func mysqlSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	mt := newMySQLTarget(t)
	px := addProxy(t, h, "mysql", mt.cfg.Addr)
	ctx := context.Background()
	direct := mt.direct(t)
	admin, err := mysqllock.New(ctx, direct, mysqllock.WithTable(mysqlTable), mysqllock.WithAutoMigrate())
	if err != nil {
		direct.Close()
		t.Fatalf("lock table: %v", err)
	}
	dsn := mt.proxiedDSN(px.Addr())
	env := &backendEnv{name: "mysql", proxy: px, admin: admin, keyPrefix: prefix}
	closeReg := withRegister(t, env, keys)
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		l, err := mysqllock.Open(ctx, dsn, mysqllock.WithTable(mysqlTable), mysqllock.WithClientOptions(opts...))
		if err != nil {
			return nil, nil, err
		}
		return l, l.Close, nil
	}
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		sent := time.Now()
		removed, err := mysqlDeleteLocks(ctx, direct, mysqlTable, keys, env.limit)
		if err != nil {
			return nil, err
		}
		return removals(keys, sent, removed), nil
	}
	probeCfg := mt.cfg.Clone()
	probeCfg.Addr = px.Addr()
	env.probe = func(ctx context.Context) error {
		conn, err := mysql.NewConnector(probeCfg)
		if err != nil {
			return err
		}
		db := sql.OpenDB(conn)
		defer db.Close()
		_, err = db.ExecContext(ctx, "SELECT 1")
		return err
	}
	if mt.srv != nil {
		// Durable commits: a restart loses nothing, so it is no state loss.
		env.faults = append(env.faults, faultDef{name: "mysql-restart", run: func(ctx context.Context, rng *mrand.Rand) error {
			mt.srv.crash()
			sleepCtx(ctx, between(rng, 100*time.Millisecond, 800*time.Millisecond))
			if err := mt.srv.start(); err != nil {
				return fmt.Errorf("restart mariadbd: %w", err)
			}
			return nil
		}})
	}
	env.close = func() {
		_ = admin.Close()
		_ = direct.Close()
		closeReg()
	}
	return env
}
