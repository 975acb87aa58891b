package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
		return "", invalidOption("WithTable", "the permits table's name would be longer than %d bytes", maxIdentLen)
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

// semStatements is the SQL of the semaphore operations. Each pair (lock,
// then act) is sent as one batch: one round trip, one transaction.
type semStatements struct {
	acquireLock, acquire string
	releaseLock, release string
	keep                 string
	renewLock, renew     string
	forceLock, force     string
	holders, list        string
	prune                string
	leave                string // "" on the legacy table (no queue)
}

func buildSemStatements(t, p string, legacy, async bool) semStatements {
	ac := ""
	if async {
		ac = asyncClause
	}
	const (
		exp    = `coalesce($6::timestamptz, now() + $5::bigint * interval '1 microsecond')`
		locked = `(coalesce(current_setting('` + semSetting + `', true), '') <> '')`
	)
	// The lock table's holder, token and acquisition time, with a table
	// alias (ending in a dot) or none. The legacy table keeps the holder
	// in value ("<holder> <owner>") and has no token: its permits' tokens
	// are 0.
	hh := func(alias string) string { return alias + "holder" }
	tok := "token"
	acq := "acquired_at"
	if legacy {
		hh = func(alias string) string { return "split_part(" + alias + "value, ' ', 1)" }
		tok, acq = "0::bigint", "NULL::timestamptz"
	}
	isHdr := `starts_with(` + hh("") + `, '` + semMark + `')`
	var s semStatements
	// acquireLock ($1 key, $2 mark, $3 limit, $4 owner token, $5 TTL µs,
	// $6 slot end) locks the key's header row, creating it when the key
	// has no row, or taking over an expired row of any kind, and bumps its
	// token: greatest(server clock µs, last token + 1), both read under the
	// row's lock (the proposed row's clock, read before the wait for the
	// lock, would be older than a token given meanwhile). It is skipped
	// (no lock, no write) when its own read shows the key full, held as a
	// mutex or with another limit, the slot over, or the permit already
	// held with this owner token; and it locks without writing when the
	// row's latest version, checked under the lock, is such a row.
	const newHolder = `$2::text || ':' || md5(random()::text)`
	// The waiter queue (on the header row's waiters column; not on the
	// legacy table): acquireLock's $7 and acquire's $8 are the waiter ('':
	// none), $8 and $9 its place's TTL in µs. A full semaphore is answered
	// from the read alone unless the waiter's place is missing or half
	// gone; under the header lock a permit goes to a claim only when fewer
	// live waiters are queued before it than permits are free, and the
	// claim takes its waiter out of line or, answered busy, gives it a
	// place.
	placeDue := ""
	if !legacy {
		placeDue = ` AND NOT ($7::text <> '' AND coalesce(` + qDeadline("c.waiters", "$7::text") + `, 0) < ` + nowMicros + ` + $8::bigint / 2)`
	}
	skip := fmt.Sprintf(`WHERE ($6::timestamptz IS NULL OR $6::timestamptz > now())
	AND NOT EXISTS (SELECT 1 FROM %[2]s WHERE key = $1::text AND holder = $4::text AND expire_at > now())
	AND NOT EXISTS (SELECT 1 FROM %[1]s c WHERE c.key = $1::text AND c.expire_at > now()
		AND (NOT starts_with(%[3]s, $2::text || ':') OR ((SELECT count(*) FROM %[2]s WHERE key = $1::text AND expire_at > now()) >= $3::int%[5]s)))%[4]s`,
		t, p, hh("c."), ac, placeDue)
	s.acquireLock = fmt.Sprintf(`INSERT INTO %[1]s AS l (key, owner, holder, token, acquired_at, expire_at)
SELECT $1::text, $2::text, %[2]s, %[3]s, now(), %[4]s
%[5]s
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner,
	holder = CASE WHEN l.expire_at > now() THEN l.holder ELSE excluded.holder END,
	token = greatest(%[3]s, l.token + 1),
	acquired_at = CASE WHEN l.expire_at > now() THEN l.acquired_at ELSE excluded.acquired_at END,
	expire_at = greatest(l.expire_at, excluded.expire_at)
WHERE l.expire_at <= now() OR starts_with(l.holder, excluded.owner || ':')
RETURNING set_config('%[6]s', l.token::text, true)`, t, newHolder, tokenDefault, exp, skip, semSetting)
	if legacy {
		// value is "<holder> <owner>"; no token to bump: the setting
		// only says that the lock is held.
		s.acquireLock = fmt.Sprintf(`INSERT INTO %[1]s AS l (key, value, expire_at)
SELECT $1::text, %[2]s || ' ' || $2::text, %[3]s
%[4]s
ON CONFLICT (key) DO UPDATE SET value = CASE WHEN l.expire_at > now() THEN l.value ELSE excluded.value END,
	expire_at = greatest(l.expire_at, excluded.expire_at)
WHERE l.expire_at <= now() OR starts_with(l.value, $2::text || ':')
RETURNING set_config('%[5]s', '0', true)`, t, newHolder, exp, skip, semSetting)
	}

	// acquire ($1 key, $2 mark, $3 limit, $4 owner token, $5 TTL µs, $6
	// slot end, $7 owner) claims a permit when acquireLock locked the
	// header: it drops the key's expired permits and inserts one when
	// fewer than the limit are left and the slot (on the server's clock,
	// under the lock) is not over. When it holds the lock but grants
	// nothing (its first read was out of date), it sets the header's expiry
	// back to the live permits'. Its answer rows, by kind: 0 granted, 1
	// already held with this owner token, 2 the key's row when it is held
	// as a mutex or with another limit (holder column), 3 the live permit
	// that expires first.
	ahead, setQueue, dequeue, signal, signalled := "", "", "", "", "0::bigint"
	if !legacy {
		// ahead: the live waiters queued before $8 (all of them when $8
		// has no live place).
		live := `(x.e->>'d')::bigint > ` + nowMicros
		ahead = ` + (SELECT count(*) FROM ` + t + ` h, jsonb_array_elements(h.waiters) WITH ORDINALITY AS x(e, i)
			WHERE h.key = $1::text AND ` + live + ` AND x.i < coalesce((SELECT y.i FROM jsonb_array_elements(h.waiters) WITH ORDINALITY AS y(e, i)
				WHERE y.e->>'w' = $8::text AND (y.e->>'d')::bigint > ` + nowMicros + ` LIMIT 1), 2147483647))`
		setQueue = `,
		waiters = CASE WHEN $8::text = '' OR EXISTS (SELECT 1 FROM mine) THEN waiters
			WHEN EXISTS (SELECT 1 FROM ins) THEN ` + qWithout("waiters", "$8::text") + `
			ELSE ` + qWith("waiters", "$8::text", nowMicros+" + $9::bigint") + ` END`
		dequeue = ` OR $8::text <> ''`
		// signal ($10 channel): a grant that leaves a permit free tells
		// the next live waiter (the queue's first once the claim's own
		// waiter is out of it) that its turn has come, as a release does;
		// the answer's granted row counts it, so that it runs.
		next := qHead(qWithout("h.waiters", "$8::text"))
		signal = fmt.Sprintf(`, sig AS (
	SELECT pg_notify($10::text, %[3]s) FROM (SELECT %[4]s AS head FROM %[1]s h WHERE h.key = $1::text) AS n
	WHERE $10::text <> '' AND n.head IS NOT NULL AND EXISTS (SELECT 1 FROM ins)
		AND (SELECT count(*) FROM %[2]s WHERE key = $1::text AND expire_at > now()) + 1 < $3::int
)`, t, p, turnPayload("$1::text", "n.head"), next)
		signalled = "(SELECT count(*) FROM sig)"
	}
	s.acquire = fmt.Sprintf(`WITH tok AS (
	SELECT nullif(current_setting('%[4]s', true), '')::bigint AS token
), mine AS (
	SELECT owner, token, acquired_at, expire_at FROM %[2]s WHERE key = $1::text AND holder = $4::text AND expire_at > now()
), reap AS (
	DELETE FROM %[2]s WHERE key = $1::text AND expire_at <= now() AND (SELECT token FROM tok) IS NOT NULL RETURNING 1
), ins AS (
	INSERT INTO %[2]s (key, holder, owner, token, acquired_at, expire_at)
	SELECT $1::text, $4::text, $7::text, t.token, now(), %[3]s FROM tok t
	WHERE t.token IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mine) AND ($6::timestamptz IS NULL OR $6::timestamptz > clock_timestamp())
		AND (SELECT count(*) FROM %[2]s WHERE key = $1::text) - (SELECT count(*) FROM reap)%[9]s < $3::int
	RETURNING token, acquired_at, expire_at
), fix AS (
	UPDATE %[1]s SET expire_at = CASE WHEN EXISTS (SELECT 1 FROM ins) THEN expire_at
		ELSE coalesce((SELECT max(expire_at) FROM %[2]s WHERE key = $1::text AND expire_at > now()), now()) END%[10]s
	WHERE key = $1::text AND (SELECT token FROM tok) IS NOT NULL AND (NOT EXISTS (SELECT 1 FROM ins)%[11]s)
)%[12]s
SELECT 0, $7::text, token, acquired_at, expire_at, %[13]s FROM ins
UNION ALL
SELECT 1, owner, token, acquired_at, expire_at, 0::bigint FROM mine
UNION ALL
SELECT 2, %[6]s, %[7]s, %[8]s, expire_at, %[5]s FROM %[1]s WHERE key = $1::text AND expire_at > now() AND NOT starts_with(%[6]s, $2::text || ':')
UNION ALL
(SELECT 3, owner, token, acquired_at, expire_at, %[5]s FROM %[2]s WHERE key = $1::text AND expire_at > now() ORDER BY expire_at, token LIMIT 1)`,
		t, p, exp, semSetting, remaining, hh(""), tok, acq, ahead, setQueue, dequeue, signal, signalled)

	// A permit's release, and a ForceRelease, tell the header's first live
	// waiter (see WatchTurns), and only when one is queued, as a mutex's
	// release does; on the legacy table, which has no queue, they notify
	// with the bare key.
	turn, queued := "$1::text", ""
	if !legacy {
		head := "(SELECT " + qHead("h.waiters") + " FROM " + t + " h WHERE h.key = $1::text)"
		turn, queued = turnPayload("$1::text", head), " AND "+head+" IS NOT NULL"
	}

	// releaseLock ($1 key, $2 owner token) locks the header of a key that
	// has a permit of this owner token.
	s.releaseLock = fmt.Sprintf(`UPDATE %[1]s SET expire_at = expire_at
WHERE key = $1::text AND %[3]s AND EXISTS (SELECT 1 FROM %[2]s WHERE key = $1::text AND holder = $2::text)%[4]s
RETURNING set_config('%[5]s', %[6]s::text, true)`, t, p, isHdr, ac, semSetting, tok)

	// release ($1 key, $2 owner token, $3 channel) deletes the permit and
	// notifies when it was live. Under the header lock it also sets the
	// header's expiry to the latest of the permits left, or, when none is
	// left, ends the header (expiry -infinity) and deletes the key's
	// expired permits: the key is free at once, for a mutex or another
	// limit too. The ended header stays, with its last token: a claim
	// whose clock was read before it waited for the header's lock still
	// gets a token above every earlier one (greatest(clock, last + 1)),
	// which a deleted header could not promise. Its row says whether the
	// permit deleted was live.
	s.release = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[2]s WHERE key = $1::text AND holder = $2::text RETURNING expire_at > now() AS live
), rest AS (
	SELECT max(expire_at) AS until FROM %[2]s WHERE key = $1::text AND holder <> $2::text AND expire_at > now()
), hd AS (
	UPDATE %[1]s SET expire_at = '-infinity' WHERE key = $1::text AND %[3]s AND %[4]s AND (SELECT until FROM rest) IS NULL
), gc AS (
	DELETE FROM %[2]s WHERE key = $1::text AND holder <> $2::text AND expire_at <= now() AND %[4]s AND (SELECT until FROM rest) IS NULL
), hu AS (
	UPDATE %[1]s SET expire_at = (SELECT until FROM rest) WHERE key = $1::text AND %[3]s AND %[4]s AND expire_at > (SELECT until FROM rest)
), n AS (
	SELECT pg_notify($3::text, %[5]s) FROM d WHERE live AND $3::text <> ''%[6]s
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`, t, p, isHdr, locked, turn, queued)

	// keep ($1 key, $2 owner token, $3 µs), after releaseLock, sets a live
	// permit's expiry to now + $3 (min hold, slot mode) and keeps the
	// header's expiry at or after it; it updates a row only when the
	// permit was live.
	s.keep = fmt.Sprintf(`WITH k AS (
	UPDATE %[2]s SET expire_at = now() + $3::bigint * interval '1 microsecond'
	WHERE key = $1::text AND holder = $2::text AND expire_at > now() AND %[3]s
	RETURNING expire_at
)
UPDATE %[1]s SET expire_at = greatest(expire_at, (SELECT expire_at FROM k)) WHERE key = $1::text AND EXISTS (SELECT 1 FROM k)`, t, p, locked)

	// renewLock ($1 keys) locks the headers of the keys of a renewal's
	// permits, in key order.
	s.renewLock = fmt.Sprintf(`SELECT 1 FROM %[1]s WHERE key = ANY($1::text[]) AND %[2]s ORDER BY key FOR UPDATE`, t, isHdr)

	// renew ($1 keys, $2 owner tokens, $3 TTLs µs, $4 marks) extends each
	// live permit whose key's header has the permit's limit, and each
	// header to its permits' latest expiry.
	s.renew = fmt.Sprintf(`WITH r AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS r(key, holder, ttl, mark)
), p AS (
	UPDATE %[2]s AS l SET expire_at = now() + r.ttl * interval '1 microsecond' FROM r
	WHERE l.key = r.key AND l.holder = r.holder AND l.expire_at > now()
		AND EXISTS (SELECT 1 FROM %[1]s h WHERE h.key = r.key AND starts_with(%[4]s, r.mark || ':') AND h.expire_at > now())%[3]s
	RETURNING l.key, l.holder, l.expire_at
), h AS (
	UPDATE %[1]s AS h SET expire_at = m.until FROM (SELECT key, max(expire_at) AS until FROM p GROUP BY key) m
	WHERE h.key = m.key AND h.expire_at < m.until
)
SELECT key, holder FROM p`, t, p, ac, hh("h."))

	// forceLock ($1 key) locks a semaphore's header; force ($1 key, $2
	// channel) then deletes every permit and ends the header (keeping its
	// last token and its queue, as release does), and notifies when a live
	// permit was among them. Its row says whether the key was
	// a semaphore (locked), and whether a live permit was freed.
	s.forceLock = fmt.Sprintf(`UPDATE %[1]s SET expire_at = expire_at WHERE key = $1::text AND %[2]s
