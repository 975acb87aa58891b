package mysqllock

import "strings"

// The stored procedures Migrate installs next to the lock table. Each
// operation is one CALL: one round trip, one transaction, every decision
// taken on the server's clock under the key's row lock. MySQL has no
// RETURNING, and a multi-statement batch would need multiStatements=true
// on the caller's DSN (and then cannot be a prepared statement); a CALL
// runs in any DSN and is prepared once per connection.
//
// Written for MySQL 8.0 (8.0.14 or newer: JSON_TABLE, JSON_ARRAYAGG) and
// MariaDB 10.6 or newer; nothing in them is MariaDB-only. Every
// transaction runs at READ COMMITTED, so that the waiter and permit rows
// of a key, read under the key's row lock, are read as last committed and
// no gap lock ties one key's writes to another's (the binary log must then
// be in ROW or MIXED format, the default of both servers).
//
// Times are BIGINT microseconds since the Unix epoch, from
// UTC_TIMESTAMP(6), which both servers evaluate afresh for each statement
// of a procedure: the clock a claim decides with is read after its row
// lock is granted, never before the wait for it.
//
// Placeholders: {T} the lock table, {P} its permits, {W} its waiters, {N}
// its turns, {R} its watchers (all quoted), {p}name a procedure of the same
// table, {version} the procedures' version (their comment).

// nowSQL is the server's clock in microseconds since the epoch.
const nowSQL = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

// procVersion is each procedure's COMMENT: NewBackend checks it, so that a
// table migrated by another version of this package is reported with the
// fix (run Migrate) instead of misbehaving.
const procVersion = "dislock mysqllock 3"

// procNames are the suffixes of the procedures, in install order.
var procNames = []string{"turn", "wake", "place", "acquire", "release", "renew", "leave", "force", "prune", "watch", "batch"}

