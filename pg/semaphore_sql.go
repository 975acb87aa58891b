package pg

import (
	"fmt"
)

// The SQL of the semaphore operations (see semaphore.go for the layout of
// a semaphore's rows and the locking every statement follows).

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
	// that expires first. Its last parameter ($8, or $11 with the queue's)
	// is the claim's bound: a permit inserted later than that on the
	// server's clock, counted from the start of the batch's transaction,
	// fails the whole batch (inBound), header lock included.
	ahead, setQueue, dequeue, signal, signalled, bound := "", "", "", "", "0::bigint", "$8"
	if !legacy {
		bound = "$11"
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
	RETURNING token, acquired_at, expire_at, %[14]s AS bound
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
		t, p, exp, semSetting, remaining, hh(""), tok, acq, ahead, setQueue, dequeue, signal, signalled, inBound(bound))

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
