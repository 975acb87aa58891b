package etcdlock

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

// Release implements core.Backend. Without Keep it deletes the key if it is
// still bound to the session's lease at the session's create revision, so
// it can never delete a newer holder's key; the shared lease stays. A key
// already gone, or another's, is answered core.Gone (nothing was
// released). A claim whose outcome is unknown is undone as undo says. With
// Keep it moves the key, owner-checked, to a new lease of Keep (rounded up
// to whole seconds): two round trips.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	ctx = clientv3.WithRequireLeader(ctx)
	if err := b.txns.after(ctx, req.OwnerToken); err != nil {
		return err
	}
	h, ok := b.lookup(req.OwnerToken)
	own := ok && h.key == req.Key // the lease is this backend's own record
	if !own {
		// Not acquired through this backend: find the lease by reading
		// the key and checking its owner token. An undo does not say
		// whether it claimed a lock or a permit: read both.
		resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(b.etcdKey(req.Key)),
			clientv3.OpGet(b.permitKey(req.Key, req.OwnerToken))).Commit()
		if err != nil {
			return err
		}
		found := false
		for _, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			kv := kvs[0]
			if rec, ok := decode(kv.Value); ok && rec.OwnerToken == req.OwnerToken {
				h = held{key: req.Key, ekey: string(kv.Key), lease: kv.Lease, rev: kv.ModRevision}
				found = true
				break
			}
		}
		if !found {
			return core.Gone(req.Key, "held by another owner or gone")
		}
	}
	k := h.ekey
	if h.rev == 0 {
		return b.undo(ctx, req, h)
	}
	if req.Keep <= 0 {
		// Delete exactly this incarnation of the key, bound to this
		// lease, and keep the lease for the next claim.
		kb := []byte(k)
		mine := []*etcdserverpb.Compare{compare(etcdserverpb.Compare_LEASE, kb, nil, etcdserverpb.Compare_EQUAL, h.lease),
			compare(etcdserverpb.Compare_MOD, kb, nil, etcdserverpb.Compare_EQUAL, h.rev)}
		var then []*etcdserverpb.RequestOp
		if k == b.etcdKey(req.Key) {
			then = b.grantOps(req.Key, kb) // grant.go
		}
		granting := then != nil
		if !granting {
			then = []*etcdserverpb.RequestOp{opDelete(kb)}
		}
		resp, err := b.txns.send(ctx, req.Key, "", &etcdserverpb.TxnRequest{Compare: mine, Success: then})
		if err != nil && granting && isLeaseNotFound(err) {
			// The waiter's lease is gone: release without the grant.
			resp, err = b.txns.send(ctx, req.Key, "", &etcdserverpb.TxnRequest{Compare: mine, Success: []*etcdserverpb.RequestOp{opDelete(kb)}})
		}
		if err != nil {
			return err
		}
		if resp.Succeeded && k != b.etcdKey(req.Key) {
			b.permitFreed(req.Key, h.rev, resp.Header.Revision)
		}
		if !own {
			// A lease read from the key may serve other keys of the
			// process that holds it: never revoke it from here.
			return releasedIf(req.Key, resp.Succeeded)
		}
		// The shared lease stays for the other sessions and the next
		// claim, unless it was retired and this was its last session.
		if lease := b.forget(req.OwnerToken); lease != 0 {
			_ = b.revoke(ctx, lease)
		}
		return releasedIf(req.Key, resp.Succeeded)
	}
	seconds, err := leaseSeconds("MinHold", req.Keep)
	if err != nil {
		return err
	}
	keep := newLeaseID()
	if _, err := b.leases().LeaseGrant(ctx, &etcdserverpb.LeaseGrantRequest{ID: keep, TTL: seconds}); err != nil {
		return fmt.Errorf("lease grant: %w", err)
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(k), "=", h.lease),
			clientv3.Compare(clientv3.ModRevision(k), "=", h.rev)).
		Then(clientv3.OpPut(k, "", clientv3.WithIgnoreValue(), clientv3.WithLease(clientv3.LeaseID(keep)))).
		Commit()
	if err != nil {
		// The move may have been applied: revoking keep could then free
		// the key before the min hold ends. Left alone, keep expires by
		// itself if nothing was moved onto it, and a retry of this
		// release finds the key on keep no longer bound to h.lease.
		return err
	}
	if !resp.Succeeded {
		_ = b.revoke(ctx, keep) // not ours any more: nothing to keep
	}
	if own {
		if lease := b.forget(req.OwnerToken); lease != 0 {
			_ = b.revoke(ctx, lease)
		}
	}
	return releasedIf(req.Key, resp.Succeeded)
}

// releasedIf is a release's answer: nil when the key was still the lease's
// (deleted, or moved to the min hold's lease), else core.Gone.
func releasedIf(key string, ours bool) error {
	if !ours {
		return core.Gone(key, "held by another owner, expired or deleted")
	}
	return nil
}

// undo undoes a claim whose outcome is unknown (its reply was lost, or it
// may still be on its way). A lease of the claim's own (a slot's, or a
// shared lease no other session is bound to) is revoked: that deletes the
// key if the claim was applied and makes it fail if it arrives later.
// A shared lease that carries other sessions cannot be revoked: it is
// retired — no new claim takes it — and revoked when its last session
// ends, and the key is deleted now if the claim was applied, found by its
// owner token. (A claim that arrives after that holds the key until the
// retired lease is revoked.)
func (b *Backend) undo(ctx context.Context, req core.ReleaseRequest, h held) error {
	b.retire(h.lease)
	resp, err := b.cli.Get(ctx, h.ekey)
	if err != nil {
		return err
	}
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		if rec, ok := decode(kv.Value); ok && rec.OwnerToken == req.OwnerToken && kv.Lease == h.lease {
			if _, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(h.ekey), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(h.ekey)).Commit(); err != nil {
				return err
			}
		}
	}
	lease := b.forget(req.OwnerToken)
	if _, tracked := b.tracked(h.lease); !tracked {
		lease = h.lease // a slot's lease, or a grant whose reply was lost
	}
	if lease != 0 {
		if err := b.revoke(ctx, lease); err != nil {
			return err
		}
	}
	return nil
}
