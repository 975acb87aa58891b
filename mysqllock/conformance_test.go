package mysqllock_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/mysqllock"
)

// harness runs the conformance suite on a fresh table; opts configure every
// Backend.
func harness(admin *sql.DB, table string, opts ...mysqllock.Option) locktest.Harness {
	q := "`" + table + "`"
	return locktest.Harness{
		NewBackend: func(tb testing.TB) core.Backend {
			return newBackend(tb, table, opts...)
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
	admin := newDB(t)
	table := newTable(t, admin)
	locktest.Run(t, harness(admin, table))
}

// TestConformanceWithoutListen runs the suite with waiters that poll.
func TestConformanceWithoutListen(t *testing.T) {
	admin := newDB(t)
	table := newTable(t, admin)
	h := harness(admin, table, mysqllock.WithoutListen())
	h.NoWatch = true
	locktest.Run(t, h)
}
