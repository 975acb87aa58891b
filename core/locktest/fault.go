package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/core"
)

// errDown is what a faultBackend returns while down.
var errDown = errors.New("locktest: store unreachable (injected fault)")

// errReplyLost is what a faultBackend returns after applying an acquire
// whose reply it drops.
var errReplyLost = errors.New("locktest: reply lost (injected fault)")

// errBackendClosed is what a faultBackend returns after Close.
var errBackendClosed = errors.New("locktest: backend closed")

// faultBackend wraps the backend under test to inject faults that every
// store suffers alike, and records owner tokens so that stale-session cases
// can replay them.
type faultBackend struct {
	core.Backend
	down      atomic.Bool
	loseReply atomic.Bool
	// stallRenew makes renewals hang until their ctx ends, while every
	// other call goes through: a store that is slow rather than down.
	stallRenew atomic.Bool
	// failRelease makes releases fail as if the store were unreachable.
	failRelease atomic.Bool
	// stallClaim makes an acquire wait, after the store applied it, until
	// its ctx ends, and report the ctx's error: a reply that never comes.
	// claimed receives the key of each claim so stalled.
	stallClaim atomic.Bool
	claimed    chan string
	// hangClaim makes an acquire hang, before it reaches the store, until
	// its ctx ends, and report the ctx's error: a store that does not answer.
	hangClaim atomic.Bool
	// frozen, when set, makes an acquire ignore its ctx: it waits until
	// the channel is closed and then reaches the store all the same (a
	// driver call that does not return when its ctx ends). thawed counts
	// the frozen acquires that have returned since.
	frozen atomic.Pointer[chan struct{}]
	thawed atomic.Int64
	// ignoresCtx makes the wrapper say that its calls do not end with
	// their ctx (core.ContextBound), whatever the wrapped backend says:
	// set, before the engine is built on it, where frozen will be used.
	ignoresCtx bool
	closed     atomic.Bool  // Close was called: every call fails
	attempts   atomic.Int64 // TryAcquire calls
	watching   atomic.Bool  // a Watch or WatchTurns subscription is in place
	readyAt    atomic.Int64 // when the latest subscription came up (UnixNano)
	// waiterTTL, when positive, replaces the WaiterTTL of every acquire
	// sent with a Waiter: a wait whose place in line would outlive any
	// bound of a test unless it leaves the queue.
	waiterTTL atomic.Int64
	// queuedBusy counts acquires sent with a Waiter that were answered
	// busy: the wait has taken its place in line.
	queuedBusy atomic.Int64
	busies     atomic.Int64 // acquires answered busy
	renews     atomic.Int64 // Renew calls that reached the store
	lastRenew  atomic.Int64 // when the latest of them that succeeded was sent (UnixNano)
	leaves     atomic.Int64 // Leave calls that reached the store
	leavesDone atomic.Int64 // Leave calls that returned

	mu      sync.Mutex
	tokens  map[string]string // key -> owner token of the last acquire sent
	limits  map[string]int    // owner token -> the Limit its acquire was sent with (0: a mutex)
	misuse  []string          // Renew and Release requests whose Limit is not their acquire's
	sent    []sentAcquire     // every acquire sent, in order
	renewed []int             // the number of leases of each Renew call
	turns   []turnSeen        // every turn WatchTurns told, in order
}

// turnSeen is a turn that WatchTurns told: waiter's, or, with waiter
// empty, any waiter's of key.
type turnSeen struct {
	key, waiter string
	at          time.Time
}

// sentAcquire is what a faultBackend saw of one TryAcquire.
type sentAcquire struct {
	key, waiter    string
	busy           bool
	cut            bool // ended by its ctx without an answer: the store may still apply it
	sent, answered time.Time
}

func newFault(b core.Backend) *faultBackend {
	return &faultBackend{Backend: b, tokens: make(map[string]string), limits: make(map[string]int), claimed: make(chan string, 16)}
}

// limitOf is a request's Limit as a record kind: 0 for a mutex.
func limitOf(n int) int {
	if n <= 1 {
		return 0
	}
	return n
}

