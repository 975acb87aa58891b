package pg

import (
	"fmt"
	"strings"
)

// statements holds the SQL of every operation, built once per Backend for its
// table. Every statement stands alone (autocommit), so it works in any query
// exec mode and behind transaction poolers.
type statements struct {
	acquire, renew, release, keep, now string
	claim                              string // acquire for a caller with no waiter: $1–$5, $6 the bound
	claimFree                          string // claim of a free row nobody waits on: $1–$4, $5 the bound ("" on the legacy table)
	releaseLive                        string // release of a live lease: release's parameters ("" on the legacy table)
	peek                               string // read of a key's holder: $1 key, $2 owner token
	inspect, list, forceRelease        string
	leave                              string // "" on the legacy table (no queue)
	prune                              string // "" on the legacy table (no tokens)
	queue                              bool   // the table has the waiters column
}

// boundPassed is the text of the error a claim raises when it would take
// effect past its bound (see inBound).
const boundPassed = "dislock: the claim timeout passed on the server"

// inBound is a RETURNING column of a claim's write: it raises an error
// (SQLSTATE 22P02, its message quoting boundPassed) when the server's
// clock, read after the write, is later than the start of the claim's
// transaction (now()) plus p microseconds, the time left of the claim
// timeout. The error aborts the statement and its transaction: the write
// never takes effect. RETURNING is evaluated for each row written, after
// any wait for its lock, and only then; a claim that writes nothing needs
// no bound. (clock_timestamp() is volatile, so the planner cannot fold the
// CASE, nor the cast of the branch it does not take.)
func inBound(p string) string {
	return `(CASE WHEN clock_timestamp() <= now() + ` + p + micros + ` THEN '0' ELSE '` + boundPassed + `' END)::int`
}

// asyncClause turns synchronous_commit off for the statement's own
// transaction. It is a conjunct of a WHERE clause that every written row
// passes, so it is evaluated whenever the statement writes.
const asyncClause = ` AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// micros converts a bigint parameter of microseconds to an interval.
const micros = `::bigint * interval '1 microsecond'`

// slotOpen refuses a claim whose absolute expiry (slot mode) is already
// past: that slot is over, and its holder let it expire. It is checked twice:
// on the statement's start (now(), so that a claim of a slot that is over
// writes nothing), and under the row's lock on the server's clock
// (slotOpenLocked), since a claim can wait for the row's lock past the end of
// its slot.
const (
	slotOpen       = `($5::timestamptz IS NULL OR $5::timestamptz > now())`
	slotOpenLocked = `($5::timestamptz IS NULL OR $5::timestamptz > clock_timestamp())`
)

// remaining is the time left on a row, in microseconds, on the server clock.
const remaining = `(extract(epoch FROM expire_at - now()) * 1000000)::bigint`

// The waiter queue (see schema.go): the waiters column is NULL when nobody
// waits, else a jsonb array, first in line first, of {"w": waiter id, "d":
// the deadline of its place, server clock in microseconds}. Whoever rewrites
// the column drops the entries whose deadline passed. These build the
// expressions on a queue column q.

// nowMicros is the statement's now() in microseconds.
const nowMicros = `(extract(epoch FROM now()) * 1000000)::bigint`

// The queue expressions use jsonpath functions, not subqueries: a subquery
// is a subplan, which the executor sets up on every execution of the
// statement, used or not, and the acquire runs them on every attempt.

// qVars are the jsonpath variables: $n the statement's now, $w waiter w.
func qVars(w string) string {
	return `jsonb_build_object('n', ` + nowMicros + `, 'w', ` + w + `)`
}

// qHead is the first live waiter of q, or NULL.
func qHead(q string) string {
	return `(jsonb_path_query_first(` + q + `, '$[*] ? (@.d > $n).w', ` + qVars("''") + `) #>> '{}')`
}

// qDeadline is the deadline of waiter w's place in q (live or not), or NULL.
func qDeadline(q, w string) string {
	return `(jsonb_path_query_first(` + q + `, '$[*] ? (@.w == $w).d', ` + qVars(w) + `))::bigint`
}

