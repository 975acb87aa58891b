package pg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/sqlbackend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Semaphores (core.Limit(n), n > 1) keep their state in two places:
//
//   - A header row in the lock table, under the semaphore's key, whose
//     owner is semMark followed by the limit ("dislock:semaphore:4"; the
//     holder adds a random part). It carries the key's last fencing token and an expiry that is the
//     latest expiry of the key's live permits. A mutex claim of the key sees
//     a live row (busy: answered with core.LimitMismatch), a mutex renewal
//     or release never matches its holder, and once every permit has expired
//     the row is expired too, so the key can be taken again as anything.
//   - One row per permit in the permits table (permitsTable: the lock
//     table's name with "_permits" appended), keyed by (key, holder).
//
// Every statement that changes the permits of a key runs after a statement
// of the same transaction (sent in the same batch: one round trip) has
// locked the key's header row. Under READ COMMITTED each statement reads a
// fresh snapshot, so the second statement sees every permit committed
// before the lock was granted, and no other transaction can add, remove or
// extend a permit of the key until this one commits: the count of live
// permits it checks is exact, with no spurious busy answers. The header
// row's lock is the only lock taken before other row locks, and a renewal
// takes the header locks of its keys in key order, so these transactions
// never deadlock. The first statement tells the second that it holds the
// lock through a setting local to the transaction (semSetting); nothing
// outlives the transaction, so it works in every QueryExecMode and behind
// transaction poolers.
//
// A full semaphore is answered from a read alone: no lock, no write.
//
// This file holds the permits table and the semaphores' state; the
// statements are in semaphore_sql.go, the claim, release and renewal of
// permits in semaphore_lease.go, Holders and the Admin calls in
// semaphore_admin.go.

// semMark starts the owner and holder of a semaphore's header row; the
// limit follows (the owner is "dislock:semaphore:4"), and in the holder a
// colon and a random part made when the header is written
// ("dislock:semaphore:4:9f2c…"), so that no owner token given to a mutex
// renewal or release can match it.
const semMark = "dislock:semaphore:"

// semSetting carries, from the statement that locked a key's header row to
// the next statement of the same transaction, the header's new token (the
// permit's fencing token). It is set with set_config(…, true): local to
// the transaction.
const semSetting = "dislock.sem_token"

// permitsSuffix is appended to the lock table's name to name the permits
// table.
const permitsSuffix = "_permits"

// semMarkOf returns the header mark of a semaphore of limit permits.
func semMarkOf(limit int) string { return semMark + strconv.Itoa(limit) }

// semLimit returns the limit a header's owner or holder names, or 0 when s
// is not a header's.
func semLimit(s string) int {
	rest, ok := strings.CutPrefix(s, semMark)
	if !ok {
		return 0
	}
	rest, _, _ = strings.Cut(rest, ":")
	n, err := strconv.Atoi(rest)
	if err != nil || n < 2 {
		return 0
	}
	return n
}

// semaphores is a Backend's semaphore state: the permits table and its
// statements, and whether the table was found.
type semaphores struct {
	table  string // the permits table, quoted; "" when its name would be too long
	name   string // its name as it would be given to WithTable (for errors)
	stmt   semStatements
	reason error // set when semaphores cannot work on this lock table at all

	mu    sync.Mutex
	ready bool  // the permits table was found, usable
	why   error // when not ready: why (nil: the table is missing)
}

// permitsIdent returns the permits table of the lock table t, or ok false
// when its name would be longer than PostgreSQL keeps.
func permitsIdent(t pgx.Identifier) (pgx.Identifier, bool) {
	p := append(pgx.Identifier(nil), t...)
	last := p[len(p)-1] + permitsSuffix
	if len(last) > maxIdentLen {
		return nil, false
	}
	p[len(p)-1] = last
	return p, true
}

// permitsName returns the permits table's name as given to WithTable.
func permitsName(p pgx.Identifier) string { return strings.Join(p, ".") }

func newSemaphores(cfg config, table string) *semaphores {
	s := &semaphores{}
	switch p, ok := permitsIdent(cfg.table); {
	case !ok:
		s.reason = fmt.Errorf("%w: semaphores (core.Limit > 1): the permits table's name %q would be longer than %d bytes; fix: a shorter WithTable",
			core.ErrUnsupported, cfg.table[len(cfg.table)-1]+permitsSuffix, maxIdentLen)
	default:
		s.table, s.name = p.Sanitize(), permitsName(p)
		s.stmt = buildSemStatements(table, s.table, cfg.legacy, cfg.asyncCommit)
	}
	return s
}

// permitsSchemaSQL is the statement that creates the permits table p.
func permitsSchemaSQL(p string, unlogged bool) string {
	kind := "TABLE"
	if unlogged {
		kind = "UNLOGGED TABLE"
	}
	return fmt.Sprintf(`CREATE %s IF NOT EXISTS %s (
	key         text NOT NULL,
	holder      text NOT NULL,
	owner       text NOT NULL,
	token       bigint NOT NULL,
	acquired_at timestamptz NOT NULL,
	expire_at   timestamptz NOT NULL,
	PRIMARY KEY (key, holder)
)`, kind, p)
}