RETURNING set_config('%[3]s', %[4]s::text, true)`, t, isHdr, semSetting, tok)
	s.force = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[2]s WHERE key = $1::text AND %[4]s RETURNING expire_at > now() AS live
), h AS (
	UPDATE %[1]s SET expire_at = '-infinity' WHERE key = $1::text AND %[3]s AND %[4]s
), n AS (
	SELECT pg_notify($2::text, %[5]s) WHERE %[4]s AND $2::text <> '' AND EXISTS (SELECT 1 FROM d WHERE live)%[6]s
)
SELECT %[4]s, EXISTS (SELECT 1 FROM d WHERE live), (SELECT count(*) FROM n)`, t, p, isHdr, locked, turn, queued)

	// leave is Leave ($1 key, $2 waiter, $3 channel) once the permits table
	// is in place: the key of a semaphore can be claimed while a permit is
	// free, not only once its header expired.
	if !legacy {
		s.leave = leaveSQL(t, `(l.expire_at <= now() OR (starts_with(l.holder, '`+semMark+`')
		AND (SELECT count(*) FROM `+p+` WHERE key = $1::text AND expire_at > now()) < split_part(l.holder, ':', 3)::int))`)
	}

	// prune deletes the expired permits of keys whose header is gone (see
	// Backend.prune): a semaphore whose holders all crashed.
	s.prune = fmt.Sprintf(`DELETE FROM %[2]s p WHERE p.expire_at <= now() AND NOT EXISTS (SELECT 1 FROM %[1]s h WHERE h.key = p.key)%[3]s`,
		t, p, asyncClause)

	// holders ($1 key) and list ($1 prefix): the live permits of live
	// headers, oldest first, with the header's limit.
	permitCols := `p.key, p.owner, p.token, p.acquired_at, p.expire_at,
	(extract(epoch FROM p.expire_at - now()) * 1000000)::bigint, split_part(` + hh("h.") + `, ':', 3)::int`
	s.holders = fmt.Sprintf(`SELECT %[3]s
FROM %[2]s p JOIN %[1]s h ON h.key = p.key AND starts_with(%[5]s, '%[4]s') AND h.expire_at > now()
WHERE p.key = $1::text AND p.expire_at > now()
ORDER BY p.acquired_at, p.token`, t, p, permitCols, semMark, hh("h."))
	s.list = fmt.Sprintf(`SELECT %[3]s
FROM %[2]s p JOIN %[1]s h ON h.key = p.key AND starts_with(%[5]s, '%[4]s') AND h.expire_at > now()
WHERE starts_with(p.key, $1::text) AND p.expire_at > now()
ORDER BY p.key, p.acquired_at, p.token`, t, p, permitCols, semMark, hh("h."))
	return s
}

