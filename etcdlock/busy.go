package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

// maxBusy bounds the keys a Backend remembers as busy.
const maxBusy = 4096

// markBusy notes that key was last seen held by another owner (or, for a
// semaphore, full), so that the next claim of it reads before it writes.
func (b *Backend) markBusy(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.busy) >= maxBusy {
		clear(b.busy) // a forgotten key only costs its next busy claim a write
	}
	b.busy[key] = struct{}{}
}

// markFree forgets that key was seen busy: it was claimed here, or the
// deletion of its key (or of one of its permits) was watched.
func (b *Backend) markFree(key string) {
	b.mu.Lock()
	delete(b.busy, key)
	b.mu.Unlock()
}

func (b *Backend) knownBusy(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.busy[key]
	return ok
}

// peek answers a claim of a key last seen busy with a read: a transaction
// of Gets only, which etcd serves without a Raft proposal, where the
// claim's own transaction is a proposal even when its put is not applied.
// It returns done when the key is still held by another owner (a full
// semaphore of the same limit: the claim is then busy), or held with
// another limit (a limit mismatch). Anything else — the key free, a permit
// or record of this owner token, an ended slot, a grant to the claim's
// waiter — is left to the claim, which reads it again.
func (b *Backend) peek(ctx context.Context, req core.AcquireRequest) (done bool, err error) {
	k := b.etcdKey(req.Key)
	lo, hi := b.permitRange(req.Key)
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(k),
		clientv3.OpGet(lo, clientv3.WithRange(hi), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))).Commit()
	if err != nil {
		return true, core.Unclaimed(err) // a read: nothing was claimed
	}
	now := time.Now()
	kvs := resp.Responses[0].GetResponseRange().Kvs
	live, _ := splitPermits(resp.Responses[1].GetResponseRange().Kvs, now)
	if req.Limit <= 1 {
		if len(live) > 0 {
			return true, core.LimitMismatch(req.Key, live[0].limit(), 1)
		}
		if len(kvs) == 0 {
			return false, nil
		}
		rec, ok := decode(kvs[0].Value)
		if !ok || rec.OwnerToken == req.OwnerToken || rec.slotOver(now) || (req.Waiter != "" && rec.Grant == b.id && rec.Waiter == req.Waiter) {
			return false, nil
		}
		return true, core.Busy(req.Key, b.holderInfo(ctx, req.Key, kvs[0], rec))
	}
	if len(kvs) > 0 {
		if rec, ok := decode(kvs[0].Value); ok && !rec.slotOver(now) {
			return true, core.LimitMismatch(req.Key, 1, req.Limit)
		}
		return false, nil
	}
	if len(live) > 0 && live[0].limit() != req.Limit {
		return true, core.LimitMismatch(req.Key, live[0].limit(), req.Limit)
	}
	// The claim that follows a free permit found here is guarded by this
	// view, and takes it in one transaction.
	b.setView(req.Key, semView{rev: resp.Header.Revision, limit: req.Limit, count: len(live)})
	if len(live) < req.Limit {
		return false, nil
	}
	for _, p := range live {
		if p.rec.OwnerToken == req.OwnerToken {
			return false, nil
		}
	}
	return true, core.Busy(req.Key, b.firstToExpire(ctx, req.Key, live))
}