// PermitsSchemaSQL returns the statement Migrate runs, besides SchemaSQL's,
// to create the permits table of the lock table named table: the table
// semaphores (core.Limit > 1) keep one row per permit in. Mutexes do not
// need it. unlogged should match the lock table's.
func PermitsSchemaSQL(table string, unlogged bool) (string, error) {
	cfg, err := newConfig([]Option{WithTable(table)})
	if err != nil {
		return "", err
	}
	p, ok := permitsIdent(cfg.table)
	if !ok {
		return "", sqlbackend.InvalidOption("WithTable", "the permits table's name would be longer than %d bytes", maxIdentLen)
	}
	return permitsSchemaSQL(p.Sanitize(), unlogged), nil
}

// migrate creates the permits table inside Migrate's transaction
// (nothing when semaphores cannot work on this lock table).
func (s *semaphores) migrate(ctx context.Context, tx pgx.Tx, unlogged bool) error {
	if s.reason != nil {
		return nil
	}
	_, err := tx.Exec(ctx, permitsSchemaSQL(s.table, unlogged))
	return err
}

// check looks for the permits table and checks that the lock table's
// tokens can order permits. A missing permits table is no error here:
// mutexes do not need it, and claims of permits check again.
func (s *semaphores) check(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, lockTable string) error {
	if s.reason != nil {
		return nil
	}
	var (
		exists, identity bool
		privs            [4]bool
	)
	err := q.QueryRow(ctx, `SELECT to_regclass($1::text) IS NOT NULL,
	coalesce((SELECT attidentity <> '' FROM pg_attribute WHERE attrelid = to_regclass($2::text) AND attname = 'token' AND NOT attisdropped), false),
	coalesce(has_table_privilege(to_regclass($1::text), 'SELECT'), false), coalesce(has_table_privilege(to_regclass($1::text), 'INSERT'), false),
	coalesce(has_table_privilege(to_regclass($1::text), 'UPDATE'), false), coalesce(has_table_privilege(to_regclass($1::text), 'DELETE'), false)`,
		s.table, lockTable).Scan(&exists, &identity, &privs[0], &privs[1], &privs[2], &privs[3])
	if err != nil {
		return fmt.Errorf("pg: check table %s: %w", s.table, poolerHint(err))
	}
	var why error
	var missing []string
	for i, name := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		if !privs[i] {
			missing = append(missing, name)
		}
	}
	switch {
	case identity:
		// A sequence's values are far below the clock tokens a permit
		// gets: a mutex claim after a semaphore would go back.
		why = fmt.Errorf("%w: %w: table %s: semaphores (core.Limit > 1) need clock tokens, and column token is an identity; fix: ALTER TABLE %s ALTER COLUMN token DROP IDENTITY IF EXISTS, ALTER COLUMN token SET DEFAULT %s",
			ErrSchema, core.ErrUnsupported, lockTable, lockTable, tokenDefault)
	case exists && len(missing) > 0:
		why = fmt.Errorf("%w: %w: table %s: the role lacks the %s privilege, which semaphores (core.Limit > 1) need; fix: GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO the role dislock connects as",
			ErrSchema, core.ErrUnsupported, s.table, strings.Join(missing, ", "), s.table)
	}
	s.mu.Lock()
	s.ready, s.why = exists && why == nil, why
	s.mu.Unlock()
	return nil
}

// isReady reports whether the permits table was found, usable.
func (s *semaphores) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// missing is the error of a permit claim without a permits table.
func (s *semaphores) missing() error {
	return fmt.Errorf("%w: %w: table %s does not exist (or is not visible to this role): semaphores (core.Limit > 1) keep their permits there; fix: call pg.Migrate(ctx, pool) (with the same WithTable), use WithAutoMigrate, or run the SQL from PermitsSchemaSQL",
		ErrSchema, core.ErrUnsupported, s.table)
}

// semUsable returns nil when permits can be claimed: the permits table
// exists and is usable (looked at again while it is not).
func (b *Backend) semUsable(ctx context.Context) error {
	s := b.sem
	if s.reason != nil {
		return s.reason
	}
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	if ready {
		return nil
	}
	if err := s.check(ctx, b.pool, b.table); err != nil {
		return err
	}
	s.mu.Lock()
	ready, why := s.ready, s.why
	s.mu.Unlock()
	switch {
	case ready:
		return nil
	case why != nil:
		return why
	}
	return s.missing()
}

// semErr maps a statement's error: a permits table dropped since it was
// found (42P01) is reported as missing, and looked for again next time.
func (b *Backend) semErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" && strings.Contains(pe.Message, strings.Trim(permitsIdentLast(b.sem.table), `"`)) {
		b.sem.mu.Lock()
		b.sem.ready, b.sem.why = false, nil
		b.sem.mu.Unlock()
		return b.sem.missing()
	}
	return poolerHint(err)
}

// permitsIdentLast returns the last part of a quoted, dotted name.
func permitsIdentLast(quoted string) string {
	if i := strings.LastIndex(quoted, `"."`); i >= 0 {
		return quoted[i+2:]
	}
	return quoted
}

// semPermitsReady reports whether the permits table exists (looked for
// again while it is not: another process may have made it); admin calls
// skip the permits while it does not, as there can be none.
func (b *Backend) semPermitsReady(ctx context.Context) (bool, error) {
	if b.sem.reason != nil {
		return false, nil
	}
	b.sem.mu.Lock()
	ready := b.sem.ready
	b.sem.mu.Unlock()
	if ready {
		return true, nil
	}
	if err := b.sem.check(ctx, b.pool, b.table); err != nil {
		return false, err
	}
	b.sem.mu.Lock()
	defer b.sem.mu.Unlock()
	return b.sem.ready, nil
}
