package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

// openMySQL opens a pool and a Locker on the lock table of a mysql:// (or
// mariadb://) URL. The table rule is PostgreSQL's: a missing table (with
// its companion tables and procedures) is created only by a run, and only
// when it is the default table or --create-table says so.
func openMySQL(ctx context.Context, urlEnv, rawURL, table string, use tableUse, copts []core.ClientOption, log *slog.Logger) (locker, func() error, error) {
	if noHost(rawURL) {
		// The driver would fall back to 127.0.0.1:3306.
		return nil, nil, badURL(urlEnv, "the MySQL URL names no host (mysql://[user[:password]@]host[:port]/db)")
	}
	mc, err := mysqllock.ParseDSN(rawURL)
	if err != nil {
		// ParseDSN's errors never quote the URL.
		return nil, nil, badURL(urlEnv, "the MySQL URL cannot be parsed (mysql://[user[:password]@]host[:port]/db[?param=value…], the parameters go-sql-driver/mysql's)")
	}
	name := mysqllock.DefaultTable
	var opts []mysqllock.Option
	if table != "" {
		name = table
		opts = append(opts, mysqllock.WithTable(table))
	}
	if _, err := mysqllock.SchemaSQL(name); err != nil {
		return nil, nil, badSetting(specTable, "%v", err)
	}
	if mc.DBName == "" && !strings.Contains(name, ".") {
		return nil, nil, badURL(urlEnv, "the MySQL URL names no database (mysql://…/db), and %s no db.table", specTable.env)
	}
	// The driver logs some connection problems on its own: send them
	// through the redacting logger.
	mc.Logger = mysqlLogger{log}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, nil, badURL(urlEnv, "the MySQL URL cannot be used: %s", parseReason(err))
	}
	db := sql.OpenDB(conn)
	b, err := mysqlTable(ctx, db, name, table != "", use, opts)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	c, err := core.New(b, copts...)
	if err != nil {
		b.Close()
	}
	return onClient(c, err, db.Close)
}

// mysqlTable returns a Backend on the table name (opts name it when named
// is set), creating what is missing when use allows it, as openTable does
// on PostgreSQL.
func mysqlTable(ctx context.Context, db *sql.DB, name string, named bool, use tableUse, opts []mysqllock.Option) (*mysqllock.Backend, error) {
	schema, tbl, dotted := strings.Cut(name, ".")
	quoted := "`" + name + "`"
	if !dotted {
		schema, tbl = "", name
	} else {
		quoted = "`" + schema + "`.`" + tbl + "`"
	}
	// The names passed SchemaSQL's check (ASCII letters, digits, '_' and
	// '$'): they are written into the statement as literals, which
	// go-sql-driver then sends as a plain query instead of preparing it on
	// the server (as mysqllock reads the catalogue).
	inSchema := "DATABASE()"
	if dotted {
		inSchema = "'" + schema + "'"
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = `+inSchema+` AND TABLE_NAME = '`+tbl+`'`).Scan(&n); err != nil {
		return nil, fmt.Errorf("mysql: look up table %s: %w", quoted, err)
	}
	create := fmt.Sprintf("let dislock create it with %s=1 (--%s)", specCreate.env, specCreate.flag)
	mayCreate := use == tableCreate || use == tableRun && !named
	if n == 0 {
		switch {
		case use == tableAdmin && !named:
			return nil, errNoTable
		case use == tableAdmin:
			return nil, usagef("the lock table %s does not exist (no run has used it yet, or %s names another table); status, list and release create nothing",
				quoted, specTable.name())
		case !mayCreate:
			return nil, badSetting(specTable, "the table %s does not exist; create it, its companion tables and its procedures with the statements of mysqllock.SchemaSQL (CREATE TABLE …, CREATE PROCEDURE …) or mysqllock.Migrate; or %s",
				quoted, create)
		}
		return mysqllock.NewBackend(ctx, db, append(opts, mysqllock.WithAutoMigrate())...)
	}
	b, err := mysqllock.NewBackend(ctx, db, opts...)
	switch {
	case !errors.Is(err, mysqllock.ErrSchema):
		return b, err
	case mayCreate:
		// A companion table or procedure is missing or of another
		// version: Migrate creates or replaces only those.
		return mysqllock.NewBackend(ctx, db, append(opts, mysqllock.WithAutoMigrate())...)
	case use == tableAdmin:
		return nil, badSetting(specTable, "%v", err)
	}
	return nil, badSetting(specTable, "%v; or %s", err, strings.Replace(create, " it ", " what is missing ", 1))
}

// mysqlLogger passes go-sql-driver's log lines to slog at debug level; the
// errors that matter reach the user through the calls that failed.
type mysqlLogger struct{ log *slog.Logger }

func (l mysqlLogger) Print(v ...any) {
	msg := strings.TrimSpace(fmt.Sprint(v...))
	driverSaid.Store(msg)
	l.log.Debug("mysql: " + msg)
}