// semTimeout is what each of an acquire's two statements may take on the
// server (statement_timeout, restarted by the server for each statement):
// together no more than what is left of the claim timeout.
func semTimeout(left time.Duration) string {
	return strconv.FormatInt(max(left.Milliseconds()/2, 1), 10)
}

// tryAcquirePermit is TryAcquire for req.Limit > 1: the claim bound, the
// header lock and the claim in one batch (one round trip, one transaction).
func (b *Backend) tryAcquirePermit(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	start := time.Now()
	if err := core.ValidateKey(req.Key); err != nil {
		return core.Lease{}, err
	}
	if req.Limit > core.MaxLimit {
		return core.Lease{}, invalidOption("Limit", "must be between 1 and %d, got %d", core.MaxLimit, req.Limit)
	}
	var expireAt any
	if !req.ExpireAt.IsZero() {
		expireAt = req.ExpireAt
	} else if req.TTL <= 0 {
		return core.Lease{}, invalidOption("TTL", "must be positive, got %v", req.TTL)
	}
	if err := b.semUsable(ctx); err != nil {
		return core.Lease{}, err
	}
	conn, left, err := b.claimConn(ctx, start) // pg.go
	if err != nil {
		return core.Lease{}, err
	}
	defer conn.Release()
	mark := semMarkOf(req.Limit)
	batch := &pgx.Batch{}
	batch.Queue(b.stmt.bound, semTimeout(left))
	if b.cfg.legacy { // no queue
		batch.Queue(b.sem.stmt.acquireLock, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt)
		batch.Queue(b.sem.stmt.acquire, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Owner)
	} else {
		batch.Queue(b.sem.stmt.acquireLock, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Waiter, micro(req.WaiterTTL))
		batch.Queue(b.sem.stmt.acquire, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Owner, req.Waiter, micro(req.WaiterTTL), b.notifyChannel())
	}
	br := conn.SendBatch(ctx, batch)
	lease, err := b.readPermitAcquire(br, req)
	if cerr := br.Close(); err == nil && cerr != nil {
		return core.Lease{}, b.semErr(cerr)
	}
	return lease, err
}

