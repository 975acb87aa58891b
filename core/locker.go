package core

import (
	"context"
	"errors"
	"time"
)

// Locker takes distributed locks. Implementations are safe for concurrent use
// by many goroutines.
//
// The ctx passed to TryAcquire and Acquire bounds the acquisition only: the
// Session it returns lives until Release, lease loss or Close, whatever
// happens to ctx afterwards. Values of ctx (a trace context, say) are kept for
// the session's background work.
//
// TryAcquire and Acquire return within DeadlineSlack of ctx's end, whatever
// the store does, and make no round trip when ctx is already done.
//
// Locks are not reentrant: a key this process already holds reads as busy to
// a second acquisition. The engine's Client answers a TryAcquire of a key
// that one of its own mutex sessions holds (live, not being released, before
// its renew deadline) without a round trip: busy, with that session as the
// holder, its times on the local clock.
type Locker interface {
	// TryAcquire makes one attempt. A lock the store answers is held
	// elsewhere yields an error matching ErrNotAcquired (a
	// *NotAcquiredError with the holder's Info when known); invalid keys
	// and options yield ErrInvalidKey / ErrInvalidOption; a claim whose
	// reply arrives after the renew deadline is undone and reported as
	// ErrLeaseLost; anything else is a failure that never matches
	// ErrNotAcquired: the driver's error, or, when ctx ended before the
	// store answered, an error matching ctx's error and the driver's (the
	// claim, if the store applied it, is undone).
	TryAcquire(ctx context.Context, key string, opts ...Option) (Session, error)
	// Acquire waits until the lock is held or ctx ends, and then nothing is
	// left held. When ctx ends, the store's last answer decides the error:
	// if it was busy, a *NotAcquiredError that matches ErrNotAcquired and
	// ctx's error and names the holder; if it was a failure, or there was
	// no answer yet, an error that matches ctx's error and the last
	// failure, never ErrNotAcquired (its message says when the key had
	// been busy before). An attempt that ctx cuts short is no answer.
	// Store failures while waiting (a restart, a cut connection) are
	// retried with the same backoff; a bad key or option, ErrUnsupported,
	// ErrClosed and ErrLimitMismatch end the wait at once.
	Acquire(ctx context.Context, key string, opts ...Option) (Session, error)
	// Close releases every session this Locker holds, stops its goroutines
	// and waits for them. Later calls return ErrClosed.
	Close() error
}

// Session is one held lock. It is safe for concurrent use.
//
// A Session ends when it is released, when its lease is lost, or when its
// Locker closes; Done is then closed, Err is non-nil and
// context.Cause(Context()) tells which (ErrReleased, ErrLeaseLost, ErrClosed).
type Session interface {
	// Key is the lock's key.
	Key() string
	// Token is the fencing token: it strictly increases with every new
	// acquisition of Key and stays the same across renewals. Pass it to the
	// resource you protect and have it reject smaller tokens. 0 when the
	// backend has no fencing tokens.
	Token() uint64
	// Owner is the human-readable owner recorded with the lock.
	Owner() string
	// Deadline is the instant, on this process's monotonic clock, until which
	// this session may act as the holder. Renewals move it forward. Work that
	// cannot finish before it must not start.
	Deadline() time.Time
	// Context is cancelled when the session ends; its cause is ErrLeaseLost,
	// ErrReleased or ErrClosed. It carries the values of the acquiring ctx.
	Context() context.Context
	// Done is closed when the session ends.
	Done() <-chan struct{}
	// Err is nil while the session is held, and the reason it ended after.
	Err() error
	// Release gives the lock up (or, under MinHold and slot mode, leaves it
	// to expire at the promised time). It is idempotent, checked against the
	// owner on the server, and works with a cancelled ctx: the round trip runs
	// on a detached, bounded context.
	//
	// On a session still held, Release returns nil when the store held the
	// lease to the end, and an error matching ErrLeaseLost and ErrLeaseGone
	// when the store no longer had it — force-released, expired or taken
	// over by another owner before any renewal noticed: the work done under
	// the lock may not have been exclusive. The session then ends as lost
	// (Err, and Context's cause, match ErrLeaseLost) and nothing of another
	// owner's is touched. Either way the session ends (Done closes, Context
	// is cancelled) once the store has answered, before Release returns;
	// renewals stop when Release is called. A slot session sends nothing
	// (the key is kept until the slot ends), so its Release cannot tell and
	// returns nil.
	//
	// On a session that already ended, Release returns nil: a second
	// Release, or one after a loss that Err and Context already report.
	// On a session lost at its renew deadline, Release says the holder's
	// work has stopped: the store may still hold the key for the rest of
	// the TTL, and Release frees it for the next holder. Call it only once
	// the work has stopped. It returns the store's error if the key could
	// not be freed (it then expires at its TTL); a later Release tries
	// again.
	Release(ctx context.Context) error
	// Check asks the store, in one round trip, whether it still holds this
	// session's lease: nil when it does (the lease is then renewed and
	// Deadline moves forward as after a renewal), an error matching
	// ErrLeaseLost when the store no longer has this session's owner token
	// on the key (the session then ends as on a refused renewal), or the
	// store's error when it could not tell (the session stays held, until
	// its deadline: a Check that runs into it ends the session with
	// ErrLeaseLost). A slot session is not renewed: Check answers from its
	// deadline, without a round trip. Call it right before an irreversible
	// step on a resource that cannot check fencing tokens.
	Check(ctx context.Context) error
}

