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

// faultBackend wraps the backend under test to inject faults that every
// store suffers alike, and records owner tokens so that stale-session cases
// can replay them.
type faultBackend struct {
	core.Backend
	down      atomic.Bool
	loseReply atomic.Bool
	attempts  atomic.Int64 // TryAcquire calls
	watching  atomic.Bool  // a Watch subscription is in place

	mu     sync.Mutex
	tokens map[string]string // key -> owner token of the last acquire sent
}

func newFault(b core.Backend) *faultBackend {
	return &faultBackend{Backend: b, tokens: make(map[string]string)}
}

func (f *faultBackend) ownerToken(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens[key]
}

func (f *faultBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if f.down.Load() {
		return core.Lease{}, errDown
	}
	f.attempts.Add(1)
	f.mu.Lock()
	f.tokens[req.Key] = req.OwnerToken
	f.mu.Unlock()
	lease, err := f.Backend.TryAcquire(ctx, req)
	if err == nil && f.loseReply.Load() {
		return core.Lease{}, errReplyLost
	}
	return lease, err
}

func (f *faultBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if f.down.Load() {
		return nil, errDown
	}
	return f.Backend.Renew(ctx, reqs)
}

func (f *faultBackend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if f.down.Load() {
		return errDown
	}
	return f.Backend.Release(ctx, req)
}

func (f *faultBackend) Now(ctx context.Context, key string) (time.Time, error) {
	if f.down.Load() {
		return time.Time{}, errDown
	}
	return f.Backend.Now(ctx, key)
}

func (f *faultBackend) Watch(ctx context.Context, ready func(), fn func(string)) error {
	w, ok := f.Backend.(core.Watcher)
	if !ok {
		return core.ErrUnsupported
	}
	if f.down.Load() {
		return errDown
	}
	defer f.watching.Store(false)
	return w.Watch(ctx, func() { f.watching.Store(true); ready() }, fn)
}

func (f *faultBackend) admin() (core.Admin, error) {
	a, ok := f.Backend.(core.Admin)
	if !ok {
		return nil, core.ErrUnsupported
	}
	if f.down.Load() {
		return nil, errDown
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
