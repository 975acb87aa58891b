package etcdlock

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A release grants the key to the first waiter in line, in its own
// transaction: the hand-off is one Raft write, the release, and the waiter
// is told by its watch, with no request of its own.
//
// A waiter of a plain lock (no slot, no semaphore) writes in its waiter
// key the record its lock key would get, with the shared lease of its TTL
// it would bind it to (record.Lease) and its Backend's id (record.Grant).
// Every Backend's watch follows the waiter keys under the prefix, and so
// knows the first waiter of each key (setFirst). The release of a lock
// whose key has one is then: if the key is still this session's, and if
// that waiter key is still there at its create revision with none before
// it, put the lock key as the waiter's, bound to its lease, and delete its
// waiter key; else delete the lock key. etcd refuses a transaction that
// deletes a key and puts it again, so the grant overwrites the lock key:
// its mod revision, the grant's, is the new holder's fencing token (a key
// created by a claim has equal create and mod revisions).
//
// The waiter's Backend sees the put on its watch. When the record names it
// (record.Grant, on one of its shared leases) and the waiter it names
// (record.Waiter) still waits there, it keeps the key for the waiter's
// next attempt, which takes it without a request (takeGrant), and tells
// the waiter its turn. The store keeps the key until the lease expires:
// the lease's last refresh plus its TTL, which the attempt gives the
// engine as the session's expiry. A grant for a waiter that no longer
// waits is deleted, owner-checked, as is one whose lease the Backend no
// longer tracks when the waiter takes it. A grant the watch did not report
// (it was not running then: a lost leader ends it) is taken by the
// waiter's next attempt, which finds the key granted to it; its event, if
// it comes after, leaves the lock its Backend holds. (The record keeps the owner
// token of the attempt that queued the waiter: each attempt has its own,
// so grants are matched by waiter.)
//
// A release whose waiter's lease is gone from the store (LeaseNotFound:
// the whole transaction was refused) releases again without the grant.

// waiterState is the first waiter of a key, as a Backend's watch saw it:
// its waiter key, create revision and value, which is decoded only by a
// release that grants (every Backend's watch follows every line, and all
// but the holder's would decode it for nothing).
type waiterState struct {
	ekey  string
	rev   int64
	value []byte
}

// newBackendID returns a random id for a Backend's grants.
func newBackendID() string { return rand.Text()[:16] }

// waitValue is the value of a plain lock's waiter key: the record the
// lock key gets when a release grants it, with the lease to bind it to.
func (c *claim) waitValue() []byte {
	if c.slot || c.req.Limit > 1 || c.h.lease == 0 {
		return nil
	}
	v, err := json.Marshal(record{Owner: c.req.Owner, OwnerToken: c.req.OwnerToken, Lease: c.h.lease, Grant: c.b.id})
	if err != nil {
		return nil
	}
	return v
}

// setFirst records the first waiter of key among line (waiter keys by
// create revision, with their values), or none.
func (b *Backend) setFirst(key string, line map[string]int64, values map[string][]byte) {
	first, rev := firstIn(line)
	b.mu.Lock()
	defer b.mu.Unlock()
	if first == "" || len(values[first]) == 0 {
		delete(b.firsts, key)
		return
	}
	b.firsts[key] = waiterState{ekey: first, rev: rev, value: values[first]}
}

// grantRecord is the record a release grants w's key with, when w's value
// has one (a plain lock's waiter: see waitValue).
func (w waiterState) grantRecord() (record, bool) {
	rec, ok := decode(w.value)
	return rec, ok && rec.Lease != 0 && rec.Grant != ""
}

