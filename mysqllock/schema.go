package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// ErrSchema is matched (errors.Is) by the errors NewBackend returns when the
// lock table, one of its companion tables or one of its procedures is
// missing, has the wrong shape or is of another version. The message names
// the table and the fix; it never holds the DSN.
var ErrSchema = errors.New("mysqllock: lock table unusable")

// names are the quoted names of a lock table's objects.
type names struct {
	schema, base                   string // unquoted, as configured
	table, permits, waiters, turns string // quoted
	watchers                       string // quoted
}

func quote(s string) string { return "`" + s + "`" }

func newNames(schema, table string) names {
	q := func(t string) string {
		if schema == "" {
			return quote(t)
		}
		return quote(schema) + "." + quote(t)
	}
	return names{
		schema: schema, base: table,
		table: q(table), permits: q(table + "_permits"), waiters: q(table + "_waiters"), turns: q(table + "_turns"),
		watchers: q(table + "_watchers"),
	}
}

// The reads of the catalogue (information_schema) below take no
// arguments: the names they look for are written into the statement as
// literals, so that go-sql-driver sends them as plain queries (the text
// protocol) instead of preparing them on the server. MariaDB 10.11 was
// seen to crash (SIGSEGV in ha_maria::drop_table, freeing the statement's
// temporary table) while executing the prepared form of the read of
// information_schema.ROUTINES under concurrent DDL, kills and disconnects.

// lit returns s as a string literal. s is a name WithTable accepted, with
// a suffix of this package: ASCII letters, digits, '_' and '$' only, which
// need no escaping in any sql_mode; lit panics on anything else.
func lit(s string) string {
	if err := checkIdent(s, 64); err != "" {
		panic("mysqllock: unchecked name in a statement: " + err)
	}
	return "'" + s + "'"
}

// schemaExpr is the database of the table in a statement: the literal of
// the configured one, or DATABASE(), the connection's.
func (n names) schemaExpr() string {
	if n.schema == "" {
		return "DATABASE()"
	}
	return lit(n.schema)
}

// proc returns the quoted name of the table's procedure name.
func (n names) proc(name string) string {
	if n.schema == "" {
		return quote(n.base + "_" + name)
	}
	return quote(n.schema) + "." + quote(n.base+"_"+name)
}