var procBodies = map[string]string{
	// turn tells the first live waiter of p_key it may claim now: a row in
	// the turns table, which every watcher of the table reads. It sets
	// o_told to 1 when it wrote one, and o_watcher to the named lock of
	// the watcher that serves the waiter ('' when its place does not
	// say); the caller then wakes that watcher after its commit (wake).
	"turn": `(IN p_key VARBINARY(1024), IN p_now BIGINT, OUT o_told INT, OUT o_watcher VARBINARY(64))
BEGIN
	DECLARE v_w VARBINARY(255) DEFAULT NULL;
	DECLARE v_r VARBINARY(64) DEFAULT '';
	DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_w = NULL;
	SET o_told = 0, o_watcher = '';
	SELECT waiter, watcher INTO v_w, v_r FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline > p_now ORDER BY seq LIMIT 1;
	IF v_w IS NOT NULL THEN
		INSERT INTO {N} (` + "`key`" + `, waiter, at) VALUES (p_key, v_w, p_now);
		SET o_told = 1, o_watcher = v_r;
	END IF;
END`,

	// wake interrupts, when p_told, the wait of the watcher whose named
	// lock is p_watcher (KILL QUERY): each watcher holds, on its waiting
	// connection, a named lock that its waiters name when they queue, so
	// IS_USED_LOCK names that connection while it lives, and nothing once
	// it is gone (a crash, a server restart; on another server of a
	// cluster, nothing either): no other connection is ever killed. When
	// p_watcher is '' (a waiter queued before its Locker's watcher ran)
	// or names no live connection (its watcher was restarted since), it
	// wakes every watcher registered in the watchers table instead, as
	// each of them may serve the waiter. A kill that fails (another
	// user's connection, which needs CONNECTION_ADMIN or SUPER) is
	// skipped: that watcher's wait ends by itself and it reads the turns
	// then.
	"wake": `(IN p_told INT, IN p_watcher VARBINARY(64))
BEGIN
	DECLARE v_name VARBINARY(64);
	DECLARE v_id BIGINT DEFAULT NULL;
	DECLARE v_done INT DEFAULT 0;
	DECLARE c CURSOR FOR SELECT name FROM {R};
	DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
	DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
	IF p_told = 1 THEN
		IF p_watcher <> '' THEN
			SET v_id = IS_USED_LOCK(p_watcher);
		END IF;
		IF v_id IS NOT NULL THEN
			IF v_id <> CONNECTION_ID() THEN
				KILL QUERY v_id;
			END IF;
		ELSE
			OPEN c;
			watchers: LOOP
				FETCH c INTO v_name;
				IF v_done = 1 THEN
					LEAVE watchers;
				END IF;
				SET v_id = IS_USED_LOCK(v_name);
				IF v_id IS NOT NULL AND v_id <> CONNECTION_ID() THEN
					KILL QUERY v_id;
				END IF;
			END LOOP;
			CLOSE c;
		END IF;
	END IF;
END`,

	// place gives p_waiter its place in p_key's line, or keeps the one it
	// has: at the tail when it has no live one; a live place is written
	// only when less than half of p_wttl is left of it or it names
	// another watcher (p_watcher, the named lock of the watcher of the
	// waiter's Locker, '' when it has none running), so repeated busy
	// tries write nothing.
	"place": `(IN p_key VARBINARY(1024), IN p_waiter VARBINARY(255), IN p_watcher VARBINARY(64), IN p_wttl BIGINT, IN p_now BIGINT)
BEGIN
	DECLARE v_d BIGINT DEFAULT NULL;
	DECLARE v_r VARBINARY(64) DEFAULT '';
	DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_d = NULL;
	IF p_waiter <> '' THEN
		SELECT deadline, watcher INTO v_d, v_r FROM {W} WHERE ` + "`key`" + ` = p_key AND waiter = p_waiter;
		IF v_d IS NOT NULL AND v_d > p_now THEN
			IF v_d - p_now < p_wttl DIV 2 OR v_r <> p_watcher THEN
				UPDATE {W} SET deadline = p_now + p_wttl, watcher = p_watcher WHERE ` + "`key`" + ` = p_key AND waiter = p_waiter;
			END IF;
		ELSE
			DELETE FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline <= p_now;
			INSERT INTO {W} (` + "`key`" + `, waiter, seq, deadline, watcher)
				SELECT p_key, p_waiter, COALESCE(MAX(seq), 0) + 1, p_now + p_wttl, p_watcher FROM {W} WHERE ` + "`key`" + ` = p_key;
			UPDATE {T} SET waiting = 1 WHERE ` + "`key`" + ` = p_key AND waiting = 0;
		END IF;
	END IF;
END`,

	// acquire claims p_key for p_holder (see Backend.TryAcquire). Its one
	// row: status ('won', 'busy' or 'limit'), then for 'won' the lease
	// (token, acquired, expires), for 'busy' the holder when known (token,
	// acquired, expires, owner, µs left), for 'limit' the holders' limit.
	"acquire": `(IN p_key VARBINARY(1024), IN p_owner BLOB, IN p_holder VARBINARY(255), IN p_ttl BIGINT, IN p_expire BIGINT,
	IN p_limit INT, IN p_waiter VARBINARY(255), IN p_wttl BIGINT, IN p_left BIGINT, IN p_watcher VARBINARY(64))
proc: BEGIN
	DECLARE v_start, v_now, v_tok, v_exp, v_seq BIGINT;
	DECLARE v_found, v_dup, v_tries, v_live, v_mine, v_ahead, v_wake BIGINT DEFAULT 0;
	DECLARE v_watcher VARBINARY(64) DEFAULT '';
	DECLARE v_head VARBINARY(255);
	DECLARE r_owner BLOB;
	DECLARE r_holder VARBINARY(255);
	DECLARE r_token, r_acq, r_exp BIGINT;
	DECLARE r_lim, r_wait INT;
	DECLARE v_sys DATETIME(6);
	DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
	SET v_start = {now}, v_sys = SYSDATE(6);
	-- A key held by someone else (a live mutex, a full semaphore), asked by
	-- a caller that does not wait or whose place in line needs no refresh,
	-- is answered from reads: no row lock, no write. A free mutex key that
	-- nobody waits on is claimed by one conditional UPDATE.
	IF p_waiter = '' OR EXISTS (SELECT 1 FROM {W} WHERE ` + "`key`" + ` = p_key AND waiter = p_waiter AND watcher = p_watcher AND deadline - {now} >= p_wttl DIV 2) THEN
		BEGIN
			DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
			SET v_found = 1;
			SELECT owner, holder, token, acquired_at, expire_at, lim, waiting INTO r_owner, r_holder, r_token, r_acq, r_exp, r_lim, r_wait
				FROM {T} WHERE ` + "`key`" + ` = p_key;
		END;
		SET v_now = {now};
		IF v_found = 1 AND p_limit <= 1 AND r_lim <= 1 AND r_exp <= v_now AND r_wait = 0 AND (p_expire = 0 OR p_expire > v_now) THEN
			-- Free, nobody waits: claimed unless the row changed since it
			-- was read (its token, expiry, flag, limit: any claim, release,
			-- queueing or semaphore use changes one of them). The claim
			-- timeout and a slot's end are checked after the row lock is
			-- granted: SYSDATE is read when the row is, the statement's
			-- clock before its wait.
			SET v_tok = GREATEST(v_now, r_token + 1), v_exp = IF(p_expire > 0, p_expire, v_now + p_ttl);
			UPDATE {T} SET owner = p_owner, holder = p_holder, token = v_tok, acquired_at = v_now, expire_at = v_exp
				WHERE ` + "`key`" + ` = p_key AND token = r_token AND expire_at = r_exp AND waiting = 0 AND lim = r_lim
					AND TIMESTAMPDIFF(MICROSECOND, v_sys, SYSDATE(6)) <= p_left
					AND (p_expire = 0 OR p_expire > v_now + TIMESTAMPDIFF(MICROSECOND, v_sys, SYSDATE(6)));
			IF ROW_COUNT() = 1 THEN
				IF @@autocommit = 0 THEN
					COMMIT;
				END IF;
				SELECT 'won', v_tok, v_now, v_exp, NULL, NULL, 0;
				LEAVE proc;
			END IF;
		END IF;
		IF v_found = 1 AND p_limit <= 1 AND r_lim <= 1 AND r_exp > v_now AND r_holder <> p_holder THEN
			SELECT 'busy', r_token, r_acq, r_exp, r_owner, r_exp - v_now, 0;
			LEAVE proc;
		END IF;
		IF v_found = 1 AND p_limit > 1 AND r_lim = p_limit THEN
			SELECT COUNT(*), COALESCE(SUM(holder = p_holder), 0) INTO v_live, v_mine FROM {P}
				WHERE ` + "`key`" + ` = p_key AND expire_at > v_now;
			IF v_live >= p_limit AND v_mine = 0 THEN
				{firstToExpire}
				LEAVE proc;
			END IF;
		END IF;
	END IF;
	attempt: LOOP
		SET v_tries = v_tries + 1, v_found = 1, v_dup = 0, v_wake = 0;
		SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
		START TRANSACTION;
		BEGIN
			DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
			SELECT owner, holder, token, acquired_at, expire_at, lim, waiting INTO r_owner, r_holder, r_token, r_acq, r_exp, r_lim, r_wait
				FROM {T} WHERE ` + "`key`" + ` = p_key FOR UPDATE;
		END;
		-- The clock of every decision below: read once the row's lock is held.
		SET v_now = {now};
		IF v_now - v_start > p_left THEN
			SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'dislock: claim not applied: its claim timeout passed while it waited for the row lock (WithClaimTimeout)';
		END IF;
		SET v_exp = IF(p_expire > 0, p_expire, v_now + p_ttl);
		IF p_expire > 0 AND p_expire <= v_now THEN
			-- The slot is over: its holder let it expire. Nothing is written.
			COMMIT;
			SELECT 'busy', NULL, NULL, NULL, NULL, NULL, 0;
			LEAVE proc;
		END IF;
		IF v_found = 0 THEN
			-- A new key (or one pruned long ago: its last token is older
			-- than this clock reading).
			BEGIN
				DECLARE CONTINUE HANDLER FOR 1062, 1213 SET v_dup = 1;
				INSERT INTO {T} (` + "`key`" + `, owner, holder, token, acquired_at, expire_at, lim, waiting)
					VALUES (p_key, IF(p_limit > 1, '', p_owner), IF(p_limit > 1, '', p_holder), v_now, v_now,
						IF(p_limit > 1, 0, v_exp), IF(p_limit > 1, p_limit, 0), 0);
				IF v_dup = 0 AND p_limit > 1 THEN
					REPLACE INTO {P} (` + "`key`" + `, holder, owner, token, acquired_at, expire_at)
						VALUES (p_key, p_holder, p_owner, v_now, v_now, v_exp);
				END IF;
			END;
			IF v_dup = 1 THEN
				-- A concurrent claim inserted the key first: try again on
				-- its row (the rollback undid nothing of ours but the try).
				ROLLBACK;
				IF v_tries < 5 THEN
					ITERATE attempt;
				END IF;
				SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'dislock: claim not applied: lost the race for a new row five times';
			END IF;
			COMMIT;
			SELECT 'won', v_now, v_now, v_exp, NULL, NULL, 0;
			LEAVE proc;
		END IF;
		LEAVE attempt;
	END LOOP;
	IF p_limit <= 1 THEN
		IF r_lim > 1 THEN
			SELECT COUNT(*) INTO v_live FROM {P} WHERE ` + "`key`" + ` = p_key AND expire_at > v_now;
			IF v_live > 0 THEN
				COMMIT;
				SELECT 'limit', NULL, NULL, NULL, NULL, NULL, r_lim;
				LEAVE proc;
			END IF;
			SET r_exp = 0;
		END IF;
		IF r_exp > v_now THEN
			IF r_holder = p_holder THEN
				COMMIT;
				SELECT 'won', r_token, r_acq, r_exp, NULL, NULL, 0;
				LEAVE proc;
			END IF;
			CALL {p}place(p_key, p_waiter, p_watcher, p_wttl, v_now);
			COMMIT;
			SELECT 'busy', r_token, r_acq, r_exp, r_owner, r_exp - v_now, 0;
			LEAVE proc;
		END IF;
		-- Free or expired: the first live waiter's, or anyone's when
		-- nobody live waits. The row's waiting flag is 0 only when nobody
		-- live waits (see place): then the line is not read.
		SET v_head = NULL;
		IF r_wait <> 0 THEN
			BEGIN
				DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_head = NULL;
				SELECT waiter INTO v_head FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline > v_now ORDER BY seq LIMIT 1;
			END;
		END IF;
		IF v_head IS NULL OR v_head = p_waiter THEN
			SET r_wait = 0;
			IF v_head IS NOT NULL THEN
				DELETE FROM {W} WHERE ` + "`key`" + ` = p_key AND (waiter = p_waiter OR deadline <= v_now);
				SET r_wait = EXISTS (SELECT 1 FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline > v_now);
			END IF;
			-- The fencing token, decided under the row's lock.
			SET v_tok = GREATEST(v_now, r_token + 1);
			UPDATE {T} SET owner = p_owner, holder = p_holder, token = v_tok, acquired_at = v_now, expire_at = v_exp, lim = 0,
				waiting = r_wait WHERE ` + "`key`" + ` = p_key;
			COMMIT;
			SELECT 'won', v_tok, v_now, v_exp, NULL, NULL, 0;
			LEAVE proc;
		END IF;
		CALL {p}place(p_key, p_waiter, p_watcher, p_wttl, v_now);
		COMMIT;
		SELECT 'busy', NULL, NULL, NULL, NULL, NULL, 0;
		LEAVE proc;
	END IF;
	-- A permit of a semaphore of p_limit.
	IF r_lim <= 1 AND r_exp > v_now THEN
		COMMIT;
		SELECT 'limit', NULL, NULL, NULL, NULL, NULL, 1;
		LEAVE proc;
	END IF;
	SELECT COUNT(*) INTO v_live FROM {P} WHERE ` + "`key`" + ` = p_key AND expire_at > v_now;
	IF v_live > 0 AND r_lim <> p_limit THEN
		COMMIT;
		SELECT 'limit', NULL, NULL, NULL, NULL, NULL, r_lim;
		LEAVE proc;
	END IF;
	BEGIN
		DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
		SET v_found = 1;
		SELECT token, acquired_at, expire_at INTO r_token, r_acq, r_exp FROM {P}
			WHERE ` + "`key`" + ` = p_key AND holder = p_holder AND expire_at > v_now;
		IF v_found = 1 THEN
			COMMIT;
			SELECT 'won', r_token, r_acq, r_exp, NULL, NULL, 0;
			LEAVE proc;
		END IF;
		SET v_seq = NULL;
		SELECT seq INTO v_seq FROM {W} WHERE ` + "`key`" + ` = p_key AND waiter = p_waiter AND deadline > v_now;
	END;
	SELECT COUNT(*) INTO v_ahead FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline > v_now AND (v_seq IS NULL OR seq < v_seq);
	IF v_ahead < p_limit - v_live THEN
		SELECT token INTO v_tok FROM {T} WHERE ` + "`key`" + ` = p_key;
		SET v_tok = GREATEST(v_now, v_tok + 1);
		UPDATE {T} SET owner = '', holder = '', token = v_tok, acquired_at = v_now, expire_at = 0, lim = p_limit
			WHERE ` + "`key`" + ` = p_key;
		REPLACE INTO {P} (` + "`key`" + `, holder, owner, token, acquired_at, expire_at)
			VALUES (p_key, p_holder, p_owner, v_tok, v_now, v_exp);
		DELETE FROM {W} WHERE ` + "`key`" + ` = p_key AND (waiter = p_waiter OR deadline <= v_now);
		IF p_limit - v_live - 1 > 0 THEN
			-- A permit is still free: the next in line may take it.
			CALL {p}turn(p_key, v_now, v_wake, v_watcher);
		END IF;
		{commit}
		SELECT 'won', v_tok, v_now, v_exp, NULL, NULL, 0;
		LEAVE proc;
	END IF;
	CALL {p}place(p_key, p_waiter, p_watcher, p_wttl, v_now);
	COMMIT;
	IF v_live > 0 THEN
		-- Full: the permit that expires first.
		{firstToExpire}
	ELSE
		SELECT 'busy', NULL, NULL, NULL, NULL, NULL, 0;
	END IF;
END`,

	// release gives up p_holder's lease of p_key (a permit when p_limit >
	// 1); with p_keep > 0 it keeps it until now + p_keep instead (min
	// hold). A mutex's row is ended, not deleted: it keeps the key's last
	// token; a permit's row is deleted (the key's header keeps the token).
	// The first live waiter is told. Its one row: whether a live lease of
	// p_holder was found.
	"release": `(IN p_key VARBINARY(1024), IN p_holder VARBINARY(255), IN p_keep BIGINT, IN p_limit INT)
proc: BEGIN
	DECLARE v_now, r_exp BIGINT;
	DECLARE v_found, v_live, v_wake BIGINT DEFAULT 0;
	DECLARE v_watcher VARBINARY(64) DEFAULT '';
	DECLARE r_lim INT;
	DECLARE r_wait INT DEFAULT 1;
	DECLARE v_sys DATETIME(6);
	DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
	IF p_limit <= 1 AND p_keep <= 0 THEN
		-- A live mutex lease of p_holder that nobody waits on is ended by
		-- one conditional UPDATE, its expiry compared with the clock once
		-- the row is locked (the statement's start, plus the time SYSDATE
		-- says passed since).
		SET v_now = {now}, v_sys = SYSDATE(6);
		UPDATE {T} SET expire_at = 0
			WHERE ` + "`key`" + ` = p_key AND holder = p_holder AND waiting = 0 AND lim <= 1
				AND expire_at > v_now + TIMESTAMPDIFF(MICROSECOND, v_sys, SYSDATE(6));
		IF ROW_COUNT() = 1 THEN
			IF @@autocommit = 0 THEN
				COMMIT;
			END IF;
			SELECT 1;
			LEAVE proc;
		END IF;
	END IF;
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	START TRANSACTION;
	BEGIN
		DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
		SET v_found = 1;
		IF p_limit > 1 THEN
			SELECT lim INTO r_lim FROM {T} WHERE ` + "`key`" + ` = p_key FOR UPDATE;
			IF v_found = 1 THEN
				SELECT expire_at INTO r_exp FROM {P} WHERE ` + "`key`" + ` = p_key AND holder = p_holder;
			END IF;
		ELSE
			SELECT expire_at, waiting INTO r_exp, r_wait FROM {T} WHERE ` + "`key`" + ` = p_key AND holder = p_holder FOR UPDATE;
		END IF;
	END;
	SET v_now = {now};
	IF v_found = 1 THEN
		SET v_live = r_exp > v_now;
		IF p_keep > 0 THEN
			IF v_live = 1 AND p_limit > 1 THEN
				UPDATE {P} SET expire_at = v_now + p_keep WHERE ` + "`key`" + ` = p_key AND holder = p_holder;
			ELSEIF v_live = 1 THEN
				UPDATE {T} SET expire_at = v_now + p_keep WHERE ` + "`key`" + ` = p_key;
			END IF;
		ELSE
			IF p_limit > 1 THEN
				DELETE FROM {P} WHERE ` + "`key`" + ` = p_key AND holder = p_holder;
			ELSE
				UPDATE {T} SET owner = '', holder = '', expire_at = 0 WHERE ` + "`key`" + ` = p_key;
			END IF;
			IF r_wait <> 0 THEN
				-- Someone may wait (a mutex's flag is 0 only when nobody does).
				CALL {p}turn(p_key, v_now, v_wake, v_watcher);
			END IF;
		END IF;
	END IF;
	{commit}
	SELECT v_live;
END`,

	// renew extends the leases listed in p_items, a JSON array of {"k":
	// key, "h": owner token, "t": TTL µs, "l": limit}, that are still
	// live with their owner token. Its one row: the JSON array of the
	// (1-based) positions of the items renewed.
	"renew": `(IN p_items LONGTEXT)
BEGIN
	DECLARE v_now BIGINT;
	DECLARE v_ok LONGTEXT;
	{begin}
	SET v_now = {now};
	UPDATE {T} AS l JOIN {items} ON l.` + "`key`" + ` = CAST(r.k AS BINARY) AND l.holder = CAST(r.h AS BINARY)
		SET l.expire_at = v_now + r.t WHERE r.n <= 1 AND l.expire_at > v_now;
	UPDATE {P} AS l JOIN {items} ON l.` + "`key`" + ` = CAST(r.k AS BINARY) AND l.holder = CAST(r.h AS BINARY)
		SET l.expire_at = v_now + r.t WHERE r.n > 1 AND l.expire_at > v_now;
	SELECT JSON_ARRAYAGG(i) INTO v_ok FROM (
		SELECT r.i FROM {items} JOIN {T} AS l ON l.` + "`key`" + ` = CAST(r.k AS BINARY) AND l.holder = CAST(r.h AS BINARY)
			WHERE r.n <= 1 AND l.expire_at > v_now
		UNION ALL
		SELECT r.i FROM {items} JOIN {P} AS l ON l.` + "`key`" + ` = CAST(r.k AS BINARY) AND l.holder = CAST(r.h AS BINARY)
			WHERE r.n > 1 AND l.expire_at > v_now) AS ok;
	COMMIT;
	SELECT v_ok;
END`,

	// leave takes p_waiter out of p_key's line; when it was first and the
	// key can be claimed, the next live waiter is told.
	"leave": `(IN p_key VARBINARY(1024), IN p_waiter VARBINARY(255))
proc: BEGIN
	DECLARE v_now, r_exp BIGINT;
	DECLARE v_found, v_live, v_wake BIGINT DEFAULT 0;
	DECLARE v_watcher VARBINARY(64) DEFAULT '';
	DECLARE r_lim INT;
	DECLARE v_head VARBINARY(255);
	{begin}
	BEGIN
		DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
		SET v_found = 1;
		SELECT expire_at, lim INTO r_exp, r_lim FROM {T} WHERE ` + "`key`" + ` = p_key FOR UPDATE;
		IF v_found = 0 THEN
			COMMIT;
			LEAVE proc;
		END IF;
		SET v_now = {now};
		SET v_head = NULL;
		SELECT waiter INTO v_head FROM {W} WHERE ` + "`key`" + ` = p_key AND deadline > v_now ORDER BY seq LIMIT 1;
	END;
	DELETE FROM {W} WHERE ` + "`key`" + ` = p_key AND waiter = p_waiter;
	IF v_head = p_waiter THEN
		IF r_lim > 1 THEN
			SELECT COUNT(*) INTO v_live FROM {P} WHERE ` + "`key`" + ` = p_key AND expire_at > v_now;
			IF v_live < r_lim THEN
				CALL {p}turn(p_key, v_now, v_wake, v_watcher);
			END IF;
		ELSEIF r_exp <= v_now THEN
			CALL {p}turn(p_key, v_now, v_wake, v_watcher);
		END IF;
	END IF;
	{commit}
END`,

	// force ends p_key's lease whoever holds it (every permit of a
	// semaphore), keeping the token, and tells the first live waiter. Its
	// one row: whether a live lease was ended.
	"force": `(IN p_key VARBINARY(1024))
BEGIN
	DECLARE v_now, r_exp BIGINT;
	DECLARE v_found, v_live, v_wake BIGINT DEFAULT 0;
	DECLARE v_watcher VARBINARY(64) DEFAULT '';
	DECLARE r_lim INT;
	{begin}
	BEGIN
		DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
		SET v_found = 1;
		SELECT expire_at, lim INTO r_exp, r_lim FROM {T} WHERE ` + "`key`" + ` = p_key FOR UPDATE;
	END;
	SET v_now = {now};
	IF v_found = 1 THEN
		IF r_lim > 1 THEN
			SELECT COUNT(*) > 0 INTO v_live FROM {P} WHERE ` + "`key`" + ` = p_key AND expire_at > v_now;
			DELETE FROM {P} WHERE ` + "`key`" + ` = p_key;
		ELSE
			SET v_live = r_exp > v_now;
			UPDATE {T} SET owner = '', holder = '', expire_at = 0 WHERE ` + "`key`" + ` = p_key;
		END IF;
		IF v_live = 1 THEN
			CALL {p}turn(p_key, v_now, v_wake, v_watcher);
		END IF;
	END IF;
	{commit}
	SELECT v_live;
END`,

	// watch is a watcher's subscription (see Backend.WatchTurns): one CALL
	// that runs for p_life seconds, in a loop that sends the turns
	// not sent yet as a result set (id, key, waiter) and then, unless a
	// turn above those has committed since, waits up to p_poll seconds for
	// the named lock p_wait (held by the watcher's other connection, so
	// the wait ends only by its timeout or by KILL QUERY, see wake), until
	// it has run p_life seconds (then it ends after a read). The kill ends
	// the wait, not the CALL: the handler takes the
	// interruption (ER_QUERY_INTERRUPTED, whatever statement it hit) and
	// the loop reads the turns again, so that a wake-up costs the watcher
	// no request. A wait that times out sends a one-column row 'tick' (so
	// that a client read timeout never fires on a quiet subscription);
	// one that gets the lock (its holding connection is gone) sends 'gone'
	// and ends the CALL; any other error ends it too. The first read
	// sends the turns with an id above p_last and those in (p_low,
	// p_last] listed in p_gaps: the ids the watcher has not seen (turns
	// that commit after a later one, or that a kill cut from a result
	// set); the loop keeps the same account itself. A first CALL (p_last
	// -1) registers the watcher as p_self in the watchers table, reads
	// the log's last id and sends it in a row ('ready', id) before the
	// loop. A turn may be sent
	// twice (a kill that hit the loop after it sent them); never not at
	// all. A server that ends the whole CALL on a kill (the handler does
	// not apply) ends it with the error: the watcher then calls again.
	"watch": `(IN p_low BIGINT, IN p_last BIGINT, IN p_gaps TEXT, IN p_wait VARCHAR(64), IN p_poll DOUBLE, IN p_life DOUBLE,
	IN p_self VARCHAR(64))
BEGIN
	DECLARE v_last, v_low, v_max, v_top, v_id, v_got, v_n BIGINT DEFAULT 0;
	DECLARE v_end DOUBLE;
	DECLARE v_gaps, v_keep, v_rest, v_ids TEXT DEFAULT '';
	DECLARE v_err INT DEFAULT 0;
	-- ER_QUERY_INTERRUPTED: a kill, taken whatever statement it hit (any
	-- other error ends the CALL).
	DECLARE CONTINUE HANDLER FOR 1317 SET v_err = 1;
	-- Not seen yet: the ids above v_last and those in (v_low, v_last]
	-- listed in v_gaps.
	SET v_low = p_low, v_last = p_last, v_gaps = p_gaps, v_end = UNIX_TIMESTAMP(SYSDATE(6)) + p_life;
	IF p_last < 0 THEN
		-- A watcher's first CALL registers it (by the named lock its
		-- connection holds, p_self) and starts at the end of the log.
		registering: LOOP
			SET v_err = 0;
			INSERT IGNORE INTO {R} (name) VALUES (p_self);
			IF v_err = 0 THEN
				SELECT COALESCE(MAX(id), 0) INTO v_last FROM {N};
			END IF;
			IF v_err = 0 THEN
				SELECT 'ready', v_last;
			END IF;
			IF v_err = 0 THEN
				LEAVE registering;
			END IF;
		END LOOP;
		SET v_low = GREATEST(v_last - 256, 0), v_gaps = '';
	END IF;
	turns: LOOP
		SET v_err = 0;
		SELECT COALESCE(MAX(id), 0) INTO v_max FROM {N};
		SET v_ids = NULL, v_n = 0;
		IF v_err = 0 THEN
			-- At most 40 ids a read (their list fits group_concat_max_len's
			-- default of 1024 bytes): when there are more, the read covers
			-- the ids up to the 40th, and the next one comes at once.
			SELECT GROUP_CONCAT(id ORDER BY id), COUNT(*), MAX(id) INTO v_ids, v_n, v_top FROM (SELECT id FROM {N}
				WHERE id > v_low AND id <= v_max AND (id > v_last OR FIND_IN_SET(id, v_gaps) > 0) ORDER BY id LIMIT 40) AS t;
			IF v_err = 0 AND v_n = 40 THEN
				SET v_max = v_top;
			END IF;
		END IF;
		IF v_err = 0 AND v_ids IS NOT NULL THEN
			SELECT id, ` + "`key`" + `, waiter FROM {N} WHERE id > v_low AND id <= v_max AND FIND_IN_SET(id, v_ids) > 0 ORDER BY id;
		END IF;
		IF v_err = 0 THEN
			-- Not seen yet: the gaps not read now, and the ids up to v_max
			-- not read; those 256 or more below v_max are given up.
			SET v_keep = '', v_rest = v_gaps;
			WHILE v_rest <> '' DO
				SET v_id = CAST(SUBSTRING_INDEX(v_rest, ',', 1) AS SIGNED);
				SET v_rest = IF(LOCATE(',', v_rest) > 0, SUBSTRING(v_rest, LOCATE(',', v_rest) + 1), '');
				IF v_id > GREATEST(v_last, v_max) - 256 AND FIND_IN_SET(v_id, COALESCE(v_ids, '')) = 0 THEN
					SET v_keep = CONCAT(v_keep, IF(v_keep = '', '', ','), v_id);
				END IF;
			END WHILE;
			SET v_id = GREATEST(v_last + 1, v_max - 255);
			WHILE v_id <= v_max DO
				IF FIND_IN_SET(v_id, COALESCE(v_ids, '')) = 0 THEN
					SET v_keep = CONCAT(v_keep, IF(v_keep = '', '', ','), v_id);
				END IF;
				SET v_id = v_id + 1;
			END WHILE;
		END IF;
		IF v_err = 0 THEN
			SET v_gaps = v_keep, v_last = GREATEST(v_last, v_max), v_low = GREATEST(GREATEST(v_last, v_max) - 256, 0);
		END IF;
		IF v_err = 0 AND v_n < 40 AND UNIX_TIMESTAMP(SYSDATE(6)) >= v_end THEN
			-- Done, right after a read: a CALL holds the procedure (its
			-- metadata lock) while it runs, and Migrate's replacement of
			-- it waits for every CALL to end.
			LEAVE turns;
		END IF;
		IF v_err = 0 THEN
			-- A kill before or during the wait (a turn of one of this
			-- watcher's waiters, committed) ends it: the loop reads again.
			-- No wait while turns may be left to read.
			SET v_got = NULL;
			SELECT IF(v_n >= 40 OR EXISTS (SELECT 1 FROM {N} WHERE id > v_max), 0, GET_LOCK(p_wait, p_poll)) INTO v_got;
			IF v_err = 0 AND v_got = 1 THEN
				SELECT 'gone';
				LEAVE turns;
			END IF;
			IF v_err = 0 AND v_got = 0 AND v_n < 40 AND NOT EXISTS (SELECT 1 FROM {N} WHERE id > v_max) THEN
				SELECT 'tick';
			END IF;
		END IF;
	END LOOP;
END`,

	// prune deletes, at most p_batch of each: ended rows whose token is
	// older than p_horizon µs with nobody live in line and no live permit,
	// expired permits and places, turns older than a minute and the
	// watchers whose connection is gone. Its row:
	// how many lock rows it deleted.
	// batch runs the plain statements of a lane's batch (lane.go) in one
	// transaction, item by item in the order given: a release (r = 1) is
	// freeReleaseSQL's UPDATE, a claim freeClaimSQL's, with its bound on
	// the wait for row locks counted from the CALL's start. It answers
	// "<rows>:<token>," for each item, in order. When the bound has passed
	// by the commit of a batch with claims, it rolls back and answers ''
	// (no item changed anything).
	"batch": `(IN p_items LONGTEXT, IN p_half BIGINT)
BEGIN
	DECLARE v_start DATETIME(6);
	DECLARE v_r, v_done, v_claims INT DEFAULT 0;
	DECLARE v_k VARCHAR(1024) CHARACTER SET utf8mb4;
	DECLARE v_o VARCHAR(1024) CHARACTER SET utf8mb4;
	DECLARE v_h VARCHAR(255) CHARACTER SET utf8mb4;
	DECLARE v_t, v_n BIGINT;
	DECLARE v_out LONGTEXT DEFAULT '';
	DECLARE c CURSOR FOR SELECT i.r, i.k, i.o, i.h, i.t FROM JSON_TABLE(p_items, '$[*]' COLUMNS (r INT PATH '$.r',
		k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$.k', o VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$.o',
		h VARCHAR(255) CHARACTER SET utf8mb4 PATH '$.h', t BIGINT PATH '$.t')) AS i;
	DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
	{begin}
	SET v_start = SYSDATE(6);
	OPEN c;
	items: LOOP
		FETCH c INTO v_r, v_k, v_o, v_h, v_t;
		IF v_done = 1 THEN
			LEAVE items;
		END IF;
		IF v_r = 1 THEN
			` + freeRelease("{T}", "CAST(v_k AS BINARY)", "CAST(v_h AS BINARY)") + `;
			SET v_out = CONCAT(v_out, ROW_COUNT(), ':0,');
		ELSE
			SET v_claims = v_claims + 1;
			` + freeClaim("{T}", "CAST(v_o AS BINARY)", "CAST(v_h AS BINARY)", "v_t", "CAST(v_k AS BINARY)",
		"TIMESTAMPDIFF(MICROSECOND, v_start, SYSDATE(6)) <= p_half") + `;
			SET v_n = ROW_COUNT();
			IF v_n = 1 THEN
				SET v_out = CONCAT(v_out, '1:', LAST_INSERT_ID(), ',');
			ELSE
				SET v_out = CONCAT(v_out, v_n, ':0,');
			END IF;
		END IF;
	END LOOP;
	CLOSE c;
	IF v_claims > 0 AND TIMESTAMPDIFF(MICROSECOND, v_start, SYSDATE(6)) > p_half THEN
		ROLLBACK;
		SELECT '';
	ELSE
		COMMIT;
		SELECT v_out;
	END IF;
END`,

	"prune": `(IN p_horizon BIGINT, IN p_batch INT)
BEGIN
	DECLARE v_now, v_n BIGINT;
	SET v_now = {now};
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	DELETE FROM {T} WHERE expire_at <= v_now AND token < v_now - p_horizon
		AND NOT EXISTS (SELECT 1 FROM {W} AS w WHERE w.` + "`key`" + ` = {T}.` + "`key`" + ` AND w.deadline > v_now)
		AND NOT EXISTS (SELECT 1 FROM {P} AS p WHERE p.` + "`key`" + ` = {T}.` + "`key`" + ` AND p.expire_at > v_now)
		LIMIT p_batch;
	SET v_n = ROW_COUNT();
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	DELETE FROM {P} WHERE expire_at <= v_now LIMIT p_batch;
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	DELETE FROM {W} WHERE deadline <= v_now LIMIT p_batch;
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	DELETE FROM {N} WHERE at < v_now - 60000000 LIMIT p_batch;
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	DELETE FROM {R} WHERE IS_USED_LOCK(name) IS NULL;
	SELECT v_n;
END`,
}