// Admin lets operators look at and break locks. Backends that support it are
// exposed through *Client, which implements Admin.
type Admin interface {
	// Inspect returns the holder of key; ok is false when the key is free.
	Inspect(ctx context.Context, key string) (info Info, ok bool, err error)
	// List returns the held locks whose key starts with prefix.
	List(ctx context.Context, prefix string) ([]Info, error)
	// ForceRelease deletes key whoever holds it. The holder learns of it at
	// its next renewal (ErrLeaseLost). released is false when the key was free.
	ForceRelease(ctx context.Context, key string) (released bool, err error)
}

type sessionKey struct{}

// WithSession returns a copy of ctx that carries s.
func WithSession(ctx context.Context, s Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// SessionFromContext returns the session carried by ctx, if any.
func SessionFromContext(ctx context.Context) (Session, bool) {
	s, ok := ctx.Value(sessionKey{}).(Session)
	return s, ok
}

// Bind returns a context that carries s and is cancelled when either ctx is
// cancelled or s ends; in the latter case its cause is the session's cause
// (ErrLeaseLost, ErrReleased, ErrClosed). Call the returned cancel function
// when done with it.
func Bind(ctx context.Context, s Session) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(WithSession(ctx, s))
	stop := context.AfterFunc(s.Context(), func() { cancel(context.Cause(s.Context())) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// Do acquires key (waiting, as Acquire does), runs fn with a context that is
// cancelled if the lease is lost, and releases the lock. It returns fn's
// error joined with an error matching ErrLeaseLost when the lease was lost
// while fn ran — noticed by a renewal, or by the release itself, when the
// store no longer had the lease (force-released, expired, taken over) — and
// with the release's error when it failed. It returns nil only when fn
// returned nil and the lease was held, and released, to the end.
//
// To run fn only if the lock is free, and skip it otherwise, use TryDo.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context) error, opts ...Option) (err error) {
	s, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	return runHeld(ctx, s, fn)
}

// TryDo is Do without the wait: "run if free, else skip". It makes one
// attempt (TryAcquire). When the store answers that the key is held
// elsewhere, fn does not run and TryDo returns ran == false with a nil
// error. Any other failure to acquire (an invalid option, a store that
// errs or does not answer before ctx's deadline) is returned as the error,
// with ran == false: an outage is never a silent skip. Once the lock is
// held, fn runs with a context that is cancelled if the lease is lost,
// the lock is released, and ran is true; the error is then what Do would
// return.
func TryDo(ctx context.Context, l Locker, key string, fn func(ctx context.Context) error, opts ...Option) (ran bool, err error) {
	s, err := l.TryAcquire(ctx, key, opts...)
	if err != nil {
		if errors.Is(err, ErrNotAcquired) {
			return false, nil
		}
		return false, err
	}
	return true, runHeld(ctx, s, fn)
}

// runHeld runs fn under the held session s and releases it (see Do).
func runHeld(ctx context.Context, s Session, fn func(ctx context.Context) error) error {
	runCtx, cancel := Bind(ctx, s)
	defer cancel()
	ferr := fn(runCtx)
	lost := s.Err()
	rerr := s.Release(ctx)
	if lost != nil && !isReleased(lost) {
		// A session lost while fn ran: its Release owes nothing more to
		// say (nil), or that the key could not be freed early.
		return errJoin(lost, ferr, rerr)
	}
	return errJoin(ferr, rerr)
}
