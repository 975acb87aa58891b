package asynqlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

type policyKind int

const (
	kindRetryLater policyKind = iota
	kindSkip
	kindRevoke
	kindArchive
	kindWait
	kindHandOff
)

// Policy says what the middleware does with a task whose key is held
// elsewhere. Compare policies with ==.
type Policy struct {
	kind policyKind
	max  time.Duration
	n    int
}

var (
	// RetryLater returns a *BusyError (matching core.ErrNotAcquired): asynq
	// retries the task. Wire IsFailure and RetryDelay into asynq.Config so
	// that the bounce consumes none of the task's retries and comes back
	// after a short delay.
	RetryLater = Policy{kind: kindRetryLater}
	// Skip returns nil: the task counts as done (completed when it has a
	// retention period, deleted otherwise) without its handler running.
	Skip = Policy{kind: kindSkip}
	// Revoke returns an error wrapping asynq.RevokeTask: the task is deleted,
	// neither retried nor archived.
	Revoke = Policy{kind: kindRevoke}
	// Archive returns an error wrapping asynq.SkipRetry: the task is archived.
	Archive = Policy{kind: kindArchive}
)

// Wait waits up to max for the lock, within the task's deadline; max 0 waits
// until the deadline. If the lock is still busy then, the task is handled as
// by RetryLater: bounced, or on its last attempt given to the OnExhausted
// policy. As an OnExhausted policy, a Wait that runs out returns the
// *BusyError, and asynq archives the task with it.
func Wait(max time.Duration) Policy { return Policy{kind: kindWait, max: max} }

// HandOff (the default, HandOff(1)) lets up to n busy tasks of a key wait
// for its lock on each server, each up to HandOffWait: the Locker wakes a
// waiter when the lock is released (at once with a store that notifies
// releases: redislock, etcdlock, zklock, memlock; others are polled), so
// that a backlog on one key drains at about the handler's speed. Every
// other busy task is bounced as by RetryLater: up to QuickRetries a second
// come back at asynq's next delayed-task check, to take the place of a
// waiter that got the lock; the rest after BusyDelay. A waiter that runs
// out of HandOffWait is bounced too, after BusyDelay. Set
// asynq.Config.DelayedTaskCheckInterval and TaskCheckInterval to about
// 100ms, or bounced tasks come back only every 5s: see the package
// documentation.
//
// A waiter holds one of the server's workers while it waits, so n bounds the
// workers one key can take on a server (n must be below Concurrency;
// MaxWaiting bounds them across keys).
//
// On the task's last attempt asynq archives a bounce, so such a task takes
// a place in the line like any other (counted against n and MaxWaiting) and
// waits there until its deadline. If there is no place, the OnExhausted
// policy applies, a Wait bounded by HandOffWait: the task holds its worker
// for at most that long and is then archived with the busy error (run it
// again with asynq's Inspector.RunTask). So the tasks on their last attempt
// of a key held elsewhere take at most n workers for long.
func HandOff(n int) Policy { return Policy{kind: kindHandOff, n: n} }

func (p Policy) check(opt string) error {
	switch {
	case p.kind < kindRetryLater || p.kind > kindHandOff:
		return invalid(opt, "unknown policy")
	case p.kind == kindWait && p.max < 0:
		return invalid(opt, "Wait: must not be negative, got %v", p.max)
	case p.kind == kindHandOff && p.n < 1:
		return invalid(opt, "HandOff: need at least 1 waiter per key, got %d", p.n)
	}
	return nil
}

// String names the policy, as in its constructor.
func (p Policy) String() string {
	switch p.kind {
	case kindRetryLater:
		return "RetryLater"
	case kindSkip:
		return "Skip"
	case kindRevoke:
		return "Revoke"
	case kindArchive:
		return "Archive"
	case kindWait:
		if p.max == 0 {
			return "Wait(deadline)"
		}
		return fmt.Sprintf("Wait(%v)", p.max)
	case kindHandOff:
		return fmt.Sprintf("HandOff(%d)", p.n)
	}
	return "Policy(?)"
}

// BusyError is returned (by RetryLater, and when a Wait gives up) for a task
// whose key is held elsewhere. It matches core.ErrNotAcquired.
type BusyError struct {
	Key     string        // the full lock key
	RetryIn time.Duration // the delay RetryDelay gives asynq
	Err     error         // the Locker's error, matching core.ErrNotAcquired
}

// Error describes the busy task and who holds its key, when known.
func (e *BusyError) Error() string { return "asynqlock: task busy: " + e.Err.Error() }

// Unwrap returns the Locker's error.
func (e *BusyError) Unwrap() error { return e.Err }

// IsFailure is an asynq.Config.IsFailure that does not count a busy bounce
// (an error wrapping a *BusyError) as a failure: asynq then retries the task
// without incrementing its retry count or its queue's failure statistics.
// Every other non-nil error is a failure.
func IsFailure(err error) bool {
	if err == nil {
		return false
	}
	var b *BusyError
	return !errors.As(err, &b)
}

// RetryDelay returns an asynq.Config.RetryDelayFunc that retries a busy
// task after the short jittered delay carried by its *BusyError (see
// BusyDelay) and every other failed task after fallback's delay (nil means
// asynq.DefaultRetryDelayFunc).
func RetryDelay(fallback asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	if fallback == nil {
		fallback = asynq.DefaultRetryDelayFunc
	}
	return func(n int, err error, t *asynq.Task) time.Duration {
		var b *BusyError
		if errors.As(err, &b) {
			return b.RetryIn
		}
		return fallback(n, err, t)
	}
}
