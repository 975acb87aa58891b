package etcdlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dislock/dislock/core"
)

// TryAcquire implements core.Backend and core.SemaphoreBackend: one
// transaction that puts the key (for Limit > 1: a permit key) bound to the
// backend's shared lease of the claim's TTL if the key is free, and
// otherwise reads the holders. A shared lease that might expire before the
// claim's TTL less its Slack is refreshed by a keepalive sent with the
// transaction; when there is none yet, one is granted first. A claim on a
// lease that was not refreshed for it says when the lease expires (its last
// refresh plus its TTL) in Lease.ExpiresAt.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := core.ValidateKey(req.Key); err != nil {
		return core.Lease{}, err
	}
	if req.Limit > core.MaxLimit {
		return core.Lease{}, invalidOption("Limit", "must be at most %d, got %d", core.MaxLimit, req.Limit)
	}
	ctx = clientv3.WithRequireLeader(ctx)
	now := time.Now()
	rec := record{Owner: req.Owner, OwnerToken: req.OwnerToken, Acquired: now.UnixMilli()}
	if req.Limit > 1 {
		rec.Limit = req.Limit
	}
	var (
		seconds int64
		err     error
	)
	if !req.ExpireAt.IsZero() {
		if !req.ExpireAt.After(now) {
			return core.Lease{}, core.Busy(req.Key, nil) // the slot is over
		}
		rec.SlotEnd = req.ExpireAt.UnixMilli()
		// The lease only collects the key after the slot; the slot's end
		// is the one in the value.
		seconds, err = leaseSeconds("ForSlot", req.ExpireAt.Sub(now)+time.Second)
	} else {
		seconds, err = leaseSeconds("TTL", req.TTL)
	}
	if err != nil {
		return core.Lease{}, err
	}
	value, err := json.Marshal(rec)
	if err != nil {
		return core.Lease{}, err
	}
	c := &claim{b: b, req: req, seconds: seconds, slot: !req.ExpireAt.IsZero(), leaseOK: true, keys: b.claimKeys(req.Key)}
	if req.Waiter != "" {
		if kv := b.takeGrant(req.Key, req.Waiter); kv != nil && c.takeGranted(kv, now) {
			// A release granted the key to this waiter (grant.go): no
			// request, not even the refresh of its waiter key's lease.
			return c.succeed(kv.ModRevision, now), nil
		}
	}
	fresh, err := c.startWait(ctx)
	if err != nil {
		return core.Lease{}, err
	}
	told := req.Waiter != "" && b.takeTold(c.wkey)
	if (b.knownBusy(req.Key) && req.Waiter == "") || (req.Waiter != "" && !fresh && c.wait.rev != 0 && !told) {
		// Held when last seen; or a waiter whose place is known and kept
		// by its lease's refresh, and that was not told its turn since
		// its last attempt (an attempt that keeps its place): a read may
		// answer.
		if done, err := b.peek(ctx, req); done {
			return core.Lease{}, err
		}
	}
	if err := c.start(ctx); err != nil {
		return core.Lease{}, err
	}
	if req.Limit > 1 {
		return c.permit(ctx, value, now)
	}
	return c.mutex(ctx, value, now)
}

// claim is one TryAcquire in progress: the lease it binds its key to.
type claim struct {
	b       *Backend
	req     core.AcquireRequest
	seconds int64
	slot    bool
	h       held
	keys    claimKeys // the keys its transaction names
	wkey    string    // the waiter key of req.Waiter ("" without one)
	wlease  int64     // the lease wkey is bound to
	wait    wait      // what is known of the waiter's place
	reused  bool      // h.lease is the shared lease, refreshed with the first transaction if need be
	kaDone  bool      // no refresh is needed, or it succeeded
	expires time.Time // when the reused lease, unrefreshed, expires (zero: at the claim's TTL or later)
	leaseOK bool      // the shared lease is not known to be in doubt
}

