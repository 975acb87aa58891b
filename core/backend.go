package core

import (
	"context"
	"time"
)

// Backend is the driver interface a store implements. The lease engine
// (Client) is written once over it: waiting, backoff, renewal, loss
// detection, slots, min hold and key validation all live in core.
//
// Every operation is one round trip and idempotent per owner token: an
// acquire that finds the lock already held with its own token succeeds; a
// release that finds the key gone or taken by someone else succeeds. All
// expiry arithmetic is done on the store's clock.
//
// Backends are safe for concurrent use.
type Backend interface {
	// Name is a short, constant name ("pg", "redis", "memory") for telemetry.
	Name() string
	// TryAcquire claims req.Key when it is free or expired and returns the new
	// lease. When the key is held by another owner token it returns Busy(key,
	// holderInfo). Any other error is a failure whose outcome may be unknown.
	TryAcquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Renew extends many leases in one round trip (per store node). results
	// has one entry per request: nil when renewed, an error matching
	// ErrLeaseLost when the server refused (owner changed, key gone), or
	// another error when that item's outcome is unknown. err is non-nil when
	// the whole call failed.
	Renew(ctx context.Context, reqs []RenewRequest) (results []error, err error)
	// Release deletes req.Key if req.OwnerToken holds it and tells waiters
	// (Watcher). With req.Keep > 0 it instead sets the expiry to the store's
	// now + Keep and leaves the lock held (min hold).
	Release(ctx context.Context, req ReleaseRequest) error
	// Now returns the clock of the store node that holds key (slot ends are
	// computed on it).
	Now(ctx context.Context, key string) (time.Time, error)
	// Close frees what the backend itself opened (never the caller's client
	// or pool). Client.Close calls it; it must be safe to call more than once.
	Close() error
}

// Watcher is implemented by backends that can tell waiters a lock was
// released, so they need not poll.
type Watcher interface {
	// Watch calls fn with the key of every lock released in the store, by
	// any process, until ctx ends or the subscription fails. It calls ready
	// once the subscription is in place. It returns ctx's error after ctx
	// ends, or the failure; the engine falls back to polling and retries.
	Watch(ctx context.Context, ready func(), fn func(key string)) error
}

// AcquireRequest is one claim of a key.
type AcquireRequest struct {
	Key        string
	Owner      string        // human-readable owner, stored as metadata
	OwnerToken string        // random per session; guards renew and release
	TTL        time.Duration // lease: expire at store now + TTL
	// ExpireAt, when non-zero, is the absolute expiry on the store's clock
	// (slot mode: the slot's end, computed from the store's Now). TTL is
	// then ignored. When ExpireAt is not after the store's now, the slot is
	// over — its holder let it expire — and TryAcquire must answer Busy
	// without claiming anything, or a slot could be started twice.
	ExpireAt time.Time
}

// Lease is what a successful TryAcquire returns.
type Lease struct {
	Token      uint64    // fencing token; 0 when the backend has none
	AcquiredAt time.Time // store clock
	ExpiresAt  time.Time // store clock
}

// RenewRequest extends one lease to the store's now + TTL.
type RenewRequest struct {
	Key        string
	OwnerToken string
	TTL        time.Duration
}

// ReleaseRequest gives up one lease.
type ReleaseRequest struct {
	Key        string
	OwnerToken string
	// Keep > 0 keeps the lock until the store's now + Keep instead of
	// deleting it (min hold).
	Keep time.Duration
}
