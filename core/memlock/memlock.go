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
// Each call of New makes a new, private store: two Lockers from two New
// calls never see each other's locks, so both take the same key at once.
// For Lockers that contend with each other (the processes of a test), make
// one Store with NewStore and call its Locker method once per process.
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
	locks  map[string]*record
	tokens map[string]uint64
	queues map[string][]*queued // waiters per key, in arrival order
	subs   map[chan turn]struct{}
	offset time.Duration
}

// record is a held key: one holder for a mutex (limit 1), up to limit
// permits for a semaphore; oldest first.
type record struct {
	limit int
	held  []*entry
}

type entry struct {
	owner, ownerToken    string
	token                uint64
	acquiredAt, expireAt time.Time
}

// queued is a waiter's place in a key's queue.
type queued struct {
	id       string
	deadline time.Time
}

// turn is a release notification: the key, and the waiter whose turn it is.
type turn struct{ key, waiter string }

// defaultWaiterTTL keeps a waiter's place when a request gives no WaiterTTL.
const defaultWaiterTTL = 2 * time.Second

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		locks:  make(map[string]*record),
		tokens: make(map[string]uint64),
		queues: make(map[string][]*queued),
		subs:   make(map[chan turn]struct{}),
	}
}

// New returns a Locker on a fresh private store: the quickest way to get a
// core.Locker in a unit test or a single-process program. Every call makes
// a separate store, so Lockers from two New calls do not exclude each
// other; share a Store (NewStore, then Store.Locker) for that.
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
// else acquired it: the holder's next renewal is refused (for a semaphore:
// every permit's). It reports whether the key was held.
func (s *Store) Steal(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key)
	if r == nil {
		return false
	}
	for i, e := range r.held {
		s.tokens[key]++
		e.owner, e.ownerToken, e.token = "thief", fmt.Sprintf("stolen-%d", i), s.tokens[key]
	}
	return true
}

// Delete removes key whoever holds it, without notifying anyone, as if it
// were deleted behind the holder's back.
func (s *Store) Delete(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key)
	delete(s.locks, key)
	return r != nil
}

// Held reports whether key is held now (for a semaphore: by any permit).
func (s *Store) Held(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live(key) != nil
}

// Waiting returns the live waiters queued on key, first in line first.
func (s *Store) Waiting(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, q := range s.liveQueue(key) {
		ids = append(ids, q.id)
	}
	return ids
}

// live returns key's record without its expired holders; nil when free.
func (s *Store) live(key string) *record {
	r := s.locks[key]
	if r == nil {
		return nil
	}
	now := s.now()
	kept := r.held[:0]
	for _, e := range r.held {
		if now.Before(e.expireAt) {
			kept = append(kept, e)
		}
	}
	clear(r.held[len(kept):])
	r.held = kept
	if len(kept) == 0 {
		delete(s.locks, key)
		return nil
	}
	return r
}

// liveQueue returns key's queue without the waiters whose place expired.
func (s *Store) liveQueue(key string) []*queued {
	q := s.queues[key]
	now := s.now()
	kept := q[:0]
	for _, w := range q {
		if now.Before(w.deadline) {
			kept = append(kept, w)
		}
	}
	clear(q[len(kept):])
	if len(kept) == 0 {
		delete(s.queues, key)
		return nil
	}
	s.queues[key] = kept
	return kept
}

// enqueue puts waiter at the tail of key's queue, or refreshes its place.
func (s *Store) enqueue(key, waiter string, ttl time.Duration) {
	if ttl <= 0 {
		ttl = defaultWaiterTTL
	}
	deadline := s.now().Add(ttl)
	for _, w := range s.liveQueue(key) {
		if w.id == waiter {
			w.deadline = deadline
			return
		}
	}
	s.queues[key] = append(s.queues[key], &queued{id: waiter, deadline: deadline})
}

