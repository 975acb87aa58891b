package etcdlock

import "github.com/dislock/dislock/etcdlock/internal/state"

// The state the nested module's tests read (internal/state).
func init() {
	state.Lane = func(backend any) (busy, queued, pending int) {
		if l := backend.(*Backend).txns.lane; l != nil {
			return l.State()
		}
		return 0, 0, 0
	}
	state.FirstWaiter = func(backend any, key string) (string, bool) {
		b := backend.(*Backend)
		b.mu.Lock()
		defer b.mu.Unlock()
		w, ok := b.firsts[key]
		if _, grant := w.grantRecord(); !ok || !grant {
			return "", false
		}
		_, waiter, _ := b.queueKey(w.ekey)
		return waiter, true
	}
	state.DropPlace = func(backend any, key, waiter string) { backend.(*Backend).dropWait(key, waiter) }
}
