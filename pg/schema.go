package pg

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSchema is matched (errors.Is) by the errors NewBackend returns when the
// lock table is missing, has the wrong shape, or the role lacks a privilege
// on it. The message names the table and the fix.
var ErrSchema = errors.New("pg: lock table unusable")

// SchemaSQL returns the statement Migrate runs for table (a name as given to
// WithTable), for those who create tables through their own migrations.
// Semaphores (core.Limit > 1) also need the permits table: see
// PermitsSchemaSQL.
func SchemaSQL(table string, legacy, unlogged bool) (string, error) {
	cfg, err := newConfig([]Option{WithTable(table)})
	if err != nil {
		return "", err
	}
	return schemaSQL(cfg.table.Sanitize(), legacy, unlogged), nil
}

func schemaSQL(table string, legacy, unlogged bool) string {
	kind := "TABLE"
	if unlogged {
		kind = "UNLOGGED TABLE"
	}
	if legacy {
		return fmt.Sprintf(`CREATE %s IF NOT EXISTS %s (
	key       text PRIMARY KEY,
	value     text NOT NULL,
	expire_at timestamptz NOT NULL
)`, kind, table)
	}
	return fmt.Sprintf(`CREATE %s IF NOT EXISTS %s (
	key         text PRIMARY KEY,
	owner       text NOT NULL,
	holder      text NOT NULL,
	token       bigint NOT NULL DEFAULT %s,
	acquired_at timestamptz NOT NULL,
	expire_at   timestamptz NOT NULL,
	waiters     jsonb
)`, kind, table, tokenDefault)
}

// Schema change: the waiter queue (core.Queuer). The only column added to
// the table of earlier versions is
//
//	waiters jsonb  -- NULL: nobody waits; else [{"w": waiter id, "d": deadline µs}, …], first in line first
//
// A released key's row stays in the table, ended: an empty holder and
// expire_at '-infinity' (Inspect, List and the renewals see only rows with
// expire_at > now()), with its queue when waiters are queued and with the
// key's last token; the next claim takes it over. Backends prune ended rows
// with nobody live in line once their token is older than any claim can be
// (see prune in sql.go and the package doc's Ended rows); deleting them by
// hand could let a claim still on its way get a token below the key's last
// one. Migrate adds the column to an
// existing table (addWaitersSQL: no rewrite, nullable without a default);
// NewBackend reports a table without it as ErrSchema naming that statement.
// The legacy table gets no column: it has no queue.
func addWaitersSQL(table string) string {
	return "ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS waiters jsonb"
}

// tokenDefault is the database server's clock in microseconds: the default
// of the token column of the tables Migrate creates, and the clock every
// claim's fencing token is taken from. Unlike a sequence, a crash cannot set
// it back: an unlogged table's identity sequence is unlogged too and
// restarts at 1 after a crash, and under WithAsyncCommit a crash can undo a
// logged sequence's last advance, so tokens handed out before the crash
// would be handed out again. A claim reads it before it may wait for the
// key's row, so a reading alone can be older than the token of a claim that
// won the key meanwhile, or share its microsecond: a takeover reads it again
// under the row's lock and takes greatest(clock, last token + 1), and rows
// keep the last token until no claim that read an older clock can still
// commit (see buildStatements and prune).
const tokenDefault = `(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

// Migrate creates the lock table, and the permits table semaphores use (see
// PermitsSchemaSQL), on pool when they do not exist, and adds the waiters
// column to a table of an earlier version. It is what WithAutoMigrate runs,
// for a program that creates the schema in a step of its own (a migration
// job, a deploy hook) and then uses New or Open without WithAutoMigrate.
// The options that shape the table apply: WithTable, WithUnlogged,
// WithLegacyTable; the others are ignored. The pool stays the caller's.
// Concurrent calls from many processes are safe: they serialise on a
// transaction-scoped advisory lock. It needs the CREATE privilege on the
// schema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	cfg, err := poolConfig(pool, opts)
	if err != nil {
		return err
	}
	table := cfg.table.Sanitize()
	return migrate(ctx, pool, cfg, table, newSemaphores(cfg, table))
}

// Migrate runs the package-level Migrate for b's table and options, on b's
// pool.
func (b *Backend) Migrate(ctx context.Context) error {
	return migrate(ctx, b.pool, b.cfg, b.table, b.sem)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, cfg config, table string, sem *semaphores) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('dislock: migrate'))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schemaSQL(table, cfg.legacy, cfg.unlogged)); err != nil {
			return err
		}
		if !cfg.legacy {
			// A table of an earlier version: add the queue's column
			// (schema change above). Only when it is missing, so that a
			// role without the ALTER privilege can still migrate a
			// current table.
			var has bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = to_regclass($1::text) AND attname = 'waiters' AND NOT attisdropped)`, table).Scan(&has); err != nil {
				return err
			}
			if !has {
				if _, err := tx.Exec(ctx, addWaitersSQL(table)); err != nil {
					return err
				}
			}
		}
		return sem.migrate(ctx, tx, cfg.unlogged) // the permits table (semaphore.go)
	})
	if err != nil {
		return fmt.Errorf("pg: migrate table %s: %w", table, poolerHint(err))
	}
	return nil
}

// column is what the schema check needs to know of one column.
type column struct {
	typ        string
	identity   bool
	always     bool // GENERATED ALWAYS AS IDENTITY
	hasDefault bool
}

func schemaErr(table, format string, args ...any) error {
	return fmt.Errorf("%w: table %s: %s", ErrSchema, table, fmt.Sprintf(format, args...))
}

