// Package sqlbackend holds what the SQL backends (pg, mysqllock) share
// beyond core: the plumbing of their options, the limits of their claim
// timeout, and the checks of an acquire request. Their options differ in
// what they set, not in how an invalid one is reported: each backend's
// config embeds Errs, and its newConfig runs Apply.
package sqlbackend

import (
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// Limits of WithClaimTimeout. Half the timeout must be left when the claim
// is sent.
const (
	MinClaimTimeout = 10 * time.Millisecond
	MaxClaimTimeout = 24 * time.Hour
)

// InvalidOption is the error of the invalid option or argument name: it
// matches core.ErrInvalidOption and says why. The SQL backends' errors
// name the option without a package prefix.
func InvalidOption(name, format string, args ...any) error {
	return optcheck.Prefix("").Invalid(name, format, args...)
}

// Errs collects the errors of a backend's invalid options; the backend's
// config embeds it.
type Errs struct{ errs []error }

// Invalid records the error of the invalid option name (InvalidOption).
func (e *Errs) Invalid(name, format string, args ...any) {
	e.errs = append(e.errs, InvalidOption(name, format, args...))
}

// Err is the first error recorded, nil when there is none.
func (e *Errs) Err() error {
	if len(e.errs) > 0 {
		return e.errs[0]
	}
	return nil
}

// ClaimTimeoutOK reports whether d is within the limits of
// WithClaimTimeout, and records that option's error when it is not.
func (e *Errs) ClaimTimeoutOK(d time.Duration) bool {
	if d < MinClaimTimeout || d > MaxClaimTimeout {
		e.Invalid("WithClaimTimeout", "must be between %v and %v, got %v", MinClaimTimeout, MaxClaimTimeout, d)
		return false
	}
	return true
}

// Apply applies opts to c in order, skipping nil ones, and returns the
// first error they recorded.
func Apply[O ~func(C), C interface{ Err() error }](c C, opts []O) error {
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c.Err()
}

// CheckAcquire checks what TryAcquire needs of req: a valid key, a Limit
// of at most core.MaxLimit, a positive TTL unless ExpireAt is set, and a
// positive WaiterTTL with a Waiter.
func CheckAcquire(req core.AcquireRequest) error {
	if err := core.ValidateKey(req.Key); err != nil {
		return err
	}
	if req.Limit > core.MaxLimit {
		return InvalidOption("Limit", "must be between 1 and %d, got %d", core.MaxLimit, req.Limit)
	}
	if req.ExpireAt.IsZero() && req.TTL <= 0 {
		return InvalidOption("TTL", "must be positive, got %v", req.TTL)
	}
	if req.Waiter != "" && req.WaiterTTL <= 0 {
		return InvalidOption("WaiterTTL", "must be positive with a Waiter, got %v", req.WaiterTTL)
	}
	return nil
}
