package core

import (
	"context"
	"errors"
	"math"
	"time"
)

// Backend is the driver interface a store implements. The lease engine
// (Client) is written once over it: waiting, backoff, renewal, loss
// detection, slots, min hold and key validation all live in core.
//
// Every operation is one round trip and idempotent per owner token: an
// acquire that finds the lock already held with its own token succeeds; a
// release that finds the key gone or taken by someone else has nothing left
// to do, and says so (Gone). All expiry arithmetic is done on the store's
// clock.
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
	//
	// When the store holds no live lease of req.OwnerToken on req.Key — the
	// key is gone, expired, force-released or another owner's — Release
	// changes nothing that is not this owner token's and returns an error
	// matching ErrLeaseGone (Gone(key, reason)). That answer is final, not a
	// failure to retry: the engine reports it to the holder as a lost lease
	// and treats it as done when it undoes a claim. Any other error is a
	// failure whose outcome may be unknown; the engine may send the release
	// again; a Gone answer to such a retry is taken as done, not as a loss.
	// (A driver that retries on its own a release whose reply was lost sees
	// Gone for a release it applied: the holder then hears of a loss that
	// did not happen, a false alarm, never a missed one.) A backend that
	// cannot tell returns nil.
	Release(ctx context.Context, req ReleaseRequest) error
	// Now returns the clock of the store node that holds key (slot ends are
	// computed on it).
	Now(ctx context.Context, key string) (time.Time, error)
	// Close frees what the backend itself opened (never the caller's client
	// or pool). Client.Close calls it; it must be safe to call more than once.
	Close() error
}

// Unclaimed wraps err, the failure of a Backend's TryAcquire, to say that
// the backend knows the store claimed nothing for this request: it never
// reached the store (the connection was refused), or it failed at a step
// before the claim was sent. The engine then owes the claim no undo and
// returns the failure at once; without it, a failed claim is undone by
// owner token, which costs another round trip against a store that is
// likely down. Unclaimed(nil) is nil. The message is err's.
func Unclaimed(err error) error {
	if err == nil {
		return nil
	}
	return &unclaimedError{err}
}

type unclaimedError struct{ err error }

func (e *unclaimedError) Error() string { return e.err.Error() }
func (e *unclaimedError) Unwrap() error { return e.err }

// isUnclaimed reports whether err says that nothing was claimed.
func isUnclaimed(err error) bool {
	var u *unclaimedError
	return errors.As(err, &u)
}

// ContextBound is implemented by backends whose calls return soon after
// their ctx ends, whatever the store does: the driver watches ctx and cuts
// a call that is still waiting for the store (pgx, go-sql-driver/mysql and
// gRPC do; go-redis by itself waits for its read timeout). When EndsWithContext
// reports true, the engine makes an acquisition's store calls on the
// caller's goroutine and counts on the backend for the bound of
// DeadlineSlack; otherwise it hands each call to a call worker, which it
// can leave behind when the slack has passed. The hand-off costs each
// acquire two goroutine switches, each of which may wake another thread.
//
// A backend that reports true must return from TryAcquire and Now within a
// few milliseconds of their ctx's end, also when its store stopped
// answering in the middle of a call; the conformance suite (core/locktest)
// checks it against a stalled store.
type ContextBound interface {
	// EndsWithContext reports whether the backend's calls end with their
	// ctx as above. The answer is fixed for the backend's life.
	EndsWithContext() bool
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
	// Limit > 1 claims one of Limit permits of a semaphore on Key (a
	// SemaphoreBackend only; the engine never sends it to other backends).
	// 0 or 1 is a mutex.
	Limit int
	// Waiter, set only for a Queuer backend and only by a waiting Acquire,
	// names that wait: random per Acquire call, the same across its
	// attempts. See Queuer.
	Waiter string
	// WaiterTTL is how long, on the store's clock, the store keeps Waiter's
	// place in line after this attempt if no other attempt refreshes it.
	WaiterTTL time.Duration
	// Slack is how much less than TTL the store may keep the claim for,
	// counted from its send: a backend may then skip work that would keep
	// it the full TTL (a lease shared with other sessions, refreshed a
	// little before this claim, need not be refreshed again for it), and
	// says so in Lease (see there). 0: the store keeps the claim for TTL.
	// The engine sets it to half the renew interval; slot claims have none.
	Slack time.Duration
	// MinHold is the session's min hold (WithMinHold): its release may
	// keep the lock (ReleaseRequest.Keep) until up to MinHold after the
	// acquisition. 0: its release never keeps it, so that a backend may
	// tell the waiters behind that its release frees the key at once.
	MinHold time.Duration
}