// checkSchema verifies the table's existence, shape and privileges and
// returns its OID.
func (b *Backend) checkSchema(ctx context.Context) (uint32, error) {
	t := b.table
	var (
		oid                                  uint32
		kind                                 string
		canSelect, canInsert, canUpd, canDel bool
		uniqueKey                            bool
	)
	err := b.pool.QueryRow(ctx, `SELECT c.oid, c.relkind::text,
	has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
	has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'),
	EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = c.oid AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'key')
FROM pg_class c WHERE c.oid = to_regclass($1::text)`, t).Scan(&oid, &kind, &canSelect, &canInsert, &canUpd, &canDel, &uniqueKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, schemaErr(t, "does not exist (or is not visible to this role); fix: call pg.Migrate(ctx, pool) (with the same WithTable), use WithAutoMigrate, or run the SQL from SchemaSQL")
	}
	if err != nil {
		return 0, fmt.Errorf("pg: check table %s: %w", t, poolerHint(err))
	}
	if kind != "r" && kind != "p" {
		return 0, schemaErr(t, "is not a table (relkind %q); fix: name a plain table with WithTable", kind)
	}
	var missing []string
	for _, p := range []struct {
		ok   bool
		name string
	}{{canSelect, "SELECT"}, {canInsert, "INSERT"}, {canUpd, "UPDATE"}, {canDel, "DELETE"}} {
		if !p.ok {
			missing = append(missing, p.name)
		}
	}
	if len(missing) > 0 {
		return 0, schemaErr(t, "the role lacks the %s privilege; fix: GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO the role dislock connects as",
			strings.Join(missing, ", "), t)
	}
	if !uniqueKey {
		return 0, schemaErr(t, "column key has no unique index; fix: ALTER TABLE %s ADD PRIMARY KEY (key)", t)
	}

	rows, err := b.pool.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod), attidentity <> '', attidentity = 'a', atthasdef
FROM pg_attribute WHERE attrelid = $1::oid AND attnum > 0 AND NOT attisdropped`, oid)
	if err != nil {
		return 0, fmt.Errorf("pg: check table %s: %w", t, poolerHint(err))
	}
	cols := map[string]column{}
	for rows.Next() {
		var name string
		var c column
		if err := rows.Scan(&name, &c.typ, &c.identity, &c.always, &c.hasDefault); err != nil {
			rows.Close()
			return 0, fmt.Errorf("pg: check table %s: %w", t, poolerHint(err))
		}
		cols[name] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("pg: check table %s: %w", t, poolerHint(err))
	}

	want := []struct{ name, kind string }{
		{"key", "text"}, {"owner", "text"}, {"holder", "text"}, {"token", "bigint"},
		{"acquired_at", "timestamptz"}, {"expire_at", "timestamptz"}, {"waiters", "jsonb"},
	}
	fix := "run pg.Migrate on a new table, or use WithLegacyTable for a key_value(key, value, expire_at) table"
	if b.cfg.legacy {
		want = []struct{ name, kind string }{{"key", "text"}, {"value", "text"}, {"expire_at", "timestamptz"}}
		fix = "the legacy table is key_value(key text primary key, value text not null, expire_at timestamptz not null)"
	}
	for _, w := range want {
		c, ok := cols[w.name]
		if !ok && w.name == "waiters" {
			return 0, schemaErr(t, "column waiters (the waiter queue, added in this version) is missing; fix: %s; (or call pg.Migrate, or use WithAutoMigrate, which add it)", addWaitersSQL(t))
		}
		if !ok {
			return 0, schemaErr(t, "column %s is missing; fix: %s", w.name, fix)
		}
		switch w.kind {
		case "jsonb":
			if c.typ != "jsonb" {
				return 0, schemaErr(t, "column %s is %s, want jsonb; fix: ALTER TABLE %s DROP COLUMN %s, then %s", w.name, c.typ, t, w.name, addWaitersSQL(t))
			}
		case "text":
			if c.typ != "text" && !strings.HasPrefix(c.typ, "character varying") {
				return 0, schemaErr(t, "column %s is %s, want text; fix: ALTER TABLE %s ALTER COLUMN %s TYPE text", w.name, c.typ, t, w.name)
			}
		case "bigint":
			if c.typ != "bigint" {
				return 0, schemaErr(t, "column %s is %s, want bigint; fix: %s", w.name, c.typ, fix)
			}
			if c.always {
				// A claim writes the token itself (the clock, or the
				// row's last token + 1), which an ALWAYS identity
				// refuses.
				return 0, schemaErr(t, "column %s is GENERATED ALWAYS AS IDENTITY; fix: ALTER TABLE %s ALTER COLUMN %s DROP IDENTITY IF EXISTS, ALTER COLUMN %s SET DEFAULT %s", w.name, t, w.name, w.name, tokenDefault)
			}
			if !c.identity && !c.hasDefault {
				return 0, schemaErr(t, "column %s has no default; fix (tokens must never restart below those already handed out): ALTER TABLE %s ALTER COLUMN %s SET DEFAULT %s", w.name, t, w.name, tokenDefault)
			}
		case "timestamptz":
			if c.typ != "timestamp with time zone" {
				return 0, schemaErr(t, "column %s is %s, want timestamptz (with a zone-less timestamp, clients in different TimeZone settings can both hold a lock); fix: ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING %s AT TIME ZONE 'UTC' (name the zone the writers used)",
					w.name, c.typ, t, w.name, w.name)
			}
		}
	}
	return oid, nil
}