// checkLimit records a Renew or Release of ownerToken whose Limit differs
// from the one its acquire was sent with: the backend could not tell which
// record to act on. f.mu is held.
func (f *faultBackend) checkLimit(op, key, ownerToken string, limit int) {
	want, ok := f.limits[ownerToken]
	if ok && limitOf(limit) != want {
		f.misuse = append(f.misuse, fmt.Sprintf("%s of %q carried Limit %d; its acquire was sent with Limit %d", op, key, limit, want))
	}
}

// limitMisuse returns the Renew and Release requests sent with another
// Limit than their lease's acquire.
func (f *faultBackend) limitMisuse() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.misuse...)
}

// acquiresSent returns the acquires sent so far.
func (f *faultBackend) acquiresSent() []sentAcquire {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentAcquire(nil), f.sent...)
}

// queuedSince reports whether an acquire sent with a Waiter at or after t
// was answered busy.
func (f *faultBackend) queuedSince(t time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.sent) - 1; i >= 0; i-- {
		if a := f.sent[i]; a.busy && a.waiter != "" && !a.sent.Before(t) {
			return true
		}
	}
	return false
}

// lastCut returns the send time of the latest acquire of key that its ctx
// ended without an answer (see sentAcquire.cut), and whether there was one.
func (f *faultBackend) lastCut(key string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.sent) - 1; i >= 0; i-- {
		if a := f.sent[i]; a.key == key && a.cut {
			return a.sent, true
		}
	}
	return time.Time{}, false
}

// busySince reports whether an acquire was answered busy at or after t.
func (f *faultBackend) busySince(t time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.sent) - 1; i >= 0; i-- {
		if a := f.sent[i]; a.busy && !a.answered.Before(t) {
			return true
		}
	}
	return false
}

// renewCalls returns the number of leases of every Renew call so far.
func (f *faultBackend) renewCalls() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.renewed...)
}

// unusable is the error of a call that cannot reach the store.
func (f *faultBackend) unusable() error {
	if f.closed.Load() {
		return errBackendClosed
	}
	if f.down.Load() {
		return errDown
	}
	return nil
}

func (f *faultBackend) Close() error {
	f.closed.Store(true)
	return f.Backend.Close()
}

func (f *faultBackend) ownerToken(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens[key]
}

func (f *faultBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := f.unusable(); err != nil {
		return core.Lease{}, err
	}
	f.attempts.Add(1)
	if f.hangClaim.Load() {
		<-ctx.Done()
		return core.Lease{}, ctx.Err()
	}
	if ch := f.frozen.Load(); ch != nil {
		<-*ch
		defer f.thawed.Add(1)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
	}
	f.mu.Lock()
	f.tokens[req.Key] = req.OwnerToken
	f.limits[req.OwnerToken] = limitOf(req.Limit)
	f.mu.Unlock()
	if d := f.waiterTTL.Load(); d > 0 && req.Waiter != "" {
		req.WaiterTTL = time.Duration(d)
	}
	sentAt := time.Now()
	lease, err := f.Backend.TryAcquire(ctx, req)
	busy := errors.Is(err, core.ErrNotAcquired)
	f.mu.Lock()
	cut := err != nil && !busy && ctx.Err() != nil
	f.sent = append(f.sent, sentAcquire{key: req.Key, waiter: req.Waiter, busy: busy, cut: cut, sent: sentAt, answered: time.Now()})
	f.mu.Unlock()
	if busy {
		f.busies.Add(1)
		if req.Waiter != "" {
			f.queuedBusy.Add(1)
		}
	}
	if err == nil && f.stallClaim.Load() {
		select {
		case f.claimed <- req.Key:
		default:
		}
		<-ctx.Done()
		return core.Lease{}, ctx.Err()
	}
	if err == nil && f.loseReply.Load() {
		return core.Lease{}, errReplyLost
	}
	return lease, err
}

func (f *faultBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if err := f.unusable(); err != nil {
		return nil, err
	}
	if f.stallRenew.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.renews.Add(1)
	f.mu.Lock()
	f.renewed = append(f.renewed, len(reqs))
	for _, r := range reqs {
		f.checkLimit("Renew", r.Key, r.OwnerToken, r.Limit)
	}
	f.mu.Unlock()
	sent := time.Now()
	results, err := f.Backend.Renew(ctx, reqs)
	if err == nil {
		f.lastRenew.Store(sent.UnixNano())
	}
	return results, err
}

