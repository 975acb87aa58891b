package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Match them with errors.Is; every error dislock returns that
// stands for one of these conditions wraps the sentinel.
var (
	// ErrNotAcquired: the store answered that the lock is held by someone
	// else (TryAcquire), or ctx ended a wait whose last answer from the
	// store was that (Acquire, joined with ctx's error). It means that and
	// nothing else: an acquisition that ends without such an answer — the
	// store failed, hung, or had not answered when ctx ended — returns the
	// failure (the driver's error, ctx's error), which does not match it.
	// The error is a *NotAcquiredError, carrying the holder's Info when the
	// store named it.
	ErrNotAcquired = &sentinel{"dislock: lock not acquired", "not_acquired"}
	// ErrLeaseLost: the session can no longer be sure it holds the lock: the
	// server refused a renewal (owner changed, lock deleted) or the local renew
	// deadline passed without a successful renewal.
	ErrLeaseLost = &sentinel{"dislock: lease lost", "lease_lost"}
	// ErrLeaseGone is matched, besides ErrLeaseLost, by a loss the store
	// itself reported (see Gone): it refused a renewal, or found nothing to
	// release, because another owner holds the key or the key is gone, so
	// the key may already be someone else's. A loss by the local renew
	// deadline does not match it: the store then keeps the key until its
	// TTL runs out.
	ErrLeaseGone = &sentinel{"dislock: lease gone from the store", "lease_gone"}
	// ErrReleased: the session was released by its owner (the context cause
	// after Release).
	ErrReleased = &sentinel{"dislock: session released", "released"}
	// ErrClosed: the Locker was closed.
	ErrClosed = &sentinel{"dislock: locker closed", "closed"}
	// ErrElectionClosed: the Election was closed (the cause OnRevoked gets
	// after Election.Close; the Locker may still be open).
	ErrElectionClosed = &sentinel{"dislock: election closed", "election_closed"}
	// ErrInvalidKey: the key is empty, longer than MaxKeyLen, not valid UTF-8
	// or contains a NUL byte.
	ErrInvalidKey = &sentinel{"dislock: invalid key", "invalid_key"}
	// ErrInvalidOption: an option value, or a relation between options, is
	// invalid. The message names the option.
	ErrInvalidOption = &sentinel{"dislock: invalid option", "invalid_option"}
	// ErrUnsupported: the backend does not implement the requested capability
	// (for example Admin calls on a backend without them).
	ErrUnsupported = &sentinel{"dislock: not supported by this backend", "unsupported"}
	// ErrLimitMismatch: a semaphore claim (Limit) asked for another number
	// of permits than the key's current holders took it with; a mutex
	// counts as a limit of 1. The message names both.
	ErrLimitMismatch = &sentinel{"dislock: limit mismatch", "limit_mismatch"}
)

// LimitMismatch returns the error a backend answers a claim of key with
// when the key is held with limit have and the claim asked for want (1 for
// a mutex). It matches ErrLimitMismatch.
func LimitMismatch(key string, have, want int) error {
	return &limitError{key: key, have: max(have, 1), want: max(want, 1)}
}

type limitError struct {
	key        string
	have, want int
}

func (e *limitError) Error() string {
	return fmt.Sprintf("%s: key %q is held as %s; this claim is for %s",
		ErrLimitMismatch.msg, e.key, limitWords(e.have), limitWords(e.want))
}

func limitWords(n int) string {
	if n <= 1 {
		return "a mutex (limit 1)"
	}
	return fmt.Sprintf("a semaphore of %d permits", n)
}

func (e *limitError) Unwrap() error { return ErrLimitMismatch }

// ErrorType returns the type name of ErrLimitMismatch.
func (e *limitError) ErrorType() string { return ErrLimitMismatch.typ }

// sentinel is an error value with a stable type name for telemetry.
type sentinel struct{ msg, typ string }

func (e *sentinel) Error() string { return e.msg }

// ErrorType returns a short stable name suitable for OpenTelemetry's
// error.type attribute.
func (e *sentinel) ErrorType() string { return e.typ }

// ErrorType returns a low-cardinality name for err: the type of the first
// dislock sentinel it wraps, "canceled" or "deadline_exceeded" for context
// errors, "backend" for anything else, and "" for nil.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range []*sentinel{ErrNotAcquired, ErrLeaseLost, ErrReleased, ErrClosed, ErrElectionClosed, ErrInvalidKey, ErrInvalidOption, ErrUnsupported, ErrLimitMismatch} {
		if errors.Is(err, s) {
			return s.typ
		}
	}
	var typed interface{ ErrorType() string }
	if errors.As(err, &typed) {
		return typed.ErrorType()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "backend"
}

// Info describes the current holder of a lock, as the backend sees it.
type Info struct {
	Key        string
	Owner      string        // human-readable owner (metadata only)
	Token      uint64        // fencing token of the holder; 0 when the backend has none
	AcquiredAt time.Time     // on the backend's clock; zero when unknown
	ExpiresAt  time.Time     // on the backend's clock
	Remaining  time.Duration // ExpiresAt minus the backend's now when read; 0 when unknown
	Limit      int           // a semaphore's number of permits; 0 for a mutex
}

// NotAcquiredError is the store's answer "held by someone else": returned
// by TryAcquire when the key is busy, and by Acquire when ctx ended its
// wait while the store's last answer was busy. It matches ErrNotAcquired
// with errors.Is and, after a wait, ctx's error too. It is never the error
// of an acquisition that got no such answer: a store that failed, hung or
// did not answer before ctx ended yields its failure (see Locker).
type NotAcquiredError struct {
	Key    string
	Holder *Info // the holder as of the last busy answer; nil when the store did not say
	// Waited and Err are set when Acquire gave up waiting for a busy key:
	// how long it waited, and why it stopped (ctx's error, with its cause).
	Waited time.Duration
	Err    error
}

