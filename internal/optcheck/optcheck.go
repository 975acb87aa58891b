// Package optcheck checks the values given to the options of the packages
// built on core (zklock, asynqlock, gocronlock): an option constructor
// checks its value when it is called and returns either the setter or an
// option that records the error, for the constructor that applies the
// options to report. It is the one copy of core's checked, positive and
// notNegative for them; core keeps its own, as it imports only the standard
// library. Errs and Apply are the plumbing the options of every package
// share, the backends' too (pg and mysqllock through internal/sqlbackend,
// which makes their errors with Invalid, without a prefix).
package optcheck

import (
	"fmt"
	"time"

	"github.com/dislock/dislock/core"
)

// Prefix names a package in the errors of its options, before the option's
// name: "asynqlock: " or "zklock.".
type Prefix string

// Invalid returns the error of an invalid value given to option name: it
// matches core.ErrInvalidOption and says why (format and args).
func (p Prefix) Invalid(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s%s: %s", core.ErrInvalidOption, p, name, fmt.Sprintf(format, args...))
}

// Positive is nil for v > 0, and otherwise option name's error.
func Positive[T int | time.Duration](p Prefix, name string, v T) error {
	if v > 0 {
		return nil
	}
	return p.Invalid(name, "must be positive, got %v", v)
}

// NotNegative is nil for v >= 0, and otherwise option name's error.
func NotNegative[T int | time.Duration](p Prefix, name string, v T) error {
	if v >= 0 {
		return nil
	}
	return p.Invalid(name, "must not be negative, got %v", v)
}

// Recorder is a config that collects the errors of invalid options.
type Recorder interface{ RecordErr(error) }

// Checked returns set when err is nil, and otherwise an option that records
// err in the config.
func Checked[C Recorder](err error, set func(C)) func(C) {
	if err != nil {
		return func(c C) { c.RecordErr(err) }
	}
	return set
}

// Errs collects the errors of a package's invalid options, for the
// constructor that applies them to report the first; the package's config
// embeds it.
type Errs struct{ errs []error }

// RecordErr records the error of an invalid option (Recorder).
func (e *Errs) RecordErr(err error) { e.errs = append(e.errs, err) }

// Err is the first error recorded, nil when there is none.
func (e *Errs) Err() error {
	if len(e.errs) > 0 {
		return e.errs[0]
	}
	return nil
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