// grantOps returns the operations of a release of lock key kb that grant
// it to key's first waiter, if one is known; otherwise nil.
func (b *Backend) grantOps(key string, kb []byte) []*etcdserverpb.RequestOp {
	b.mu.Lock()
	w, ok := b.firsts[key]
	b.mu.Unlock()
	if !ok {
		return nil
	}
	_, waiter, ok := b.queueKey(w.ekey)
	if !ok {
		return nil
	}
	rec, ok := w.grantRecord()
	if !ok {
		return nil
	}
	v, err := json.Marshal(record{Owner: rec.Owner, OwnerToken: rec.OwnerToken, Acquired: time.Now().UnixMilli(), Grant: rec.Grant, Waiter: waiter})
	if err != nil {
		return nil
	}
	qlo, qhi := b.queueRange(key)
	wk := []byte(w.ekey)
	return []*etcdserverpb.RequestOp{opTxn(
		[]*etcdserverpb.Compare{compare(etcdserverpb.Compare_CREATE, wk, nil, etcdserverpb.Compare_EQUAL, w.rev),
			compare(etcdserverpb.Compare_CREATE, []byte(qlo), []byte(qhi), etcdserverpb.Compare_GREATER, w.rev-1)},
		[]*etcdserverpb.RequestOp{opPut(kb, v, rec.Lease), opDelete(wk)},
		[]*etcdserverpb.RequestOp{opDelete(kb)})}
}

// granted handles a put over a lock key whose record names this Backend:
// a grant, when it binds the key to one of this Backend's shared leases (a
// min hold's move keeps the record, on a lease of its own). It reports the
// waiter to tell when that waiter (rec.Waiter) still waits on key here;
// otherwise it deletes the key, owner-checked, in the background. (The
// record keeps the owner token of the attempt that queued the waiter; the
// attempt that takes the grant holds it under its own, by lease and
// revision, as every session is checked.)
func (b *Backend) granted(key string, kv *mvccpb.KeyValue, rec record) (waiter string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leaseByID[kv.Lease] == nil {
		return ""
	}
	if b.waits[key][rec.Waiter] == nil {
		if !b.holdsLocked(key, kv.ModRevision) {
			// (A grant that an attempt found and took before its event
			// came is this Backend's lock: it stays.)
			b.dropGrant(kv)
		}
		return ""
	}
	b.grants[b.waiterKey(key, rec.Waiter)] = kv
	return rec.Waiter
}

// holdsLocked reports whether one of this Backend's sessions holds key at
// revision rev.
func (b *Backend) holdsLocked(key string, rev int64) bool {
	for _, h := range b.held {
		if h.key == key && h.rev == rev {
			return true
		}
	}
	return false
}

// takeGrant returns the grant kept for waiter on key, if any.
func (b *Backend) takeGrant(key, waiter string) *mvccpb.KeyValue {
	b.mu.Lock()
	defer b.mu.Unlock()
	wk := b.waiterKey(key, waiter)
	kv := b.grants[wk]
	delete(b.grants, wk)
	return kv
}

// dropGrant deletes the lock key of a grant that no waiter takes, if it
// is still that grant, in the background.
func (b *Backend) dropGrant(kv *mvccpb.KeyValue) {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed {
		return
	}
	b.bg.Go(func() {
		ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(b.stopCtx), 5*time.Second)
		defer cancel()
		k := string(kv.Key)
		_, _ = b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision), clientv3.Compare(clientv3.LeaseValue(k), "=", kv.Lease)).
			Then(clientv3.OpDelete(k)).Commit()
	})
}

// takeGranted makes the grant kv the lease of claim c, when its lease is
// one this Backend tracks: the session counts from the lease's last
// refresh. It reports false, having deleted the grant, otherwise.
func (c *claim) takeGranted(kv *mvccpb.KeyValue, now time.Time) (ok bool) {
	b := c.b
	h := held{key: c.req.Key, ekey: b.etcdKey(c.req.Key), seconds: c.seconds, lease: kv.Lease}
	b.mu.Lock()
	sh := b.leaseByID[kv.Lease]
	if sh != nil {
		h.refreshed = sh.refreshed
		b.rememberLocked(c.req.OwnerToken, h) // a user of the lease from now on
	}
	b.mu.Unlock()
	if sh == nil {
		b.dropGrant(kv)
		return false
	}
	c.h, c.reused = h, true
	c.expires = h.refreshed.Add(time.Duration(sh.seconds) * time.Second)
	return true
}
