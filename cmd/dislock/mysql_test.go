package main

import (
	"context"
	"testing"

	"github.com/dislock/dislock/internal/mysqltest"
)

func mysqlFixture(t *testing.T) *fixture {
	u, db := mysqltest.DB(t)
	// A table named by LOCK_TABLE must exist: the CLI creates only the
	// default one.
	table := mysqltest.Table(t, db, "dislock_cli_")
	ctx := context.Background()
	q := "`" + table + "`"
	return &fixture{
		name: "mysql", url: u, env: []string{"LOCK_TABLE=" + table},
		held: func(t *testing.T, key string) bool {
			var n int
			err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+q+" WHERE `key` = ? AND holder <> '' AND expire_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))", key).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
		steal: func(t *testing.T, key string) {
			res, err := db.ExecContext(ctx, "UPDATE "+q+" SET holder = 'thief', owner = 'thief' WHERE `key` = ?", key)
			n := int64(-1)
			if err == nil {
				n, _ = res.RowsAffected()
			}
			if err != nil || n != 1 {
				t.Fatalf("steal %s: %v (%d rows)", key, err, n)
			}
		},
	}
}