func (f *faultBackend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if err := f.unusable(); err != nil {
		return err
	}
	f.mu.Lock()
	f.checkLimit("Release", req.Key, req.OwnerToken, req.Limit)
	f.mu.Unlock()
	if f.failRelease.Load() {
		return errDown
	}
	return f.Backend.Release(ctx, req)
}

func (f *faultBackend) Now(ctx context.Context, key string) (time.Time, error) {
	if err := f.unusable(); err != nil {
		return time.Time{}, err
	}
	return f.Backend.Now(ctx, key)
}

func (f *faultBackend) admin() (core.Admin, error) {
	a, ok := f.Backend.(core.Admin)
	if !ok {
		return nil, core.ErrUnsupported
	}
	if err := f.unusable(); err != nil {
		return nil, err
	}
	return a, nil
}

func (f *faultBackend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	a, err := f.admin()
	if err != nil {
		return core.Info{}, false, err
	}
	return a.Inspect(ctx, key)
}

func (f *faultBackend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	a, err := f.admin()
	if err != nil {
		return nil, err
	}
	return a.List(ctx, prefix)
}

func (f *faultBackend) ForceRelease(ctx context.Context, key string) (bool, error) {
	a, err := f.admin()
	if err != nil {
		return false, err
	}
	return a.ForceRelease(ctx, key)
}

// The optional interfaces of the wrapped backend — core.Watcher, core.Queuer,
// core.SemaphoreBackend, core.ClaimBounder — are forwarded exactly when it
// implements them, since the engine changes its behaviour on each: a
// wrapper that claimed one its backend lacks (or hid one it has) would test
// another engine than the one the backend runs under. faultBackend itself
// has none of their methods; each comes from one of the parts below, and
// backend composes the parts the wrapped backend has. queuePart forwards
// core.QueueKeeper's KeepsQueue too (true for a core.Queuer that is not a
// core.QueueKeeper, which is what core.QueuerOf makes of one), so that the
// engine decides by it whether to run the queue's protocol, as it does on
// the bare backend. The Admin calls stay on faultBackend (answering
// ErrUnsupported for a backend without them), as the engine only forwards
// them.

// watchPart adds core.Watcher.
type watchPart struct{ f *faultBackend }

func (p watchPart) Watch(ctx context.Context, ready func(), fn func(string)) error {
	f := p.f
	if err := f.unusable(); err != nil {
		return err
	}
	defer f.watching.Store(false)
	return f.Backend.(core.Watcher).Watch(ctx, func() { f.readyAt.Store(time.Now().UnixNano()); f.watching.Store(true); ready() }, fn)
}

// queuePart adds core.Queuer (and so core.Watcher).
type queuePart struct{ watchPart }

func (p queuePart) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	f := p.f
	if err := f.unusable(); err != nil {
		return err
	}
	defer f.watching.Store(false)
	told := func(key, waiter string) {
		f.mu.Lock()
		f.turns = append(f.turns, turnSeen{key: key, waiter: waiter, at: time.Now()})
		f.mu.Unlock()
		fn(key, waiter)
	}
	return f.Backend.(core.Queuer).WatchTurns(ctx, func() { f.readyAt.Store(time.Now().UnixNano()); f.watching.Store(true); ready() }, told)
}

// polledGrants returns how many acquires of keys with a Waiter were
// granted without a turn: not the wait's first attempt, and no turn for its
// waiter (or for any waiter of its key) was told to any of fs since the
// wait's attempt before it was sent — a grant at the fallback poll. A grant
// whose own turn, naming its waiter, is told after the attempt was sent is
// no poll grant: the store had sent that turn, and the poll merely came
// first (on a busy machine a turn's delivery can outlast the poll's wait).
func polledGrants(fs []*faultBackend, keys map[string]bool) (polled, grants int) {
	var sent []sentAcquire
	var turns []turnSeen
	for _, f := range fs {
		f.mu.Lock()
		sent = append(sent, f.sent...)
		turns = append(turns, f.turns...)
		f.mu.Unlock()
	}
	prev := map[string]time.Time{} // key NUL waiter -> the send of its last attempt
	slices.SortFunc(sent, func(a, b sentAcquire) int { return a.sent.Compare(b.sent) })
	for _, a := range sent {
		if a.waiter == "" || !keys[a.key] {
			continue
		}
		kw := a.key + "\x00" + a.waiter
		before, ok := prev[kw]
		prev[kw] = a.sent
		if !ok || a.busy {
			continue
		}
		grants++
		told := false
		for _, t := range turns {
			if t.key == a.key && (t.waiter == a.waiter || t.waiter == "") && t.at.After(before) && !t.at.After(a.sent) ||
				t.key == a.key && t.waiter == a.waiter && t.at.After(a.sent) {
				told = true
				break
			}
		}
		if !told {
			polled++
		}
	}
	return polled, grants
}