// start takes the shared lease of the claim's TTL, or grants one that
// becomes it. The store must keep the claim for its TTL less its Slack
// from the moment it is sent (core.Lease): a shared lease whose last
// refresh leaves less than that is refreshed by a keepalive sent with the
// claim, in the same round trip; one that leaves enough is not, and the
// lease's expiry goes to the engine, which counts the session from it. So a
// steady run of claims refreshes the lease once per Slack, not once per
// claim. Slot claims get a lease of their own, never renewed.
//
// A Backend grants one shared lease of a TTL at a time: claims that find
// none while a grant is in flight wait for its answer (or for their ctx)
// and then take the lease it made, so that concurrent first claims share
// one lease. When that grant fails they fail with it, having sent nothing
// (core.Unclaimed); when it failed only because its own claim's context
// ended, they try again.
func (c *claim) start(ctx context.Context) error {
	b, req := c.b, c.req
	h := held{key: req.Key, ekey: b.recordKey(req.Key, req.OwnerToken, req.Limit), seconds: c.seconds}
	c.reused, c.kaDone, c.expires = false, false, time.Time{}
	if c.slot {
		h.lease = newLeaseID()
		h, err := b.grant(ctx, req.OwnerToken, h, c.seconds, false)
		c.h = h
		if err != nil {
			return c.grantFailed(err)
		}
		return nil
	}
	for {
		sh, call, lead := b.shareOrGrant(c.seconds, req.OwnerToken, h)
		if call == nil {
			h.lease, h.refreshed = sh.id, sh.refreshed
			c.h, c.reused = h, true
			// The key expires no earlier than the lease's refresh plus its
			// TTL: without a refresh now, that must cover the claim's TTL
			// less its Slack.
			expires := sh.refreshed.Add(time.Duration(c.seconds) * time.Second)
			c.kaDone = !time.Now().Add(req.TTL - req.Slack).After(expires)
			if c.kaDone {
				c.expires = expires
			}
			return nil
		}
		if !lead {
			select {
			case <-call.done:
				if call.err != nil && !call.retry {
					return core.Unclaimed(fmt.Errorf("lease grant: %w", call.err))
				}
				continue
			case <-ctx.Done():
				return core.Unclaimed(fmt.Errorf("lease grant: %w", ctx.Err()))
			}
		}
		h.lease = newLeaseID()
		h, err := b.grant(ctx, req.OwnerToken, h, c.seconds, true)
		b.endGrant(c.seconds, call, err, err != nil && ctx.Err() != nil)
		c.h = h
		if err != nil {
			return c.grantFailed(err)
		}
		return nil
	}
}

// grantFailed is the error of a claim whose lease grant failed, before
// the claim's transaction was sent. When the grant itself never left (no
// connection to any endpoint: refused, unknown host), the store has
// neither the lease nor the key, and the engine owes no undo.
func (c *claim) grantFailed(err error) error {
	err = fmt.Errorf("lease grant: %w", err)
	if notSent(err) {
		c.b.forget(c.req.OwnerToken)
		return core.Unclaimed(err)
	}
	return err
}

// notSent reports whether err is gRPC's answer to a call that it could not
// send because no connection could be made: Unavailable, with the dial
// error as its description.
func notSent(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && strings.Contains(st.Message(), "Error while dialing")
}

