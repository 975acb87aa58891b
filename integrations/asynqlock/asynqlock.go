package asynqlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// handOffMargin is how long before the task's deadline a HandOff wait gives
// up at the latest (or a tenth of the time left, if less), so that its bounce reaches asynq before the deadline
// cancels the task (which would be an ordinary failure, using a retry).
const handOffMargin = time.Second

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
		c.RecordErr(invalid("Locker", "nil"))
	}
	if err := optcheck.Apply(&c, opts); err != nil {
		return nil, err
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
