// Package memlock is an in-process dislock backend: the store lives in memory
// and every Backend handle on one Store acts as a separate process connected
// to it.
//
// Use it in unit tests of code that takes locks, in examples, and wherever a
// single process needs the Locker API. It has fencing tokens, release
// notifications, the Admin calls and a clock, and hooks to simulate faults:
// a store that stops answering (SetDown), latency (SetLatency), replies lost
// after the store applied a call (SetLoseReplies), a stolen or deleted lock
// (Steal, Delete) and a skewed store clock (SetClockOffset).
//
// It gives no protection across processes.
package memlock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dislock/dislock/core"
)

// ErrUnavailable is returned by a Backend handle set down with SetDown.
var ErrUnavailable = errors.New("memlock: store unavailable")

// ErrReplyLost is returned by a handle with SetLoseReplies(true) after the
// store applied the call.
var ErrReplyLost = errors.New("memlock: reply lost")

// Store is the shared in-memory lock table.
type Store struct {
	mu     sync.Mutex
	locks  map[string]*entry
	tokens map[string]uint64
	subs   map[chan string]struct{}
	offset time.Duration
}

type entry struct {
	owner, ownerToken    string
	token                uint64
	acquiredAt, expireAt time.Time
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		locks:  make(map[string]*entry),
		tokens: make(map[string]uint64),
		subs:   make(map[chan string]struct{}),
	}
}

// New returns a Locker on a fresh private store: the quickest way to get a
// core.Locker in a unit test or a single-process program.
func New(opts ...core.ClientOption) (*core.Client, error) {
	return NewStore().Locker(opts...)
}

// Locker returns a new Locker on s, acting as a separate process.
func (s *Store) Locker(opts ...core.ClientOption) (*core.Client, error) {
	return core.New(s.Backend(), opts...)
}

// Backend returns a new handle on s: a separate process's connection.
func (s *Store) Backend() *Backend { return &Backend{s: s} }

func (s *Store) now() time.Time { return time.Now().Add(s.offset) }

// SetClockOffset skews the store's clock by d.
func (s *Store) SetClockOffset(d time.Duration) {
	s.mu.Lock()
	s.offset = d
	s.mu.Unlock()
}

// Steal gives key to another owner, as if the lease had expired and someone
// else acquired it: the holder's next renewal is refused. It reports whether
// the key was held.
func (s *Store) Steal(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key)
	if e == nil {
		return false
	}
	s.tokens[key]++
	e.owner, e.ownerToken, e.token = "thief", "stolen", s.tokens[key]
	return true
}

// Delete removes key whoever holds it, without notifying anyone, as if it
// were deleted behind the holder's back.
func (s *Store) Delete(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key)
	delete(s.locks, key)
	return e != nil
}

// Held reports whether key is held now.
func (s *Store) Held(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live(key) != nil
}

// live returns key's unexpired entry.
func (s *Store) live(key string) *entry {
	e := s.locks[key]
	if e == nil {
		return nil
	}
	if !s.now().Before(e.expireAt) {
		delete(s.locks, key)
		return nil
	}
	return e
}

func (s *Store) info(key string, e *entry) core.Info {
	return core.Info{Key: key, Owner: e.owner, Token: e.token, AcquiredAt: e.acquiredAt,
		ExpiresAt: e.expireAt, Remaining: e.expireAt.Sub(s.now())}
}

func (s *Store) publish(key string) {
	for ch := range s.subs {
		select {
		case ch <- key:
		default: // a slow subscriber falls back to polling
		}
	}
}

// Backend is one process's handle on a Store. It implements core.Backend,
// core.Watcher and core.Admin.
type Backend struct {
	s *Store

	mu        sync.Mutex
	down      bool
	loseReply bool
	latency   time.Duration
	stats     Stats
}

var (
	_ core.Backend = (*Backend)(nil)
	_ core.Watcher = (*Backend)(nil)
	_ core.Admin   = (*Backend)(nil)
)

// Stats counts the calls a handle served.
type Stats struct {
	Acquires, Renews, RenewedLeases, Releases, Nows int
}

// Stats returns the calls served so far.
func (b *Backend) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// SetDown makes every call of this handle fail with ErrUnavailable (true) or
// work again (false), as if the store were unreachable from this process.
func (b *Backend) SetDown(down bool) {
	b.mu.Lock()
	b.down = down
	b.mu.Unlock()
}

// SetLatency delays every call of this handle by d (honouring ctx).
func (b *Backend) SetLatency(d time.Duration) {
	b.mu.Lock()
	b.latency = d
	b.mu.Unlock()
}

// SetLoseReplies makes every call apply its effect and then return
// ErrReplyLost, as when a connection drops after the server committed.
func (b *Backend) SetLoseReplies(lose bool) {
	b.mu.Lock()
	b.loseReply = lose
	b.mu.Unlock()
}

