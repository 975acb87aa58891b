// Package asynqlock is an asynq middleware that keeps at most one task per
// key running at a time (or up to n, with Limit), across every asynq
// server that shares the lock store.
//
// asynq's own Unique option does not do this: it deduplicates at enqueue
// time, and only tasks with the same type and exactly the same payload (and
// queue). Two tasks that touch the same resource with different payloads, or
// a task enqueued again after the uniqueness window, run side by side. The
// middleware instead takes a dislock lock around the handler, keyed by
// anything derived from the task.
//
// # Wiring
//
//	mw, err := asynqlock.New(locker, asynqlock.Key(asynqlock.ByTypeAndPayload))
//	if err != nil {
//		return err // an invalid option, named in the error
//	}
//	mux := asynq.NewServeMux()
//	mux.Use(mw)
//	srv := asynq.NewServer(redisOpt, asynq.Config{
//		IsFailure:                asynqlock.IsFailure,       // a busy bounce consumes no retry
//		RetryDelayFunc:           asynqlock.RetryDelay(nil), // and comes back soon
//		DelayedTaskCheckInterval: 100 * time.Millisecond,    // bounced tasks move back to pending every 0.1s (default 5s)
//		TaskCheckInterval:        100 * time.Millisecond,    // and are picked up within about 0.1s (default 1s)
//	})
//
// The middleware can also wrap one handler: mux.Handle(pattern, mw(h)).
// MustNew is New that panics on an invalid option instead, for wiring with
// fixed options at program start; Middleware, its former name, is
// deprecated.
//
// The two intervals are what makes a bounce cheap in time: asynq puts a
// retried task in its retry set, with its due time in whole seconds, and
// moves the due ones back to pending only every DelayedTaskCheckInterval;
// a server whose queues are empty looks for pending tasks only every
// TaskCheckInterval (0.5 to 1.5 times it). With asynq's defaults a bounced
// task comes back after 5s at best, and a backlog on one key drains at about
// one task every 4-5s whatever the policy that bounces. At 100ms each, an
// idle server asks Redis about 10 times a second for pending tasks and 10
// times a second per queue for due ones.
//
// # Keys
//
// Key selects the key: ByType (default: one task of each type at a
// time), ByTypeAndPayload (type and a payload hash), ByTaskID (one run of a
// given task at a time), ByHeader(name), or any KeyFunc. Prefix (default
// "asynqlock:") is put before it. An empty key runs the task without a lock.
// A KeyFunc error, or a key the Locker rejects, is permanent: the returned
// error wraps asynq.SkipRetry and asynq archives the task.
//
// # Up to n at a time: Limit
//
// Limit(n) lets up to n tasks of a key run at once, across all servers:
// each running task holds one of the n permits of a semaphore on the key
// (core.Limit), with its own lease, renewal, loss signal and fencing token
// (tokens increase per key across the permits). A task that finds all n
// permits taken is busy, and everything below applies as to a held lock:
// under HandOff it waits in line for a permit and is woken when one is
// released; the others are bounced, quick retries included. The store must
// hold semaphores (a core.SemaphoreBackend: memlock, and the backends whose
// documentation says so); New reports a store without them, naming
// Limit. Every server must use the same n for a key: a task whose key
// is held under another limit (a server without Limit, or a rolling
// change of n) is bounced as busy, with an error that also matches
// core.ErrLimitMismatch, until those holders are gone (on its last
// attempt it is archived with that error).
//
// # When the key is busy
//
// What asynq does with a handler's return value (v0.26) decides each policy:
// nil completes the task; an error wrapping asynq.RevokeTask deletes it; an
// error wrapping asynq.SkipRetry archives it, and so does any error when the
// task's retry count has reached its MaxRetry; any other error schedules a
// retry after Config.RetryDelayFunc's delay, counting one retry only when
// Config.IsFailure says the error is a failure.
//
//   - HandOff(n) (default HandOff(1)): up to n busy tasks of a key wait for
//     the lock on each server, each up to HandOffWait (default 5s, and never
//     past a second before its deadline), and the Locker wakes one when the
//     lock is released (at once with a store that notifies
//     releases: redislock, etcdlock, zklock, memlock; others are polled).
//     Every other busy task is bounced as by RetryLater: up to QuickRetries
//     a second per key and server (default 200, in bursts of 50) with a
//     retry delay of 0, so that they come back at the next delayed-task
//     check and take the place of a waiter that got the lock; the rest
//     after BusyDelay. Quick retries stop while a key has
//     not changed hands for a second: its holders run long, and the bounced
//     tasks come back after BusyDelay, which is short next to them. A
//     waiter that runs out of HandOffWait is bounced after BusyDelay, with a
//     *BusyError that uses no retry, so that a holder elsewhere that runs
//     long keeps a worker here for at most HandOffWait at a time (a server
//     of Concurrency 1 still runs other keys' tasks). A wait that the task's
//     own context ends (shutdown, deadline) is an ordinary failure.
//   - RetryLater returns a *BusyError, which matches core.ErrNotAcquired.
//     With IsFailure and RetryDelay wired in, the task goes back to the
//     retry set for a short jittered delay (BusyDelay, 1-3s) without using
//     up its retries. Without them a bounce counts as a failed attempt with
//     asynq's long exponential delays.
//   - Skip returns nil: completed without running.
//   - Revoke returns an error wrapping asynq.RevokeTask: deleted.
//   - Archive returns an error wrapping asynq.SkipRetry: archived.
//   - Wait(max) waits for the lock up to max within the task's deadline, then
//     falls back to RetryLater. Every busy task waits, each holding a worker.
//
// # Under a backlog: what each policy costs, and which to pick
//
// Measured with 2 servers of Concurrency 5 wired as above, a 30ms handler,
// the locks in the same Redis (redislock), on 2 vCPUs (BenchmarkDrain and
// the TestREADMEWiring tests):
//
//   - HandOff(1): 20 tasks on one key drain in about 1s (1.7 × their serial
//     time of 0.6s), 200 in about 9-10s (1.5-1.7 × 6s). At most one waiter
//     per key holds a worker on each server (with the holder, two), so other
//     keys keep flowing: 20 tasks of another key enqueued behind the 200
//     drain about as fast as alone. The price is the bouncing: 11-14 busy
//     bounces per task of a long backlog, each a dequeue, a TryAcquire and a
//     retry (a few Redis round trips), bounded by QuickRetries per key and
//     server (by default 200 a second, some 600 Redis calls) plus one per
//     backlogged task per BusyDelay. On a CPU already saturated by other
//     work the bouncing competes for it, and the drain slows down. HandOff(2) drains
//     short handlers faster (200 in 7.5-8.5s) for one more worker per key
//     and server. n must stay below Concurrency, or one key can take every
//     worker of a server; and k keys backlogged at once take up to k·n
//     workers of each server, for as long as their holders run: MaxWaiting
//     bounds the waiters of a server across keys.
//   - RetryLater: no worker ever waits, but a bounced task comes back only
//     after BusyDelay (1-3s) rounded to asynq's whole seconds, so a key
//     changes hands only once or twice a second: 20 tasks take about 19s,
//     and of 200 a third were still waiting after 60s. Pick it when a key's
//     tasks are rare (a backlog is the exception) or when no worker may be
//     held by a task that does not run.
//   - Wait(0): the fastest drain (200 in 6.6s, 1.1 × serial), but every busy
//     task holds a worker until it gets the lock: one hot key takes every
//     worker, and 20 tasks of another key wait for the whole backlog (6.6s
//     instead of 1s). Pick it only for keys that are never backlogged, or
//     with a server (queue) of their own.
//   - Skip, Revoke, Archive: nothing waits or comes back; the busy task is
//     dropped (completed, deleted or archived). Pick them when a task that
//     finds its key busy is redundant (a refresh that the running one does
//     anyway).
//
// On the task's last attempt (retry count = MaxRetry, which is every attempt
// of a task enqueued with MaxRetry(0)), asynq archives any error, so retrying
// later is impossible. There RetryLater and a Wait that ran out apply the
// OnExhausted policy instead, by default Wait(0): wait for the lock until the
// task's deadline. Only if the lock is still busy then is the task archived,
// with the busy error as its last error. Under HandOff a task on its last
// attempt takes a place in the line like any other (counted against n and
// MaxWaiting) and waits there until its deadline; one that finds no place
// gets the OnExhausted policy with its wait bounded by HandOffWait, and is
// then archived with the busy error (asynq's Inspector.RunTask runs it
// again). So a backlog of such tasks on a key held elsewhere takes at most n
// workers of a server for long, not all of them. Because busy bounces do not
// count, a task reaches its last attempt only through real failures or a
// MaxRetry of 0.
//
// # While the lock is held
//
// The handler's context carries the session (core.SessionFromContext; use
// its fencing token with the resource you protect) and is cancelled when the
// lease is lost, with context.Cause equal to an error matching
// core.ErrLeaseLost. If the lease was lost (or the Locker closed) while the
// handler ran — noticed by a renewal, or by the release after the handler,
// which finds the lease gone from the store (force-released, expired, taken
// over) — the middleware returns an error matching core.ErrLeaseLost even
// when the handler returned nil, so asynq retries the task.
//
// The lock is released when the handler returns, also when it panics (asynq
// recovers panics outside the middleware chain), on a context detached from
// the task's cancellation and bounded by ReleaseTimeout. A failed release
// does not change the task's outcome: the Locker's Observer sees it and the
// lock expires after its TTL. asynq cancels the handler's context at the
// task's deadline; a handler that ignores that keeps its lock renewed only
// until the deadline plus Grace (default 10s), after which the lock is
// released while the handler may still run.
//
// # What is not guaranteed
//
// A lease is not a fence. A handler that is paused (GC, a stopped VM) past
// its lease, or that ignores its context's cancellation, can still be
// writing when another task holds the key. Pass the session's Token to the
// protected resource and have it reject writes carrying a token smaller than
// the largest it has seen. Exclusion holds only among servers that use this
// middleware with the same key function, prefix and lock store.
//
// The tasks of a key run in no particular order, and a task waiting under
// HandOff or Wait keeps its worker when the server shuts down, until it gets
// the lock or asynq's ShutdownTimeout ends the wait (the task then goes back
// to pending).
package asynqlock
