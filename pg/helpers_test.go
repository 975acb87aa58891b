package pg_test

import (
	"context"
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
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newPool returns a small pool on the test server, closed at cleanup. edit
// may change its config first.
func newPool(t testing.TB, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PG(t))
	if err != nil {
		t.Fatalf("parse test URL: %v", err)
	}
	cfg.MaxConns = 4
	if throughPooler(t) {
		// The test server is a transaction pooler: no prepared
		// statements (edit may choose another mode that needs none).
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
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
	name := testenv.Name("dislock_test_")
	opts = append([]pg.Option{pg.WithTable(name), pg.WithAutoMigrate()}, opts...)
	// Registered first, so that a table whose check fails is dropped too.
	dropAtCleanup(t, admin, pgx.Identifier{name})
	b, err := pg.NewBackend(ctxT(t), admin, opts...)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	_ = b.Close()
	return name
}

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
	pool := newPool(t, nil)
	b, err := pg.NewBackend(ctxT(t), pool, append([]pg.Option{pg.WithTable(table)}, opts...)...)
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

func init() {
	if os.Getenv("DISLOCK_TEST_PG") == "" {
		os.Setenv("DISLOCK_TEST_PG", testenv.DefaultPG)
	}
}

// newBackendPool is newBackend with a pool config edit.
func newBackendPool(t testing.TB, table string, edit func(*pgxpool.Config), opts ...pg.Option) *pg.Backend {
	t.Helper()
	pool := newPool(t, edit)
	b, err := pg.NewBackend(ctxT(t), pool, append([]pg.Option{pg.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
