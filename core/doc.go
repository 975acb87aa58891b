// Package core is dislock's contract and its lease engine.
//
// Users code against two interfaces, Locker and Session. Backends (pg,
// redislock, memlock) implement the small Backend driver interface, and
// Client — the engine, written once — turns any Backend into a Locker:
// leases with heartbeat renewal, a local deadline on the monotonic clock,
// loss notification, blocking acquisition woken by release notifications,
// schedule-slot locks, min hold, jitter and fencing tokens.
//
// # What is guaranteed
//
// Mutual exclusion as seen by the store: the store grants a key to one owner
// token at a time, and every renewal and release is checked against that
// token on the store. A session's Deadline is the send time of its last
// successful acquire or renewal plus the renew deadline (default 2/3 of the
// TTL), on this process's monotonic clock — sooner after an acquire whose
// store says it keeps the claim for less than the TTL (by at most half a
// renew interval; see Lease): by as much. When no renewal succeeds by then,
// the session ends with ErrLeaseLost — Done closes and Context is cancelled —
// before the store can grant the key to anyone else (that takes the full
// TTL). A renewal the store refuses ends the session at once, with an error
// that also matches ErrLeaseGone. A Release that finds the lease gone from the
// store before any renewal did (force-released, expired, taken over) returns
// that error too, and the session ends as lost, not released; Do returns it.
// Loss is never silent, except to a slot session, whose Release sends nothing.
//
// # The margin belongs to the holder
//
// After a loss at the renew deadline, the store still holds the key for the
// margin TTL − RenewDeadline: that is the holder's time to stop its work.
// The engine never frees a lost lease's key on its own initiative. The key
// is freed before its TTL only when the holder calls Release on the lost
// session, which means "my work has stopped"; otherwise the store drops it
// when the TTL, counted from the last acquire or renewal it may have applied,
// runs out. Do and TryDo release once fn has returned; the gocron and asynq
// integrations once the job or handler has returned; the dislock CLI once
// the command's whole process group has exited; an Election once OnRevoked
// has returned. Close releases every session, including lost ones not yet
// released: closing a Locker says its work is over. After a refusal
// (ErrLeaseGone) there is no margin: the key may already be someone else's.
//
// Renewals are bounded per lease: a renewal call waits at most until the
// earliest deadline among its sessions (half the time left, when it carries
// several), calls run concurrently, and the sessions of a call that failed as
// a whole (it hung, or the store failed it) are split into smaller groups
// until they succeed, so that one key that hangs or fails (a slow node, a row
// locked by an open transaction) never costs another lease its lock. When
// nothing fails, all of a Locker's leases still cost one call per interval.
//
// # What is not guaranteed
//
// A lease is not a fence. A process that pauses (GC, SIGSTOP, a swapped-out
// VM) for longer than the margin TTL - RenewDeadline can wake up believing it
// still holds a lock that has passed to someone else, and clock-rate drift
// between this process and the store eats into the same margin. When the
// protected resource can check it, pass Session.Token (strictly increasing per
// key, kept across renewals) with every write and have the resource reject
// tokens smaller than the largest it has seen. Work that cannot finish before
// Session.Deadline must not start.
//
// A store that loses data (a Redis restart without persistence, a failover to
// a replica that missed a write, an unlogged PostgreSQL table after a crash)
// can grant a lock twice; the backend packages say exactly when.
//
// # Concurrency
//
// Lockers, Sessions and Elections are safe for concurrent use. A Client runs
// one renewer goroutine for all of its sessions, which batches every renewal
// due within half a renew interval into one Backend.Renew call (leases of
// the interval of those due ride along, so that leases taken at different
// times share one call per interval), plus one
// Watcher goroutine while anyone waits in Acquire. Close ends waits in
// Acquire, cuts acquisitions in flight short and waits for them, for the
// store calls they left running and for the undo of their claims, releases
// every session, stops both goroutines and waits for them, and only then
// closes the Backend.
//
// # Waiting in line
//
// Acquire waits until the key is free or ctx ends. On a backend that is a
// Queuer (memlock, redislock, pg; not pg's legacy table, a QueueKeeper that
// keeps no queue: see QueuerOf) the store keeps the waiters of a key in a
// first-in, first-out queue: a busy answer puts the waiter in line, a
// release tells the first waiter in line — across all processes — that its
// turn has come, and only that waiter claims. One release costs one claim,
// not one per waiting process, and waiters get the key in the order they
// came. A caller that does not wait (TryAcquire) never takes a free key
// from a waiter in line. A waiter's place lasts two seconds after its latest
// attempt and is refreshed while it waits, so the place of a process that
// died is skipped within two seconds; a wait that gives up (ctx, Close)
// leaves the line at once. On other backends a release wakes one waiter
// per process. Either way a jittered backoff, capped at the holder's known
// expiry, polls when a notification is missed.
//
// # Semaphores
//
// Limit(n) makes the acquisition one of n permits of a semaphore on the key:
// up to n sessions hold it at once. Each permit is a lease like a lock —
// renewed in the Locker's one batched call per interval, lost with the same
// signal, with a fencing token that strictly increases per key across all
// permits — and waiters wake when a permit frees. Every holder of a key must
// ask for the same limit: a claim with another one fails with
// ErrLimitMismatch. Client.Holders lists every permit of a key. Backends
// opt in by implementing SemaphoreBackend; others answer Limit(n > 1) with
// ErrUnsupported.
//
// # Check
//
// Session.Check asks the store in one round trip whether it still holds the
// session's lease (renewing it when it does): call it right before an
// irreversible step on a resource that cannot check fencing tokens. It
// narrows the window in which a paused or partitioned holder acts on a lost
// lease to that round trip; only a fencing token closes it.
//
// # Slots and min hold
//
// Schedulers that fire on several machines at slightly different moments want
// one start per tick, not mutual exclusion of the runs. ForSlot(schedule)
// holds the key until the end of the slot the start belongs to, computed on
// the store's clock; MinHold(d) keeps a released lock until d after it was
// taken. Either stops a fast job from running on every node.
//
// # Elections
//
// CampaignContext campaigns for leadership of a key in the background:
// whoever holds the key's lock leads, IsLeader answers from memory (no I/O,
// no allocation), Resign hands over, Close resigns and stops. An election
// says what stops it:
//
//   - CampaignContext waits, bounded by its ctx, for the first attempt's
//     answer, so that IsLeader then says what the store decided (Ready
//     closes at that answer). It returns an error, and campaigns no further,
//     for what no retry can mend: a bad key or option, an option the
//     backend rejects (a TTL longer than a ZooKeeper session allows),
//     ErrLimitMismatch, ErrUnsupported, a closed Locker. A busy key or a
//     store failure is not an error: the campaign goes on.
//   - OnError hears of every attempt that failed for another reason than a
//     busy key, including a store that fails while this process stands by
//     (within one lock TTL); by default these are logged at WARN through the
//     Client's logger (WithLogger, default slog.Default()).
//   - OnRevoked gets the cause of every end of leadership: ErrLeaseLost,
//     ErrReleased after Resign, ErrElectionClosed after the Election's own
//     Close, ErrClosed when the Locker was closed.
//   - Observe reports who leads as it changes (the Admin's view, looked up
//     at this process's own changes and once per retry interval); Leader
//     looks it up once.
//
// Campaign, without a ctx, is kept for existing callers and deprecated.
//
// # Deadlines
//
// TryAcquire and Acquire return within DeadlineSlack (100ms) of the end of
// their ctx, whatever the store does. A ctx that is already done costs no
// round trip. A store call that has not returned by then — a driver that
// ignores ctx, a server that never answers — is left to finish in the
// background, and a claim it makes after its caller left is undone by owner
// token. A backend whose driver itself ends every call with its ctx
// (ContextBound: pg, mysqllock, etcdlock, zklock) keeps that bound on its
// own, and its claims are made on the caller's goroutine; a claim in doubt
// when ctx ended is undone all the same. The undo of a claim left in doubt
// and a waiter's leaving the store's queue run in the background too: the
// caller waits for them only while its ctx lasts (plus the slack). Close
// waits for all of it (for a store call left running, up to 10s before it
// closes the backend, and as long again after), so a Close right after an
// outage can take about two release timeouts: the undo's release in
// flight, then its last attempt.
//
// # Errors
//
// Errors are errors.Is-able sentinels (ErrNotAcquired, ErrLeaseLost — with
// ErrLeaseGone when the store refused a renewal or found nothing to
// release —, ErrReleased, ErrClosed, ErrElectionClosed, ErrInvalidKey,
// ErrInvalidOption, ErrUnsupported, ErrLimitMismatch); backend failures wrap
// the driver's error.
//
// ErrNotAcquired means the store answered "held by someone else", and
// nothing else, so that skipping work on it never hides an outage. A
// TryAcquire matches it only on a busy answer. An Acquire that ctx ends
// matches it (and ctx's error) only when the store's last answer was busy;
// an attempt that ctx cuts short is no answer, so a wait that saw the key
// busy and then timed out mid-attempt is still busy. Every other way an
// acquisition ends without the lock is a failure that does not match it:
// the store failed (the driver's error), the store had not answered when
// ctx ended (ctx's error and the driver's: a store that hangs), or ctx was
// over before the first attempt (ctx's error; no round trip is made). When
// a wait saw busy answers and then failed, the message says both. Close
// ends acquisitions with ErrClosed.
package core
