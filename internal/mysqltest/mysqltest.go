// Package mysqltest opens the MySQL / MariaDB server of the tests
// (internal/testenv's DISLOCK_TEST_MYSQL) and removes the lock tables the
// tests make there, for the packages and modules whose tests run on
// mysqllock beside the other backends.
package mysqltest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// DB returns the test server's URL (or DSN) and a pool on it, closed when
// the test ends. It skips the test (fails it under CI) as testenv.MySQL does.
func DB(t testing.TB) (string, *sql.DB) {
	t.Helper()
	u := testenv.MySQL(t)
	return u, open(t, parse(t, u))
}

// ConnectorDB is DB's pool made with mysqllock.Connector, as
// mysqllock.Open makes its own: its statements end with their ctx by a
// cut of their socket instead of the driver's watcher goroutine.
func ConnectorDB(t testing.TB) *sql.DB {
	t.Helper()
	return OpenWith(t, parse(t, testenv.MySQL(t)), mysqllock.Connector)
}

// StalledDB is ConnectorDB's pool through a testenv.StallProxy, which it
// also returns.
func StalledDB(t testing.TB) (*sql.DB, *testenv.StallProxy) {
	t.Helper()
	mc := parse(t, testenv.MySQL(t))
	p := testenv.NewStallProxy(t, mc.Net, mc.Addr)
	mc.Net, mc.Addr = "tcp", p.Addr()
	return OpenWith(t, mc, mysqllock.Connector), p
}

func parse(t testing.TB, u string) *mysql.Config {
	t.Helper()
	mc, err := mysqllock.ParseDSN(u)
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// open returns a pool on mc, closed when the test ends.
func open(t testing.TB, mc *mysql.Config) *sql.DB {
	t.Helper()
	return OpenWith(t, mc, nil)
}

// OpenWith returns a pool on mc from connector (the driver's own when
// nil), closed when the test ends.
func OpenWith(t testing.TB, mc *mysql.Config, connector func(*mysql.Config) (driver.Connector, error)) *sql.DB {
	t.Helper()
	if connector == nil {
		connector = mysql.NewConnector
	}
	conn, err := connector(mc)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// Table returns a new lock table's name, created by mysqllock.Migrate on db
// and dropped, with its companion tables and procedures, when the test
// ends.
func Table(t testing.TB, db *sql.DB, prefix string) string {
	t.Helper()
	name := testenv.Name(prefix)
	DropAtCleanup(t, db, name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := mysqllock.Migrate(ctx, db, mysqllock.WithTable(name)); err != nil {
		t.Fatalf("create lock table %s: %v", name, err)
	}
	return name
}

// DropAtCleanup drops the lock table name of db's database, its companion
// tables and its procedures (whoever made them) when the test ends.
func DropAtCleanup(t testing.TB, db *sql.DB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if !plainName(name) {
			t.Errorf("drop lock table %q: not a plain name", name)
			return
		}
		// The name is written into the statement, not sent as an
		// argument: go-sql-driver sends it as a plain query instead of a
		// server-side prepared statement (see mysqllock's catalogue reads).
		procs, err := Names(ctx, db, `SELECT ROUTINE_NAME FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME LIKE '`+name+`\_%'`)
		if err != nil {
			t.Errorf("drop lock table %s: %v", name, err)
			return
		}
		for _, p := range procs {
			if _, err := db.ExecContext(ctx, "DROP PROCEDURE IF EXISTS `"+p+"`"); err != nil {
				t.Errorf("drop procedure %s: %v", p, err)
			}
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`, `"+name+"_permits`, `"+name+"_waiters`, `"+name+"_turns`, `"+name+"_watchers`"); err != nil {
			t.Errorf("drop lock table %s: %v", name, err)
		}
	})
}

// plainName reports whether name holds only ASCII letters, digits, '_'
// and '$' (what mysqllock.WithTable accepts): nothing to escape in a
// literal.
func plainName(name string) bool {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '$') {
			return false
		}
	}
	return name != ""
}

// Names returns the first column of the rows that query q with args
// selects on db: the names of the tables or procedures to drop.
func Names(ctx context.Context, db *sql.DB, q string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	return names, rows.Err()
}