// Layout. Times are microseconds since the Unix epoch on the server's clock;
// keys, owner tokens and waiter ids are compared byte for byte.
//
//   - The lock table has one row per key. A mutex's holder is in it
//     (holder ” and expire_at 0 once released: the row stays, ended, with
//     the key's last fencing token, until pruned a day later). A
//     semaphore's row is its header: lim > 1, holder ”, the key's last
//     token; its permits are rows of <table>_permits. Its waiting flag is
//     1 whenever a live waiter is in the key's line (place sets it; a grant
//     that leaves nobody live in line clears it; a 1 with nobody in line
//     only costs a read), so that claims and releases of keys nobody waits
//     on skip the line. Rows of version 1 get 1 when Migrate adds the
//     column.
//   - <table>_waiters holds the line of each key: each waiter's place
//     (seq), the place's deadline and the named lock of the watcher that
//     serves the waiter (watcher, ” when unknown), the one a turn wakes.
//     (Tables of version 1 lack the column: Migrate adds it, see
//     addedColumns.)
//   - <table>_turns is the log of the turns told, which every watcher of
//     the table reads (see Backend.WatchTurns), kept for a minute.
//   - <table>_watchers names the locks (GET_LOCK) the table's watchers
//     hold on their waiting connections, for the releases to find them
//     when a waiter's place names no live watcher.
func tablesSQL(n names) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	` + "`key`" + `       VARBINARY(1024) NOT NULL,
	owner       BLOB            NOT NULL,
	holder      VARBINARY(255)  NOT NULL,
	token       BIGINT          NOT NULL,
	acquired_at BIGINT          NOT NULL,
	expire_at   BIGINT          NOT NULL,
	lim         INT             NOT NULL DEFAULT 0,
	waiting     TINYINT         NOT NULL DEFAULT 1,
	PRIMARY KEY (` + "`key`" + `)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + n.permits + ` (
	` + "`key`" + `       VARBINARY(1024) NOT NULL,
	holder      VARBINARY(255)  NOT NULL,
	owner       BLOB            NOT NULL,
	token       BIGINT          NOT NULL,
	acquired_at BIGINT          NOT NULL,
	expire_at   BIGINT          NOT NULL,
	PRIMARY KEY (` + "`key`" + `, holder)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + n.waiters + ` (
	` + "`key`" + `    VARBINARY(1024) NOT NULL,
	waiter   VARBINARY(255)  NOT NULL,
	seq      BIGINT          NOT NULL,
	deadline BIGINT          NOT NULL,
	watcher  VARBINARY(64)   NOT NULL DEFAULT '',
	PRIMARY KEY (` + "`key`" + `, waiter),
	KEY by_seq (` + "`key`" + `, seq)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + n.turns + ` (
	id      BIGINT          NOT NULL AUTO_INCREMENT,
	` + "`key`" + `   VARBINARY(1024) NOT NULL,
	waiter  VARBINARY(255)  NOT NULL,
	at      BIGINT          NOT NULL,
	PRIMARY KEY (id)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + n.watchers + ` (
	name VARBINARY(64) NOT NULL,
	PRIMARY KEY (name)
) ENGINE=InnoDB`,
	}
}

// SchemaSQL returns the statements Migrate runs for table (a name as given
// to WithTable), in order, one statement each: the five tables, then the
// procedures (each dropped first, so that running them again upgrades).
// For those who create schemas through their own migrations; a tool that
// splits scripts on ';' must take each string whole. It needs the CREATE,
// CREATE ROUTINE and ALTER ROUTINE privileges; using the locks needs
// SELECT, INSERT, UPDATE, DELETE on the tables and EXECUTE.
func SchemaSQL(table string) ([]string, error) {
	cfg, err := newConfig([]Option{WithTable(table)})
	if err != nil {
		return nil, err
	}
	n := newNames(cfg.schema, cfg.table)
	out := tablesSQL(n)
	for _, p := range procNames {
		out = append(out, "DROP PROCEDURE IF EXISTS "+n.proc(p), n.procSQL(p))
	}
	return out, nil
}

// Migrate creates the lock table, its companion tables and its procedures
// on db when they are missing, and replaces procedures of another version.
// It is what WithAutoMigrate runs, for a program that creates the schema in
// a step of its own (a migration job, a deploy hook) and then uses New or
// Open without WithAutoMigrate. Of the options only WithTable applies. db
// stays the caller's. Concurrent calls from many processes are safe: they
// serialise on a named lock (GET_LOCK) held for the call.
func Migrate(ctx context.Context, db *sql.DB, opts ...Option) error {
	cfg, err := dbConfig(db, opts)
	if err != nil {
		return err
	}
	return migrate(ctx, db, newNames(cfg.schema, cfg.table))
}

// Migrate runs the package-level Migrate for b's table on b's pool.
func (b *Backend) Migrate(ctx context.Context) error { return migrate(ctx, b.db, b.n) }

func migrate(ctx context.Context, db *sql.DB, n names) error {
	err := func() error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK('dislock: migrate', 30)`).Scan(&got); err != nil {
			return err
		}
		if got.Int64 != 1 {
			return errors.New("another Migrate held the named lock 'dislock: migrate' for 30s")
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK('dislock: migrate')`)
		for _, s := range tablesSQL(n) {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		if err := addColumns(ctx, conn, n); err != nil {
			return err
		}
		have, err := procVersions(ctx, conn, n)
		if err != nil {
			return err
		}
		for _, p := range procNames {
			if have[p] == procVersion {
				continue
			}
			if _, err := conn.ExecContext(ctx, "DROP PROCEDURE IF EXISTS "+n.proc(p)); err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, n.procSQL(p)); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		return fmt.Errorf("mysqllock: migrate table %s: %w", n.table, err)
	}
	return nil
}

// addedColumn is a column that a later version of the package added to a
// table CREATE TABLE IF NOT EXISTS leaves as it was.
type addedColumn struct {
	table  func(names) string // quoted
	suffix string             // the table's suffix ("_waiters")
	column string
	def    string // its definition in ALTER TABLE … ADD COLUMN
}

// addedColumns: version 2 names each waiter's watcher, so that a turn
// wakes that one watcher instead of all, and flags the keys someone may
// wait on, so that the claim and release of a key nobody waits on do not
// read its line.
var addedColumns = []addedColumn{
	{func(n names) string { return n.waiters }, "_waiters", "watcher", "VARBINARY(64) NOT NULL DEFAULT ''"},
	// 1 for the rows there are: someone may wait on them.
	{func(n names) string { return n.table }, "", "waiting", "TINYINT NOT NULL DEFAULT 1"},
}

// addColumns adds to the tables made by an earlier version the columns
// this one reads (MySQL has no ADD COLUMN IF NOT EXISTS: the catalogue
// says which are missing). Processes of the earlier version keep working
// on the table until their procedures are replaced: the new columns have
// defaults.
func addColumns(ctx context.Context, conn *sql.Conn, n names) error {
	var cond []string
	for _, c := range addedColumns {
		cond = append(cond, "(TABLE_NAME = "+lit(n.base+c.suffix)+" AND COLUMN_NAME = "+lit(c.column)+")")
	}
	rows, err := conn.QueryContext(ctx, `SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = `+n.schemaExpr()+` AND (`+strings.Join(cond, " OR ")+`)`)
	if err != nil {
		return err
	}
	have := map[[2]string]bool{}
	for rows.Next() {
		var t, c string
		if err := rows.Scan(&t, &c); err != nil {
			rows.Close()
			return err
		}
		have[[2]string{strings.ToLower(t), strings.ToLower(c)}] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range addedColumns {
		if have[[2]string{strings.ToLower(n.base + c.suffix), c.column}] {
			continue
		}
		if _, err := conn.ExecContext(ctx, "ALTER TABLE "+c.table(n)+" ADD COLUMN "+quote(c.column)+" "+c.def); err != nil {
			return err
		}
	}
	return nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// procVersions returns the comment (version) of each of the table's
// procedures that exists, by suffix.
func procVersions(ctx context.Context, q querier, n names) (map[string]string, error) {
	in := make([]string, len(procNames))
	for i, p := range procNames {
		in[i] = lit(n.base + "_" + p)
	}
	rows, err := q.QueryContext(ctx, `SELECT ROUTINE_NAME, ROUTINE_COMMENT FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = `+n.schemaExpr()+` AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME IN (`+strings.Join(in, ", ")+`)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[string]string{}
	for rows.Next() {
		var name, comment string
		if err := rows.Scan(&name, &comment); err != nil {
			return nil, err
		}
		have[strings.TrimPrefix(name, n.base+"_")] = comment
	}
	return have, rows.Err()
}

