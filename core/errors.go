package core

import (
	"context"
	"errors"
	"fmt"
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
	// ErrReleased: the session was released by its owner (the context cause
	// after Release).
	ErrReleased = &sentinel{"dislock: session released", "released"}
	// ErrClosed: the Locker was closed.
	ErrClosed = &sentinel{"dislock: locker closed", "closed"}
	// ErrInvalidKey: the key is empty, longer than MaxKeyLen, not valid UTF-8
	// or contains a NUL byte.
	ErrInvalidKey = &sentinel{"dislock: invalid key", "invalid_key"}
	// ErrInvalidOption: an option value, or a relation between options, is
	// invalid. The message names the option.
	ErrInvalidOption = &sentinel{"dislock: invalid option", "invalid_option"}
	// ErrUnsupported: the backend does not implement the requested capability
	// (for example Admin calls on a backend without them).
	ErrUnsupported = &sentinel{"dislock: not supported by this backend", "unsupported"}
)

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
	for _, s := range []*sentinel{ErrNotAcquired, ErrLeaseLost, ErrReleased, ErrClosed, ErrInvalidKey, ErrInvalidOption, ErrUnsupported} {
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
}

// NotAcquiredError is returned when a lock is held elsewhere. It matches
// ErrNotAcquired with errors.Is.
type NotAcquiredError struct {
	Key    string
	Holder *Info // nil when the backend did not say who holds it
}

// Error says which key is busy and, when known, who holds it and for how long.
func (e *NotAcquiredError) Error() string {
	if e.Holder == nil {
		return fmt.Sprintf("dislock: lock %q not acquired: held elsewhere", e.Key)
	}
	return fmt.Sprintf("dislock: lock %q not acquired: held by %q (token %d) for %v more",
		e.Key, e.Holder.Owner, e.Holder.Token, e.Holder.Remaining.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrNotAcquired) true.
func (e *NotAcquiredError) Unwrap() error { return ErrNotAcquired }

// ErrorType implements the telemetry error-type contract.
func (e *NotAcquiredError) ErrorType() string { return ErrNotAcquired.typ }

// Busy builds the error a Backend returns when key is held by someone else.
// holder may be nil.
func Busy(key string, holder *Info) error { return &NotAcquiredError{Key: key, Holder: holder} }

// Gone builds the error a Backend reports for a lease it may no longer
// renew or release because another owner holds the key or the key is gone.
func Gone(key, reason string) error { return fmt.Errorf("%w: %q: %s", ErrLeaseLost, key, reason) }

func invalidOption(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidOption, name, fmt.Sprintf(format, args...))
}
