package pg_test

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ctxT returns a context bounded for one test step.
func ctxT(t testing.TB) context.Context { return testenv.Context(t, 30*time.Second) }

// newPool returns a small pool on the test server, closed at cleanup. edit
// may change its config first.
func newPool(t testing.TB, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return openPool(t, testenv.PG(t), func(cfg *pgxpool.Config) {
		if throughPooler(t) {
			// The test server is a transaction pooler: no prepared
			// statements (edit may choose another mode that needs none).
			execMode(cfg)
		}
		if edit != nil {
			edit(cfg)
		}
	})
}

// openPool returns a pool of 4 connections on url, closed at cleanup. edit
// may change its config first.
func openPool(t testing.TB, url string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse the pool's URL: %v", err)
	}
	cfg.MaxConns = 4
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newTable creates a fresh lock table named after prefix, dropped at
// cleanup, and returns its name as given to pg.WithTable.
func newTable(t testing.TB, admin *pgxpool.Pool, opts ...pg.Option) string {
	t.Helper()
	// Dropped at cleanup even when its check fails.
	name := scratchTable(t, admin, "dislock_test_")
	opts = append([]pg.Option{pg.WithTable(name), pg.WithAutoMigrate()}, opts...)
	b, err := pg.NewBackend(ctxT(t), admin, opts...)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	_ = b.Close()
	return name
}

// freshTable is newTable on a pool of its own, for a test that needs no
// admin connection of its own.
func freshTable(t testing.TB, opts ...pg.Option) string {
	t.Helper()
	return newTable(t, newPool(t, nil), opts...)
}

// adminAndTable returns an admin pool and a fresh lock table (newTable) made
// on it.
func adminAndTable(t testing.TB, opts ...pg.Option) (*pgxpool.Pool, string) {
	t.Helper()
	admin := newPool(t, nil)
	return admin, newTable(t, admin, opts...)
}

// scratchTable returns a fresh table name that starts with prefix; a table
// of that name (and its permits table) is dropped at cleanup.
func scratchTable(t testing.TB, admin *pgxpool.Pool, prefix string) string {
	name := testenv.Name(prefix)
	dropAtCleanup(t, admin, pgx.Identifier{name})
	return name
}

// quoted is the SQL identifier of the table name.
func quoted(name string) string { return pgx.Identifier{name}.Sanitize() }

func dropAtCleanup(t testing.TB, admin *pgxpool.Pool, ident pgx.Identifier) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Migrate creates the table's permits table (semaphores) too.
		permits := append(pgx.Identifier(nil), ident...)
		permits[len(permits)-1] += "_permits"
		if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+ident.Sanitize()+", "+permits.Sanitize()); err != nil {
			t.Errorf("drop %s: %v", ident.Sanitize(), err)
		}
	})
}

// newBackend returns a Backend on its own pool (a separate process).
func newBackend(t testing.TB, table string, opts ...pg.Option) *pg.Backend {
	t.Helper()
	return backendOn(t, newPool(t, nil), table, opts...)
}

// queryMode is a pool config edit that sets the default query exec mode.
func queryMode(mode pgx.QueryExecMode) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }
}

// execMode is the pool config edit of the configuration documented behind
// PgBouncer in transaction mode: no prepared statements (exec mode; the
// simple protocol works too).
var execMode = queryMode(pgx.QueryExecModeExec)

// backendOn returns a Backend of table on pool, closed at cleanup.
func backendOn(t testing.TB, pool *pgxpool.Pool, table string, opts ...pg.Option) *pg.Backend {
	t.Helper()
	b, err := pg.NewBackend(ctxT(t), pool, append([]pg.Option{pg.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newClient(t testing.TB, b core.Backend, opts ...core.ClientOption) *core.Client {
	t.Helper()
	return testenv.Client(t, b, opts...)
}

func init() {
	if os.Getenv("DISLOCK_TEST_PG") == "" {
		os.Setenv("DISLOCK_TEST_PG", testenv.DefaultPG)
	}
}

// newBackendPool is newBackend with a pool config edit.
func newBackendPool(t testing.TB, table string, edit func(*pgxpool.Config), opts ...pg.Option) *pg.Backend {
	t.Helper()
	return backendOn(t, newPool(t, edit), table, opts...)
}

// loginRole creates a role that can log in to the test server with a
// password of its own, use the schema the tests' tables are made in (the
// URL's search_path) and has the privileges grants (each "<privileges> ON
// <table>"), dropped with what it owns at cleanup, and returns its name (an
// identifier that needs no quoting) and a pool that connects as it. The
// test is skipped when the URL's role may not create roles.
func loginRole(t testing.TB, admin *pgxpool.Pool, grants ...string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := ctxT(t)
	var may bool
	if err := admin.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&may); err != nil {
		t.Fatal(err)
	}
	if !may {
		t.Skip("DISLOCK_TEST_PG's role may not create roles (CREATEROLE); this test connects as a role of its own")
	}
	role := testenv.Name("dislock_role_")
	password := rand.Text()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD '`+password+`'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	if _, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO `+role+`', current_schema()); END $$`); err != nil {
		t.Fatal(err)
	}
	for _, g := range grants {
		if _, err := admin.Exec(ctx, `GRANT `+g+` TO `+role); err != nil {
			t.Fatal(err)
		}
	}
	return role, newPool(t, func(c *pgxpool.Config) { c.ConnConfig.User, c.ConnConfig.Password = role, password })
}