func (b *Backend) readPermitAcquire(br pgx.BatchResults, req core.AcquireRequest) (core.Lease, error) {
	if _, err := br.Exec(); err != nil {
		return core.Lease{}, b.semErr(err)
	}
	if _, err := br.Exec(); err != nil {
		return core.Lease{}, b.semErr(err)
	}
	rows, err := br.Query()
	if err != nil {
		return core.Lease{}, b.semErr(err)
	}
	defer rows.Close()
	type answer struct {
		found    bool
		owner    string
		token    int64
		acquired pgtype.Timestamptz
		expires  time.Time
		left     int64
	}
	var ans [4]answer
	for rows.Next() {
		var kind int32
		var a answer
		if err := rows.Scan(&kind, &a.owner, &a.token, &a.acquired, &a.expires, &a.left); err != nil {
			return core.Lease{}, err
		}
		if kind >= 0 && int(kind) < len(ans) {
			a.found = true
			ans[kind] = a
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return core.Lease{}, b.semErr(err)
	}
	switch {
	case ans[0].found:
		return core.Lease{Token: uint64(ans[0].token), AcquiredAt: ans[0].acquired.Time, ExpiresAt: ans[0].expires}, nil
	case ans[1].found:
		return core.Lease{Token: uint64(ans[1].token), AcquiredAt: ans[1].acquired.Time, ExpiresAt: ans[1].expires}, nil
	case ans[2].found:
		// ans[2].owner is the holder column: a header's mark, or a
		// mutex's owner token.
		return core.Lease{}, core.LimitMismatch(req.Key, max(semLimit(ans[2].owner), 1), req.Limit)
	case ans[3].found:
		a := ans[3]
		return core.Lease{}, core.Busy(req.Key, &core.Info{
			Key: req.Key, Owner: a.owner, Token: uint64(a.token), AcquiredAt: a.acquired.Time,
			ExpiresAt: a.expires, Remaining: time.Duration(a.left) * time.Microsecond, Limit: req.Limit,
		})
	}
	return core.Lease{}, core.Busy(req.Key, nil)
}

// releasePermit is Release for req.Limit > 1: the header lock and the
// delete (or, with Keep, the update) in one batch. A permit that was not
// live is answered core.Gone.
func (b *Backend) releasePermit(ctx context.Context, req core.ReleaseRequest) error {
	if b.sem.reason != nil {
		return nil // no permit can have been claimed
	}
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return err // no permits table, no permit to release (the undo of a refused claim)
	}
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.releaseLock, req.Key, req.OwnerToken)
	if req.Keep > 0 {
		batch.Queue(b.sem.stmt.keep, req.Key, req.OwnerToken, micro(req.Keep))
	} else {
		batch.Queue(b.sem.stmt.release, req.Key, req.OwnerToken, b.notifyChannel())
	}
	br := b.pool.SendBatch(ctx, batch)
	live, err := permitReleased(br, req.Keep > 0)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return b.semErr(err)
	}
	b.prune(ctx)
	return released(req.Key, live)
}