// dequeue takes waiter out of key's queue; it reports whether waiter was
// first in line.
func (s *Store) dequeue(key, waiter string) (first bool) {
	q := s.liveQueue(key)
	for i, w := range q {
		if w.id == waiter {
			q = append(q[:i:i], q[i+1:]...)
			if len(q) == 0 {
				delete(s.queues, key)
			} else {
				s.queues[key] = q
			}
			return i == 0
		}
	}
	return false
}

// claimable reports whether key has room for one more holder of limit.
func (s *Store) claimable(key string) bool {
	r := s.live(key)
	return r == nil || len(r.held) < r.limit
}

// signal tells the first live waiter of key, if any, that it is its turn.
func (s *Store) signal(key string) {
	if q := s.liveQueue(key); len(q) > 0 {
		s.publish(turn{key, q[0].id})
	}
}

func (s *Store) info(key string, r *record, e *entry) core.Info {
	i := core.Info{Key: key, Owner: e.owner, Token: e.token, AcquiredAt: e.acquiredAt,
		ExpiresAt: e.expireAt, Remaining: e.expireAt.Sub(s.now())}
	if r.limit > 1 {
		i.Limit = r.limit
	}
	return i
}

// firstToExpire is the holder of r whose lease ends first.
func firstToExpire(r *record) *entry {
	first := r.held[0]
	for _, e := range r.held[1:] {
		if e.expireAt.Before(first.expireAt) {
			first = e
		}
	}
	return first
}

func (s *Store) publish(t turn) {
	for ch := range s.subs {
		select {
		case ch <- t:
		default: // a slow subscriber falls back to polling
		}
	}
}

// Backend is one process's handle on a Store. It implements core.Backend,
// core.Watcher, core.Queuer (waiters wait in line, first come first served),
// core.SemaphoreBackend and core.Admin.
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
	_ core.Queuer  = (*Backend)(nil)

	_ core.SemaphoreBackend = (*Backend)(nil)
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

// TryAcquire implements core.Backend, core.Queuer and core.SemaphoreBackend.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (lease core.Lease, err error) {
	err = b.call(ctx, func(st *Stats) { st.Acquires++ }, func() error {
		s := b.s
		limit := max(req.Limit, 1)
		r := s.live(req.Key)
		if r != nil {
			for _, e := range r.held {
				if e.ownerToken == req.OwnerToken {
					// A retry of a claim that already succeeded.
					lease = core.Lease{Token: e.token, AcquiredAt: e.acquiredAt, ExpiresAt: e.expireAt}
					return nil
				}
			}
			if r.limit != limit {
				return core.LimitMismatch(req.Key, r.limit, limit)
			}
		}
		now := s.now()
		exp := now.Add(req.TTL)
		if !req.ExpireAt.IsZero() {
			if !req.ExpireAt.After(now) {
				return core.Busy(req.Key, nil) // the slot is over
			}
			exp = req.ExpireAt
		}
		full := r != nil && len(r.held) >= limit
		// Waiters ahead of this caller: a claim may take a free permit only
		// when fewer callers are ahead of it than there are free permits.
		ahead := 0
		for _, w := range s.liveQueue(req.Key) {
			if w.id == req.Waiter && req.Waiter != "" {
				break
			}
			ahead++
		}
		free := limit
		if r != nil {
			free -= len(r.held)
		}
		if full || ahead >= free {
			if req.Waiter != "" {
				s.enqueue(req.Key, req.Waiter, req.WaiterTTL)
			}
			if full {
				info := s.info(req.Key, r, firstToExpire(r))
				return core.Busy(req.Key, &info)
			}
			return core.Busy(req.Key, nil) // free, but someone waits before this caller
		}
		if req.Waiter != "" {
			s.dequeue(req.Key, req.Waiter)
		}
		if r == nil {
			r = &record{limit: limit}
			s.locks[req.Key] = r
		}
		s.tokens[req.Key]++
		e := &entry{owner: req.Owner, ownerToken: req.OwnerToken, token: s.tokens[req.Key], acquiredAt: now, expireAt: exp}
		r.held = append(r.held, e)
		if len(r.held) < r.limit {
			s.signal(req.Key) // a permit is still free
		}
		lease = core.Lease{Token: e.token, AcquiredAt: now, ExpiresAt: exp}
		return nil
	})
	return lease, err
}

