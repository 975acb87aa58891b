// Package mysqllock is the MySQL and MariaDB backend of dislock, on
// database/sql with github.com/go-sql-driver/mysql.
//
//	db, _ := sql.Open("mysql", "user:password@tcp(db:3306)/app")
//	locker, err := mysqllock.New(ctx, db, mysqllock.WithAutoMigrate()) // a *core.Client: core.Locker and core.Admin
//	s, err := locker.TryAcquire(ctx, "nightly-report")                 // errors.Is(err, core.ErrNotAcquired) when busy
//
// New and NewBackend use the caller's pool and never close it; Open and
// OpenBackend make a pool of their own from a mysql://user:password@host:
// port/dbname URL or a go-sql-driver DSN, which the Locker's (or the
// Backend's) Close closes. Without WithAutoMigrate the schema must exist
// already: create it with mysqllock.Migrate(ctx, db, opts...) or with the
// statements of SchemaSQL. No DSN is ever formatted into an error.
//
// Open's pool comes from Connector, which a program that makes its own
// pool can use too (sql.OpenDB(c)): a statement that returns no rows and
// whose ctx ends is cut short by closing its connection's socket, where go-sql-driver/mysql
// hands every statement whose ctx can end to its connection's watcher
// goroutine and takes it back at the end. Every statement of the engine
// has a ctx that can end (the caller's deadline, the claim's bound, the
// release timeout), and on a busy machine those two hand-offs cost an
// uncontended acquire and release about 5 % (see BENCHMARKS.md). A pool of
// the driver's own, given to New, works the same otherwise.
//
// # Servers
//
// The SQL is written for MySQL 8.0.14 or newer and MariaDB 10.6 or newer
// (JSON_TABLE, JSON_ARRAYAGG, stored procedures, KILL QUERY of the user's
// own connections); it uses nothing that only one of them has. It is
// tested on MariaDB 10.11 only: MySQL 8 was not available to the tests.
// InnoDB tables; the binary log, when on, in ROW or MIXED format (the
// procedures' transactions run at READ COMMITTED).
//
// # How it works
//
// Locks are rows of one table (default dislock_locks) with four companion
// tables (<table>_permits, <table>_waiters, <table>_turns,
// <table>_watchers) and eleven stored procedures (<table>_acquire, …) that
// Migrate installs. MySQL has no
// RETURNING, so each operation that decides something is one CALL of a
// procedure (but for the claim and release of a free key, below: one
// UPDATE each): one round trip (COM_STMT_EXECUTE of a statement that
// database/sql prepares once per pool connection), one transaction, every
// decision taken under the key's row lock on the server's clock
// (UTC_TIMESTAMP(6), in microseconds, read after the row lock is granted).
// A multi-statement batch would need multiStatements=true in the caller's
// DSN and cannot be prepared; the procedures run with any DSN.
//
//   - Acquire locks the key's row (SELECT … FOR UPDATE) and claims it when
//     it is missing, free or expired (and, with waiters queued, it is the
//     caller's turn). A key held by someone else, asked by a caller that
//     does not wait (or whose place in line needs no refresh), is answered
//     from a plain read, without a row lock or a write. A free mutex key
//     whose row says nobody waits (a flag that queueing sets), asked by a
//     caller that does not wait, is claimed by one conditional UPDATE of
//     the row as that read found it (no transaction of its own, no locked
//     read); a row changed since goes the locked way. Acquiring with the
//     same owner token again is a success (idempotent).
//   - The free key of a caller that does not wait: a TTL claim of a mutex
//     key whose lease the same Backend lately ended is first a plain
//     UPDATE (prepared once per connection, no CALL, no result set): it
//     claims the row when its expiry and token are below the statement's
//     clock and its waiting flag is 0, the token being that clock, decided
//     under the row's lock and returned in the OK packet
//     (LAST_INSERT_ID(expr), which the connection then keeps as its
//     LAST_INSERT_ID()). When it claims nothing the CALL follows (two
//     round trips), and a key the CALL finds held is no longer tried so;
//     other keys (new ones, and those of other processes) go to the CALL
//     at once. The release of a lease claimed so is a plain UPDATE too
//     (owner token, waiting flag 0, expiry against the clock once the row
//     is locked), with the CALL after it only when it ended nothing (a
//     waiter queued meanwhile, the lease lost); that of a lease the CALL
//     claimed (a waiter's, a new key's) is the CALL alone. A free key's claim and
//     release are then one statement each, as a plain TTL row's are. A slot's end is
//     checked on the server's clock under the lock, so a claim that waited
//     for the row past its slot's end is refused.
//   - Those plain UPDATEs, when several are made at once (many goroutines
//     on distinct keys), share round trips: a statement made while none of
//     the Backend's is on its way is sent at once, and those made
//     meanwhile queue and go, up to three batches at a time, as one CALL
//     of <table>_batch. It runs them in one transaction, in key order,
//     with each claim's bound counted from the CALL's start, and answers
//     each as its statement alone would; a batch refused whole (a
//     deadlock, a bound passed) changes nothing, and its callers go on to
//     the procedures, as after an UPDATE that changed no row. A batch is
//     sent under the earliest deadline of its claims. With 64 goroutines
//     on distinct keys this doubles the pairs per second of a plain TTL
//     row's statements (BENCHMARKS.md).
//   - A key found held by another owner, tried again by a caller that does
//     not wait while that owner's lease has not run out, is first read by
//     a plain SELECT of its row (no CALL, no lock, no write): while the key
//     stays held, that read is the whole try; when it finds the key free,
//     the claim follows.
//   - A try of a key while another try of the same key by this Backend has
//     its claim on the way (callers that do not wait, both) sends nothing:
//     it waits for that claim and answers busy with the winner's lease
//     when it won; otherwise it sends its own claim, so a failure is never
//     passed on as busy. A hot key that comes free then costs the server
//     one claim per Backend.
//   - Fencing tokens are decided under the row's lock: greatest(the
//     server's clock in microseconds, read then, the row's last token + 1).
//     A release ends the row rather than deleting it, so the key's last
//     token stays: a lease's own release sets only its expiry to 0, in
//     place (a row whose expiry is past is free whatever its holder
//     columns say, and keeping them spares the server a row rewrite);
//     the locked release (a key someone may wait on) and ForceRelease
//     clear the holder columns too.
//     Ended rows are pruned a day after
//     their last claim, and a claim that finds no row reads the clock after
//     that, so tokens increase per key across releases, expiries, permits,
//     crashes and server restarts, as long as the server's clock is not
//     stepped back.
//   - Renewal of every due session of a Locker is one CALL whose argument
//     is a JSON array of the leases (JSON_TABLE), mutexes and permits alike;
//     a session missing from its answer is lost at once.
//   - Release is an owner-checked CALL that ends the row (or, under MinHold
//     and slot mode, sets its expiry); a lease that was no longer live is
//     answered as lost (core.ErrLeaseGone). A mutex lease nobody waits for
//     is ended by one conditional UPDATE; otherwise the first live waiter
//     is told, in the same transaction.
//   - The claim timeout (WithClaimTimeout) is checked by the procedure on
//     the server once it holds the row's lock: a claim held up past it is
//     rolled back (the one-UPDATE claims compare SYSDATE(6), read when the
//     row is, with the statement's or the procedure's start: they do not
//     apply), so the
//     engine knows when an ambiguous claim can no longer take effect
//     (core.ClaimBounder).
//   - Commits are durable as the server is configured
//     (innodb_flush_log_at_trx_commit = 1 by default): MySQL has no
//     per-transaction setting.
//
// # Semaphores
//
// core.Limit(n) keys have a header row in the lock table (lim = n, the
// key's last token) and a row per permit in <table>_permits, claimed under
// the header's row lock: one CALL. A mutex claim of a key with live
// permits, or a claim with another limit, fails with core.ErrLimitMismatch.
//
// # Waiting in line
//
// Backend is a core.Queuer: the waiters of a key wait in a first-in,
// first-out line in <table>_waiters, across all processes. A waiting
// Acquire's busy attempt takes a place at the tail (or keeps its own) in
// the same CALL, naming the watcher of its Locker; a free key is granted
// only to the first live waiter, or to anyone when nobody live waits. A
// release, ForceRelease, a Leave of the first waiter of a free key, or a
// grant that leaves a permit free writes the turn of the next live waiter
// to <table>_turns and, after its commit, in the same CALL, ends with KILL
// QUERY the wait of the one watcher that waiter's place names. When the
// place names none (the waiter queued before its Locker's watcher ran) or
// a watcher that is gone (its connection was lost and it started again),
// the release ends the wait of every watcher of the table instead, and
// the engine's own polling still gets the waiter in.
//
// A watcher (one per Locker while anyone waits) holds two pool
// connections: one holds a named lock (GET_LOCK), the other waits for it
// with a timeout, so a KILL QUERY ends the wait at once. The waiting
// connection runs a CALL (<table>_watch) that lasts about 20s (a server
// that holds a procedure while a CALL runs it keeps Migrate's replacement
// of it waiting no longer than that), then the next: a loop that sends the
// turns the watcher has not read as a result set (the server sends it
// before it goes on) and then waits. The procedure's handler takes the
// kill (ER_QUERY_INTERRUPTED) and the loop reads the turns again: a
// wake-up costs no request, as a notification on a LISTEN connection
// costs none on PostgreSQL. (A server whose procedures cannot catch a kill
// ends the CALL instead, and the watcher calls again: one request per
// wake-up. MariaDB 10.11 catches it, but for a kill that lands while the
// handler runs, which only a storm of kills makes common; MySQL 8 was not
// tested.) The waiting connection holds a named lock of its own
// (its connection id and a random part), listed in <table>_watchers and
// named by the places of its Locker's waiters: a release kills the
// connection IS_USED_LOCK names, so never a connection that merely took
// over a dead watcher's id. KILL QUERY needs no privilege for the user's
// own connections; when it fails (processes connecting as different users
// without CONNECTION_ADMIN), the wait ends by itself every 2s and the
// engine's own polling still runs. A hand-off with 16 waiting processes
// costs 3 requests per acquisition once their watchers run (the busy try
// that queues the waiter, its claim, the release; a watcher's start costs
// 3 statements, once per Locker, and a CALL every 20s) and a p50 of about
// 3ms on a loaded test machine. WithoutListen turns the watchers off:
// waiters poll.
//
// # Upgrading
//
// This release adds one procedure, <table>_batch (the plain statements that
// meet share its CALL), at the same version: NewBackend on procedures
// migrated by an earlier release fails with ErrSchema saying that it does
// not exist and naming the fix; Migrate (or WithAutoMigrate) creates it and
// leaves the other procedures as they are, and processes of the earlier
// release go on working beside this one.
//
// Version 3 of the procedures (this one) changes what <table>_watch
// sends (a loop of result sets instead of one wait) and keeps the tables
// of version 2: Migrate (or WithAutoMigrate) replaces the procedures, and
// NewBackend on procedures of another version fails with ErrSchema naming
// the fix. Processes of version 2 still claim and release once the
// procedures are replaced, but their watchers fail (their waiters poll)
// until they are upgraded too. Version 2 of the schema added a column to
// the lock table (the waiting flag, 1 on the rows there are) and one to
// <table>_waiters (the watcher): NewBackend on tables of version 1 fails
// with ErrSchema naming the fix, and processes still running version 1
// fail their calls once the procedures are replaced (their statements
// have other arguments): upgrade them together.
//
// # Not guaranteed
//
// Replication is asynchronous: a lock acquired on a primary that fails
// before its replicas received it can be granted again by the promoted
// replica, and a replica's clock decides expiries after a failover.
// Galera Cluster and MySQL Group Replication are not tested (certification
// conflicts surface as failed claims the engine undoes, and wake-ups reach
// only watchers on the node of the release). Behind a proxy (ProxySQL,
// MaxScale), prepared statements and the watchers' long waits must reach
// one server.
package mysqllock
