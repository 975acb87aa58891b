// Package locktest is the conformance suite every dislock backend and every
// Locker decorator runs. A backend supplies a Harness; Run checks the rules
// of the core contract against it, each subtest naming the rule it checks.
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, locktest.Harness{
//			NewBackend: func(t testing.TB) core.Backend { return newBackend(t) },
//			Steal:      steal,
//		})
//	}
//
// Faults that every backend can suffer the same way (a store that stops
// answering, a crashed holder, lost replies) are injected by locktest itself
// through a Backend wrapper, so a backend needs no test hooks for them. The
// wrapper has exactly the optional interfaces of the backend it wraps
// (core.Watcher, core.Queuer, core.SemaphoreBackend, core.ClaimBounder), and
// forwards core.QueueKeeper's answer, so the engine under test runs as it
// would on the bare backend.
//
// Rules of optional capabilities run when the backend implements them and
// are skipped, with the reason, when it does not: the Semaphore rules for a
// core.SemaphoreBackend (at most n holders, racing tries all granted while
// permits are free, tokens across permits, a crashed permit, wake-ups,
// limit mismatches, Holders and the Admin calls per permit, batched
// renewal, min hold), the Queue rules for a backend that the engine runs
// as a core.Queuer (core.QueuerOf: a core.Queuer, unless it is a
// core.QueueKeeper that keeps no queue; FIFO across processes, dead and
// cancelled waiters, no barging, one wake per release). The Check rules (Session.Check) run on every backend, and so does
// the token race (TokensIncreaseUnderRace: many processes race for one key,
// and no holder's token may fail to exceed its predecessors'), whose
// semaphore half needs a core.SemaphoreBackend.
package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Harness describes the backend under test.
type Harness struct {
	// NewBackend returns a new, independent connection to the one store
	// under test: two Backends from it must behave as two processes. It
	// registers its own cleanup with t.Cleanup.
	NewBackend func(t testing.TB) core.Backend

	// ClientOptions are added to every Client the suite builds (after its
	// own TTL default): an Observer under test, say.
	ClientOptions []core.ClientOption

	// Wrap, when set, wraps every Locker the suite builds: the decorator
	// under test. The suite checks that it changes no behaviour.
	Wrap func(core.Locker) core.Locker

	// Steal, when set, makes key held by another owner behind the holder's
	// back (as if its lease had expired and someone else took it). Delete
	// removes key behind the holder's back. Cases that need them are
	// skipped when they are nil.
	Steal  func(ctx context.Context, key string) error
	Delete func(ctx context.Context, key string) error

	// Stall, when set, returns a Backend on a new connection to the store
	// and two functions: stall makes the store stop answering it (every
	// reply held back, on its connections open now or made later, while
	// its requests still arrive), resume lets the replies through again. A
	// backend that says its calls end with their ctx (core.ContextBound)
	// must set it: the rule that checks the claim fails without it.
	Stall func(t testing.TB) (b core.Backend, stall, resume func())

	// KeyPrefix is put before every key, so suites running at the same
	// time against one server never collide. Run adds a random part.
	KeyPrefix string

	// TTL is the lease used by timing cases (default 1s: its renew
	// deadline, 2/3 of it, leaves a renewal room for a stall of over half
	// a second, which a busy machine's scheduler or a store's fsync can
	// cause; 600ms lost leases that way). Raise it for a slow store; keep
	// TTL/3 well above a round trip.
	TTL time.Duration

	// ExpiryLag is how late after a lease's TTL the store may still hold
	// it when nobody renewed it: its expiry's granularity (etcd's lessor
	// looks for expired leases every 500ms and revokes them through
	// consensus). The rules that bound when an unrenewed key frees allow
	// it beyond their usual second. Default 0.
	ExpiryLag time.Duration

	// Capabilities the backend lacks: cases that need them are skipped
	// with this reason in the log rather than forked.
	NoFencing    bool // tokens are 0
	NoHolderInfo bool // a busy answer does not say who holds the key
	NoWatch      bool // no release notifications
	NoAdmin      bool // no Inspect/List/ForceRelease
	NoSlots      bool // ForSlot unsupported
}
