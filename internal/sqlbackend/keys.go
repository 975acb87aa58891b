package sqlbackend

import "sync"

// Keys is what a Backend remembers of keys between calls (keys found held
// by another owner, keys it lately released, leases it claimed by a plain
// statement): a map safe for concurrent use, bounded to MaxKeys entries.
// Its zero value is empty and ready. A value is only ever a reason to send
// one statement rather than another; every answer comes from the store.
type Keys[V comparable] struct {
	mu sync.Mutex
	m  map[string]V
}

// MaxKeys bounds a Keys: a Put into a full one first drops the entries its
// stale function reports, and all of them when that frees none.
const MaxKeys = 4096

// Get returns key's value and whether there is one.
func (k *Keys[V]) Get(key string) (V, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.m[key]
	return v, ok
}

// Put sets key's value. stale (nil: none is) tells the entries a full Keys
// may drop first.
func (k *Keys[V]) Put(key string, v V, stale func(V) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.m) >= MaxKeys {
		if stale != nil {
			for key, v := range k.m {
				if stale(v) {
					delete(k.m, key)
				}
			}
		}
		if len(k.m) >= MaxKeys {
			clear(k.m)
		}
	}
	if k.m == nil {
		k.m = make(map[string]V)
	}
	k.m[key] = v
}

// Delete forgets key.
func (k *Keys[V]) Delete(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, key)
}

// CompareAndDelete forgets key when its value is v, and reports whether it
// did.
func (k *Keys[V]) CompareAndDelete(key string, v V) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w, ok := k.m[key]; ok && w == v {
		delete(k.m, key)
		return true
	}
	return false
}

// Released is the keys whose lease a Backend lately ended. Their rows are
// still there (a release keeps the row, and its token) and, unless someone
// claimed them since, free: a claim of one by a caller that does not wait
// is first the backend's one plain UPDATE of that row, and other keys go
// to the full claim at once, so that a new key (no row to update) costs one
// round trip, not two. A backend forgets a key when a claim finds it taken
// since (pg: whenever the UPDATE took nothing; mysqllock: on a busy
// answer), until it releases the key again.
type Released struct{ k Keys[struct{}] }

// Note remembers that key's lease was released here.
func (r *Released) Note(key string) { r.k.Put(key, struct{}{}, nil) }

// Has reports whether key's lease was lately released here.
func (r *Released) Has(key string) bool {
	_, ok := r.k.Get(key)
	return ok
}

// Forget forgets key.
func (r *Released) Forget(key string) { r.k.Delete(key) }
