package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// noFlushWait makes a conformance pool's sessions commit without waiting
// for the WAL flush (synchronous_commit = off), and then applies edits. The
// suite's rules are about leases, not about surviving a database crash
// (TestChaosPGCrash is): on a shared machine a commit's fsync at a
// checkpoint took over a second, longer than the suite's 600ms TTL leaves
// a renewal. Behind a transaction pooler the setting is left alone (a
// pooler refuses unknown startup parameters).
func noFlushWait(tb testing.TB, edits ...func(*pgxpool.Config)) func(*pgxpool.Config) {
	pooled := throughPooler(tb)
	return func(c *pgxpool.Config) {
		if !pooled {
			c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		}
		for _, edit := range edits {
			edit(c)
		}
	}
}

// harness runs the conformance suite on a fresh table; opts configure every
// Backend (exec mode, legacy table, async commit).
func harness(t *testing.T, admin *pgxpool.Pool, table string, opts ...pg.Option) locktest.Harness {
	ident := quoted(table)
	return locktest.Harness{
		// Behind a transaction pooler, LISTEN cannot work: waiters poll.
		NoWatch: throughPooler(t),
		NewBackend: func(tb testing.TB) core.Backend {
			return newBackendPool(tb, table, noFlushWait(tb), opts...)
		},
		Steal: func(ctx context.Context, key string) error {
			_, err := admin.Exec(ctx, `UPDATE `+ident+` SET owner = 'thief', holder = 'stolen',
				token = DEFAULT WHERE key = $1 AND expire_at > now()`, key)
			return err
		},
		Delete: func(ctx context.Context, key string) error {
			_, err := admin.Exec(ctx, `DELETE FROM `+ident+` WHERE key = $1`, key)
			return err
		},
	}
}

func TestConformance(t *testing.T) {
	admin, table := adminAndTable(t)
	locktest.Run(t, harness(t, admin, table))
}

// TestConformanceExecMode runs the suite with no prepared statements at all
// (QueryExecModeExec) and no notifications (WithoutNotify, WithoutListen),
// as behind PgBouncer in transaction mode: waiters poll.
func TestConformanceExecMode(t *testing.T) {
	admin, table := adminAndTable(t)
	h := harness(t, admin, table)
	h.NewBackend = func(tb testing.TB) core.Backend {
		return newBackendPool(tb, table, noFlushWait(tb, queryMode(pgx.QueryExecModeExec)), pg.WithoutNotify(), pg.WithoutListen())
	}
	h.NoWatch = true
	locktest.Run(t, h)
}

// TestConformanceSimpleProtocolAsync runs the suite over the simple query
// protocol with asynchronous commit.
func TestConformanceSimpleProtocolAsync(t *testing.T) {
	admin, table := adminAndTable(t)
	h := harness(t, admin, table)
	h.NewBackend = func(tb testing.TB) core.Backend {
		return newBackendPool(tb, table, noFlushWait(tb, queryMode(pgx.QueryExecModeSimpleProtocol)), pg.WithAsyncCommit())
	}
	locktest.Run(t, h)
}

// TestConformanceLegacy runs the suite on the 3-column key_value table of
// the older tool: everything but fencing tokens and the waiter queue (the
// table has no column for it; its Backend grants a free key to whoever
// comes and notifies every release), so the suite sees no Queuer.
func TestConformanceLegacy(t *testing.T) {
	admin, table := adminAndTable(t, pg.WithLegacyTable())
	ident := quoted(table)
	h := harness(t, admin, table, pg.WithLegacyTable())
	h.NewBackend = func(tb testing.TB) core.Backend {
		return noQueue{newBackendPool(tb, table, noFlushWait(tb), pg.WithLegacyTable())}
	}
	h.NoFencing = true
	h.Steal = func(ctx context.Context, key string) error {
		_, err := admin.Exec(ctx, `UPDATE `+ident+` SET value = 'stolen' WHERE key = $1 AND expire_at > now()`, key)
		return err
	}
	locktest.Run(t, h)
}

// noQueue is a Backend without its core.Queuer methods (Watch, Admin and
// ClaimBounder kept): the legacy table's Backend as the suite should see it.
type noQueue struct{ b *pg.Backend }

func (n noQueue) Name() string { return n.b.Name() }
func (n noQueue) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	return n.b.TryAcquire(ctx, req)
}
func (n noQueue) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	return n.b.Renew(ctx, reqs)
}
func (n noQueue) Release(ctx context.Context, req core.ReleaseRequest) error {
	return n.b.Release(ctx, req)
}
func (n noQueue) Now(ctx context.Context, key string) (time.Time, error) { return n.b.Now(ctx, key) }
func (n noQueue) Close() error                                           { return n.b.Close() }
func (n noQueue) Watch(ctx context.Context, ready func(), fn func(string)) error {
	return n.b.Watch(ctx, ready, fn)
}
func (n noQueue) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	return n.b.Inspect(ctx, key)
}
func (n noQueue) List(ctx context.Context, prefix string) ([]core.Info, error) {
	return n.b.List(ctx, prefix)
}
func (n noQueue) ForceRelease(ctx context.Context, key string) (bool, error) {
	return n.b.ForceRelease(ctx, key)
}
func (n noQueue) ClaimBound() time.Duration { return n.b.ClaimBound() }