// commit sends the transaction txn builds, together with a keepalive of a
// reused lease. A reused lease found expired is replaced by a granted one
// and the transaction sent again.
func (c *claim) commit(ctx context.Context, txn func() *etcdserverpb.TxnRequest) (*clientv3.TxnResponse, error) {
	expired := 0 // shared leases found expired
	for {
		var (
			wg     sync.WaitGroup
			kaErr  error
			kaSent time.Time
		)
		if c.reused && !c.kaDone {
			kaSent = time.Now()
			wg.Go(func() { kaErr = c.refresh(ctx) })
		}
		resp, err := c.b.txns.send(ctx, c.req.Key, c.req.OwnerToken, txn())
		wg.Wait()
		if kaErr != nil && err == nil && resp.Succeeded && ctx.Err() == nil {
			// The stream failed under the keepalive (another caller ended
			// it): any refresh sent after the claim was sent will do.
			kaErr = c.refresh(ctx)
		}
		if err != nil {
			if c.reused && isLeaseNotFound(err) && expired < 3 {
				// The shared lease expired (its sessions are lost, and
				// their renewals say so): nothing was written. Claim on
				// the lease that replaces it: granted now, by this claim
				// or another.
				expired++
				c.b.retire(c.h.lease)
				if err := c.start(ctx); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		if c.reused && !c.kaDone {
			if kaErr == nil {
				c.h.refreshed = kaSent
				c.b.leaseRefreshed(c.h.lease, kaSent)
				c.kaDone = true // refreshed after the engine sent the claim: once is enough
			} else {
				c.leaseOK = false
				if resp.Succeeded {
					// The key is bound to a lease whose refresh is not
					// confirmed: it might expire before this session's
					// deadline. The engine undoes the claim.
					return nil, fmt.Errorf("refresh the lease: %w", kaErr)
				}
			}
		}
		return resp, nil
	}
}

// refresh sends a keepalive of the claim's lease on the Backend's stream.
func (c *claim) refresh(ctx context.Context) error {
	ttls, err := c.b.ka.keepAlive(ctx, []int64{c.h.lease}, false)
	switch {
	case err != nil:
		return err
	case ttls[0] <= 0:
		return errors.New("lease expired")
	}
	return nil
}

// succeed records the claim as held with fencing token rev.
func (c *claim) succeed(rev int64, now time.Time) core.Lease {
	c.h.rev = rev
	c.b.keep(c.req, c.h) // before the place goes: a grant the claim took stays (dropWaitLocked)
	if c.req.Waiter != "" {
		c.b.dropWait(c.req.Key, c.req.Waiter)
	}
	c.b.markFree(c.req.Key)
	l := c.b.lease(rev, now, c.req)
	if !c.slot && !c.expires.IsZero() && c.expires.Before(l.ExpiresAt) {
		l.ExpiresAt = c.expires // the shared lease was not refreshed for this claim
	}
	return l
}

// own is a claim that finds its own record, written by an earlier attempt
// with the same owner token: it holds the key with that record's lease.
func (c *claim) own(ctx context.Context, kv *mvccpb.KeyValue, now time.Time) core.Lease {
	if kv.Lease != c.h.lease {
		// An earlier attempt's lease (a shared lease is never revoked
		// here: other sessions may be bound to it).
		if lease := c.b.forget(c.req.OwnerToken); lease != 0 {
			_ = c.b.revoke(ctx, lease)
		}
		c.expires = time.Time{}
		if sh, ok := c.b.tracked(kv.Lease); ok {
			c.expires = sh.refreshed.Add(time.Duration(sh.seconds) * time.Second)
		}
	}
	c.h.lease = kv.Lease
	return c.succeed(kv.ModRevision, now)
}

// giveUp forgets a claim that took nothing. A shared lease stays for the
// next claim unless its refresh failed; a slot's own lease is revoked.
// wait waits for that revoke.
func (c *claim) giveUp(ctx context.Context) (wait func()) {
	b := c.b
	lease := b.forget(c.req.OwnerToken)
	if c.reused && !c.leaseOK && b.retire(c.h.lease) {
		lease = c.h.lease
	}
	if c.slot {
		lease = c.h.lease
	}
	var wg sync.WaitGroup
	if lease != 0 {
		wg.Go(func() { _ = b.revoke(ctx, lease) })
	}
	return wg.Wait
}

// claimTxn is the transaction of a claim on its lock key with its permit
// keys (c.keys): if guards hold (the lock key does not exist, and the
// permits allow) and the queue allows (qcmp), put putKey with value bound
// to the claim's lease (with the queue's writes); otherwise read the lock
// key, the permits (oldest first) and the queue.
func (c *claim) claimTxn(putKey, value []byte, guards, qcmp []*etcdserverpb.Compare) *etcdserverpb.TxnRequest {
	return &etcdserverpb.TxnRequest{
		Compare: append(guards, qcmp...),
		Success: append([]*etcdserverpb.RequestOp{opPut(putKey, value, c.h.lease)}, c.queueThen()...),
		Failure: append([]*etcdserverpb.RequestOp{opGet(c.keys.k, nil, false), opGet(c.keys.lo, c.keys.hi, false)}, c.queueElse()...),
	}
}

// mutex claims the lock key: if neither it nor any permit key of the same
// key exists, put it bound to the claim's lease; otherwise read both.
func (c *claim) mutex(ctx context.Context, value []byte, now time.Time) (core.Lease, error) {
	b, key := c.b, c.req.Key
	k := b.etcdKey(key)
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := c.commit(ctx, func() *etcdserverpb.TxnRequest {
			// Neither k nor a permit key exists: no key in [k, hi), which
			// holds k and exactly the permit keys (lock keys have no NUL).
			free := compare(etcdserverpb.Compare_CREATE, c.keys.k, c.keys.hi, etcdserverpb.Compare_EQUAL, 0)
			return c.claimTxn(c.keys.k, value, []*etcdserverpb.Compare{free}, c.queueCmp(true, 0))
		})
		if err != nil {
			return core.Lease{}, err
		}
		if resp.Succeeded {
			// The transaction's only write created the key: its create
			// revision is the transaction's revision.
			return c.succeed(resp.Header.Revision, now), nil
		}
		qv := c.readQueue(resp, 2)
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 && len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
			if qv.before > 0 || (c.wkey != "" && c.wait.rev == 0) {
				// Free, but others are in line first.
				c.giveUp(ctx)()
				return core.Lease{}, core.Busy(key, nil)
			}
			continue // another claim came and went
		}
		if len(kvs) == 0 {
			// Permits of a semaphore hold the key, or held it: a slot
			// semaphore whose slot ended leaves its permits to their
			// leases, which only collect them.
			live, ended := splitPermits(resp.Responses[1].GetResponseRange().Kvs, time.Now())
			if len(live) > 0 {
				c.giveUp(ctx)()
				return core.Lease{}, core.LimitMismatch(key, live[0].limit(), 1)
			}
			if len(ended) > 0 && attempt == 0 {
				kvs := make([]*mvccpb.KeyValue, len(ended))
				for i, p := range ended {
					kvs[i] = p.kv
				}
				if _, err := b.deleteIncarnations(ctx, kvs); err != nil {
					return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
				}
			}
			continue
		}
		kv := kvs[0]
		cur, ok := decode(kv.Value)
		if ok && cur.OwnerToken == c.req.OwnerToken {
			return c.own(ctx, kv, now), nil // our own claim, by an earlier attempt
		}
		if ok && cur.slotOver(time.Now()) && attempt == 0 {
			// A slot lock whose slot has ended is free; its lease only
			// keeps it for garbage collection. Delete exactly that
			// incarnation and claim again.
			_, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(k)).
				Commit()
			if err != nil {
				return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
			}
			continue
		}
		if ok && c.req.Waiter != "" && cur.Grant == b.id && cur.Waiter == c.req.Waiter && kv.ModRevision != kv.CreateRevision && c.takeGranted(kv, now) {
			// A release granted the key to this waiter while this
			// Backend's watch was not running (a lost leader ends it):
			// the attempt takes it, as the watch's turn would have. The
			// transaction queued the waiter again: that place goes.
			b.deleteWaiter(key, c.req.Waiter, c.wait.rev)
			return c.succeed(kv.ModRevision, now), nil
		}
		// Busy: keep the unused lease for the next claim (or revoke it) and
		// say who holds the key.
		wait := c.giveUp(ctx)
		var info *core.Info
		if ok {
			info = b.holderInfo(ctx, key, kv, cur)
		}
		wait()
		b.markBusy(key)
		return core.Lease{}, core.Busy(key, info)
	}
	c.giveUp(ctx)()
	return core.Lease{}, errors.New("the key changed under every attempt")
}

// keep records a claim that succeeded. The engine neither renews nor
// releases slot locks, so those are not kept: an undo finds them by owner
// token in the key's value.
func (b *Backend) keep(req core.AcquireRequest, h held) {
	if req.ExpireAt.IsZero() {
		b.remember(req.OwnerToken, h)
	} else {
		b.forget(req.OwnerToken)
	}
}

func (b *Backend) lease(rev int64, now time.Time, req core.AcquireRequest) core.Lease {
	l := core.Lease{Token: uint64(rev), AcquiredAt: now}
	if !req.ExpireAt.IsZero() {
		l.ExpiresAt = req.ExpireAt
	} else {
		l.ExpiresAt = now.Add(req.TTL)
	}
	return l
}