// permitReleased reads releasePermit's batch: whether a live permit was
// released (or, with keep, kept).
func permitReleased(br pgx.BatchResults, keep bool) (bool, error) {
	if _, err := br.Exec(); err != nil { // the header lock
		return false, err
	}
	if keep {
		tag, err := br.Exec()
		return tag.RowsAffected() > 0, err
	}
	var live bool
	var n int64
	err := br.QueryRow().Scan(&live, &n)
	return live, err
}

// hasPermits reports whether a renewal includes permits.
func hasPermits(reqs []core.RenewRequest) bool {
	for _, r := range reqs {
		if r.Limit > 1 {
			return true
		}
	}
	return false
}

// renewWithPermits is Renew for a batch that includes permits: the header
// locks of the permits' keys, the mutex renewal (when there are mutexes)
// and the permits' renewal, in one batch: one round trip, one transaction.
func (b *Backend) renewWithPermits(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if b.sem.reason != nil {
		return nil, fmt.Errorf("pg: renew: %w", b.sem.reason)
	}
	var mk, mh, pk, ph, pm []string
	var mt, pt []int64
	for _, r := range reqs {
		if r.Limit > 1 {
			pk, ph, pt, pm = append(pk, r.Key), append(ph, r.OwnerToken), append(pt, micro(r.TTL)), append(pm, semMarkOf(r.Limit))
		} else {
			mk, mh, mt = append(mk, r.Key), append(mh, r.OwnerToken), append(mt, micro(r.TTL))
		}
	}
	lockKeys := append([]string(nil), pk...)
	slices.Sort(lockKeys)
	lockKeys = slices.Compact(lockKeys)
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.renewLock, lockKeys)
	if len(mk) > 0 {
		batch.Queue(b.stmt.renew, mk, mh, mt)
	}
	batch.Queue(b.sem.stmt.renew, pk, ph, pt, pm)
	br := b.pool.SendBatch(ctx, batch)
	type kh struct{ key, holder string }
	mutexes := make(map[kh]bool, len(mk))
	permits := make(map[kh]bool, len(pk))
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		read := func(into map[kh]bool) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k kh
				if err := rows.Scan(&k.key, &k.holder); err != nil {
					return err
				}
				into[k] = true
			}
			return rows.Err()
		}
		if len(mk) > 0 {
			if err := read(mutexes); err != nil {
				return err
			}
		}
		return read(permits)
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pg: renew: %w", b.semErr(err))
	}
	results := make([]error, len(reqs))
	for i, r := range reqs {
		renewed := mutexes
		if r.Limit > 1 {
			renewed = permits
		}
		if !renewed[kh{r.Key, r.OwnerToken}] {
			results[i] = core.Gone(r.Key, "held by another owner, expired or deleted")
		}
	}
	return results, nil
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

