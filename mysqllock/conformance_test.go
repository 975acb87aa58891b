package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/mysqllock"
)

// harness runs the conformance suite on a fresh table; opts configure every
// Backend. Every other Backend is on a pool of mysqllock.Connector (as
// Open's), the others on the driver's own, so that each rule with more than
// one process runs on both; a stalled store is one of Connector's, whose
// cut of a statement at its ctx's end those rules check
// (TestStatementEndsWithContext checks the driver's own beside it).
func harness(admin *sql.DB, table string, opts ...mysqllock.Option) locktest.Harness {
	q := "`" + table + "`"
	var n atomic.Int64
	return locktest.Harness{
		// Every write is a durable commit (an fsync: MySQL has no
		// per-transaction relaxation, unlike pg's releases), in a
		// procedure of about ten statements; on the shared test machine
		// under load a reply took 430ms, past the default 600ms TTL's
		// renew deadline. TTL/3 stays above such a round trip.
		TTL: time.Second,
		NewBackend: func(tb testing.TB) core.Backend {
			if n.Add(1)%2 == 0 {
				db := mysqltest.ConnectorDB(tb)
				db.SetMaxOpenConns(6)
				db.SetMaxIdleConns(6)
				return backendOn(tb, db, table, opts...)
			}
			return newBackend(tb, table, opts...)
		},
		Stall: func(tb testing.TB) (core.Backend, func(), func()) {
			db, p := mysqltest.StalledDB(tb)
			return backendOn(tb, db, table, opts...), p.Stall, p.Resume
		},
		Steal: func(ctx context.Context, key string) error {
			_, err := admin.ExecContext(ctx, `UPDATE `+q+` SET owner = 'thief', holder = 'stolen', token = token + 1
WHERE `+"`key`"+` = ? AND expire_at > `+"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))", []byte(key))
			return err
		},
		Delete: func(ctx context.Context, key string) error {
			if _, err := admin.ExecContext(ctx, "DELETE FROM `"+table+"_permits` WHERE `key` = ?", []byte(key)); err != nil {
				return err
			}
			_, err := admin.ExecContext(ctx, `DELETE FROM `+q+" WHERE `key` = ?", []byte(key))
			return err
		},
	}
}

func TestConformance(t *testing.T) {
	admin, table := adminAndTable(t)
	locktest.Run(t, harness(admin, table))
}

// Rule: under WithoutListen a Backend has no watcher (the engine's waiters
// poll; the suite's rules for polling waiters run on every backend): it
// holds no connection for one.
func TestWithoutListenHasNoWatcher(t *testing.T) {
	table := freshTable(t)
	b := newBackend(t, table, mysqllock.WithoutListen())
	err := b.WatchTurns(ctxT(t), func() { t.Error("ready called") }, func(string, string) {})
	if !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("WatchTurns under WithoutListen = %v, want core.ErrUnsupported", err)
	}
}