// KeepsQueue forwards core.QueueKeeper: whether the engine runs the wrapped
// backend as a core.Queuer.
func (p queuePart) KeepsQueue() bool { return p.f.queues() }

func (p queuePart) Leave(ctx context.Context, key, waiter string) error {
	f := p.f
	if err := f.unusable(); err != nil {
		return err
	}
	f.leaves.Add(1)
	defer f.leavesDone.Add(1)
	return f.Backend.(core.Queuer).Leave(ctx, key, waiter)
}

// semPart adds core.SemaphoreBackend's Holders.
type semPart struct{ f *faultBackend }

func (p semPart) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := p.f.unusable(); err != nil {
		return nil, err
	}
	return p.f.Backend.(core.SemaphoreBackend).Holders(ctx, key)
}

// boundPart adds core.ClaimBounder, so that the engine repeats undos for
// the backend as it would unwrapped.
type boundPart struct{ f *faultBackend }

func (p boundPart) ClaimBound() time.Duration {
	return p.f.Backend.(core.ClaimBounder).ClaimBound()
}

// EndsWithContext is the wrapped backend's answer (core.ContextBound),
// unless the rule makes calls that ignore their ctx (ignoresCtx).
func (f *faultBackend) EndsWithContext() bool { return endsWithCtx(f.Backend) && !f.ignoresCtx }

// endsWithCtx reports whether b says its calls end with their ctx
// (core.ContextBound).
func endsWithCtx(b core.Backend) bool {
	cb, ok := b.(core.ContextBound)
	return ok && cb.EndsWithContext()
}

// queues reports whether the engine runs the wrapped backend as a
// core.Queuer (core.QueuerOf): it is one and keeps a waiter queue.
func (f *faultBackend) queues() bool {
	_, q := core.QueuerOf(f.Backend)
	return q
}

// backend returns f with exactly the optional interfaces of the backend it
// wraps: what the engine under test is given.
func (f *faultBackend) backend() core.Backend {
	_, watch := f.Backend.(core.Watcher)
	_, queue := f.Backend.(core.Queuer)
	_, sem := f.Backend.(core.SemaphoreBackend)
	_, bound := f.Backend.(core.ClaimBounder)
	w, q, s, b := watchPart{f}, queuePart{watchPart{f}}, semPart{f}, boundPart{f}
	switch {
	case queue && sem && bound:
		return struct {
			*faultBackend
			queuePart
			semPart
			boundPart
		}{f, q, s, b}
	case queue && sem:
		return struct {
			*faultBackend
			queuePart
			semPart
		}{f, q, s}
	case queue && bound:
		return struct {
			*faultBackend
			queuePart
			boundPart
		}{f, q, b}
	case queue:
		return struct {
			*faultBackend
			queuePart
		}{f, q}
	case watch && sem && bound:
		return struct {
			*faultBackend
			watchPart
			semPart
			boundPart
		}{f, w, s, b}
	case watch && sem:
		return struct {
			*faultBackend
			watchPart
			semPart
		}{f, w, s}
	case watch && bound:
		return struct {
			*faultBackend
			watchPart
			boundPart
		}{f, w, b}
	case watch:
		return struct {
			*faultBackend
			watchPart
		}{f, w}
	case sem && bound:
		return struct {
			*faultBackend
			semPart
			boundPart
		}{f, s, b}
	case sem:
		return struct {
			*faultBackend
			semPart
		}{f, s}
	case bound:
		return struct {
			*faultBackend
			boundPart
		}{f, b}
	}
	return f
}
