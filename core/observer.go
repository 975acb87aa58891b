package core

import (
	"context"
	"time"
)

// Mode says how an acquisition was asked for.
type Mode string

// Acquisition modes, as reported to Observers. A slot acquisition
// (ForSlot) has one of these modes too; its events say Slot.
const (
	ModeTry  Mode = "try"  // TryAcquire
	ModeWait Mode = "wait" // Acquire
)

// Wake says what woke a waiting Acquire for its next attempt.
type Wake string

// Wake-up reasons, as reported to Observers.
const (
	WakeNotify Wake = "notify" // a release notification (the Watcher, or a release by this Client)
	WakePoll   Wake = "poll"   // the polling timer (backoff, or the holder's known expiry), or a re-check after the Watcher (re)subscribed
)

// Observer sees every store operation of a Client, including the background
// renewals and lease losses no caller is waiting for. Each Start hook returns
// the context the matching End hook (and, for acquisitions, all later events
// of that session) receives, so a tracer can keep its span there; it must be
// derived from the ctx it was given. The store calls of an acquisition run
// under the ctx AcquireStart returned, so driver spans nest under it. Lost is
// called before the session's Done channel closes. Hooks are
// called synchronously and must be fast and safe for concurrent use.
//
// Embed NopObserver to implement only some hooks.
type Observer interface {
	// AcquireStart is called when TryAcquire or Acquire begins (after the
	// key and options are validated); AcquireEnd when it returns.
	AcquireStart(ctx context.Context, e AcquireStartEvent) context.Context
	AcquireEnd(ctx context.Context, e AcquireEndEvent)
	// RenewStart and RenewEnd bracket one session's part in a batched
	// renewal, run by the renewer goroutine (see RenewBatchObserver for
	// the call as a whole).
	RenewStart(ctx context.Context, e RenewStartEvent) context.Context
	RenewEnd(ctx context.Context, e RenewEndEvent)
	// ReleaseStart and ReleaseEnd bracket a release (by Release or Close).
	ReleaseStart(ctx context.Context, e ReleaseStartEvent) context.Context
	ReleaseEnd(ctx context.Context, e ReleaseEndEvent)
	// Lost is called once when a session's lease is lost. ctx is the one
	// AcquireEnd received.
	Lost(ctx context.Context, e LostEvent)
}

// AcquireStartEvent starts an acquisition.
type AcquireStartEvent struct {
	Backend string
	Key     string
	Mode    Mode
	Slot    bool // the acquisition is for a schedule slot (ForSlot)
}

// AcquireEndEvent ends an acquisition.
type AcquireEndEvent struct {
	Backend  string
	Key      string
	Mode     Mode
	Slot     bool
	Session  Session // nil unless acquired
	Attempts int     // store attempts made
	Wait     time.Duration
	Err      error // nil when acquired; matches ErrNotAcquired only when the store's last answer was busy
	// Holder is the holder named by the last busy answer, as of that
	// answer; nil when no attempt was busy or the store did not say.
	Holder *Info
	// Wake is what woke the wait for the last attempt; "" when the
	// first attempt decided.
	Wake Wake
}

// RenewStartEvent starts the renewal of one session's lease. Renewals of
// many sessions share one round trip; each session gets its own events.
type RenewStartEvent struct {
	Backend string
	Key     string
	Token   uint64
}

// RenewEndEvent ends one session's renewal.
type RenewEndEvent struct {
	Backend string
	Key     string
	Token   uint64
	Err     error // nil when renewed
}

// ReleaseStartEvent starts a release. The hook's ctx is the session's (the
// one AcquireEnd received); Caller is the ctx passed to Release, or
// context.Background() when the Locker's Close releases.
type ReleaseStartEvent struct {
	Backend string
	Key     string
	Token   uint64
	Caller  context.Context
}

// ReleaseEndEvent ends a release.
type ReleaseEndEvent struct {
	Backend string
	Key     string
	Token   uint64
	Held    time.Duration // from acquisition to release
	Kept    bool          // the lock was left to expire (min hold or slot)
	Err     error
}

// LostEvent reports a lost lease.
type LostEvent struct {
	Backend string
	Key     string
	Token   uint64
	Held    time.Duration
	Err     error // matches ErrLeaseLost
}

// RenewBatchObserver is an Observer that also sees each renewal call as a
// whole: one Backend.Renew round trip for one or more sessions. The renewer
// calls RenewBatchStart before the sessions' RenewStart hooks and makes the
// store call under the context it returns (with the call's time bound
// added), so that a tracer's span there is the parent of the driver's own
// spans; it calls RenewBatchEnd, with that context, after the sessions'
// RenewEnd hooks. The ctx RenewBatchStart receives is the renewer's own: it
// carries no caller's values and ends when the Client closes; the context it
// returns must be derived from it. The events' slices are read-only and
// valid only during the call.
//
// An Observer that does not implement it sees only the per-session hooks,
// and the store call runs on the renewer's own context. Observers composes
// RenewBatchObserver members like the other hooks.
type RenewBatchObserver interface {
	Observer
	RenewBatchStart(ctx context.Context, e RenewBatchStartEvent) context.Context
	RenewBatchEnd(ctx context.Context, e RenewBatchEndEvent)
}

