package pg

import "fmt"

// statements holds the SQL of every operation, built once per Backend for its
// table. Every statement stands alone (autocommit), so it works in any query
// exec mode and behind transaction poolers; only the acquire is preceded by
// bound, in one batch that is one implicit transaction and one round trip.
type statements struct {
	bound, acquire, renew, release, keep, now string
	inspect, list, forceRelease               string
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

func buildStatements(table string, legacy, async bool) statements {
	ac := ""
	if async {
		ac = asyncClause
	}
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
	s := statements{bound: bound}
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
	// the server clock in microseconds in tables Migrate creates).
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
	WHERE l.key = $1::text AND l.expire_at <= now() AND %[11]s%[8]s
	RETURNING %[4]s AS token, %[5]s AS acquired_at, expire_at
)
SELECT true, $2::text, token, coalesce(acquired_at, now()), expire_at, 0::bigint FROM ins
UNION ALL
SELECT true, $2::text, token, coalesce(acquired_at, now()), expire_at, 0::bigint FROM upd
UNION ALL
SELECT holder = $3::text, owner, token, acquired_at, expire_at, %[10]s
FROM cur WHERE expire_at > now()`,
		table, owner, holder, token, acquiredAt, insertCols, insertVals, ac, set, remaining, slotOpen)

	s.renew = fmt.Sprintf(`UPDATE %[1]s AS l SET expire_at = now() + r.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, holder, ttl)
WHERE l.key = r.key AND %[2]s = r.holder AND l.expire_at > now()%[3]s
RETURNING l.key, r.holder`, table, lholder, ac)

	// The notification is sent when the statement's transaction commits;
	// the payload is the key (at most 1024 bytes, under pg_notify's 8000).
	// An empty channel (WithoutNotify) sends none.
	s.release = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text AND %[2]s = $2::text%[3]s RETURNING key
)
SELECT pg_notify($3::text, key) FROM d WHERE $3::text <> ''`, table, holder, ac)

	s.keep = fmt.Sprintf(`UPDATE %[1]s SET expire_at = now() + $3%[4]s
WHERE key = $1::text AND %[2]s = $2::text AND expire_at > now()%[3]s`, table, holder, ac, micros)

	s.now = `SELECT now()`

	s.inspect = fmt.Sprintf(`SELECT %[2]s, %[3]s, %[4]s, expire_at, %[5]s
FROM %[1]s WHERE key = $1::text AND expire_at > now()`, table, owner, token, acquiredAt, remaining)

	s.list = fmt.Sprintf(`SELECT key, %[2]s, %[3]s, %[4]s, expire_at, %[5]s
FROM %[1]s WHERE starts_with(key, $1::text) AND expire_at > now() ORDER BY key`,
		table, owner, token, acquiredAt, remaining)

	s.forceRelease = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text RETURNING key, expire_at > now() AS live
), n AS (
	SELECT pg_notify($2::text, key) FROM d WHERE live AND $2::text <> ''
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`, table)
	return s
}
