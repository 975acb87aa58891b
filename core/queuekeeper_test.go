package core_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
)

// releaseHub is the notifications of a store that keeps no waiter queue, as
// pg's legacy table: every release is told to every subscriber, by key.
type releaseHub struct {
	mu   sync.Mutex
	subs map[chan string]struct{}
}

func (h *releaseHub) publish(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		ch <- key
	}
}

// subscribe tells ch of every release until the func it returns is called.
func (h *releaseHub) subscribe(ch chan string) (unsubscribe func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs[ch] = struct{}{}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, ch)
	}
}

// unqueued is a memlock handle run as a store without a waiter queue: a
// Queuer type (it has WatchTurns and Leave) whose KeepsQueue reports false.
// Its releases are told through hub. It records what the engine asks of it.
type unqueued struct {
	*memlock.Backend
	hub *releaseHub

	busies     atomic.Int64 // claims answered busy
	waiters    atomic.Int64 // claims sent with a Waiter
	leaves     atomic.Int64
	turns      atomic.Bool   // WatchTurns was called
	subscribed chan struct{} // receives once per Watch in place
	delivered  chan string   // receives each key after the engine handled its release
	hang       atomic.Bool   // the next TryAcquire waits for its ctx's end
	hung       chan struct{} // receives when a TryAcquire starts to hang
}

var _ core.QueueKeeper = (*unqueued)(nil)

func newUnqueued(st *memlock.Store, hub *releaseHub) *unqueued {
	return &unqueued{Backend: st.Backend(), hub: hub,
		subscribed: make(chan struct{}, 4), delivered: make(chan string, 16), hung: make(chan struct{}, 1)}
}

func (u *unqueued) KeepsQueue() bool { return false }

func (u *unqueued) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if req.Waiter != "" {
		u.waiters.Add(1)
	}
	if u.hang.CompareAndSwap(true, false) {
		u.hung <- struct{}{}
		<-ctx.Done()
		return core.Lease{}, core.Unclaimed(ctx.Err())
	}
	req.Waiter, req.WaiterTTL = "", 0 // the store has no queue to put it in
	l, err := u.Backend.TryAcquire(ctx, req)
	if errors.Is(err, core.ErrNotAcquired) {
		u.busies.Add(1)
	}
	return l, err
}

func (u *unqueued) Release(ctx context.Context, req core.ReleaseRequest) error {
	err := u.Backend.Release(ctx, req)
	if err == nil {
		u.hub.publish(req.Key)
	}
	return err
}

func (u *unqueued) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	ch := make(chan string, 16)
	defer u.hub.subscribe(ch)()
	ready()
	u.subscribed <- struct{}{}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case key := <-ch:
			fn(key)
			u.delivered <- key
		}
	}
}

func (u *unqueued) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	u.turns.Store(true)
	return u.Watch(ctx, ready, func(key string) { fn(key, "") })
}

func (u *unqueued) Leave(context.Context, string, string) error {
	u.leaves.Add(1)
	return nil
}

// QueuerOf: a Queuer whose KeepsQueue reports false is run as a Watcher; a
// plain Queuer, and one that keeps a queue, as a Queuer.
func TestQueuerOf(t *testing.T) {
	st := memlock.NewStore()
	if _, ok := core.QueuerOf(newUnqueued(st, &releaseHub{})); ok {
		t.Error("QueuerOf(a QueueKeeper that keeps no queue) is a Queuer")
	}
	if _, ok := core.QueuerOf(st.Backend()); !ok {
		t.Error("QueuerOf(memlock) is not a Queuer")
	}
	kept := struct {
		*memlock.Backend
		keeps
	}{st.Backend(), true}
	if _, ok := core.QueuerOf(kept); !ok {
		t.Error("QueuerOf(a QueueKeeper that keeps a queue) is not a Queuer")
	}
	if _, ok := core.QueuerOf(struct{ core.Backend }{st.Backend()}); ok {
		t.Error("QueuerOf(a Backend without WatchTurns) is a Queuer")
	}
}

type keeps bool

func (k keeps) KeepsQueue() bool { return bool(k) }

// A Queuer whose store keeps no queue is run as a Watcher: a wait sends no
// Waiter, subscribes through Watch, and a wait that gives up sends no
// Leave; a wake-up it received and did not use goes to the next waiter of
// its process, as the store hands nothing on.
func TestQueueKeeperWithoutQueueRunsAsWatcher(t *testing.T) {
	st, hub := memlock.NewStore(), &releaseHub{subs: map[chan string]struct{}{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder := newClient(t, newUnqueued(st, hub))
	u := newUnqueued(st, hub)
	obs := &testenv.Wakes{}
	c := newClient(t, u, core.WithObserver(obs))
	slow := core.Backoff(10*time.Second, 10*time.Second) // only a wake-up explains a prompt attempt

	// A wait on another key brings the subscription up, so that its first
	// re-check (after it came up) is over before the waits below start.
	other := hold(t, holder, "other")
	first := make(chan error, 1)
	go func() {
		s, err := c.Acquire(ctx, "other", slow)
		if err == nil {
			err = s.Release(ctx)
		}
		first <- err
	}()
	<-u.subscribed
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("wait on other: %v", err)
	}

	const key = "no-queue"
	held := hold(t, holder, key)
	waitBusy := func(n int64) {
		t.Helper()
		for u.busies.Load() < n {
			if ctx.Err() != nil {
				t.Fatal("wait never tried")
			}
			time.Sleep(time.Millisecond)
		}
	}
	base := u.busies.Load()
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	gaveUp := make(chan error, 1)
	go func() {
		_, err := c.Acquire(actx, key, slow)
		gaveUp <- err
	}()
	waitBusy(base + 1)
	got := make(chan error, 1)
	go func() {
		s, err := c.Acquire(ctx, key, slow)
		if err == nil {
			err = s.Release(ctx)
		}
		got <- err
	}()
	waitBusy(base + 2)

	// The first wait, woken by a release, is cut off in its attempt (a
	// slow store) while a second release's wake-up reaches it; then it
	// gives up without using that wake-up.
	u.hang.Store(true)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-u.hung
	told := func() { // the engine handled a release of key
		t.Helper()
		for {
			select {
			case k := <-u.delivered:
				if k == key {
					return
				}
			case <-ctx.Done():
				t.Fatal("release never told")
			}
		}
	}
	told()
	held = hold(t, holder, key)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	told()
	acancel()
	if err := <-gaveUp; !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("the wait that gave up: %v, want ErrNotAcquired", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the second wait: %v", err)
	}
	if wake := obs.Of(key); wake != core.WakeNotify {
		t.Errorf("the second wait acquired on a %q wake, want the release's wake-up passed on (%q)", wake, core.WakeNotify)
	}
	if n := u.waiters.Load(); n != 0 {
		t.Errorf("%d claims carried a Waiter, want none", n)
	}
	if n := u.leaves.Load(); n != 0 {
		t.Errorf("%d Leave calls, want none", n)
	}
	if u.turns.Load() {
		t.Error("the engine subscribed through WatchTurns, want Watch")
	}
}
