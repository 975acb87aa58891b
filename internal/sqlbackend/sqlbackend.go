// Package sqlbackend holds what the SQL backends (pg, mysqllock) share
// beyond core: the options they both have (Config), the limits of their
// claim timeout, and the checks of an acquire request. Their other options
// differ in what they set, not in how an invalid one is reported: each
// backend's config embeds Config, and so Errs.
package sqlbackend

import (
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// DefaultTable is the lock table both backends use when WithTable is not
// given (pg.DefaultTable, mysqllock.DefaultTable).
const DefaultTable = "dislock_locks"

// The default and the limits of WithClaimTimeout. The default is far above
// what a healthy acquire takes, well below the TTLs locks usually have.
// Half the timeout must be left when the claim is sent.
const (
	DefaultClaimTimeout = 2 * time.Second
	MinClaimTimeout     = 10 * time.Millisecond
	MaxClaimTimeout     = 24 * time.Hour
)

// InvalidOption is the error of the invalid option or argument name: it
// matches core.ErrInvalidOption and says why. The SQL backends' errors
// name the option without a package prefix.
func InvalidOption(name, format string, args ...any) error {
	return optcheck.Prefix("").Invalid(name, format, args...)
}

// Config is what the options of both SQL backends set alike: each
// backend's config embeds it, and its newConfig applies the options with
// optcheck.Apply.
type Config struct {
	AutoMigrate  bool                // WithAutoMigrate
	NoListen     bool                // WithoutListen
	ClaimTimeout time.Duration       // WithClaimTimeout
	ClientOpts   []core.ClientOption // WithClientOptions
	Errs
}

// SetClaimTimeout is WithClaimTimeout's: it sets ClaimTimeout to d when d
// is within the option's limits, and records the option's error otherwise.
func (c *Config) SetClaimTimeout(d time.Duration) {
	if d < MinClaimTimeout || d > MaxClaimTimeout {
		c.Invalid("WithClaimTimeout", "must be between %v and %v, got %v", MinClaimTimeout, MaxClaimTimeout, d)
		return
	}
	c.ClaimTimeout = d
}

// Errs collects the errors of a backend's invalid options.
type Errs struct{ optcheck.Errs }

// Invalid records the error of the invalid option name (InvalidOption).
func (e *Errs) Invalid(name, format string, args ...any) {
	e.RecordErr(InvalidOption(name, format, args...))
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
