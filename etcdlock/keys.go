package etcdlock

import (
	"encoding/json"
	"strings"
	"time"
)

// record is the value of a lock key.
type record struct {
	Owner      string `json:"owner"`
	OwnerToken string `json:"otoken"`
	Acquired   int64  `json:"acquired_ms"`        // acquirer's clock, Unix ms
	SlotEnd    int64  `json:"slot_end,omitempty"` // slot locks: the slot's end, Unix ms
	Limit      int    `json:"limit,omitempty"`    // permits: the semaphore's limit
	// Lease, on a waiter key, is the lease a release that grants the key
	// to this waiter binds it to (see grant.go).
	Lease int64 `json:"lease,omitempty"`
	// Grant, on a lock key that a release granted to a waiter, and on a
	// waiter key, names the waiter's Backend; Waiter, on such a lock key,
	// names the waiter.
	Grant  string `json:"grant,omitempty"`
	Waiter string `json:"waiter,omitempty"`
}

func decode(v []byte) (record, bool) {
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return record{}, false
	}
	return r, true
}

// slotOver reports whether r is a slot lock whose slot has ended at now.
func (r record) slotOver(now time.Time) bool {
	return r.SlotEnd != 0 && r.SlotEnd <= now.UnixMilli()
}

func (b *Backend) etcdKey(key string) string { return b.prefix + key }

// permitKey is the etcd key of the permit of key held with ownerToken:
// <prefix><key> NUL <ownerToken>. Lock keys cannot contain NUL, so no lock
// key is a permit key, and the permits of key are exactly the etcd keys in
// permitRange(key).
func (b *Backend) permitKey(key, ownerToken string) string {
	return b.prefix + key + "\x00" + ownerToken
}

// permitRange is the etcd key range [lo, hi) of the permits of key.
func (b *Backend) permitRange(key string) (lo, hi string) {
	return b.prefix + key + "\x00", b.prefix + key + "\x01"
}

// recordKey is the etcd key a claim with limit writes.
func (b *Backend) recordKey(key, ownerToken string, limit int) string {
	if limit > 1 {
		return b.permitKey(key, ownerToken)
	}
	return b.etcdKey(key)
}

// lockKey returns the lock key of an etcd key under the prefix: for a
// permit key, the key of its semaphore.
func (b *Backend) lockKey(ekey string) (string, bool) {
	key, ok := strings.CutPrefix(ekey, b.prefix)
	if !ok || strings.HasPrefix(key, "\x00") { // a waiter key
		return "", false
	}
	if i := strings.IndexByte(key, 0); i >= 0 {
		key = key[:i]
	}
	return key, true
}
