package main

import (
	"context"
	"net/url"
	"testing"

	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
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

// mysqlDatabaseFixture returns a fixture on a database of its own (dropped
// at the end), without any lock table, and a function that reports whether
// a table exists there.
func mysqlDatabaseFixture(t *testing.T, prefix string) (*fixture, func(name string) bool) {
	u, db := mysqltest.DB(t)
	mc, err := mysqllock.ParseDSN(u)
	if err != nil {
		t.Fatal(err)
	}
	if mc.Net != "tcp" {
		t.Skip("DISLOCK_TEST_MYSQL is not a TCP address: the CLI takes mysql:// URLs")
	}
	ctx := context.Background()
	name := testenv.Name(prefix)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`") })
	dbURL := url.URL{Scheme: "mysql", User: url.UserPassword(mc.User, mc.Passwd), Host: mc.Addr, Path: "/" + name}
	if mc.Passwd == "" {
		dbURL.User = url.User(mc.User)
	}
	return &fixture{name: "mysql", url: dbURL.String()}, func(table string) bool {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", name, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
}