// Lease is what a successful TryAcquire returns.
//
// ExpiresAt − AcquiredAt is how long the store keeps the claim, on the
// store's clock, counted from no earlier than the claim's send, if nobody
// renews it. It is at least the request's TTL − Slack (at least the TTL
// without Slack) and may be longer; for a slot claim it ends at ExpireAt.
// When it is shorter than the TTL, the engine counts the session as if
// claimed that much before its send: the renew deadline and the first
// renewal come that much sooner, so that the session never believes it
// holds the key past the store's own expiry less the usual margin. Zero
// times say nothing: the TTL from the send is taken.
type Lease struct {
	Token      uint64    // fencing token; 0 when the backend has none
	AcquiredAt time.Time // store clock
	ExpiresAt  time.Time // store clock
}

// life is how long the store keeps the lease from its claim; the longest
// duration when the backend did not say.
func (l Lease) life() time.Duration {
	if l.AcquiredAt.IsZero() || l.ExpiresAt.IsZero() {
		return math.MaxInt64
	}
	return l.ExpiresAt.Sub(l.AcquiredAt)
}

// RenewRequest extends one lease to the store's now + TTL.
type RenewRequest struct {
	Key        string
	OwnerToken string
	TTL        time.Duration
	Limit      int // the Limit the lease was acquired with (0 or 1: a mutex)
}

// ReleaseRequest gives up one lease.
type ReleaseRequest struct {
	Key        string
	OwnerToken string
	// Keep > 0 keeps the lock until the store's now + Keep instead of
	// deleting it (min hold).
	Keep  time.Duration
	Limit int // the Limit the lease was acquired with (0 or 1: a mutex)
	// Token is the lease's fencing token, as TryAcquire returned it; 0
	// when the caller does not know it (the undo of a claim whose reply
	// was lost). A store may use it to check the release without reading
	// the lease first; OwnerToken alone decides whose lease it is.
	Token uint64
}

// Queuer is implemented by Watcher backends that keep the waiters of a key
// in a first-in, first-out queue on the store, so that one release wakes one
// waiter across all processes, in the order they came, instead of one
// waiter per process.
//
// This is the single statement of the queue's rules; each clause is checked
// by the core/locktest rule named after it, so a backend that differs fails
// that rule. On top of Backend's contract:
//
//   - The grant rule. TryAcquire grants a claim of a key only when fewer
//     live waiters are queued before it than the key has free permits (a
//     mutex has one permit, free when the key is free or expired). A claim
//     without a Waiter, and one whose Waiter has no live place yet, has
//     every live waiter before it: a waiter is never overtaken by a caller
//     that did not wait, nor by one that came later. (QueueNoBarging,
//     QueueFIFOAcrossProcesses, QueueNoBargingOnSemaphore,
//     QueueSemaphoreGrantsByFreePermits.)
//   - A claim with req.Waiter that is not granted answers Busy and leaves
//     req.Waiter in line: at the tail, or in the place it had, until the
//     store's now + req.WaiterTTL — whatever the reason, a held key, a full
//     semaphore, someone else's turn, or a free or new key lost to a
//     concurrent claim. A grant takes req.Waiter out of line.
//     (QueueWaitNamesItself, QueueNoBarging,
//     QueueSemaphoreGrantsByFreePermits, QueueDeadWaiterSkipped,
//     QueueHandoffPrompt.)
//   - A waiter whose place expired (its process died or stopped trying) is
//     not live: it is skipped, and dropped by whoever rewrites the queue
//     next. (QueueDeadWaiterSkipped.)
//   - Turns. The first live waiter is told through WatchTurns, by name —
//     of its own process at least; a store may tell every process —
//     whenever the grant rule may now let it in: a Release of a key with
//     live waiters, ForceRelease, a Leave of the first waiter of a
//     claimable key (a semaphore with a permit free is one), and a grant
//     that leaves a permit free; of a mutex and of a semaphore alike.
//     Nothing else sends a turn: a release with nobody queued sends
//     nothing. A lease that expires need send nothing (waiters poll at the
//     holder's expiry, and the first live one gets the key); a store may
//     tell the first live waiter then. (QueueNoBarging,
//     QueueLeaveOfFirstPassesTurn, QueueSemaphoreGrantPassesTurn,
//     QueueSemaphoreTurns, QueueOneWakePerRelease, QueueHandoffPrompt.)
//
// A Backend that wraps a Queuer must be a Queuer itself, forwarding
// WatchTurns and Leave (and KeepsQueue, when it wraps a QueueKeeper):
// waiters behind a wrapper that hides them are never queued, so no release
// tells them anything and they only poll.
//
// A Backend type whose store keeps a queue in some configurations only is a
// QueueKeeper, and says at run time whether it does.
type Queuer interface {
	Watcher
	// WatchTurns is Watch for a Queuer: fn gets the key and the waiter whose
	// turn it is (empty when the store did not say: any waiter may try).
	// The engine calls WatchTurns instead of Watch. fn must return at once
	// without blocking: a backend may call it on the goroutine that reads
	// the store's replies, which wait behind it.
	WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error
	// Leave takes waiter out of key's queue: its Acquire gave up or failed.
	// When waiter was first in line and the key can be claimed, the next
	// live waiter is told. Leaving a queue one is not in is not an error.
	Leave(ctx context.Context, key, waiter string) error
}