// firstToExpire is the busy answer of a full semaphore: the permit that
// expires first, in one row even when the permits ended since they were
// counted (the holder is then unknown).
const firstToExpire = `SELECT 'busy', x.token, x.acquired_at, x.expire_at, x.owner, x.expire_at - v_now, p_limit
	FROM (SELECT 1) AS one LEFT JOIN (SELECT token, acquired_at, expire_at, owner FROM {P}
		WHERE ` + "`key`" + ` = p_key AND expire_at > v_now ORDER BY expire_at, token LIMIT 1) AS x ON TRUE;`

// itemsTable is the JSON_TABLE of renew's items, as table r.
const itemsTable = `JSON_TABLE(p_items, '$[*]' COLUMNS (i FOR ORDINALITY, k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$.k',
	h VARCHAR(255) CHARACTER SET utf8mb4 PATH '$.h', t BIGINT PATH '$.t', n INT PATH '$.l')) AS r`

// characteristics go between each procedure's parameters and its body.
// INVOKER: the caller's privileges apply, not those of whoever migrated.
const characteristics = "\nSQL SECURITY INVOKER MODIFIES SQL DATA COMMENT '{version}'"

// beginTx starts the procedure's transaction, rolled back on any error.
const beginTx = `DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
	SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
	START TRANSACTION;`

// commitWake ({commit}) commits the procedure's transaction, then wakes the
// watcher that turn named: only after the commit, so that the woken watcher
// reads the turn.
const commitWake = `COMMIT;
	IF v_wake = 1 THEN
		CALL {p}wake(v_wake, v_watcher);
	END IF;`

// procSQL returns the CREATE PROCEDURE statement of procedure name.
func (n names) procSQL(name string) string {
	body := procBodies[name]
	i := strings.Index(body, "\nBEGIN")
	if j := strings.Index(body, "\nproc: BEGIN"); i < 0 || j >= 0 && j < i {
		i = j
	}
	body = body[:i] + characteristics + body[i:]
	body = strings.NewReplacer("{firstToExpire}", firstToExpire, "{begin}", beginTx, "{commit}", commitWake).Replace(body)
	r := strings.NewReplacer("{p}turn", n.proc("turn"), "{p}wake", n.proc("wake"), "{p}place", n.proc("place"),
		"{T}", n.table, "{P}", n.permits, "{W}", n.waiters, "{N}", n.turns, "{R}", n.watchers, "{version}", procVersion, "{now}", nowSQL, "{items}", itemsTable)
	return "CREATE PROCEDURE " + n.proc(name) + r.Replace(body)
}