// qWithout is q without waiter w and without the expired places; NULL when
// nobody is left.
func qWithout(q, w string) string {
	return `nullif(jsonb_path_query_array(` + q + `, '$[*] ? (@.d > $n && @.w != $w)', ` + qVars(w) + `), '[]'::jsonb)`
}

// qWith is q with waiter w's deadline set to d: in its place when it has a
// live one (its entry, whose text is canonical jsonb and unique in the
// queue, is replaced in the queue's text), else at the tail of the live
// places.
func qWith(q, w, d string) string {
	old := qDeadline(q, w)
	entry := func(d string) string { return `jsonb_build_object('d', ` + d + `, 'w', ` + w + `)` }
	return `CASE WHEN coalesce(` + old + `, 0) <= ` + nowMicros + `
		THEN coalesce(jsonb_path_query_array(` + q + `, '$[*] ? (@.d > $n)', ` + qVars(w) + `), '[]'::jsonb) || jsonb_build_array(` + entry(d) + `)
		ELSE replace(` + q + `::text, ` + entry(old) + `::text, ` + entry(d) + `::text)::jsonb END`
}

// leaveSQL is the statement of Leave ($1 key, $2 waiter, $3 channel) on
// table: it takes $2 out of the key's queue and, when $2 was first in line
// and the key can be claimed (claimable, a condition on the row l as
// updated), notifies the next live waiter.
func leaveSQL(table, claimable string) string {
	return fmt.Sprintf(`WITH cur AS (
	SELECT %[2]s AS head FROM %[1]s WHERE key = $1::text
), upd AS (
	UPDATE %[1]s AS l SET waiters = %[3]s
	WHERE l.key = $1::text AND l.waiters IS NOT NULL
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(l.waiters) AS x(e) WHERE e->>'w' = $2::text)%[5]s
	RETURNING l.key, %[7]s AS free, %[4]s AS head
)
SELECT pg_notify($3::text, %[6]s) FROM upd
WHERE $3::text <> '' AND free AND head IS NOT NULL AND (SELECT head FROM cur) = $2::text`,
		table, qHead("waiters"), qWithout("l.waiters", "$2::text"), qHead("waiters"), asyncClause, turnPayload("key", "head"), claimable)
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
	insertCols := "key, owner, holder, token, acquired_at, expire_at"
	insertVals := "$1::text, $2::text, $3::text, " + tokenDefault + ", now(), " + expire
	if legacy {
		// value is "<owner token> <owner>": the token guards renew and
		// release, the rest is the human-readable owner. Rows written by
		// the older tool have no such token, so they never match ours.
		owner, holder, lholder = "substr(value, strpos(value, ' ') + 1)", "split_part(value, ' ', 1)", "split_part(l.value, ' ', 1)"
		token, acquiredAt = "0::bigint", "NULL::timestamptz"
		insertCols = "key, value, expire_at"
		insertVals = "$1::text, $3::text || ' ' || $2::text, " + expire
	}
	s := statements{queue: queue}
	// Acquire reads the row first (cur) and writes only when that read
	// says a write is due: the key is missing, or free or expired (and,
	// with the queue, this caller may take it), or a waiter's place must be
	// taken or refreshed. A live row, whoever holds it, is answered from
	// that read alone: no row lock, no write, no commit flush (a live row
	// with the caller's own owner token is an idempotent success). The one
	// write is an INSERT … ON CONFLICT (key) DO UPDATE whose WHERE and SET
	// look at the latest row version (locked): a missing key is inserted; a
	// row that is free or expired there is taken over (C below) by one of
	// several concurrent takers, the others finding it held; with the
	// queue, a row this caller may not take gets its place in line (E). A
	// claim for a slot that is already over (slotOpen) writes nothing, and
	// one whose slot ended while it waited for the row's lock takes nothing.
	//
	// The fencing token is decided under the row's lock: a takeover sets it
	// to greatest(server clock in µs, the row's last token + 1), the clock
	// read once the lock is held (a proposed row's clock, read before the
	// statement waited for the row, can be older than the token of a claim
	// that won the key meanwhile). Rows are never deleted while such a
	// claim can still be running (a release ends its row and keeps its
	// token; see prune), so a claim inserts a row only for a key whose last
	// token is older than its own clock reading. The legacy table has no
	// tokens, and its releases delete the row.
	//
	// Losing the race for a free row answers busy, holder
	// unknown; ON CONFLICT has locked the row the winner wrote, a lock-only
	// transaction (or, with the queue, one that gives a waiter its place in
	// line there), which the WHERE's ELSE branch commits without waiting for
	// the flush (a CASE evaluates only the branch it takes, so a takeover
	// keeps the Backend's durability).
	//
	// A row that w writes (taken, or a place in line) is checked against
	// the claim's bound in its RETURNING (inBound), once its lock is held
	// and the row written: a claim that got there too late fails, writing
	// nothing. (enq writes only a place in line, soft state that no undo
	// removes either.)
	//
	// One row comes back (v LEFT JOIN cur LEFT JOIN w): the write's outcome
	// (won: this caller holds the row it wrote) and what cur read. No
	// subqueries, so no subplan is set up per execution.
	//
	// With the queue ($6 the waiter, '' for none; $7 its place's TTL in
	// microseconds), a free or expired row goes only to its first live
	// waiter, or to anyone when no live waiter is queued; the takeover
	// drops the claimant and the expired places from the queue. A waiter
	// that finds the key held, or free but not its turn, takes a place at
	// the tail or keeps its own; its deadline is written only when less than
	// half of $7 is left of it, so a waiter's repeated busy tries are reads,
	// and that write commits without waiting for the flush (a place in line
	// is soft state, see above).
	take := "l.expire_at <= now() AND " + slotOpenLocked
	gate := "c.expire_at IS NULL OR c.expire_at <= now()"
	cols := insertCols
	sets := "owner = excluded.owner, holder = excluded.holder, token = greatest(" + tokenDefault + ", l.token + 1), acquired_at = excluded.acquired_at, expire_at = excluded.expire_at"
	won := "l.holder = $3::text"
	if legacy {
		sets = "value = excluded.value, expire_at = excluded.expire_at"
		won = "split_part(l.value, ' ', 1) = $3::text"
	}
	enq := ""
	// lost is the write of a claim that found the row taken: none, but
	// the lock ON CONFLICT took commits without waiting for the flush.
	lost := "set_config('synchronous_commit', 'off', true) IS NULL"
	if queue {
		turn := func(r string) string { return "coalesce(" + qHead(r+".waiters") + " = $6::text, true)" }
		take += " AND " + turn("l")
		gate = "c.expire_at IS NULL OR (c.expire_at <= now() AND " + turn("c") + ")"
		// A waiter not holding a live row, whose place is missing, expired
		// or half gone, on a row it may not take (as cur read it, so that
		// w and enq never both write).
		// A live semaphore header (semaphore.go) gets no place: the
		// claim fails with core.LimitMismatch, queuing nothing.
		due := func(r string) string {
			return "NOT (" + r + ".holder = $3::text AND " + r + ".expire_at > now()) AND NOT (starts_with(" + r + ".holder, '" + semMark + "') AND " + r + ".expire_at > now()) AND coalesce(" +
				qDeadline(r+".waiters", "$6::text") + ", 0) < " + nowMicros + " + $7::bigint / 2"
		}
		// A claim that read the row as missing or claimable but lost it
		// to a concurrent claim (the row ON CONFLICT locked is held, or
		// free but another waiter's turn) queues there, in the same
		// write: enq cannot, since the statement's snapshot may not even
		// see the row (a key never used before), and a waiter that is
		// not queued is told nothing and waits for its poll. claimable
		// tells the two writes apart in SET: it holds for a takeover and
		// not for a place in line (a claimable row whose slot is over is
		// neither, and is not written).
		claimable := "l.expire_at <= now() AND " + turn("l")
		pick := func(col, taken string) string {
			return col + " = CASE WHEN " + claimable + " THEN " + taken + " ELSE l." + col + " END"
		}
		sets = strings.Join([]string{pick("owner", "excluded.owner"), pick("holder", "excluded.holder"),
			pick("token", "greatest("+tokenDefault+", l.token + 1)"), pick("acquired_at", "excluded.acquired_at"),
			pick("expire_at", "excluded.expire_at"),
			"waiters = CASE WHEN " + claimable + " THEN " + qWithout("l.waiters", "$6::text") +
				" ELSE " + qWith("l.waiters", "$6::text", nowMicros+" + $7::bigint") + " END"}, ", ")
		lost = "CASE WHEN set_config('synchronous_commit', 'off', true) IS NULL THEN false ELSE $6::text <> '' AND NOT (" + claimable + ") AND " + due("l") + " END"
		enq = fmt.Sprintf(`, enq AS (
	UPDATE %[1]s AS l SET waiters = %[2]s
	FROM cur AS c
	WHERE l.key = $1::text AND $6::text <> '' AND NOT (%[3]s) AND %[4]s AND %[5]s%[6]s
)`, table, qWith("l.waiters", "$6::text", nowMicros+" + $7::bigint"), gate, due("c"), due("l"), asyncClause)
	}
	curCols := fmt.Sprintf("%s AS owner, %s AS holder, %s AS token, %s AS acquired_at, expire_at", owner, holder, token, acquiredAt)
	if queue {
		curCols += ", waiters"
	}
	acquire := func(take, gate, sets, enq, lost, bound string) string {
		return fmt.Sprintf(`WITH cur AS (
	SELECT %[2]s FROM %[1]s WHERE key = $1::text
), w AS (
	INSERT INTO %[1]s AS l (%[3]s)
	SELECT %[4]s
	FROM (VALUES (1)) AS v LEFT JOIN cur AS c ON true
	WHERE %[5]s AND (%[6]s)%[7]s
	ON CONFLICT (key) DO UPDATE SET %[8]s
	WHERE CASE WHEN %[9]s THEN true%[7]s ELSE %[15]s END
	RETURNING %[11]s AS won, %[12]s AS token, coalesce(%[13]s, now()) AS acquired_at, l.expire_at, %[16]s AS bound
)%[10]s
SELECT coalesce(w.won, false), w.token, w.acquired_at, w.expire_at,
	c.expire_at > now(), c.holder = $3::text, c.owner, c.token, c.acquired_at, c.expire_at, %[14]s
FROM (VALUES (1)) AS v LEFT JOIN cur AS c ON true LEFT JOIN w ON true`,
			table, curCols, cols, insertVals, slotOpen, gate, ac, sets, take, enq,
			won, strings.Replace(token, "token", "l.token", 1), strings.Replace(acquiredAt, "acquired_at", "l.acquired_at", 1),
			"CASE WHEN c.expire_at > now() THEN "+strings.ReplaceAll(remaining, "expire_at", "c.expire_at")+" END", lost, inBound(bound))
	}
	// The bound (inBound) follows the other parameters: $8 with the
	// queue's branches, else $6.
	bound := "$6"
	if queue {
		bound = "$8"
	}
	s.acquire = acquire(take, gate, sets, enq, lost, bound)
	s.claim = s.acquire
	if queue {
		// claim is acquire for a caller with no waiter ($6 = ''), with
		// the waiter's branches taken out ($1–$5, then the bound): a free or expired
		// row is taken only when no live waiter is queued, and the
		// takeover empties the queue, which then holds only expired
		// places; a claim that may not take the row writes nothing. The
		// executor sets up every expression of a statement on each
		// execution, taken or not, so the waiter's (qWith, due, enq) would
		// cost every TryAcquire: about 60 µs of server CPU of the 180 an
		// acquire and release took (PostgreSQL 15, see BENCHMARKS.md).
		free := func(r string) string { return "(" + r + ".waiters IS NULL OR " + qHead(r+".waiters") + " IS NULL)" }
		s.claim = acquire("l.expire_at <= now() AND "+slotOpenLocked+" AND "+free("l"),
			"c.expire_at IS NULL OR (c.expire_at <= now() AND "+free("c")+")",
			"owner = excluded.owner, holder = excluded.holder, token = greatest("+tokenDefault+", l.token + 1), acquired_at = excluded.acquired_at, expire_at = excluded.expire_at, waiters = NULL",
			"", "set_config('synchronous_commit', 'off', true) IS NULL", "$6")
	}

	s.renew = fmt.Sprintf(`UPDATE %[1]s AS l SET expire_at = now() + r.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, holder, ttl)
WHERE l.key = r.key AND %[2]s = r.holder AND l.expire_at > now()%[3]s
RETURNING l.key, r.holder`, table, lholder, ac)

	s.keep = fmt.Sprintf(`UPDATE %[1]s SET expire_at = now() + $3%[4]s
WHERE key = $1::text AND %[2]s = $2::text AND expire_at > now()%[3]s`, table, holder, ac, micros)

	// peek reads the row alone: no lock, no write, no set_config (see
	// peek.go). Its columns are the acquire's cur columns.
	s.peek = fmt.Sprintf(`SELECT expire_at > now(), %[2]s = $2::text, %[3]s, %[4]s, %[5]s, expire_at, %[6]s FROM %[1]s WHERE key = $1::text`,
		table, holder, owner, token, acquiredAt, "CASE WHEN expire_at > now() THEN "+remaining+" END")
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
		// An empty channel (WithoutNotify) sends none. Its row says
		// whether the row deleted was a live lease (see releaseStmt).
		s.release = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text AND %[2]s = $2::text%[3]s RETURNING key, expire_at > now() AS live
), n AS (
	SELECT pg_notify($3::text, key) FROM d WHERE $3::text <> ''
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`, table, holder, asyncClause)

		s.forceRelease = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key = $1::text%[2]s RETURNING key, expire_at > now() AS live
), n AS (
	SELECT pg_notify($2::text, key) FROM d WHERE live AND $2::text <> ''
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`, table, asyncClause)
		return s
	}

	// With the queue, a release ends the row: it keeps the key's last token
	// (see prune) with an empty holder and expire_at '-infinity', drops the
	// expired places from the queue, and notifies the first live waiter,
	// and only then: a release with nobody queued sends no notification,
	// so it takes no database-wide notify lock through its commit. The
	// UPDATE locks the row and writes its latest version, so a waiter that
	// queued concurrently is kept.
	end := func(l string) string {
		return `owner = '', holder = '', expire_at = '-infinity', waiters = ` + qWithout(l+".waiters", "''")
	}
	// Its row says whether the row ended was a live lease: an expired
	// one of this owner token is ended all the same, but was not held to
	// the end. (o reads, and locks, the row's latest version.)
	s.release = fmt.Sprintf(`WITH o AS (
	SELECT key, expire_at > now() AS live FROM %[1]s WHERE key = $1::text AND holder = $2::text FOR UPDATE
), d AS (
	UPDATE %[1]s AS l SET %[2]s FROM o
	WHERE l.key = o.key AND l.holder = $2::text%[3]s RETURNING l.key, o.live, %[4]s AS head
), n AS (
	SELECT pg_notify($3::text, %[5]s) FROM d WHERE $3::text <> '' AND head IS NOT NULL
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`,
		table, end("l"), asyncClause, qHead("l.waiters"), turnPayload("key", "head"))

	// releaseLive is release for a live lease of the owner token: one
	// UPDATE, with no read before it and no CTE, that ends the row as
	// release does and tells the first live waiter from its RETURNING. It
	// returns no row when the owner token holds no live lease there
	// (expired, another's, gone): release then decides, and answers.
	// The queue's expressions are behind CASEs that test the column for
	// NULL first: a CASE evaluates only the branch it takes, and with
	// nobody in line they would cost a fifth of the pair's server CPU.
	s.releaseLive = fmt.Sprintf(`UPDATE %[1]s AS l SET owner = '', holder = '', expire_at = '-infinity',
	waiters = CASE WHEN l.waiters IS NULL THEN NULL ELSE %[2]s END
WHERE key = $1::text AND holder = $2::text AND expire_at > now()%[3]s
RETURNING (CASE WHEN l.waiters IS NULL OR $3::text = '' THEN NULL WHEN %[4]s IS NOT NULL THEN pg_notify($3::text, %[5]s) END) IS NULL`,
		table, qWithout("l.waiters", "''"), asyncClause, qHead("l.waiters"), turnPayload("l.key", qHead("l.waiters")))

	// claimFree is claim for a key whose row is there ($1 key, $2 owner,
	// $3 owner token, $4 TTL µs, $5 the bound): one UPDATE of the row, with
	// no read before it, no INSERT and no CTE. It takes the row only when
	// the row is free or expired and nobody is in line (waiters IS NULL,
	// so no live waiter is passed over), deciding the token under the
	// row's lock as a takeover does, and checks the claim's bound as claim
	// does. It returns no row when the key is held, has a queue, or has
	// no row: claim then decides, and answers.
	s.claimFree = fmt.Sprintf(`UPDATE %[1]s AS l SET owner = $2::text, holder = $3::text, token = greatest(%[2]s, l.token + 1),
	acquired_at = now(), expire_at = now() + $4%[3]s
WHERE key = $1::text AND expire_at <= now() AND waiters IS NULL%[4]s
RETURNING l.token, l.acquired_at, l.expire_at, %[5]s`, table, tokenDefault, micros, ac, inBound("$5"))

	// ForceRelease ends the row whoever holds it, keeping the queue and the
	// token, and tells its first live waiter. (o reads, and locks, the
	// row's latest version: whether it was live.)
	s.forceRelease = fmt.Sprintf(`WITH o AS (
	SELECT key, expire_at > now() AS live FROM %[1]s WHERE key = $1::text FOR UPDATE
), d AS (
	UPDATE %[1]s AS l SET %[2]s FROM o
	WHERE l.key = o.key%[3]s RETURNING l.key, o.live, %[4]s AS head
), n AS (
	SELECT pg_notify($2::text, %[5]s) FROM d WHERE $2::text <> '' AND head IS NOT NULL
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM n) FROM d`,
		table, end("l"), asyncClause, qHead("l.waiters"), turnPayload("key", "head"))

	// Leave takes $2 out of the queue of $1. When $2 was first in line and
	// the key is free, the next live waiter is told. The row stays when its
	// queue empties, with its token (see prune).
	s.leave = leaveSQL(table, "l.expire_at <= now()")

	// prune ($1 the horizon in µs, $2 the most rows to delete) deletes
	// ended rows (free or expired, nobody live in line) whose token is
	// older than the horizon. A claim that read the clock before such a
	// row's token was read can no longer take effect by then (its bound,
	// inBound, is at most the longest claim timeout, and the horizon is
	// longer; see pruneAfter), so every claim that can still insert the
	// key reads a newer clock.
	// SKIP LOCKED: a row that a claim is taking over right now is left for
	// the next prune, and the prune waits for no one.
	s.prune = fmt.Sprintf(`WITH d AS (
	DELETE FROM %[1]s WHERE key IN (
		SELECT key FROM %[1]s
		WHERE expire_at <= now() AND token < %[2]s - $1::bigint AND %[3]s IS NULL
		LIMIT $2::int FOR UPDATE SKIP LOCKED)%[4]s
	RETURNING key
)
SELECT count(*) FROM d`, table, nowMicros, qHead("waiters"), asyncClause)
	return s
}