// holder returns the live holder of key with ownerToken.
func (s *Store) holder(key, ownerToken string) (*record, int) {
	r := s.live(key)
	if r == nil {
		return nil, -1
	}
	for i, e := range r.held {
		if e.ownerToken == ownerToken {
			return r, i
		}
	}
	return r, -1
}

// Renew implements core.Backend.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) (results []error, err error) {
	err = b.call(ctx, func(st *Stats) { st.Renews++; st.RenewedLeases += len(reqs) }, func() error {
		s := b.s
		results = make([]error, len(reqs))
		for i, q := range reqs {
			r, j := s.holder(q.Key, q.OwnerToken)
			if j < 0 {
				results[i] = core.Gone(q.Key, "held by another owner or gone")
				continue
			}
			r.held[j].expireAt = s.now().Add(q.TTL)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// Release implements core.Backend. It tells the first waiter in line, if
// any, that its turn has come. A lease that is no longer live (expired,
// force-released, taken over) is reported Gone.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	return b.call(ctx, func(st *Stats) { st.Releases++ }, func() error {
		s := b.s
		r, j := s.holder(req.Key, req.OwnerToken)
		if j < 0 {
			return core.Gone(req.Key, "held by another owner or gone")
		}
		if req.Keep > 0 {
			r.held[j].expireAt = s.now().Add(req.Keep)
			return nil
		}
		r.held = append(r.held[:j:j], r.held[j+1:]...)
		if len(r.held) == 0 {
			delete(s.locks, req.Key)
		}
		s.signal(req.Key)
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
	return b.WatchTurns(ctx, ready, func(key, _ string) { fn(key) })
}

// WatchTurns implements core.Queuer.
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	b.mu.Lock()
	down := b.down
	b.mu.Unlock()
	if down {
		return ErrUnavailable
	}
	ch := make(chan turn, 256)
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
		case t := <-ch:
			fn(t.key, t.waiter)
		}
	}
}

// Leave implements core.Queuer.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	return b.call(ctx, func(*Stats) {}, func() error {
		if b.s.dequeue(key, waiter) && b.s.claimable(key) {
			b.s.signal(key)
		}
		return nil
	})
}

// Inspect implements core.Admin: the oldest holder.
func (b *Backend) Inspect(ctx context.Context, key string) (info core.Info, ok bool, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		if r := b.s.live(key); r != nil {
			info, ok = b.s.info(key, r, r.held[0]), true
		}
		return nil
	})
	return info, ok, err
}

// Holders implements core.SemaphoreBackend.
func (b *Backend) Holders(ctx context.Context, key string) (list []core.Info, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		if r := b.s.live(key); r != nil {
			for _, e := range r.held {
				list = append(list, b.s.info(key, r, e))
			}
		}
		return nil
	})
	return list, err
}

// List implements core.Admin: one Info per holder (every permit of a
// semaphore), by key, oldest first.
func (b *Backend) List(ctx context.Context, prefix string) (list []core.Info, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		for k := range b.s.locks {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			if r := b.s.live(k); r != nil {
				for _, e := range r.held {
					list = append(list, b.s.info(k, r, e))
				}
			}
		}
		return nil
	})
	sort.SliceStable(list, func(i, j int) bool {
		if list[i].Key != list[j].Key {
			return list[i].Key < list[j].Key
		}
		return list[i].AcquiredAt.Before(list[j].AcquiredAt)
	})
	return list, err
}

// ForceRelease implements core.Admin: every holder of key is dropped.
func (b *Backend) ForceRelease(ctx context.Context, key string) (released bool, err error) {
	err = b.call(ctx, func(*Stats) {}, func() error {
		if b.s.live(key) != nil {
			delete(b.s.locks, key)
			b.s.signal(key)
			released = true
		}
		return nil
	})
	return released, err
}

// String describes the handle without secrets (there are none).
func (b *Backend) String() string { return fmt.Sprintf("memlock.Backend(%p)", b.s) }
