package etcdlock

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// shared is a lease that the keys of this backend's sessions of one TTL
// are bound to: one lease per TTL, kept alive by one keepalive per renewal
// however many sessions it carries. Its loss (expiry, revoke) is the loss
// of every session on it; a key deleted on its own (a release, a
// ForceRelease) ends only its session, which the renewal's owner check
// finds.
type shared struct {
	id        int64
	seconds   int64
	refreshed time.Time // send time of the last successful grant or keepalive
	users     int       // held entries bound to it, claims in flight included
	current   bool      // new claims of its TTL take it
}

// grantCall is a grant of a shared lease in flight. The claims of its TTL
// that find no current lease meanwhile wait for it rather than grant a
// lease each, so that concurrent first claims of a Backend share one
// lease.
type grantCall struct {
	done  chan struct{} // closed when the grant has an answer
	err   error         // the grant's failure, set before done is closed
	retry bool          // it failed because its own claim's context ended
}

// shareOrGrant returns the current lease of the given TTL, if one was
// refreshed less than its TTL ago (an older one has expired: it is
// retired), and records h on it under ownerToken. Without one it returns
// the grant in flight for that TTL, or, with lead, a new one that the
// caller must make and end with endGrant.
func (b *Backend) shareOrGrant(seconds int64, ownerToken string, h held) (sh shared, call *grantCall, lead bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur := b.current[seconds]; cur != nil {
		if time.Since(cur.refreshed) < time.Duration(seconds)*time.Second {
			h.lease, h.refreshed = cur.id, cur.refreshed
			b.rememberLocked(ownerToken, h) // before the claim is sent: an undo finds it
			return *cur, nil, false
		}
		b.retireLocked(cur)
	}
	if call := b.granting[seconds]; call != nil {
		return shared{}, call, false
	}
	call = &grantCall{done: make(chan struct{})}
	b.granting[seconds] = call
	return shared{}, call, true
}

// endGrant answers the claims waiting for call, the grant of a shared
// lease of the given TTL: err is its failure, and retry says that it
// failed only because the granting claim's context ended, so that they
// try again.
func (b *Backend) endGrant(seconds int64, call *grantCall, err error, retry bool) {
	b.mu.Lock()
	if b.granting[seconds] == call {
		delete(b.granting, seconds)
	}
	b.mu.Unlock()
	call.err, call.retry = err, retry
	close(call.done)
}

// makeCurrent registers lease id, just granted (at sent) for a claim, as
// the current lease of its TTL.
func (b *Backend) makeCurrent(id, seconds int64, sent time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sh := b.leaseByID[id]
	if sh == nil {
		sh = &shared{id: id, seconds: seconds}
		b.leaseByID[id] = sh
	}
	if sent.After(sh.refreshed) {
		sh.refreshed = sent
	}
	if old := b.current[seconds]; old != nil && old != sh {
		b.retireLocked(old)
	}
	sh.current = true
	b.current[seconds] = sh
}

// retire stops new claims from taking lease id: it expired, or a claim on
// it has an unknown outcome. The lease is revoked once no session of this
// backend is bound to it; retire returns true when that is now.
func (b *Backend) retire(id int64) (revoke bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sh := b.leaseByID[id]
	if sh == nil {
		return false
	}
	b.retireLocked(sh)
	return b.leaseByID[id] == nil
}

func (b *Backend) retireLocked(sh *shared) {
	if sh.current {
		sh.current = false
		if b.current[sh.seconds] == sh {
			delete(b.current, sh.seconds)
		}
	}
	if sh.users <= 0 {
		delete(b.leaseByID, sh.id)
	}
}

// tracked reports whether lease id is a shared lease still in use.
func (b *Backend) tracked(id int64) (shared, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sh := b.leaseByID[id]
	if sh == nil {
		return shared{}, false
	}
	return *sh, true
}

// leaseRefreshed notes that a keepalive of lease id, sent at t, succeeded.
func (b *Backend) leaseRefreshed(id int64, t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sh := b.leaseByID[id]; sh != nil && t.After(sh.refreshed) {
		sh.refreshed = t
	}
}

