package pg

import "fmt"

// statements holds the SQL of every operation, built once per Backend for its
// table. Every statement stands alone (autocommit), so it works in any query
// exec mode and behind transaction poolers; only the acquire is preceded by
// bound, in one batch that is one implicit transaction and one round trip.
type statements struct {
	bound, acquire, renew, release, keep, now string
	inspect, list, forceRelease               string
	leave                                     string // "" on the legacy table (no queue)
	queue                                     bool   // the table has the waiters column
}

// bound sets statement_timeout, for its own transaction only, to $1
// milliseconds (text), or keeps the current setting when that is lower (and
// not 0, which means none; the common case, tested first because it is
// cheapest). Sent in one batch before the acquire, it arms the server's
// timer for the acquire: the server starts a fresh statement timer for each
// statement of a pipeline (extended protocol) or of a multi-statement query
// (simple protocol), and commits or rolls back the whole batch at its end, so
// no setting outlives it.
const bound = `SELECT set_config('statement_timeout', CASE WHEN current_setting('statement_timeout') = '0' THEN $1::text
	ELSE least((extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::bigint, $1::text::bigint)::text END, true)`

// asyncClause turns synchronous_commit off for the statement's own
// transaction. It is a conjunct of a WHERE clause that every written row
// passes, so it is evaluated whenever the statement writes.
const asyncClause = ` AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// micros converts a bigint parameter of microseconds to an interval.
const micros = `::bigint * interval '1 microsecond'`

// slotOpen refuses a claim whose absolute expiry (slot mode) is already
// past: that slot is over, and its holder let it expire.
const slotOpen = `($5::timestamptz IS NULL OR $5::timestamptz > now())`

// remaining is the time left on a row, in microseconds, on the server clock.
const remaining = `(extract(epoch FROM expire_at - now()) * 1000000)::bigint`

// The waiter queue (see schema.go): the waiters column is NULL when nobody
// waits, else a jsonb array, first in line first, of {"w": waiter id, "d":
// the deadline of its place, server clock in microseconds}. Whoever rewrites
// the column drops the entries whose deadline passed. These build the
// expressions on a queue column q.

// nowMicros is the statement's now() in microseconds.
const nowMicros = `(extract(epoch FROM now()) * 1000000)::bigint`

// qHead is the first live waiter of q, or NULL.
func qHead(q string) string {
	return `(SELECT e->>'w' FROM jsonb_array_elements(` + q + `) WITH ORDINALITY AS x(e, i)
		WHERE (e->>'d')::bigint > ` + nowMicros + ` ORDER BY i LIMIT 1)`
}

// qDeadline is the deadline of waiter w's place in q (live or not), or NULL.
func qDeadline(q, w string) string {
	return `(SELECT (e->>'d')::bigint FROM jsonb_array_elements(` + q + `) AS x(e) WHERE e->>'w' = ` + w + ` LIMIT 1)`
}

// qWithout is q without waiter w and without the expired places; NULL when
// nobody is left.
func qWithout(q, w string) string {
	return `(SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(` + q + `) WITH ORDINALITY AS x(e, i)
		WHERE (e->>'d')::bigint > ` + nowMicros + ` AND e->>'w' <> ` + w + `)`
}

// qWith is q without the expired places, with waiter w's deadline set to d:
// in its place when it has a live one, else at the tail.
func qWith(q, w, d string) string {
	live := `(e->>'d')::bigint > ` + nowMicros
	return `coalesce((SELECT jsonb_agg(CASE WHEN e->>'w' = ` + w + ` THEN jsonb_build_object('w', ` + w + `, 'd', ` + d + `) ELSE e END ORDER BY i)
		FROM jsonb_array_elements(` + q + `) WITH ORDINALITY AS x(e, i) WHERE ` + live + `), '[]'::jsonb)
	|| CASE WHEN EXISTS (SELECT 1 FROM jsonb_array_elements(` + q + `) AS x(e) WHERE e->>'w' = ` + w + ` AND ` + live + `)
		THEN '[]'::jsonb ELSE jsonb_build_array(jsonb_build_object('w', ` + w + `, 'd', ` + d + `)) END`
}

// turnPayload is the notification of a turn: the waiter's length in bytes,
// a colon, the waiter and the key (see parseTurn).
func turnPayload(key, waiter string) string {
	return `octet_length(` + waiter + `)::text || ':' || ` + waiter + ` || ` + key
}

// Durability: acquires and renewals commit with the Backend's setting
// (durable unless WithAsyncCommit), because losing one in a database crash
// could let two owners hold a key: a renewal lost shortens a lease its
// holder counts on. Every other write commits with synchronous_commit = off
// (asyncClause) in every mode, since losing it only delays others: a
// release, ForceRelease or Leave lost in a crash leaves the key held until
// its TTL (as a release that never arrived does) or a waiter's place until
// its own TTL, and a place in line is refreshed by the waiter's next try.
// No claim can outlive such a crash without the release before it: the
// claim saw the release, so the release's commit record precedes the
// claim's in the WAL, and the claim's flush (or a synchronous standby's
// confirmation) covers both. So a release waits for no WAL flush, holds
// the notify lock (pg_notify's database-wide lock, held from commit through
// the flush) only for moments, and a queued waiter's write to the hot row
// does not hold its row lock through a flush either.
func buildStatements(table string, legacy, async bool) statements {
	ac := ""
	if async {
		ac = asyncClause
	}
	queue := !legacy
	// Column roles: the human-readable owner, the owner token, the fencing
	// token and the acquisition time. The legacy table keeps only the owner
	// token (in value).
	owner, holder, lholder, token, acquiredAt := "owner", "holder", "l.holder", "token", "acquired_at"
	expire := "coalesce($5::timestamptz, now() + $4" + micros + ")"
	insertCols := "key, owner, holder, acquired_at, expire_at"
	insertVals := "$1::text, $2::text, $3::text, now(), " + expire
	set := "owner = $2::text, holder = $3::text, token = DEFAULT, acquired_at = now(), expire_at = " + expire
	if legacy {
		// value is "<owner token> <owner>": the token guards renew and
		// release, the rest is the human-readable owner. Rows written by
		// the older tool have no such token, so they never match ours.
		owner, holder, lholder = "substr(value, strpos(value, ' ') + 1)", "split_part(value, ' ', 1)", "split_part(l.value, ' ', 1)"
		token, acquiredAt = "0::bigint", "NULL::timestamptz"
		insertCols = "key, value, expire_at"
		insertVals = "$1::text, $3::text || ' ' || $2::text, " + expire
		set = "value = $3::text || ' ' || $2::text, expire_at = " + expire
	}
	s := statements{bound: bound, queue: queue}
	// Acquire reads the row first (cur). A live row, whoever holds it, is
	// answered from that read alone: no row lock, no write, no commit flush
	// (a live row with the caller's own owner token is an idempotent
	// success). A missing row is inserted with ON CONFLICT DO NOTHING, so a
	// concurrent inserter makes this one busy without taking a lock. An
	// expired row is taken over by an UPDATE whose WHERE re-checks the expiry
	// on the latest row version (READ COMMITTED re-evaluation), so of several
	// concurrent takeovers one wins and the others skip the row without
	// locking it. Losing such a race yields no result row: busy, holder
	// unknown. A claim for a slot that is already over (slotOpen) is refused
	// the same way. The fencing token is the column's default (DEFAULT:
	// the server clock in microseconds in tables Migrate creates). The
	// writes are gated on what cur read (uncorrelated EXISTS: evaluated once,
	// before any scan), so a busy answer costs the one indexed read.
	//
	// With the queue ($6 the waiter, '' for none; $7 its place's TTL in
	// microseconds), a free or expired row is claimable only by its first
	// live waiter, or by anyone when no live waiter is queued; the takeover
	// drops the claimant and the expired places from the queue. A waiter
	// that finds the key held, or free but not its turn, takes a place at
	// the tail or keeps its own (enq); its deadline is written only when
	// less than half of $7 is left of it, so the busy tries of a waiter
	// that keeps trying are reads. upd and enq never both match one row
	// version: their conditions exclude each other.
	claimTurn, enq := "", ""
	if queue {
		claimTurn = ` AND coalesce(` + qHead("l.waiters") + ` = $6::text, true)`
		enq = fmt.Sprintf(`, enq AS (
	UPDATE %[1]s AS l SET waiters = %[2]s
	WHERE l.key = $1::text AND $6::text <> '' AND EXISTS (SELECT 1 FROM cur)
		AND NOT (l.holder = $3::text AND l.expire_at > now())
		AND (l.expire_at > now() OR %[3]s <> $6::text)
		AND coalesce(%[4]s, 0) < %[5]s + $7::bigint / 2%[6]s
	RETURNING 1
)`, table, qWith("l.waiters", "$6::text", nowMicros+" + $7::bigint"), qHead("l.waiters"), qDeadline("l.waiters", "$6::text"), nowMicros, asyncClause)
		set += ", waiters = " + qWithout("l.waiters", "$6::text")
	}
	s.acquire = fmt.Sprintf(`WITH cur AS (
	SELECT %[2]s AS owner, %[3]s AS holder, %[4]s AS token, %[5]s AS acquired_at, expire_at
	FROM %[1]s WHERE key = $1::text
), ins AS (
	INSERT INTO %[1]s AS l (%[6]s)
	SELECT %[7]s
	WHERE NOT EXISTS (SELECT 1 FROM cur) AND %[11]s%[8]s
	ON CONFLICT (key) DO NOTHING
	RETURNING %[4]s AS token, %[5]s AS acquired_at, expire_at
), upd AS (
	UPDATE %[1]s AS l SET %[9]s
	WHERE l.key = $1::text AND EXISTS (SELECT 1 FROM cur WHERE expire_at <= now())
		AND l.expire_at <= now() AND %[11]s%[12]s%[8]s
	RETURNING %[4]s AS token, %[5]s AS acquired_at, expire_at
)%[13]s
SELECT true, $2::text, token, coalesce(acquired_at, now()), expire_at, 0::bigint FROM ins
UNION ALL
SELECT true, $2::text, token, coalesce(acquired_at, now()), expire_at, 0::bigint FROM upd
UNION ALL
SELECT holder = $3::text, owner, token, acquired_at, expire_at, %[10]s
FROM cur WHERE expire_at > now()`,
		table, owner, holder, token, acquiredAt, insertCols, insertVals, ac, set, remaining, slotOpen, claimTurn, enq)

	s.renew = fmt.Sprintf(`UPDATE %[1]s AS l SET expire_at = now() + r.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, holder, ttl)
