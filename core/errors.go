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
	// ErrNotAcquired: the lock is held elsewhere (TryAcquire), or waiting ended
	// before it was free (Acquire, joined with the context's error). When the
	// holder is known the error is a *NotAcquiredError carrying its Info.
	ErrNotAcquired = &sentinel{"dislock: lock not acquired", "not_acquired"}
	// ErrLeaseLost: the session can no longer be sure it holds the lock: the
	// server refused a renewal (owner changed, lock deleted) or the local renew
	// deadline passed without a successful renewal.
	ErrLeaseLost = &sentinel{"dislock: lease lost", "lease_lost"}
	// ErrLeaseGone is matched, besides ErrLeaseLost, by a loss the store
	// itself reported (see Gone): it refused a renewal because another owner
	// holds the key or the key is gone, so the key may already be someone
	// else's. A loss by the local renew deadline does not match it: the store
	// then keeps the key until its TTL runs out.
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
	for _, s := range []*sentinel{ErrNotAcquired, ErrLeaseLost, ErrReleased, ErrClosed, ErrInvalidKey, ErrInvalidOption, ErrUnsupported, ErrLimitMismatch} {
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

// NotAcquiredError is returned when a lock is held elsewhere, and when
// Acquire gives up waiting for it. It matches ErrNotAcquired with errors.Is,
// and, after a wait that ctx cut short, ctx's error too.
type NotAcquiredError struct {
	Key    string
	Holder *Info // the holder as of the last busy answer; nil when the store did not say
	// Waited and Err are set when Acquire (or a TryAcquire whose ctx ended
	// mid-call) gave up: how long it tried, and why it stopped — ctx's error,
	// with the cause of the last failed attempt when there was one.
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
		fmt.Fprintf(&b, ": held by %q (token %d) for %v more", e.Holder.Owner, e.Holder.Token, e.Holder.Remaining.Round(time.Millisecond))
	case e.Err == nil:
		b.WriteString(": held elsewhere")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(strings.ReplaceAll(e.Err.Error(), "\n", "; "))
	}
	return b.String()
}

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

// notAcquiredWithin is the error of an acquisition of key that ctx cut
// short after waited: the last busy answer (received at busyAt, its
// remaining time brought up to now) stays in the chain, and failure is the
// last attempt's error, if any.
func notAcquiredWithin(ctx context.Context, key string, busy *NotAcquiredError, busyAt time.Time, waited time.Duration, failure error) error {
	e := &NotAcquiredError{Key: key, Waited: waited, Err: ctx.Err()}
	if e.Err == nil {
		e.Err = context.Canceled
	}
	if cause := context.Cause(ctx); cause != nil && cause != e.Err {
		e.Err = fmt.Errorf("%w: %w", e.Err, cause)
	}
	if failure != nil {
		e.Err = fmt.Errorf("%w: %w", e.Err, failure)
	}
	if busy != nil && busy.Holder != nil {
		h := *busy.Holder
		if h.Remaining > 0 {
			h.Remaining = max(0, h.Remaining-time.Since(busyAt))
		}
		e.Holder = &h
	}
	return e
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
// renew or release because another owner holds the key or the key is gone.
// It matches ErrLeaseLost and ErrLeaseGone.
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