// leaseSeconds rounds d up to whole seconds, at least 1, and rejects what
// etcd would refuse.
func leaseSeconds(option string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 1, nil
	}
	if d > MaxLeaseTTL {
		return 0, invalidOption(option, "%v exceeds etcd's longest lease (%d s)", d, int64(MaxLeaseTTL/time.Second))
	}
	s := int64(math.Ceil(d.Seconds()))
	return s, nil
}

// newLeaseID returns a random positive lease ID. The backend chooses lease
// IDs itself so that it knows a lease's ID before the grant is answered:
// a grant whose reply is lost is undone like any other claim.
func newLeaseID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := int64(binary.BigEndian.Uint64(b[:]) >> 1)
	if id == 0 {
		id = 1
	}
	return id
}

// remember records h under ownerToken, counting it as a user of its
// lease.
func (b *Backend) remember(ownerToken string, h held) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rememberLocked(ownerToken, h)
}

// rememberLocked is remember with b.mu held. The new record counts as a
// user of its lease before the one it replaces stops counting: when both
// are on one retired lease (a claim that succeeds records itself again),
// the lease stays tracked, and is revoked with its last session. A lease
// that the replaced record leaves unused and retired stays tracked with
// no user: Close revokes it.
func (b *Backend) rememberLocked(ownerToken string, h held) {
	if h.seen.IsZero() {
		h.seen = time.Now()
	}
	if sh := b.leaseByID[h.lease]; sh != nil {
		sh.users++
	}
	if old, ok := b.held[ownerToken]; ok {
		if sh := b.leaseByID[old.lease]; sh != nil {
			sh.users--
		}
	}
	b.held[ownerToken] = h
}

func (b *Backend) lookup(ownerToken string) (held, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[ownerToken]
	return h, ok
}

// forget drops the record of ownerToken. It returns the lease that record
// was bound to when that lease should now be revoked: retired, and no
// other session bound to it.
func (b *Backend) forget(ownerToken string) (revoke int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[ownerToken]
	if !ok {
		return 0
	}
	delete(b.held, ownerToken)
	return b.dropUserLocked(h.lease)
}

func (b *Backend) dropUserLocked(id int64) (revoke int64) {
	sh := b.leaseByID[id]
	if sh == nil {
		return 0
	}
	sh.users--
	if sh.users <= 0 && !sh.current {
		delete(b.leaseByID, id)
		return id
	}
	return 0
}

func (b *Backend) leases() etcdserverpb.LeaseClient {
	return etcdserverpb.NewLeaseClient(b.cli.ActiveConnection())
}

// grant creates a lease with the ID h.lease (a fresh ID when another lease
// has it), recording every ID tried under ownerToken before it is sent.
// With share, the lease becomes the current shared lease of its TTL.
func (b *Backend) grant(ctx context.Context, ownerToken string, h held, seconds int64, share bool) (held, error) {
	h.seconds = seconds
	for range 3 {
		if share {
			b.mu.Lock()
			b.leaseByID[h.lease] = &shared{id: h.lease, seconds: seconds}
			b.mu.Unlock()
		}
		b.remember(ownerToken, h)
		sent := time.Now()
		_, err := b.leases().LeaseGrant(ctx, &etcdserverpb.LeaseGrantRequest{ID: h.lease, TTL: seconds})
		if err == nil {
			h.refreshed = sent
			if share {
				b.makeCurrent(h.lease, seconds, sent)
			}
			return h, nil
		}
		if !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist) {
			return h, err
		}
		if share {
			// Someone else's lease: never revoked from here.
			b.mu.Lock()
			delete(b.leaseByID, h.lease)
			b.mu.Unlock()
		}
		h.lease = newLeaseID() // taken by someone else: 1 in 2^63
	}
	return h, errors.New("lease IDs keep colliding")
}

// revoke revokes a lease; a lease that no longer exists is not an error.
func (b *Backend) revoke(ctx context.Context, id int64) error {
	if id == 0 {
		return nil
	}
	_, err := b.cli.Revoke(ctx, clientv3.LeaseID(id))
	if err != nil && !isLeaseNotFound(err) {
		return err
	}
	return nil
}

func isLeaseNotFound(err error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound)
}