// Holders implements core.SemaphoreBackend: every live permit of key,
// oldest first (Info.Limit set), or the holder of a mutex; empty when the
// key is free.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	ready, err := b.semPermitsReady(ctx)
	if err != nil {
		return nil, err
	}
	if ready {
		list, err := b.queryPermits(ctx, "holders", b.sem.stmt.holders, key)
		if err != nil {
			return nil, err
		}
		if len(list) > 0 {
			return list, nil
		}
	}
	info, ok, err := b.Inspect(ctx, key)
	if err != nil || !ok {
		return nil, err
	}
	return []core.Info{info}, nil
}

// inspectPermits is Inspect of a semaphore's key: its oldest live permit.
func (b *Backend) inspectPermits(ctx context.Context, key string) (core.Info, bool, error) {
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return core.Info{}, false, err
	}
	list, err := b.queryPermits(ctx, "inspect", b.sem.stmt.holders, key)
	if err != nil || len(list) == 0 {
		return core.Info{}, false, err
	}
	return list[0], true, nil
}

// queryPermits runs stmt, a query of live permits, with arg (a key or a
// prefix) and returns them; op names the call in its error.
func (b *Backend) queryPermits(ctx context.Context, op, stmt, arg string) ([]core.Info, error) {
	rows, err := b.pool.Query(ctx, stmt, arg)
	if err == nil {
		var list []core.Info
		if list, err = scanInfos(rows, true); err == nil {
			return list, nil
		}
	}
	return nil, fmt.Errorf("pg: %s: %w", op, b.semErr(err))
}