WHERE l.key = r.key AND %[2]s = r.holder AND l.expire_at > now()%[3]s
RETURNING l.key, r.holder`, table, lholder, ac)

	s.keep = fmt.Sprintf(`UPDATE %[1]s SET expire_at = now() + $3%[4]s
WHERE key = $1::text AND %[2]s = $2::text AND expire_at > now()%[3]s`, table, holder, ac, micros)

	s.now = `SELECT now()`

	s.inspect = fmt.Sprintf(`SELECT %[2]s, %[3]s, %[4]s, expire_at, %[5]s
FROM %[1]s WHERE key = $1::text AND expire_at > now()`, table, owner, token, acquiredAt, remaining)

	s.list = fmt.Sprintf(`SELECT key, %[2]s, %[3]s, %[4]s, expire_at, %[5]s
FROM %[1]s WHERE starts_with(key, $1::text) AND expire_at > now() ORDER BY key`,
		table, owner, token, acquiredAt, remaining)

	if !queue {
		// The legacy table has no queue: every release notifies (the
		// payload is the key alone), so that waiters in every process
		// wake. The notification is sent when the statement's transaction
		// commits; the key is at most 1024 bytes, under pg_notify's 8000.
		// An empty channel (WithoutNotify) sends none.
		s.release = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text AND %[2]s = $2::text%[3]s RETURNING key
)
SELECT pg_notify($3::text, key) FROM d WHERE $3::text <> ''`, table, holder, asyncClause)

		s.forceRelease = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text%[2]s RETURNING key, expire_at > now() AS live
), n AS (
	SELECT pg_notify($2::text, key) FROM d WHERE live AND $2::text <> ''
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`, table, asyncClause)
		return s
	}

	// With the queue, a release deletes the row; when live waiters are
	// queued it puts back a free row (holder '', expired) that keeps them,
	// and notifies the first of them, and only then: a release with nobody
	// queued sends no notification, so it takes no database-wide notify
	// lock through its commit. The DELETE locks the row and returns its
	// latest version, so a waiter that queued concurrently is kept. A
	// waiter whose enq meets the deleted row finds nothing to update and is
	// answered busy; its next try queues it.
	refill := func(from string) string {
		return fmt.Sprintf(`q AS (
	SELECT key, %[2]s AS waiters FROM %[3]s WHERE waiters IS NOT NULL
), i AS (
	INSERT INTO %[1]s (key, owner, holder, acquired_at, expire_at, waiters)
	SELECT key, '', '', now(), '-infinity', waiters FROM q WHERE waiters IS NOT NULL
	ON CONFLICT (key) DO NOTHING
	RETURNING key, %[4]s AS head
)`, table, qWithout("waiters", "''"), from, qHead("waiters"))
	}
	s.release = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text AND holder = $2::text%[2]s RETURNING key, waiters
), %[3]s
SELECT pg_notify($3::text, %[4]s) FROM i WHERE $3::text <> '' AND head IS NOT NULL`,
		table, asyncClause, refill("d"), turnPayload("key", "head"))

	// ForceRelease frees the key whoever holds it, keeping the queue, and
	// tells its first live waiter.
	s.forceRelease = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text%[4]s RETURNING key, waiters, expire_at > now() AS live
), %[2]s, n AS (
	SELECT pg_notify($2::text, %[3]s) FROM i WHERE $2::text <> '' AND head IS NOT NULL
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`,
		table, refill("d"), turnPayload("key", "head"), asyncClause)

	// Leave takes $2 out of the queue of $1. When $2 was first in line and
	// the key is free, the next live waiter is told; a free row whose queue
	// empties is deleted. (Its two writes exclude each other on any row
	// version.)
	s.leave = fmt.Sprintf(`WITH cur AS (
	SELECT %[2]s AS head, expire_at <= now() AS free FROM %[1]s WHERE key = $1::text
), del AS (
	DELETE FROM %[1]s AS l
	WHERE l.key = $1::text AND l.waiters IS NOT NULL AND l.expire_at <= now()
		AND %[3]s IS NULL%[5]s
	RETURNING 1
), upd AS (
	UPDATE %[1]s AS l SET waiters = %[3]s
	WHERE l.key = $1::text AND l.waiters IS NOT NULL
		AND NOT (l.expire_at <= now() AND %[3]s IS NULL)
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(l.waiters) AS x(e) WHERE e->>'w' = $2::text)%[5]s
	RETURNING l.key, l.expire_at <= now() AS free, %[4]s AS head
)
SELECT pg_notify($3::text, %[6]s) FROM upd
WHERE $3::text <> '' AND free AND head IS NOT NULL AND (SELECT head FROM cur) = $2::text`,
		table, qHead("waiters"), qWithout("l.waiters", "$2::text"), qHead("waiters"), asyncClause, turnPayload("key", "head"))
	return s
}
