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

// spare is a lease this backend granted that no key is bound to any more:
// a released lock's, or one a busy claim did not use. The next claim with
// the same TTL takes it instead of granting a new one, refreshing it in
// the same round trip as its claim.
type spare struct {
	id        int64
	refreshed time.Time
}

// takeSpare returns a spare lease of the given TTL refreshed within the
// last half of it; older ones are dropped (they expire by themselves).
func (b *Backend) takeSpare(seconds int64) (spare, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.spares[seconds]
	for len(list) > 0 {
		sp := list[len(list)-1]
		list = list[:len(list)-1]
		if time.Since(sp.refreshed) < time.Duration(seconds)*time.Second/2 {
			b.spares[seconds] = list
			return sp, true
		}
	}
	delete(b.spares, seconds)
	return spare{}, false
}

func (b *Backend) putSpare(seconds int64, sp spare) bool {
	if seconds <= 0 || time.Since(sp.refreshed) >= time.Duration(seconds)*time.Second/2 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.spares[seconds]) >= maxSpares {
		return false
	}
	b.spares[seconds] = append(b.spares[seconds], sp)
	return true
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

func (b *Backend) remember(ownerToken string, h held) {
	b.mu.Lock()
	b.held[ownerToken] = h
	b.mu.Unlock()
}

func (b *Backend) lookup(ownerToken string) (held, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[ownerToken]
	return h, ok
}

// refreshed notes that a keepalive of lease, sent at t, succeeded.
func (b *Backend) refreshed(ownerToken string, lease int64, t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.held[ownerToken]; ok && h.lease == lease && t.After(h.refreshed) {
		h.refreshed = t
		b.held[ownerToken] = h
	}
}

func (b *Backend) forget(ownerToken string) {
	b.mu.Lock()
	delete(b.held, ownerToken)
	b.mu.Unlock()
}

func (b *Backend) leases() etcdserverpb.LeaseClient {
	return etcdserverpb.NewLeaseClient(b.cli.ActiveConnection())
}

// grant creates a lease with the ID h.lease (a fresh ID when another lease
// has it), recording every ID tried under ownerToken before it is sent.
func (b *Backend) grant(ctx context.Context, ownerToken string, h held, seconds int64) (held, error) {
	h.seconds = seconds
	for range 3 {
		b.remember(ownerToken, h)
		sent := time.Now()
		_, err := b.leases().LeaseGrant(ctx, &etcdserverpb.LeaseGrantRequest{ID: h.lease, TTL: seconds})
		if err == nil {
			h.refreshed = sent
			return h, nil
		}
		if !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist) {
			return h, err
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
