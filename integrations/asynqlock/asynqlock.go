package asynqlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
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

// handOffMargin is how long before the task's deadline a HandOff wait gives
// up at the latest (or a tenth of the time left, if less), so that its bounce reaches asynq before the deadline
// cancels the task (which would be an ordinary failure, using a retry).
const handOffMargin = time.Second

// quickWindow is how long after the key last changed hands HandOff still
// sends bounces back quickly: a key held longer has long-running holders,
// its waiters are next anyway, and a bounce comes back after BusyDelay
// instead.
const quickWindow = time.Second

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
	errs           []error
}

func invalid(name, format string, args ...any) error {
	return fmt.Errorf("%w: asynqlock: %s: %s", core.ErrInvalidOption, name, fmt.Sprintf(format, args...))
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
	return func(c *config) {
		if fn == nil {
			c.errs = append(c.errs, invalid(name, "nil key function"))
			return
		}
		c.key = fn
	}
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
	return func(c *config) {
		if n < 1 || n > core.MaxLimit {
			c.errs = append(c.errs, invalid(name, "must be between 1 and %d, got %d", core.MaxLimit, n))
			return
		}
		c.limit, c.limitName = n, name
	}
}

// LockOptions are passed to every acquisition (core.TTL, core.WithOwner, …).
func LockOptions(opts ...core.Option) Option {
	return func(c *config) { c.lockOpts = append(c.lockOpts, opts...) }
}

// OnBusy sets what happens to a task whose key is held elsewhere (default
// HandOff(1)).
func OnBusy(p Policy) Option {
	return func(c *config) {
		if err := p.check("OnBusy"); err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.onBusy = p
	}
}

// OnExhausted sets what happens to a busy task on its last attempt (its
// retry count has reached its MaxRetry), when the busy policy would retry it
// later. asynq archives a task that fails on its last attempt whatever
// Config.IsFailure says, so retrying later is not possible then; the default
// is Wait(0): wait for the lock until the task's deadline (under HandOff, a
// task that found no place in the line waits at most HandOffWait). RetryLater
// and HandOff are not valid values.
func OnExhausted(p Policy) Option {
	return func(c *config) {
		if err := p.check("OnExhausted"); err != nil {
			c.errs = append(c.errs, err)
			return
		}
		if p.kind == kindRetryLater || p.kind == kindHandOff {
			c.errs = append(c.errs, invalid("OnExhausted", "%v cannot apply once retries are exhausted", p))
			return
		}
		c.onExhausted = p
	}
}

// Grace sets how long after the task's deadline the lock stays held if the
// handler has not returned (default DefaultGrace). asynq cancels the
// handler's context at the deadline; a handler that ignores it keeps running,
// but its lock is released at deadline + grace so that the key does not stay
// locked for as long as the handler hangs.
func Grace(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, invalid("Grace", "must not be negative, got %v", d))
			return
		}
		c.grace = d
	}
}

// BusyDelay sets the range from which the retry delay of a busy task is
// drawn (uniformly; default DefaultBusyDelayMin to DefaultBusyDelayMax),
// except for HandOff's quick retries, whose delay is 0. The delay travels in
// the *BusyError and is applied by RetryDelay. asynq keeps retry times in
// whole seconds and moves due tasks every Config.DelayedTaskCheckInterval
// (default 5s), which bound how soon a bounced task runs again.
func BusyDelay(min, max time.Duration) Option {
	return func(c *config) {
		if min < 0 || max < min {
			c.errs = append(c.errs, invalid("BusyDelay", "need 0 <= min <= max, got min %v max %v", min, max))
			return
		}
		c.delayMin, c.delayMax = min, max
	}
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
	return func(c *config) {
		if perSecond < 0 {
			c.errs = append(c.errs, invalid("QuickRetries", "must not be negative, got %d", perSecond))
			return
		}
		c.quick = perSecond
	}
}

// MaxWaiting bounds the tasks that wait in HandOff's lines on this server at
// once, across all keys (default 0: no bound beyond HandOff's n per key). A
// busy task that finds the bound reached is bounced. HandOff(n) keeps one
// hot key to n workers of a server, but k keys backlogged at once can take
// k·n, and a waiter holds its worker as long as the holder elsewhere runs:
// set MaxWaiting below the server's Concurrency (half of it, say) when many
// keys can be busy at once.
func MaxWaiting(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.errs = append(c.errs, invalid("MaxWaiting", "must not be negative, got %d", n))
			return
		}
		c.maxWaiting = n
	}
}

