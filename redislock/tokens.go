package redislock

import "sync"

// maxKnownTokens bounds the leases whose fencing token a Backend remembers.
const maxKnownTokens = 1 << 16

// knownTokens remembers the fencing token of each lease this Backend
// granted until it is released, so that the release can write the
// tombstone (which keeps the token) without reading the record first: one
// server command instead of two. It is only a shortcut: the release script
// checks the record it replaced and puts it back when it was not this
// lease's, and a release without a known token reads the record first.
// Leases never released (their session was lost and dropped) stay until
// their renewal fails; past maxKnownTokens new ones are not remembered.
type knownTokens struct {
	mu sync.Mutex
	m  map[leaseID]uint64
}

type leaseID struct{ key, ownerToken string }

func (k *knownTokens) put(key, ownerToken string, token uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[leaseID]uint64)
	}
	if len(k.m) < maxKnownTokens {
		k.m[leaseID{key, ownerToken}] = token
	}
}

// take returns and forgets the token of a lease.
func (k *knownTokens) take(key, ownerToken string) (uint64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id := leaseID{key, ownerToken}
	t, ok := k.m[id]
	if ok {
		delete(k.m, id)
	}
	return t, ok
}

func (k *knownTokens) drop(key, ownerToken string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, leaseID{key, ownerToken})
}
