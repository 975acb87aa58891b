package zklock

import (
	"context"

	"github.com/go-zookeeper/zk"
)

// Wake-ups. A busy TryAcquire leaves a one-shot watch on the claim that
// holds the lock (the waiter's only predecessor that matters, since its own
// claim is gone again), never on the key's children, whose every change would
// wake every waiter. A renewal changes the holder's data, which fires the
// watch: the backend sets it again without waking anyone. The deletion of
// the holder's claim (release, force release, expiry of its session, or an
// acquirer removing it after its TTL) wakes the engine's waiters on the key.
// One watch per node per backend, however many waiters.

// armWatch follows ch, the watch set on the node at p by a read, unless the
// backend already follows p.
func (b *Backend) armWatch(p, key string, ch <-chan zk.Event) {
	if ch == nil {
		return
	}
	b.mu.Lock()
	if _, ok := b.watches[p]; ok {
		b.mu.Unlock()
		return
	}
	b.watches[p] = key
	b.mu.Unlock()
	b.spawn(func() { b.follow(p, key, ch) })
}

func (b *Backend) follow(p, key string, ch <-chan zk.Event) {
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
			b.notify(key)
			return
		}
	}
}

// echo tells subscribers of a release this backend made, unless a watch of
// its own on the node will.
func (b *Backend) echo(key, p string) {
	b.mu.Lock()
	_, watched := b.watches[p]
	b.mu.Unlock()
	if !watched {
		b.notify(key)
	}
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
	b.mu.Lock()
	id := b.nextSub
	b.nextSub++
	b.subs[id] = fn
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.subs, id)
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