// HandOffWait bounds how long a task waits in HandOff's line (default
// DefaultHandOffWait), and never past one second (or a tenth of the time
// left, if less) before the task's deadline. A waiter that runs out is bounced with a *BusyError, which uses
// none of its retries, and its place goes to the next busy task: a holder
// elsewhere that runs long keeps a worker of this server for at most d at a
// time, so that a server whose Concurrency is 1 still runs other keys' tasks.
// On the task's last attempt a bounce would be archived: see HandOff.
func HandOffWait(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, invalid("HandOffWait", "must be positive, got %v", d))
			return
		}
		c.handOffWait = d
	}
}

// ReleaseTimeout bounds the release after the handler returns, which runs on
// a context detached from the task's cancellation (default
// DefaultReleaseTimeout).
func ReleaseTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, invalid("ReleaseTimeout", "must be positive, got %v", d))
			return
		}
		c.releaseTimeout = d
	}
}

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

// New returns an asynq middleware that runs at most one task per key
// (Limit: n tasks) at a time across every server that uses the same lock
// store, or an error matching core.ErrInvalidOption that names the first
// invalid option. Use the middleware with ServeMux.Use, or around one
// handler: mw(h). The middleware and the handlers it returns are safe for
// concurrent use.
//
//	mw, err := asynqlock.New(locker, asynqlock.Key(asynqlock.ByHeader("account")))
//	if err != nil {
//		return err
//	}
//	mux.Use(mw)
func New(l core.Locker, opts ...Option) (asynq.MiddlewareFunc, error) {
	c := config{
		key:            ByType,
		prefix:         DefaultPrefix,
		onBusy:         HandOff(1),
		onExhausted:    Wait(0),
		grace:          DefaultGrace,
		delayMin:       DefaultBusyDelayMin,
		delayMax:       DefaultBusyDelayMax,
		releaseTimeout: DefaultReleaseTimeout,
		quick:          DefaultQuickRetries,
		handOffWait:    DefaultHandOffWait,
	}
	if l == nil {
		c.errs = append(c.errs, invalid("Locker", "nil"))
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		return nil, c.errs[0]
	}
	if c.limit > 1 {
		if cl, ok := l.(*core.Client); ok {
			if _, ok := cl.Backend().(core.SemaphoreBackend); !ok {
				return nil, fmt.Errorf("%w: asynqlock: %s: %d permits need a backend with semaphores, and %s has none: %w",
					core.ErrInvalidOption, c.limitName, c.limit, cl.Backend().Name(), core.ErrUnsupported)
			}
		}
		// Last, so that it wins over a core.Limit in LockOptions.
		c.lockOpts = append(append([]core.Option(nil), c.lockOpts...), core.Limit(c.limit))
	}
	m := &middleware{l: l, c: c, lines: lines{keys: map[string]*line{}}}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			return m.process(ctx, t, next)
		})
	}, nil
}

// MustNew is New for wiring at program start: it panics, with New's
// error, when an option is invalid, like regexp.MustCompile. Prefer New
// wherever the options come from configuration.
func MustNew(l core.Locker, opts ...Option) asynq.MiddlewareFunc {
	mw, err := New(l, opts...)
	if err != nil {
		panic(err.Error())
	}
	return mw
}

// Middleware is MustNew: it panics when an option is invalid.
//
// Deprecated: use New, which returns the error instead of panicking, or
// MustNew where a panic at start-up is wanted.
func Middleware(l core.Locker, opts ...Option) asynq.MiddlewareFunc {
	return MustNew(l, opts...)
}

type middleware struct {
	l     core.Locker
	c     config
	lines lines
}

func (m *middleware) process(ctx context.Context, t *asynq.Task, next asynq.Handler) error {
	k, err := m.c.key(ctx, t)
	if err != nil {
		return fmt.Errorf("asynqlock: key of task %q: %w: %w", t.Type(), err, asynq.SkipRetry)
	}
	if k == "" {
		return next.ProcessTask(ctx, t)
	}
	key := m.c.prefix + k
	if err := core.ValidateKey(key); err != nil {
		return fmt.Errorf("asynqlock: key of task %q: %w: %w", t.Type(), err, asynq.SkipRetry)
	}
	s, err := m.acquire(ctx, key, m.c.onBusy, nil)
	if err != nil {
		return err
	}
	if s == nil { // skipped
		return nil
	}
	return m.run(ctx, t, next, s)
}

