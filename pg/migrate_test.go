package pg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
)

// Rule: on an empty database, the error names pg.Migrate as the fix, and
// the package-level pg.Migrate (which needs no Backend, since NewBackend
// refuses a missing table) creates what New then uses, semaphores included.
func TestPackageMigrate(t *testing.T) {
	admin := newPool(t, nil)
	ctx := ctxT(t)
	name := testenv.Name("dislock_mig_")
	dropAtCleanup(t, admin, pgx.Identifier{name})

	_, err := pg.New(ctx, admin, pg.WithTable(name))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "pg.Migrate(ctx, pool)") {
		t.Fatalf("New on a missing table = %v, want ErrSchema naming pg.Migrate(ctx, pool)", err)
	}
	if err := pg.Migrate(ctx, admin, pg.WithTable(name)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	// Again: it is idempotent.
	if err := pg.Migrate(ctx, admin, pg.WithTable(name)); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	l, err := pg.New(ctx, admin, pg.WithTable(name))
	if err != nil {
		t.Fatalf("New after Migrate: %v", err)
	}
	defer l.Close()
	s, err := l.TryAcquire(ctx, "k", core.Limit(2))
	if err != nil {
		t.Fatalf("a semaphore permit on the migrated table: %v", err)
	}
	_ = s.Release(ctx)

	if err := pg.Migrate(ctx, nil); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("Migrate(nil pool) = %v, want ErrInvalidOption", err)
	}
	if err := pg.Migrate(ctx, admin, pg.WithTable("")); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithTable") {
		t.Errorf("Migrate(WithTable(\"\")) = %v, want ErrInvalidOption naming WithTable", err)
	}
}
