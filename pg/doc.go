// Package pg is the PostgreSQL backend of dislock, built on pgx v5 and
// pgxpool.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	locker, err := pg.New(ctx, pool, pg.WithAutoMigrate()) // a *core.Client: core.Locker and core.Admin
//	s, err := locker.TryAcquire(ctx, "nightly-report")     // errors.Is(err, core.ErrNotAcquired) when busy
//
// New and NewBackend use the caller's pool and never close it; Open and
// OpenBackend make a pool of their own from a connection string, which the
// Locker's (or the Backend's) Close closes: pg.Open(ctx, url,
// pg.WithAutoMigrate()) is a Locker, like New. Without WithAutoMigrate the
// lock table must exist already: create it with the package-level
// pg.Migrate(ctx, pool, opts...) (in a migration step of its own, say), or
// with the SQL from SchemaSQL in your own migrations. No connection string
// or config is ever formatted into an error.
//
// # How it works
//
// Locks are rows of one table (default dislock_locks). Every operation is
// one statement in its own transaction, one round trip:
//
//   - Acquire reads the key's row and, only when it is missing or expired
//     (and, with waiters queued, it is the caller's turn), claims it with an
//     INSERT … ON CONFLICT DO UPDATE that re-checks the expiry on the latest
//     row version. A busy key is answered by that read: a failed try takes
//     no row lock and writes nothing (a waiting Acquire's first busy try
//     takes its place in line; see Waiting in line). Acquiring with the same owner
//     token again is a success (idempotent). The fencing token is decided
//     under the row's lock: greatest(the database server's clock in
//     microseconds, read then, the row's last token + 1). All expiry times
//     come from the database's now(); a slot's end is checked again on the
//     server's clock under the row's lock, so a claim that waited for the
//     row past its slot's end is refused.
//     The statement carries its own bound (see WithClaimTimeout): one
//     round trip and one transaction, in every QueryExecMode, and no
//     setting beyond it. A claim that takes no place in
//     line (every TryAcquire) sends the statement without the queue's
//     branches.
//   - A TryAcquire of a key whose lease this Backend lately released is
//     first one UPDATE of its row, with no read before it: it takes the
//     row when it is free or expired and nobody is in line, deciding the
//     token under the row's lock as above, and carries the same bound.
//     When it takes nothing (someone claimed the key since, or waits for
//     it), the claim follows, one round trip more, and the key is
//     forgotten until this Backend releases it again. It costs the server
//     about 40 % less CPU than the claim's statement (see BENCHMARKS.md).
//   - A TryAcquire of a key that this Backend found held by another owner,
//     whose lease has not run out since, is first a read of the row alone
//     (no lock, no write, no set_config): while the key stays held, that
//     read is the whole try; when it finds the key free, the claim follows,
//     one round trip more. (A key that this Locker's own live session
//     holds is answered busy by the engine, with no statement at all.)
//   - A TryAcquire of a key while another TryAcquire of the same key by
//     this Backend has its claim on the way sends nothing: it waits for
//     that claim, without a pool connection, and answers busy with the
//     winner's lease when it won (the key was held from its commit, before
//     the later try returned). When it did not win (busy, refused, failed),
//     the later try sends its own claim, so a failure is never passed on
//     as busy. A hot key that comes free then costs the server one claim
//     per Backend, where every trying goroutine's claim waited for the
//     winner's row lock and commit flush, each holding a connection.
//   - Renewal of every due session of a Locker is one UPDATE … FROM
//     unnest(…), checked against each session's random owner token; a
//     session missing from the result is lost at once.
//   - Release is an owner-checked UPDATE that ends the row (or, under
//     MinHold and slot mode, sets its expiry): the row stays, free, with
//     the key's last token, for claims still on their way (see Ended rows).
//     A live lease is ended by one plain UPDATE whose queue expressions are
//     skipped when nobody is in line. A lease that was no longer live
//     (expired, ended, another owner's) takes a second statement, which
//     ends an expired row of the owner token all the same, and is answered
//     as lost (core.ErrLeaseGone). When waiters are queued on the
//     row (see Waiting in line), the same statement keeps their queue and
//     calls pg_notify for the first of them; with nobody queued it notifies
//     nobody. Each Locker keeps one LISTEN
//     connection, separate from the pool, so a waiter in another process
//     wakes at once when its turn comes; if LISTEN fails the Locker polls
//     and retries the subscription.
//   - Nothing depends on session state: no advisory locks, no SET beyond
//     a statement's own transaction, no prepared statements (every
//     statement works in QueryExecModeExec and the simple protocol). Renewals that fail with 40001, 57P01 or a broken
//     connection are retried by the engine until the renew deadline.
//
// # Waiting in line
//
// Backend is a core.Queuer: the waiters of a key wait in a first-in,
// first-out queue kept on the key's row (the waiters column), across all
// processes, so one release wakes one waiter, the first in line, instead of
// one per process. A waiting Acquire's busy attempt takes a place at the
// tail (or keeps its own) in the same statement as the attempt, also when
// the attempt lost a free or new key to a concurrent claim; the place
// lasts the engine's queue TTL (2s) from the attempt that last refreshed
// it, and the engine refreshes it while it waits. A free key is granted only
// to the first live waiter, or to anyone when nobody live is queued, so a
// TryAcquire never overtakes a waiter. A release, ForceRelease, or a Leave
// of the first waiter of a free key (a wait that gave up) notifies the next
// live waiter by name; a waiter whose process died is skipped once its
// place expires; a lease that expires notifies nobody (waiters poll at the
// holder's expiry). The notification's payload is the waiter id's length
// in bytes, a colon, the id and the key.
//
// It costs the common paths nothing: with nobody queued the column is
// NULL, a busy TryAcquire is the one indexed read it was, and a release
// sends no notification. A queued waiter's repeated busy attempts write
// its place only when less than half of its TTL is left, so they are reads
// too.
//
// # Ended rows
//
// A claim reads the server's clock before it may wait for the key's row
// (held by a claim or release of another transaction), so a token read from
// that clock can be older than one another claim got meanwhile. The token is
// therefore decided under the row's lock, from the row's last token, and
// rows are not deleted while such a claim can still be running: Release,
// ForceRelease and a Leave that empties a free key's queue leave an ended
// row (an empty holder, expire_at -infinity) that keeps the key's last token.
//
// Ended rows, and rows whose holder let them expire, are deleted once their
// token is older than any claim can be on the server: the server refuses a
// claim's write past its claim timeout, at most the longest one
// WithClaimTimeout accepts (24h), whichever timeout the process that
// deletes them uses; one second more is the margin. Each Backend does it in
// a statement of its own after its first release and then after a release
// at most once a minute (deleting up to 10,000 rows each time, sooner again
// when there were more): no other acquire or release pays for it. So a
// workload with a fresh key per task (task IDs) keeps about a day of keys in
// the table, not all of them. Rows with live waiters stay, as do the
// permits of live semaphores; the expired permits of a semaphore whose
// header was deleted go with it.
//
// The legacy table (WithLegacyTable) has no queue: a free key goes to
// whoever comes first, and every release notifies with the bare key, as
// before. Its Backend says so (KeepsQueue, core.QueueKeeper), and the
// engine runs it as a core.Watcher, not a core.Queuer: a release wakes one
// waiter of each process, and a wake-up that a waiter which gave up did
// not use passes to the next waiter of its process. Processes of earlier versions sharing a table ignore the queue:
// they may take a free key out of turn, and their releases drop the queue
// (its waiters poll and queue again).
//
// # Guarantees
//
// With the default durable commits, a lock is held by at most one owner
// token at a time as seen by the database, and a holder that cannot renew
// learns of its loss (Session.Done, ErrLeaseLost) at the renew deadline,
// before the row expires on the server. Fencing tokens strictly increase per
// key, in every durability mode and across crashes: a token is the server's
// clock_timestamp() in microseconds, read under the row's lock, or the
// row's last token + 1 when that is larger, so no crash can set it back,
// given a server clock that never steps back past earlier tokens (keep it
// slewed, not stepped; a step back is covered while the key's row lasts,
// see Ended rows). Processes of earlier versions sharing the table delete
// rows on release, and take their tokens from the clock read before they
// wait for a row: upgrade them all before counting on this. Expiry is compared on the database's
// clock only, so client clocks and TimeZone settings do not matter; the
// expire_at column must be timestamptz, which NewBackend checks.
//
// An acquire whose outcome is unknown — its ctx ended during the call, or
// its reply was lost — is undone by the engine, by owner token. The claim
// cannot take effect after that undo: pgx sends a cancel request when the
// ctx ends, and whether or not it arrives, the server refuses the claim's
// write once the claim timeout (WithClaimTimeout, default 2s) has passed
// since TryAcquire was called; the wait for a pool connection counts
// against it. The statement checks the server's clock after its write (in
// RETURNING, so after any wait for the row's lock) and raises an error
// past the bound, which rolls the write back. Backend is a
// core.ClaimBounder: ClaimBound is the claim timeout plus one second, after
// which the engine releases the claim once more (when its TTL is longer),
// in case it took effect between the ctx's end and the bound (another
// transaction's row or table lock was in its way, say). A claim that lands
// late also lives correspondingly less: its expiry counts from the start of
// its transaction. An acquire held up past the bound fails with an error
// matching ErrClaimTimeout (and core.Unclaimed: nothing was claimed, so the
// engine owes it no undo); it is never busy. The server does not cut the
// wait itself short: a claim waiting behind another transaction's row lock
// waits, and holds its connection, until it gets the row (or pgx's cancel
// request, sent when the ctx ends, arrives), and is refused then. A
// statement_timeout of the role or session still applies (SQLSTATE 57014).
//
// # Not guaranteed
//
// A lease is not a fence: a holder paused longer than the margin between
// the renew deadline and the TTL (GC pause, VM freeze) can still act after
// the lock passed on. Pass Session.Token to the protected resource and have
// it reject smaller tokens. A failover to an asynchronous replica can lose
// recent commits and with them locks; so can a server crash under
// WithAsyncCommit (the commits of up to 3×wal_writer_delay) or with a
// WithUnlogged table (the whole table). Tokens handed out later are still
// larger (on a replica, as long as its clock is not behind the old
// primary's). The legacy table (WithLegacyTable) has no fencing tokens.
//
// The claim bound covers the acquire's time on the server and allows one
// second for its way there and its commit. It does not cover an acquire
// whose packets reach the server later than that (a TCP connection
// retransmitting for longer, a PgBouncer queue waiting for a server
// connection — its query_wait_timeout bounds that), nor an extra round trip before the
// acquire is sent (the describe of QueryExecModeDescribeExec, the prepare of
// a statement new to a connection's cache) that takes that long. Nor does it
// cover a longer commit, which follows the check: a WAL flush
// stalled on the disk, or with synchronous_standby_names the wait for a
// standby, can make a claim visible after the undo's repeat, and it is then
// held until its TTL (WithAsyncCommit waits for neither). Close of the
// Locker cuts a claim in flight short and sends its last undo once the
// bound has passed (core waits for that at most 10s).
//
// # Schema and privileges
//
// Migrate (pg.Migrate(ctx, pool, opts...), or Backend.Migrate, or
// WithAutoMigrate) runs, for the default table:
//
//	CREATE TABLE IF NOT EXISTS "dislock_locks" (
//		key         text PRIMARY KEY,
//		owner       text NOT NULL,        -- human-readable owner (metadata)
//		holder      text NOT NULL,        -- random owner token of the session
//		token       bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, -- fencing token
//		acquired_at timestamptz NOT NULL,
//		expire_at   timestamptz NOT NULL,
//		waiters     jsonb                 -- the waiter queue; NULL when nobody waits
//	)
//
// SchemaSQL returns it for any table name, for use in your own migrations.
// Migrate needs CREATE on the schema; at run time the role needs only
// SELECT, INSERT, UPDATE and DELETE on the table. NewBackend checks the
// table, its columns and types, the unique index on key and these
// privileges, and reports a problem as an error matching ErrSchema that
// names the table and the fix.
//
// Tables created by earlier versions lack the waiters column: NewBackend
// refuses them with an ErrSchema error naming the statement that adds it,
//
//	ALTER TABLE dislock_locks ADD COLUMN IF NOT EXISTS waiters jsonb
//
// which Migrate (and WithAutoMigrate) run for you. It is instant (a
// nullable column without a default rewrites nothing), and processes of
// the earlier version keep working on the table.
//
// Tables created by earlier versions take their tokens from an identity
// sequence, which a crash can set back under WithAsyncCommit (its last
// advance lost) or with an unlogged table (the sequence is unlogged too and
// restarts at 1). Switch such a table to clock tokens (they are far above
// any sequence value, so tokens keep growing) with:
//
//	ALTER TABLE dislock_locks ALTER COLUMN token DROP IDENTITY IF EXISTS,
//		ALTER COLUMN token SET DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
//
// Table names are quoted identifiers: WithTable("Jobs") is the table "Jobs",
// not jobs, and no name is ever interpreted as SQL.
//
// # Semaphores
//
// With core.Limit(n), n > 1, a key has up to n holders at once, each
// holding one permit with its own owner token, lease, renewal and fencing
// token (tokens strictly increase per key across permits and across mutex
// use of the key):
//
//	s, err := locker.TryAcquire(ctx, "thumbnails", core.Limit(4)) // one of 4 permits
//
// A semaphore's key has a header row in the lock table, whose owner is
// "dislock:semaphore:<n>" (its holder adds a random part, so no mutex
// renewal or release matches it). It carries the key's last fencing token
// and the latest expiry of the key's live permits, so a mutex claim of the
// key sees it held (and gets an error matching core.ErrLimitMismatch) and,
// when every holder crashed, can take it once the last permit expired. Each
// permit is a row of a second table, the lock table's name with "_permits"
// appended (dislock_locks_permits):
//
//	CREATE TABLE IF NOT EXISTS "dislock_locks_permits" (
//		key         text NOT NULL,
//		holder      text NOT NULL,  -- the permit's owner token
//		owner       text NOT NULL,
//		token       bigint NOT NULL, -- fencing token
//		acquired_at timestamptz NOT NULL,
//		expire_at   timestamptz NOT NULL,
//		PRIMARY KEY (key, holder)
//	)
//
// Migrate and WithAutoMigrate create it; PermitsSchemaSQL returns it for
// your own migrations. Mutexes never use it: a deployment without it keeps
// working, and only a permit claim fails, with an error matching ErrSchema
// (and core.ErrUnsupported, so a waiting Acquire ends at once) that names
// the table and the fix. Nothing is created silently; once the table exists
// claims work without a restart. Semaphores need clock tokens (the column
// default Migrate sets; the ALTER TABLE above switches an older table), and
// are not available when the permits table's name would exceed 63 bytes.
// On the legacy table (WithLegacyTable) the header's value is "<holder>
// <owner>" like any row of it, and permits have no fencing tokens (0).
//
// Each operation on permits is one round trip, one transaction: a batch of
// which the first statement locks the key's header row and the second,
// reading a fresh snapshot (READ COMMITTED), acts on the permits. The count
// of live permits is therefore exact: concurrent claims from any number of
// processes never exceed the limit and are not refused while a permit is
// free. In detail:
//
//   - Acquire sends an upsert of the header that takes its row lock and
//     the next token (the server's clock in microseconds, or the key's last
//     token + 1 when that is larger), then the claim, which drops the key's
//     expired permits and inserts the new one when fewer than n are left;
//     the permit's insert carries the claim bound, which refuses the whole
//     transaction past the claim timeout, counted from its start. A full semaphore, a
//     key held as a mutex or with another limit, and a permit already held
//     with the same owner token are answered from a read alone: no lock, no
//     write. A full semaphore answers core.Busy with the permit that expires
//     first (Info.Limit set); another limit answers core.LimitMismatch.
//   - Release locks the header and deletes the permit, notifying the
//     first waiter (pg_notify) when it was live; the header's
//     expiry follows the permits left, and the last one's release ends
//     the header (its expiry becomes -infinity), so the key is free at
//     once for a mutex or another limit. The ended header keeps the key's
//     last token: a claim that read the server clock before it waited for
//     the header's lock still gets a larger one (greatest(clock, last + 1)).
//     Under MinHold and slot mode it sets the permit's expiry instead.
//   - A Renew call that includes permits is one batch: a statement that
//     locks the headers of their keys, in key order (so renewals never
//     deadlock), the mutex renewal when there are mutexes, and one
//     UPDATE … FROM unnest(…) of the permits and their headers. A Locker's
//     1,000 permits are one round trip per renew interval. The renewal
//     holds those header rows until it commits: claims and releases of its
//     keys wait for it (one commit), and it waits for theirs.
//   - Holders lists a key's live permits oldest first; List has one
//     Info per live permit; Inspect returns a semaphore's oldest permit;
//     ForceRelease deletes every permit and ends the header (one batch)
//     and notifies.
//
// The statements keep no session state (the header lock is passed from the
// first statement to the second with a set_config local to the
// transaction), so permits work in every QueryExecMode and behind
// PgBouncer in transaction mode, like mutexes.
//
// Waiters for permits wait in line too, in the header row's waiters
// column (see Waiting in line): under the header lock a permit goes to a
// claim only when fewer live waiters are queued before it than permits are
// free, so a TryAcquire never takes a permit a waiter is owed; a waiter
// answered busy takes its place there (a full semaphore's repeated busy
// tries by a waiter whose place is fresh stay reads). The turns are a
// mutex's: a permit's release and a ForceRelease notify the first live
// waiter by name, and nobody when nobody is queued; a Leave of the first
// waiter while a permit is free, and a grant that leaves a permit free (in
// the grant's transaction), notify the next live waiter by name. Not on
// the legacy table, which has no queue.
//
// # Durability modes
//
// By default every acquire and renewal waits for its WAL flush, so its
// latency is the commit latency of the server, not the round trip.
// WithAsyncCommit sets synchronous_commit = off for each statement's own
// transaction; WithUnlogged creates an UNLOGGED table. Both are faster and
// both can grant a lock twice after a database crash; see their docs.
//
// Releases of mutexes (and their ForceRelease, a waiter's place in line,
// Leave) commit with synchronous_commit = off in every mode (permit
// releases keep the Backend's setting): they wait for no WAL flush. That
// costs no guarantee. A release lost in a database crash leaves the key held
// until its TTL, as a release that never arrived does, and a lost place in
// line is taken again by the waiter's next try. No claim made after a
// release can survive a crash that loses the release: the claim saw it, so
// the release's commit record comes first in the WAL, and the claim's own
// durable commit flushes (and, with synchronous_standby_names, replicates)
// both.
//
// # PgBouncer
//
// Statements hold no session state, so the pool may go through PgBouncer in
// transaction mode (pool_mode = transaction), with two settings:
//
//   - No prepared statements: set the pool's DefaultQueryExecMode to
//     pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol
//     (default_query_exec_mode=exec in the URL). pgx's default caches
//     prepared statements per client connection, which the pooler's server
//     connections do not share: statements then fail with SQLSTATE 42P05
//     or 26000, and the error says what to set.
//   - LISTEN: through a transaction pooler it is accepted, but the
//     notifications never arrive. Give the LISTEN connection (one per
//     Backend, outside the pool) a direct route to the database server
//     with WithListenConfig, or turn it off with WithoutListen: waiters then
//     poll (see core.Backoff), and a hand-off takes a poll interval rather
//     than a round trip or two.
//
// For example (ExampleNew_pgBouncer):
//
//	cfg, _ := pgxpool.ParseConfig(os.Getenv("DATABASE_URL")) // through PgBouncer
//	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//	direct, _ := pgx.ParseConfig(os.Getenv("DATABASE_DIRECT_URL")) // the server itself
//	locker, err := pg.New(ctx, pool, pg.WithListenConfig(direct))  // or pg.WithoutListen()
//
// The acquire is one statement (a permit's, one batch), one transaction,
// so it stays on one server connection and sets nothing on it beyond that
// transaction.
//
// Watch checks its LISTEN connection each time it subscribes: it also
// listens on a private channel, sends a NOTIFY there through the pool and
// waits up to 2s for it. When it does not arrive, the Backend warns once,
// through the logger (WithLogger, default slog.Default()) and any
// ListenObserver given with WithObserver, naming the fix; it closes that
// connection and lets waiters poll, as under WithoutListen, until it is
// closed. No connection string or host is logged.
//
// # Notifications and durable commits
//
// A transaction that calls pg_notify holds a database-wide lock from its
// commit until its WAL flush; with durable releases, the releases of many
// Lockers used to queue behind one another's fsync. Now only releases of keys
// that someone waits for notify (see Waiting in line), and releases wait for
// no flush (see Durability modes), so releases commit in parallel. Where
// hand-off latency matters less than the LISTEN connections, WithoutNotify
// (with WithoutListen) sends no notifications and lets waiters poll (the
// queue's order still holds).
package pg