// acquire takes key under policy p. It returns a nil session and nil error
// when the task is to be skipped. from is the busy policy when p is the
// OnExhausted policy applied in its place, nil otherwise.
func (m *middleware) acquire(ctx context.Context, key string, p Policy, from *Policy) (core.Session, error) {
	var (
		s   core.Session
		err error
	)
	quick := false
	switch p.kind {
	case kindWait:
		max := p.max
		if from != nil && from.kind == kindHandOff && (max == 0 || max > m.c.handOffWait) {
			// A last attempt that found no place in HandOff's line: its
			// wait is not counted there, so it is bounded in time.
			max = m.c.handOffWait
		}
		s, err = m.wait(ctx, key, max)
	case kindHandOff:
		s, quick, err = m.handOff(ctx, key, p.n)
	default:
		s, err = m.l.TryAcquire(ctx, key, m.c.lockOpts...)
	}
	if err == nil {
		return s, nil
	}
	if errors.Is(err, core.ErrLimitMismatch) && !errors.Is(err, core.ErrNotAcquired) && ctx.Err() == nil {
		// The key's holders took it under another limit (servers that
		// disagree on WithLimit, or a rolling change of it): the key is
		// taken for this task until they are gone.
		err = fmt.Errorf("%w: %w", core.ErrNotAcquired, err)
	}
	if !errors.Is(err, core.ErrNotAcquired) || ctx.Err() != nil {
		if errors.Is(err, core.ErrInvalidKey) || errors.Is(err, core.ErrInvalidOption) || errors.Is(err, core.ErrUnsupported) {
			return nil, fmt.Errorf("asynqlock: %w: %w", err, asynq.SkipRetry)
		}
		// A store failure or the task's own cancellation: an ordinary
		// failure, retried with backoff and counted.
		return nil, fmt.Errorf("asynqlock: acquire %q: %w", key, err)
	}
	busy := &BusyError{Key: key, RetryIn: m.delay(), Err: err}
	if quick {
		busy.RetryIn = 0
	}
	switch p.kind {
	case kindSkip:
		return nil, nil
	case kindRevoke:
		return nil, fmt.Errorf("%w: %w", busy, asynq.RevokeTask)
	case kindArchive:
		return nil, fmt.Errorf("%w: %w", busy, asynq.SkipRetry)
	}
	// RetryLater, or a Wait that ran out. On the last attempt asynq would
	// archive the task: apply the OnExhausted policy instead.
	if from == nil && exhausted(ctx) {
		return m.acquire(ctx, key, m.c.onExhausted, &p)
	}
	return nil, busy
}

// wait acquires key, waiting up to max (0: until ctx ends).
func (m *middleware) wait(ctx context.Context, key string, max time.Duration) (core.Session, error) {
	wctx := ctx
	if max > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, max)
		defer cancel()
	}
	return m.l.Acquire(wctx, key, m.c.lockOpts...)
}

// handOff tries key once and, when it is busy, waits for it if fewer than n
// tasks of key wait on this server: up to HandOffWait, or on the task's last
// attempt until its deadline. A busy answer without a wait reports whether
// the bounce may come back quickly.
func (m *middleware) handOff(ctx context.Context, key string, n int) (core.Session, bool, error) {
	s, err := m.l.TryAcquire(ctx, key, m.c.lockOpts...)
	if err == nil || !errors.Is(err, core.ErrNotAcquired) {
		return s, false, err
	}
	last := exhausted(ctx)
	wctx := ctx
	if !last {
		d := m.c.handOffWait
		if dl, ok := ctx.Deadline(); ok {
			left := time.Until(dl)
			d = min(d, left-min(handOffMargin, left/10))
		}
		if d <= 0 {
			return nil, false, err // too close to the deadline to wait
		}
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	var holder *core.Info
	var na *core.NotAcquiredError
	if errors.As(err, &na) {
		holder = na.Holder
	}
	wait, quick := m.lines.enter(key, n, m.c.maxWaiting, m.c.quick, holder, time.Now())
	if !wait {
		return nil, quick, err
	}
	defer m.lines.leave(key)
	// When wctx's own timer ends the wait, ctx has not ended, and acquire
	// bounces the task with a *BusyError; when ctx ends, it is an ordinary
	// failure.
	s, err = m.l.Acquire(wctx, key, m.c.lockOpts...)
	return s, false, err
}

func (m *middleware) delay() time.Duration {
	if m.c.delayMax <= m.c.delayMin {
		return m.c.delayMin
	}
	return m.c.delayMin + mrand.N(m.c.delayMax-m.c.delayMin+1)
}

// exhausted reports whether this is the task's last attempt: asynq archives
// it if it fails, whatever Config.IsFailure says.
func exhausted(ctx context.Context) bool {
	n, ok1 := asynq.GetRetryCount(ctx)
	max, ok2 := asynq.GetMaxRetry(ctx)
	return ok1 && ok2 && n >= max
}

// run calls next while s is held and releases s afterwards, also when next
// panics (asynq recovers the panic outside the middleware chain).
func (m *middleware) run(ctx context.Context, t *asynq.Task, next asynq.Handler, s core.Session) (err error) {
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.c.releaseTimeout)
		defer cancel()
		// A failed release is reported to the Locker's Observer; the lock
		// then expires after its TTL. It does not change the task's outcome.
		// A release that finds the lease gone from the store ends the
		// session as lost: the check below sees it.
		_ = s.Release(rctx)
	}
	defer release()
	if dl, ok := ctx.Deadline(); ok {
		// Stop holding (and renewing) the lock at deadline + grace even if
		// the handler never returns.
		timer := time.AfterFunc(time.Until(dl)+m.c.grace, release)
		defer timer.Stop()
	}
	runCtx, cancel := core.Bind(ctx, s)
	defer cancel()
	err = next.ProcessTask(runCtx, t)
	release()
	if cause := s.Err(); cause != nil && !errors.Is(cause, core.ErrReleased) {
		// The lock was lost (or its Locker closed) while the handler ran,
		// noticed by a renewal or by the release: the work may have
		// overlapped another holder's, so the task fails and asynq retries
		// it.
		if err == nil {
			return fmt.Errorf("asynqlock: task %q: %w", t.Type(), cause)
		}
		return fmt.Errorf("%w; asynqlock: %w", err, cause)
	}
	return err
}