// RenewBatchStartEvent starts one renewal call.
type RenewBatchStartEvent struct {
	Backend string
	// Renewals are the sessions the call renews. Contexts[i] is the
	// context the AcquireEnd hook of the session of Renewals[i] received.
	Renewals []RenewStartEvent
	Contexts []context.Context
}

// RenewBatchEndEvent ends one renewal call.
type RenewBatchEndEvent struct {
	Backend string
	// Renewals are the sessions' outcomes, in the order of the start
	// event (each Err is nil when that session's lease was renewed), and
	// Contexts the same as the start event's.
	Renewals []RenewEndEvent
	Contexts []context.Context
	// Err is the call's own failure (transport error, time bound passed),
	// which every session shares; nil when the store answered.
	Err error
}

// NopObserver implements Observer with hooks that do nothing. Embed it.
type NopObserver struct{}

// AcquireStart returns ctx unchanged.
func (NopObserver) AcquireStart(ctx context.Context, _ AcquireStartEvent) context.Context {
	return ctx
}

// AcquireEnd does nothing.
func (NopObserver) AcquireEnd(context.Context, AcquireEndEvent) {}

// RenewStart returns ctx unchanged.
func (NopObserver) RenewStart(ctx context.Context, _ RenewStartEvent) context.Context {
	return ctx
}

// RenewEnd does nothing.
func (NopObserver) RenewEnd(context.Context, RenewEndEvent) {}

// ReleaseStart returns ctx unchanged.
func (NopObserver) ReleaseStart(ctx context.Context, _ ReleaseStartEvent) context.Context {
	return ctx
}

// ReleaseEnd does nothing.
func (NopObserver) ReleaseEnd(context.Context, ReleaseEndEvent) {}

// Lost does nothing.
func (NopObserver) Lost(context.Context, LostEvent) {}

// Observers composes observers; hooks run in order, each Start hook receiving
// the context the previous one returned. Nil observers are skipped.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case multiObserver:
			list = append(list, o...)
		default:
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

var _ RenewBatchObserver = multiObserver(nil)

func (m multiObserver) RenewBatchStart(ctx context.Context, e RenewBatchStartEvent) context.Context {
	return startAll(m, ctx, e, func(o Observer, ctx context.Context, e RenewBatchStartEvent) context.Context {
		if b, ok := o.(RenewBatchObserver); ok {
			return b.RenewBatchStart(ctx, e)
		}
		return ctx
	})
}
func (m multiObserver) RenewBatchEnd(ctx context.Context, e RenewBatchEndEvent) {
	endAll(m, ctx, e, func(o Observer, ctx context.Context, e RenewBatchEndEvent) {
		if b, ok := o.(RenewBatchObserver); ok {
			b.RenewBatchEnd(ctx, e)
		}
	})
}

func (m multiObserver) AcquireStart(ctx context.Context, e AcquireStartEvent) context.Context {
	return startAll(m, ctx, e, Observer.AcquireStart)
}
func (m multiObserver) AcquireEnd(ctx context.Context, e AcquireEndEvent) {
	endAll(m, ctx, e, Observer.AcquireEnd)
}
func (m multiObserver) RenewStart(ctx context.Context, e RenewStartEvent) context.Context {
	return startAll(m, ctx, e, Observer.RenewStart)
}
func (m multiObserver) RenewEnd(ctx context.Context, e RenewEndEvent) {
	endAll(m, ctx, e, Observer.RenewEnd)
}
func (m multiObserver) ReleaseStart(ctx context.Context, e ReleaseStartEvent) context.Context {
	return startAll(m, ctx, e, Observer.ReleaseStart)
}
func (m multiObserver) ReleaseEnd(ctx context.Context, e ReleaseEndEvent) {
	endAll(m, ctx, e, Observer.ReleaseEnd)
}
func (m multiObserver) Lost(ctx context.Context, e LostEvent) {
	endAll(m, ctx, e, Observer.Lost)
}

// startAll runs the Start hook start of every observer of m in order, each
// receiving the context the previous one returned.
func startAll[E any](m multiObserver, ctx context.Context, e E, start func(Observer, context.Context, E) context.Context) context.Context {
	for _, o := range m {
		ctx = start(o, ctx, e)
	}
	return ctx
}

// endAll runs the hook end of every observer of m in order.
func endAll[E any](m multiObserver, ctx context.Context, e E, end func(Observer, context.Context, E)) {
	for _, o := range m {
		end(o, ctx, e)
	}
}
