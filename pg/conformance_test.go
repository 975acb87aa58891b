package pg_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
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
		Stall: func(tb testing.TB) (core.Backend, func(), func()) {
			var p *testenv.StallProxy
			b := newBackendPool(tb, table, noFlushWait(tb, func(c *pgxpool.Config) {
				p = viaStallProxy(tb, c.ConnConfig)
			}), opts...)
			return b, p.Stall, p.Resume
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

// viaStallProxy points cc, and its fallbacks, at a testenv.StallProxy in
// front of its server, and returns the proxy.
func viaStallProxy(tb testing.TB, cc *pgx.ConnConfig) *testenv.StallProxy {
	network, addr := "tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	if strings.HasPrefix(cc.Host, "/") { // a Unix socket's directory
		network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cc.Host, cc.Port)
	}
	p := testenv.NewStallProxy(tb, network, addr)
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		tb.Fatal(err)
	}
	cc.Host, cc.Port = host, uint16(n)
	for _, f := range cc.Fallbacks {
		f.Host, f.Port = host, uint16(n)
	}
	return p
}

// A Backend counts on its pool to end calls with their ctx (EndsWithContext,
// which the rule CallsEndWithContext checks) only when the pool's context
// watcher cuts a connection at once.
func TestEndsWithContextFollowsThePoolsWatcher(t *testing.T) {
	_, table := adminAndTable(t)
	for _, c := range []struct {
		name  string
		delay time.Duration // of a CancelRequestContextWatcherHandler's deadline; < 0: pgx's default watcher
		want  bool
	}{
		{"default", -1, true},
		{"cancel request, deadline at once", 0, true},
		{"cancel request, deadline after 5s", 5 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBackendPool(t, table, func(cfg *pgxpool.Config) {
				if c.delay >= 0 {
					cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
						return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: c.delay}
					}
				}
			})
			if got := b.EndsWithContext(); got != c.want {
				t.Errorf("EndsWithContext() = %v, want %v", got, c.want)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	t.Parallel() // each suite has its own table; the suites mostly wait on timers
	admin, table := adminAndTable(t)
	locktest.Run(t, harness(t, admin, table))
}

// TestConformanceExecMode runs the suite with no prepared statements at all
// (QueryExecModeExec) and no notifications (WithoutNotify, WithoutListen),
// as behind PgBouncer in transaction mode: waiters poll.
func TestConformanceExecMode(t *testing.T) {
	t.Parallel() // each suite has its own table; the suites mostly wait on timers
	admin, table := adminAndTable(t)
	h := harness(t, admin, table)
	h.NewBackend = func(tb testing.TB) core.Backend {
		return newBackendPool(tb, table, noFlushWait(tb, execMode), pg.WithoutNotify(), pg.WithoutListen())
	}
	h.NoWatch = true
	locktest.Run(t, h)
}

// TestConformanceSimpleProtocolAsync runs the suite over the simple query
// protocol with asynchronous commit.
func TestConformanceSimpleProtocolAsync(t *testing.T) {
	t.Parallel() // each suite has its own table; the suites mostly wait on timers
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
// comes and notifies every release with the bare key, and says it keeps no
// queue, so that the engine runs it as a core.Watcher and the Queue rules
// are skipped).
func TestConformanceLegacy(t *testing.T) {
	t.Parallel() // each suite has its own table; the suites mostly wait on timers
	admin, table := adminAndTable(t, pg.WithLegacyTable())
	ident := quoted(table)
	h := harness(t, admin, table, pg.WithLegacyTable())
	h.NoFencing = true
	h.Steal = func(ctx context.Context, key string) error {
		_, err := admin.Exec(ctx, `UPDATE `+ident+` SET value = 'stolen' WHERE key = $1 AND expire_at > now()`, key)
		return err
	}
	locktest.Run(t, h)
}