// lines keeps, per key, the tasks waiting for it on this server and the
// budget of quick retries.
type lines struct {
	mu      sync.Mutex
	keys    map[string]*line
	waiting int // across keys
	swept   time.Time
}

type line struct {
	waiting int       // tasks waiting for the key
	moved   time.Time // when the key last changed hands, as far as seen here
	holder  holder    // the holder in the last busy answer
	newest  uint64    // a semaphore's newest permit token seen in busy answers
	// Quick retries are a token bucket kept as the time at which it is
	// full again (GCRA): each retry moves it on by 1s/rate.
	full time.Time
}

// holder identifies one acquisition of a key.
type holder struct {
	token      uint64
	owner      string
	acquiredAt int64 // Unix nanoseconds on the store's clock
}

// enter says whether a busy task of key waits (fewer than n wait for key and
// fewer than total, if not 0, for any key; it then counts as waiting until
// leave) and, if not, whether its bounce is a quick retry: at most rate a
// second, in bursts of up to rate/4, and only while the key changed hands
// (a new holder in the busy answer, or a waiter here that took its place in
// line) within quickWindow.
func (ls *lines) enter(key string, n, total, rate int, info *core.Info, now time.Time) (wait, quick bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if now.Sub(ls.swept) > time.Second {
		ls.sweep(now)
	}
	l := ls.keys[key]
	if l == nil {
		l = &line{}
		ls.keys[key] = l
	}
	switch {
	case info == nil:
		// The store does not say who holds the key: count every busy
		// answer as a change of hands, so that only the rate bounds the
		// quick retries.
		l.moved = now
	case info.Limit > 1 && info.Token != 0:
		// A full semaphore names the permit that expires first, which
		// changes as its holders renew. A permit changed hands when one
		// with a newer token shows up: tokens increase per key across
		// permits.
		if info.Token > l.newest {
			l.newest, l.moved = info.Token, now
		}
	default:
		if h := (holder{info.Token, info.Owner, info.AcquiredAt.UnixNano()}); h != l.holder {
			l.holder, l.moved = h, now
		}
	}
	if l.waiting < n && (total == 0 || ls.waiting < total) {
		l.waiting++
		ls.waiting++
		l.moved = now
		return true, false
	}
	if rate == 0 || now.Sub(l.moved) > quickWindow {
		return false, false
	}
	step := time.Second / time.Duration(rate)
	burst := time.Duration(max(1, rate/4)) * step
	if l.full.Before(now) {
		l.full = now
	}
	if l.full.Sub(now)+step > burst {
		return false, false
	}
	l.full = l.full.Add(step)
	return false, true
}

// leave ends a wait that enter started.
func (ls *lines) leave(key string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.keys[key]; l != nil {
		l.waiting--
		ls.waiting--
	}
}

// sweep drops the keys nobody waits for whose bucket is full again.
func (ls *lines) sweep(now time.Time) {
	ls.swept = now
	for k, l := range ls.keys {
		if l.waiting == 0 && !l.full.After(now) && now.Sub(l.moved) > quickWindow {
			delete(ls.keys, k)
		}
	}
}