// QueueKeeper is implemented by a Queuer whose store keeps a waiter queue
// in some configurations only: pg's Backend on the legacy table, which has
// no column for one, is one type with its Backend on the full table. When
// KeepsQueue reports false, the engine runs the backend as a Watcher that
// is not a Queuer (see QueuerOf): an Acquire sends no Waiter and no Leave,
// the subscription is Watch's, and a release wakes one waiter per process,
// a wake-up that a waiter which gave up did not use passing to the next
// waiter of its process, as on any Watcher. (Run as a Queuer, such a store
// would see the queue's protocol and keep none of it: no release would be
// handed on to the next waiter, and a wake-up not used would be lost.)
type QueueKeeper interface {
	Queuer
	// KeepsQueue reports whether the store keeps the waiters of a key in
	// line by the Queuer's contract. The answer is fixed for the
	// backend's life.
	KeepsQueue() bool
}

// QueuerOf returns b as the Queuer the engine runs it as: b when it is a
// Queuer, unless it is a QueueKeeper whose KeepsQueue reports false; nil
// and false otherwise. The engine (New) and the conformance suite decide by
// it whether a backend keeps a waiter queue.
func QueuerOf(b Backend) (Queuer, bool) {
	q, ok := b.(Queuer)
	if !ok {
		return nil, false
	}
	if k, ok := b.(QueueKeeper); ok && !k.KeepsQueue() {
		return nil, false
	}
	return q, true
}

// SemaphoreBackend is implemented by backends that also hold semaphores: a
// key with up to Limit holders at once. TryAcquire, Renew and Release with
// Limit > 1 act on one permit of the key; each permit has its own owner
// token, lease and fencing token, and tokens strictly increase per key
// across all permits. A permit that is not renewed expires at its TTL like
// a lock. A claim on a full semaphore returns Busy with the Info of the
// permit that expires first. A claim whose Limit differs from the one the
// key's current holders took it with (a mutex counts as 1) fails with an
// error matching ErrLimitMismatch (see LimitMismatch) and claims nothing. A
// SemaphoreBackend that is also a Queuer grants permits by the Queuer's
// grant rule.
type SemaphoreBackend interface {
	Backend
	// Holders lists every holder of key, oldest first: each permit of a
	// semaphore (Info.Limit is the semaphore's limit), or the one holder of
	// a mutex. It is empty when the key is free.
	Holders(ctx context.Context, key string) ([]Info, error)
}
