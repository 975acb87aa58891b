package zklock

import (
	"context"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

// Wake-ups. A busy TryAcquire leaves a one-shot watch on the claim that
// holds the lock (the waiter's only predecessor that matters, since its own
// claim is gone again), never on the key's children, whose every change would
// wake every waiter. A renewal changes the holder's data, which fires the
// watch: the backend sets it again without waking anyone. The deletion of
// the holder's claim (release, force release, expiry of its session, or an
// acquirer removing it after its TTL) wakes the engine's waiters on the key.
// One watch per node per backend, however many waiters.
//
// While this backend itself holds a key, a TryAcquire of it answers busy at
// once, without a request; so does a second acquisition of a key while one
// is in flight from this backend. A busy answer is always safe.

// watched is a claim node the backend follows.
type watched struct {
	key string
}

// armWatch follows ch, the watch set by a read of the holder's claim at p,
// unless the backend already follows p.
func (b *Backend) armWatch(p, key string, ch <-chan zk.Event) {
	if ch == nil {
		return
	}
	b.mu.Lock()
	if _, ok := b.watches[p]; ok || len(b.subs) == 0 {
		// Followed already, or nobody to tell: a Locker listens to
		// turns (WatchTurns), not to these.
		b.mu.Unlock()
		return
	}
	w := &watched{key: key}
	b.watches[p] = w
	b.mu.Unlock()
	b.spawn(func() { b.follow(p, w, ch) })
}

// held is a lock this backend holds: another TryAcquire of its key is busy.
type held struct {
	ownerToken string
	info       core.Info
	until      time.Time // local: the lease's TTL runs out, as of its last renewal
}

// markHeld records a lock this backend just acquired, sent at the local
// time sent.
func (b *Backend) markHeld(key, ownerToken string, info core.Info, ttl time.Duration, sent time.Time) {
	b.mu.Lock()
	b.held[key] = &held{ownerToken: ownerToken, info: info, until: sent.Add(ttl)}
	b.mu.Unlock()
}

// unmarkHeld forgets a lock of this backend (ownerToken "" : whoever's).
// The caller holds b.mu.
func (b *Backend) unmarkHeldLocked(key, ownerToken string) {
	if h := b.held[key]; h != nil && (ownerToken == "" || h.ownerToken == ownerToken) {
		delete(b.held, key)
	}
}

func (b *Backend) unmarkHeld(key, ownerToken string) {
	b.mu.Lock()
	b.unmarkHeldLocked(key, ownerToken)
	b.mu.Unlock()
}

// knownBusy returns the holder of key while this backend holds it. (What
// a watch says of another process's claim is not used this way: its
// deletion event may still be on its way after that process's release
// returned, and an acquirer must see that release.)
func (b *Backend) knownBusy(key string) (*core.Info, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.held[key]; h != nil {
		if left := time.Until(h.until); left > 0 {
			info := h.info
			info.Remaining = left
			return &info, true
		}
	}
	return nil, false
}

func (b *Backend) follow(p string, w *watched, ch <-chan zk.Event) {
	defer func() {
		b.mu.Lock()
		delete(b.watches, p)
		b.mu.Unlock()
	}()
	for {
		select {
		case <-b.done:
			return
		case ev, ok := <-ch:
			if ok && ev.Type == zk.EventNodeDataChanged {
				// A renewal: watch again.
				var exists bool
				var next <-chan zk.Event
				var err error
				cerr := b.call(context.Background(), func() { exists, _, next, err = b.conn.ExistsW(p) }, nil)
				if cerr == nil && err == nil && exists {
					ch = next
					continue
				}
			}
			b.mu.Lock()
			delete(b.watches, p)
			b.mu.Unlock()
			b.notify(w.key)
			return
		}
	}
}

// echoDelay puts the notification of a release this backend made after the
// engine's own bookkeeping of it, which follows the Release call: the engine
// expects such an echo to come back from the store, as notifications from a
// server do.
const echoDelay = 2 * time.Millisecond

// echo tells subscribers of a release this backend made, unless a watch of
// its own on the node will, or nobody subscribes (a Locker follows turns).
func (b *Backend) echo(key, p string) {
	b.mu.Lock()
	_, watched := b.watches[p]
	none := len(b.subs) == 0
	b.mu.Unlock()
	if watched || none {
		return
	}
	b.spawn(func() {
		t := time.NewTimer(echoDelay)
		defer t.Stop()
		select {
		case <-t.C:
			b.notify(key)
		case <-b.done:
		}
	})
}

func (b *Backend) notify(key string) {
	b.mu.Lock()
	fns := make([]func(string), 0, len(b.subs))
	for _, fn := range b.subs {
		fns = append(fns, fn)
	}
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key)
	}
}

// Watch implements core.Watcher. ZooKeeper has no prefix watch: the
// notifications come from the watches that busy acquisitions left on the
// holders' claims (see above), plus this backend's own releases. ready is
// called at once.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	return b.subscribed(ctx, ready, func(id int) { b.subs[id] = fn }, func(id int) { delete(b.subs, id) })
}

// subscribed registers a subscriber (add, under b.mu), calls ready, and
// waits for ctx or Close; then remove (under b.mu) unregisters it.
func (b *Backend) subscribed(ctx context.Context, ready func(), add, remove func(id int)) error {
	b.mu.Lock()
	id := b.nextSub
	b.nextSub++
	add(id)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		remove(id)
		b.mu.Unlock()
	}()
	ready()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return errClosed
	}
}
