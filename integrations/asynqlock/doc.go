// Package asynqlock is an asynq middleware that keeps at most one task per
// key running at a time, across every asynq server that shares the lock
// store.
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
//	mux := asynq.NewServeMux()
//	mux.Use(asynqlock.Middleware(locker, asynqlock.WithKey(asynqlock.ByTypeAndPayload)))
//	srv := asynq.NewServer(redisOpt, asynq.Config{
//		IsFailure:      asynqlock.IsFailure,        // a busy bounce consumes no retry
//		RetryDelayFunc: asynqlock.RetryDelay(nil),  // and comes back after 1-3s
//	})
//
// The middleware can also wrap one handler: mux.Handle(pattern,
// asynqlock.Middleware(locker)(h)).
//
// # Keys
//
// WithKey selects the key: ByType (default: one task of each type at a
// time), ByTypeAndPayload (type and a payload hash), ByTaskID (one run of a
// given task at a time), ByHeader(name), or any KeyFunc. Prefix (default
// "asynqlock:") is put before it. An empty key runs the task without a lock.
// A KeyFunc error, or a key the Locker rejects, is permanent: the returned
// error wraps asynq.SkipRetry and asynq archives the task.
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
//   - RetryLater (default) returns a *BusyError, which matches
//     core.ErrNotAcquired. With IsFailure and RetryDelay wired in, the task
//     goes back to the retry set for a short jittered delay (BusyDelay)
//     without using up its retries. Without them a bounce counts as a failed
//     attempt with asynq's long exponential delays.
//   - Skip returns nil: completed without running.
//   - Revoke returns an error wrapping asynq.RevokeTask: deleted.
//   - Archive returns an error wrapping asynq.SkipRetry: archived.
//   - Wait(max) waits for the lock up to max within the task's deadline, then
//     falls back to RetryLater.
//
// On the task's last attempt (retry count = MaxRetry, which is every attempt
// of a task enqueued with MaxRetry(0)), asynq archives any error, so retrying
// later is impossible. There RetryLater and a Wait that ran out apply the
// OnExhausted policy instead, by default Wait(0): wait for the lock until
// the task's deadline. Only if the lock is still busy then is the task
// archived, with the busy error as its last error. Because busy bounces do
// not count, a task reaches its last attempt only through real failures or
// a MaxRetry of 0.
//
// # While the lock is held
//
// The handler's context carries the session (core.SessionFromContext; use
// its fencing token with the resource you protect) and is cancelled when the
// lease is lost, with context.Cause equal to an error matching
// core.ErrLeaseLost. If the lease was lost (or the Locker closed) while the
// handler ran, the middleware returns an error matching core.ErrLeaseLost
// even when the handler returned nil, so asynq retries the task.
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
package asynqlock