// call runs op under the handle's faults.
func (b *Backend) call(ctx context.Context, count func(*Stats), op func() error) error {
	b.mu.Lock()
	down, lat, lose := b.down, b.latency, b.loseReply
	count(&b.stats)
	b.mu.Unlock()
	if lat > 0 {
		t := time.NewTimer(lat)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if down {
		return ErrUnavailable
	}
	b.s.mu.Lock()
	err := op()
	b.s.mu.Unlock()
	if lose && err == nil {
		return ErrReplyLost
	}
	return err
}

// Name implements core.Backend.
func (b *Backend) Name() string { return "memory" }

// TryAcquire implements core.Backend.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (lease core.Lease, err error) {
	err = b.call(ctx, func(st *Stats) { st.Acquires++ }, func() error {
		s := b.s
		if e := s.live(req.Key); e != nil {
			if e.ownerToken == req.OwnerToken {
				lease = core.Lease{Token: e.token, AcquiredAt: e.acquiredAt, ExpiresAt: e.expireAt}
				return nil
			}
			info := s.info(req.Key, e)
			return core.Busy(req.Key, &info)
		}
		now := s.now()
		exp := now.Add(req.TTL)
		if !req.ExpireAt.IsZero() {
			if !req.ExpireAt.After(now) {
				return core.Busy(req.Key, nil) // the slot is over
			}
			exp = req.ExpireAt
		}
		s.tokens[req.Key]++
		e := &entry{owner: req.Owner, ownerToken: req.OwnerToken, token: s.tokens[req.Key], acquiredAt: now, expireAt: exp}
		s.locks[req.Key] = e
		lease = core.Lease{Token: e.token, AcquiredAt: now, ExpiresAt: exp}
		return nil
	})
	return lease, err
}

// Renew implements core.Backend.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) (results []error, err error) {
	err = b.call(ctx, func(st *Stats) { st.Renews++; st.RenewedLeases += len(reqs) }, func() error {
		s := b.s
		results = make([]error, len(reqs))
		for i, r := range reqs {
			e := s.live(r.Key)
			if e == nil || e.ownerToken != r.OwnerToken {
				results[i] = core.Gone(r.Key, "held by another owner or gone")
				continue
			}
			e.expireAt = s.now().Add(r.TTL)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// Release implements core.Backend.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	return b.call(ctx, func(st *Stats) { st.Releases++ }, func() error {
		s := b.s
		e := s.live(req.Key)
		if e == nil || e.ownerToken != req.OwnerToken {
			return nil
		}
		if req.Keep > 0 {
			e.expireAt = s.now().Add(req.Keep)
			return nil
		}
		delete(s.locks, req.Key)
		s.publish(req.Key)
		return nil
	})
}

// Now implements core.Backend.
func (b *Backend) Now(ctx context.Context, _ string) (now time.Time, err error) {
	err = b.call(ctx, func(st *Stats) { st.Nows++ }, func() error {
		now = b.s.now()
		return nil
	})
	return now, err
}

// Close implements core.Backend; it does nothing.
func (b *Backend) Close() error { return nil }

// Watch implements core.Watcher.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	b.mu.Lock()
	down := b.down
	b.mu.Unlock()
	if down {
		return ErrUnavailable
	}
	ch := make(chan string, 256)
	b.s.mu.Lock()
	b.s.subs[ch] = struct{}{}
	b.s.mu.Unlock()
	defer func() {
		b.s.mu.Lock()
		delete(b.s.subs, ch)
		b.s.mu.Unlock()
	}()
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case key := <-ch:
			fn(key)
		}
	}
}

// Inspect implements core.Admin.
func (b *Backend) Inspect(ctx context.Context, key string) (info core.Info, ok bool, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		if e := b.s.live(key); e != nil {
			info, ok = b.s.info(key, e), true
		}
		return nil
	})
	return info, ok, err
}

// List implements core.Admin.
func (b *Backend) List(ctx context.Context, prefix string) (list []core.Info, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		for k := range b.s.locks {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			if e := b.s.live(k); e != nil {
				list = append(list, b.s.info(k, e))
			}
		}
		return nil
	})
	sort.Slice(list, func(i, j int) bool { return list[i].Key < list[j].Key })
	return list, err
}

// ForceRelease implements core.Admin.
func (b *Backend) ForceRelease(ctx context.Context, key string) (released bool, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		if b.s.live(key) != nil {
			delete(b.s.locks, key)
			b.s.publish(key)
			released = true
		}
		return nil
	})
	return released, err
}

// String describes the handle without secrets (there are none).
func (b *Backend) String() string { return fmt.Sprintf("memlock.Backend(%p)", b.s) }
