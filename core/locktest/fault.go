package locktest

import (
	"context"
	"errors"
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
	closed     atomic.Bool  // Close was called: every call fails
	attempts   atomic.Int64 // TryAcquire calls
	watching   atomic.Bool  // a Watch subscription is in place

	mu     sync.Mutex
	tokens map[string]string // key -> owner token of the last acquire sent
}

func newFault(b core.Backend) *faultBackend {
	return &faultBackend{Backend: b, tokens: make(map[string]string), claimed: make(chan string, 16)}
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

// ClaimBound forwards the backend's core.ClaimBounder, so that the engine
// repeats undos for it as it would unwrapped (0: the backend has no bound).
func (f *faultBackend) ClaimBound() time.Duration {
	if cb, ok := f.Backend.(core.ClaimBounder); ok {
		return cb.ClaimBound()
	}
	return 0
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
	f.mu.Lock()
	f.tokens[req.Key] = req.OwnerToken
	f.mu.Unlock()
	lease, err := f.Backend.TryAcquire(ctx, req)
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
	return f.Backend.Renew(ctx, reqs)
}

func (f *faultBackend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if err := f.unusable(); err != nil {
		return err
	}
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

func (f *faultBackend) Watch(ctx context.Context, ready func(), fn func(string)) error {
	w, ok := f.Backend.(core.Watcher)
	if !ok {
		return core.ErrUnsupported
	}
	if err := f.unusable(); err != nil {
		return err
	}
	defer f.watching.Store(false)
	return w.Watch(ctx, func() { f.watching.Store(true); ready() }, fn)
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