// added reports whether column c of table t is one an earlier version did
// not make (Migrate adds it).
func added(t, base, c string) bool {
	for _, a := range addedColumns {
		if t == base+a.suffix && c == a.column {
			return true
		}
	}
	return false
}

func schemaErr(table, format string, args ...any) error {
	return fmt.Errorf("%w: table %s: %s", ErrSchema, table, fmt.Sprintf(format, args...))
}

// fixHint is the fix of a missing or outdated object.
const fixHint = "fix: call mysqllock.Migrate(ctx, db) (with the same WithTable), use WithAutoMigrate, or run the statements of mysqllock.SchemaSQL"

// checkSchema verifies that the tables have the columns the procedures use
// and that every procedure is of this version.
func (b *Backend) checkSchema(ctx context.Context) error {
	if b.n.schema == "" {
		var db sql.NullString
		if err := b.db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&db); err != nil {
			return fmt.Errorf("mysqllock: check table %s: %w", b.n.table, err)
		}
		if !db.Valid {
			return schemaErr(b.n.table, "no database selected; fix: name one in the DSN (…/dbname) or in WithTable(\"dbname.table\")")
		}
	}
	tables := []string{b.n.base, b.n.base + "_permits", b.n.base + "_waiters", b.n.base + "_turns", b.n.base + "_watchers"}
	want := map[string][]string{
		tables[0]: {"key", "owner", "holder", "token", "acquired_at", "expire_at", "lim", "waiting"},
		tables[1]: {"key", "holder", "owner", "token", "acquired_at", "expire_at"},
		tables[2]: {"key", "waiter", "seq", "deadline", "watcher"},
		tables[3]: {"id", "key", "waiter", "at"},
		tables[4]: {"name"},
	}
	in := make([]string, len(tables))
	for i, t := range tables {
		in[i] = lit(t)
	}
	rows, err := b.db.QueryContext(ctx, `SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = `+b.n.schemaExpr()+` AND TABLE_NAME IN (`+strings.Join(in, ", ")+`)`)
	if err != nil {
		return fmt.Errorf("mysqllock: check table %s: %w", b.n.table, err)
	}
	have := map[string]map[string]bool{}
	for rows.Next() {
		var t, c string
		if err := rows.Scan(&t, &c); err != nil {
			rows.Close()
			return fmt.Errorf("mysqllock: check table %s: %w", b.n.table, err)
		}
		t = strings.ToLower(t)
		if have[t] == nil {
			have[t] = map[string]bool{}
		}
		have[t][strings.ToLower(c)] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("mysqllock: check table %s: %w", b.n.table, err)
	}
	for _, t := range tables {
		cols := have[strings.ToLower(t)]
		if cols == nil {
			return schemaErr(b.n.table, "table %s does not exist (or is not visible to this user); %s", quote(t), fixHint)
		}
		for _, c := range want[t] {
			if !cols[c] && added(t, b.n.base, c) {
				return schemaErr(b.n.table, "table %s has no column %s: it was made by an earlier version of mysqllock; %s", quote(t), c, fixHint)
			}
			if !cols[c] {
				return schemaErr(b.n.table, "table %s has no column %s: it was not made by mysqllock.Migrate; fix: name another table with WithTable, or drop it and migrate", quote(t), c)
			}
		}
	}
	procs, err := procVersions(ctx, b.db, b.n)
	if err != nil {
		return fmt.Errorf("mysqllock: check table %s: %w", b.n.table, err)
	}
	for _, p := range procNames {
		switch v, ok := procs[p]; {
		case !ok:
			return schemaErr(b.n.table, "procedure %s does not exist (or this user may not see it); %s", b.n.proc(p), fixHint)
		case v != procVersion:
			return schemaErr(b.n.table, "procedure %s is of another version (%q, want %q); %s", b.n.proc(p), v, procVersion, fixHint)
		}
	}
	return nil
}
