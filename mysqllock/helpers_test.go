package mysqllock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ctxT returns a context bounded for one test step.
func ctxT(t testing.TB) context.Context { return testenv.Context(t, 30*time.Second) }

// testDSN is the test server's DSN (DISLOCK_TEST_MYSQL or the default).
func testDSN(t testing.TB) string {
	t.Helper()
	return testenv.MySQL(t)
}

// newDB returns a small pool on the test server, closed at cleanup.
func newDB(t testing.TB) *sql.DB {
	t.Helper()
	_, db := mysqltest.DB(t)
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(6)
	return db
}

// newTable migrates a fresh lock table, dropped (with its companions and
// procedures) at cleanup, and returns its name as given to WithTable.
func newTable(t testing.TB, admin *sql.DB) string {
	t.Helper()
	return mysqltest.Table(t, admin, "dislock_test_")
}

// freshTable is newTable on a pool of its own, for a test that needs no
// admin connection of its own.
func freshTable(t testing.TB) string {
	t.Helper()
	return newTable(t, newDB(t))
}

// adminAndTable returns an admin pool and a fresh lock table (newTable) made
// on it.
func adminAndTable(t testing.TB) (*sql.DB, string) {
	t.Helper()
	admin := newDB(t)
	return admin, newTable(t, admin)
}

// lockRow locks the row of key in table FOR UPDATE, in a transaction of
// admin that the caller ends.
func lockRow(t testing.TB, admin *sql.DB, table, key string) *sql.Tx {
	t.Helper()
	ctx := ctxT(t)
	tx, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT 1 FROM `"+table+"` WHERE `key` = ? FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// newBackend returns a Backend on its own pool (a separate process).
func newBackend(t testing.TB, table string, opts ...mysqllock.Option) *mysqllock.Backend {
	t.Helper()
	return backendOn(t, newDB(t), table, opts...)
}

// backendOn returns a Backend on db and table, closed when the test ends.
func backendOn(t testing.TB, db *sql.DB, table string, opts ...mysqllock.Option) *mysqllock.Backend {
	t.Helper()
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(6)
	b, err := mysqllock.NewBackend(ctxT(t), db, append([]mysqllock.Option{mysqllock.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// sessionStatus returns the counter name of SHOW SESSION STATUS on db (a
// pool of one connection, so that the session is that of its calls).
func sessionStatus(t testing.TB, db *sql.DB, name string) int64 {
	t.Helper()
	var got string
	var n int64
	if err := db.QueryRowContext(ctxT(t), "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&got, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
