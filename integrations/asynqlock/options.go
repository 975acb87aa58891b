package asynqlock

import (
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// Defaults used when no option says otherwise.
const (
	DefaultPrefix         = "asynqlock:"
	DefaultGrace          = 10 * time.Second
	DefaultBusyDelayMin   = time.Second
	DefaultBusyDelayMax   = 3 * time.Second
	DefaultReleaseTimeout = 5 * time.Second
	// DefaultQuickRetries is the default of QuickRetries.
	DefaultQuickRetries = 200
	// DefaultHandOffWait is the default of HandOffWait.
	DefaultHandOffWait = 5 * time.Second
)

// Option configures the middleware.
type Option func(*config)

type config struct {
	key            KeyFunc
	prefix         string
	lockOpts       []core.Option
	onBusy         Policy
	onExhausted    Policy
	grace          time.Duration
	delayMin       time.Duration
	delayMax       time.Duration
	releaseTimeout time.Duration
	quick          int
	maxWaiting     int
	handOffWait    time.Duration
	limit          int
	limitName      string // the option that set limit, for its errors
	optcheck.Errs
}

// optPrefix names asynqlock in the errors of its options.
const optPrefix optcheck.Prefix = "asynqlock: "

// invalid returns the error of an invalid value given to option name.
var invalid = optPrefix.Invalid

// checked is an Option that applies set, or records err when the value
// given was invalid (optcheck.Checked).
func checked(err error, set Option) Option { return optcheck.Checked(err, set) }

// positive is nil for v > 0, and otherwise option name's error.
func positive(name string, v time.Duration) error { return optcheck.Positive(optPrefix, name, v) }

// notNegative is nil for v >= 0, and otherwise option name's error.
func notNegative[T int | time.Duration](name string, v T) error {
	return optcheck.NotNegative(optPrefix, name, v)
}

// Key sets how a task's lock key is derived (default ByType). The key
// function's result is put after the prefix; an empty result means the task
// runs without a lock.
func Key(fn KeyFunc) Option { return key("Key", fn) }

// WithKey is Key.
//
// Deprecated: use Key. The package's options have no With prefix, and
// otel.WithKey meant something else (now otel.WithKeyMode).
func WithKey(fn KeyFunc) Option { return key("WithKey", fn) }

func key(name string, fn KeyFunc) Option {
	var err error
	if fn == nil {
		err = invalid(name, "nil key function")
	}
	return checked(err, func(c *config) { c.key = fn })
}

// Prefix is put before every lock key (default DefaultPrefix), so that the
// locks of asynq tasks share a namespace of their own. It may be empty.
func Prefix(p string) Option {
	return func(c *config) { c.prefix = p }
}

// Limit lets up to n tasks of a key run at once across every server
// that shares the lock store (default 1: one at a time): each running task
// holds one of the n permits of a semaphore on the key (core.Limit(n)), with
// its own lease, renewal, loss signal and fencing token. A task that finds
// all n permits taken is busy, and the busy policy (OnBusy, OnExhausted)
// applies as for a held lock: under HandOff it waits for a permit, and is
// woken when one is released. n must be between 1 and core.MaxLimit, and
// the Locker's backend must hold semaphores (a core.SemaphoreBackend:
// New checks this when l is a *core.Client); it overrides a core.Limit
// given in LockOptions. It is core.Limit and gocronlock.Limit for asynq
// tasks.
//
// Every server must use the same n for a key. While a key's tasks hold it
// under another limit (a rolling change of n), a task is bounced as busy
// with an error that also matches core.ErrLimitMismatch, and runs once
// those holders are gone; on its last attempt, where the OnExhausted wait
// cannot wait for that (Acquire answers a mismatch at once), asynq archives
// it with that error.
func Limit(n int) Option { return limit("Limit", n) }

// WithLimit is Limit.
//
// Deprecated: use Limit, as in core and gocronlock.
func WithLimit(n int) Option { return limit("WithLimit", n) }

func limit(name string, n int) Option {
	var err error
	if n < 1 || n > core.MaxLimit {
		err = invalid(name, "must be between 1 and %d, got %d", core.MaxLimit, n)
	}
	return checked(err, func(c *config) { c.limit, c.limitName = n, name })
}

// LockOptions are passed to every acquisition (core.TTL, core.WithOwner, …).
func LockOptions(opts ...core.Option) Option {
	return func(c *config) { c.lockOpts = append(c.lockOpts, opts...) }
}

// OnBusy sets what happens to a task whose key is held elsewhere (default
// HandOff(1)).
func OnBusy(p Policy) Option {
	return checked(p.check("OnBusy"), func(c *config) { c.onBusy = p })
}

// OnExhausted sets what happens to a busy task on its last attempt (its
// retry count has reached its MaxRetry), when the busy policy would retry it
// later. asynq archives a task that fails on its last attempt whatever
// Config.IsFailure says, so retrying later is not possible then; the default
// is Wait(0): wait for the lock until the task's deadline (under HandOff, a
// task that found no place in the line waits at most HandOffWait). RetryLater
// and HandOff are not valid values.
func OnExhausted(p Policy) Option {
	err := p.check("OnExhausted")
	if err == nil && (p.kind == kindRetryLater || p.kind == kindHandOff) {
		err = invalid("OnExhausted", "%v cannot apply once retries are exhausted", p)
	}
	return checked(err, func(c *config) { c.onExhausted = p })
}

// Grace sets how long after the task's deadline the lock stays held if the
// handler has not returned (default DefaultGrace). asynq cancels the
// handler's context at the deadline; a handler that ignores it keeps running,
// but its lock is released at deadline + grace so that the key does not stay
// locked for as long as the handler hangs.
func Grace(d time.Duration) Option {
	return checked(notNegative("Grace", d), func(c *config) { c.grace = d })
}

// BusyDelay sets the range from which the retry delay of a busy task is
// drawn (uniformly; default DefaultBusyDelayMin to DefaultBusyDelayMax),
// except for HandOff's quick retries, whose delay is 0. The delay travels in
// the *BusyError and is applied by RetryDelay. asynq keeps retry times in
// whole seconds and moves due tasks every Config.DelayedTaskCheckInterval
// (default 5s), which bound how soon a bounced task runs again.
func BusyDelay(min, max time.Duration) Option {
	var err error
	if min < 0 || max < min {
		err = invalid("BusyDelay", "need 0 <= min <= max, got min %v max %v", min, max)
	}
	return checked(err, func(c *config) { c.delayMin, c.delayMax = min, max })
}

// QuickRetries sets how many bounces of HandOff per key and per second, on
// each server, come back at asynq's next delayed-task check (a retry delay
// of 0) rather than after BusyDelay (default DefaultQuickRetries, in bursts
// of up to a quarter of it; 0: none).
// They keep a few tasks of a backlog circling, so that a place in line freed
// by a hand-off is taken again within about Config.DelayedTaskCheckInterval,
// while the cost of the circling stays bounded however long the backlog:
// each bounce is a dequeue, a TryAcquire and a retry, a few store round
// trips. Quick retries stop while the key has not changed hands for a
// second (its holders run long, and bouncing fast gains nothing).
func QuickRetries(perSecond int) Option {
	return checked(notNegative("QuickRetries", perSecond), func(c *config) { c.quick = perSecond })
}

// MaxWaiting bounds the tasks that wait in HandOff's lines on this server at
// once, across all keys (default 0: no bound beyond HandOff's n per key). A
// busy task that finds the bound reached is bounced. HandOff(n) keeps one
// hot key to n workers of a server, but k keys backlogged at once can take
// k·n, and a waiter holds its worker as long as the holder elsewhere runs:
// set MaxWaiting below the server's Concurrency (half of it, say) when many
// keys can be busy at once.
func MaxWaiting(n int) Option {
	return checked(notNegative("MaxWaiting", n), func(c *config) { c.maxWaiting = n })
}

// HandOffWait bounds how long a task waits in HandOff's line (default
// DefaultHandOffWait), and never past one second (or a tenth of the time
// left, if less) before the task's deadline. A waiter that runs out is bounced with a *BusyError, which uses
// none of its retries, and its place goes to the next busy task: a holder
// elsewhere that runs long keeps a worker of this server for at most d at a
// time, so that a server whose Concurrency is 1 still runs other keys' tasks.
// On the task's last attempt a bounce would be archived: see HandOff.
func HandOffWait(d time.Duration) Option {
	return checked(positive("HandOffWait", d), func(c *config) { c.handOffWait = d })
}

// ReleaseTimeout bounds the release after the handler returns, which runs on
// a context detached from the task's cancellation (default
// DefaultReleaseTimeout).
func ReleaseTimeout(d time.Duration) Option {
	return checked(positive("ReleaseTimeout", d), func(c *config) { c.releaseTimeout = d })
}