// listPermits replaces the semaphores' header rows in list (the lock
// table's live rows whose key starts with prefix, by key) with one Info per
// live permit.
func (b *Backend) listPermits(ctx context.Context, prefix string, list []core.Info) ([]core.Info, error) {
	out := list[:0]
	headers := 0
	for _, info := range list {
		if semLimit(info.Owner) > 0 {
			headers++
			continue
		}
		out = append(out, info)
	}
	if headers == 0 {
		return out, nil
	}
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return out, err
	}
	permits, err := b.queryPermits(ctx, "list", b.sem.stmt.list, prefix)
	if err != nil {
		return nil, err
	}
	out = append(out, permits...)
	slices.SortStableFunc(out, func(a, b core.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// forceReleasePermits is ForceRelease of a semaphore's key: every permit
// and the header, in one batch. handled is false when key is not a
// semaphore's (ForceRelease then deletes the lock table's row).
func (b *Backend) forceReleasePermits(ctx context.Context, key string) (handled, released bool, err error) {
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return false, false, err
	}
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.forceLock, key)
	batch.Queue(b.sem.stmt.force, key, b.notifyChannel())
	br := b.pool.SendBatch(ctx, batch)
	err = func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		var n int64
		return br.QueryRow().Scan(&handled, &released, &n)
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, false, fmt.Errorf("pg: force release: %w", b.semErr(err))
	}
	return handled, released, nil
}