// Error says which key is busy and, when known, who holds it and for how
// long; after a wait, for how long it was tried and why it stopped. It is
// one line.
func (e *NotAcquiredError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dislock: lock %q not acquired", e.Key)
	if e.Err != nil {
		fmt.Fprintf(&b, " within %v", roundWait(e.Waited))
	}
	switch {
	case e.Holder != nil:
		b.WriteString(": ")
		writeHolder(&b, e.Holder)
	case e.Err == nil:
		b.WriteString(": held elsewhere")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(oneLine(e.Err))
	}
	return b.String()
}

// writeHolder describes h: held by "owner" (token n) for d more.
func writeHolder(b *strings.Builder, h *Info) {
	fmt.Fprintf(b, "held by %q (token %d) for %v more", h.Owner, h.Token, h.Remaining.Round(time.Millisecond))
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// Unwrap makes errors.Is(err, ErrNotAcquired) true, and errors.Is with the
// reason a wait ended.
func (e *NotAcquiredError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotAcquired}
	}
	return []error{ErrNotAcquired, e.Err}
}

// ErrorType implements the telemetry error-type contract.
func (e *NotAcquiredError) ErrorType() string { return ErrNotAcquired.typ }

// acquireError is the error of an acquisition that ctx (or its deadline)
// ended without the store's last word being "busy": no attempt was made,
// the store failed, or it did not answer in time. It matches ctx's error
// and the last failure, never ErrNotAcquired. busy, when set, is the holder
// an earlier busy answer named (for the message only).
type acquireError struct {
	key     string
	waited  time.Duration
	tried   bool  // an attempt was sent
	wasBusy bool  // an earlier attempt was answered busy
	busy    *Info // the holder that answer named, if it did
	err     error // ctx's error, its cause, the last failure
}

func (e *acquireError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dislock: acquire %q", e.key)
	if e.tried {
		b.WriteString(" failed")
	} else {
		b.WriteString(" not tried")
	}
	if w := roundWait(e.waited); w > 0 {
		fmt.Fprintf(&b, " after %v", w)
	}
	if e.wasBusy {
		b.WriteString(" (the store had answered busy before")
		if e.busy != nil {
			b.WriteString(": ")
			writeHolder(&b, e.busy)
		}
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(oneLine(e.err))
	return b.String()
}

func (e *acquireError) Unwrap() error { return e.err }

// endedBy is ctx's error, with its cause when that says more:
// DeadlineExceeded when ctx's deadline has passed and its timer has not
// ended it yet (see ctxEnded), and Canceled when ctx has not ended (the
// acquisition was cut short by other means).
func endedBy(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		err = context.Canceled
		if deadlinePassed(ctx) {
			err = context.DeadlineExceeded // its timer not run yet (see ctxEnded)
		}
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// notAcquiredWithin is the error of a wait for key that ctx ended after
// waited, while the store's last answer was busy (received at busyAt,
// the holder's remaining time brought up to now).
func notAcquiredWithin(ctx context.Context, key string, busy *NotAcquiredError, busyAt time.Time, waited time.Duration) error {
	e := &NotAcquiredError{Key: key, Waited: waited, Err: endedBy(ctx)}
	e.Holder = holderNow(busy, busyAt)
	return e
}

// acquireFailed is the error of an acquisition of key that ctx ended after
// waited without a busy answer as the store's last word; failure is the
// last attempt's error (nil when no attempt was made or answered), busy the
// last busy answer before it, if any.
func acquireFailed(ctx context.Context, key string, tried bool, busy *NotAcquiredError, busyAt time.Time, waited time.Duration, failure error) error {
	e := &acquireError{key: key, waited: waited, tried: tried, wasBusy: busy != nil, busy: holderNow(busy, busyAt), err: endedBy(ctx)}
	if failure != nil {
		e.err = fmt.Errorf("%w: %w", e.err, failure)
	}
	return e
}

// holderNow is the holder busy named at busyAt, its remaining time brought
// up to now; nil when there is none.
func holderNow(busy *NotAcquiredError, busyAt time.Time) *Info {
	if busy == nil || busy.Holder == nil {
		return nil
	}
	h := *busy.Holder
	if h.Remaining > 0 {
		h.Remaining = max(0, h.Remaining-time.Since(busyAt))
	}
	return &h
}

// roundWait rounds a wait for a message: to 10ms from 100ms up, else to 1ms.
func roundWait(d time.Duration) time.Duration {
	if d >= 100*time.Millisecond {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// Busy builds the error a Backend returns when key is held by someone else.
// holder may be nil.
func Busy(key string, holder *Info) error { return &NotAcquiredError{Key: key, Holder: holder} }

// Gone builds the error a Backend reports for a lease it may no longer
// renew or release because another owner holds the key or the key is gone
// (expired, deleted). It matches ErrLeaseLost and ErrLeaseGone.
func Gone(key, reason string) error { return &goneError{key: key, reason: reason} }

// goneError is the store's refusal of a lease.
type goneError struct{ key, reason string }

func (e *goneError) Error() string {
	return fmt.Sprintf("%s: %q: %s", ErrLeaseLost.msg, e.key, e.reason)
}

func (e *goneError) Unwrap() []error { return []error{ErrLeaseLost, ErrLeaseGone} }

func invalidOption(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidOption, name, fmt.Sprintf(format, args...))
}
