package mysqllock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ctxT returns a context bounded for one test step.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testDSN is the test server's DSN (DISLOCK_TEST_MYSQL or the default).
func testDSN(t testing.TB) string {
	t.Helper()
	return testenv.MySQL(t)
}

// newDB returns a small pool on the test server, closed at cleanup.
func newDB(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := mysqllock.ParseDSN(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(6)
	t.Cleanup(func() { db.Close() })
	return db
}

// newTable migrates a fresh lock table, dropped (with its companions and
// procedures) at cleanup, and returns its name as given to WithTable.
func newTable(t testing.TB, admin *sql.DB) string {
	t.Helper()
	name := testenv.Name("dislock_test_")
	dropAtCleanup(t, admin, name)
	if err := mysqllock.Migrate(ctxT(t), admin, mysqllock.WithTable(name)); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return name
}

func dropAtCleanup(t testing.TB, admin *sql.DB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, p := range mysqllock.ProcNames {
			if _, err := admin.ExecContext(ctx, "DROP PROCEDURE IF EXISTS `"+name+"_"+p+"`"); err != nil {
				t.Errorf("drop procedure: %v", err)
			}
		}
		if _, err := admin.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`, `"+name+"_permits`, `"+name+"_waiters`, `"+name+"_turns`, `"+name+"_watchers`"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
}

// newBackend returns a Backend on its own pool (a separate process).
func newBackend(t testing.TB, table string, opts ...mysqllock.Option) *mysqllock.Backend {
	t.Helper()
	b, err := mysqllock.NewBackend(ctxT(t), newDB(t), append([]mysqllock.Option{mysqllock.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newClient(t testing.TB, b core.Backend, opts ...core.ClientOption) *core.Client {
	t.Helper()
	c, err := core.New(b, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
