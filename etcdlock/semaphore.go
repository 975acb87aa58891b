package etcdlock

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

var _ core.SemaphoreBackend = (*Backend)(nil)

// maxViews bounds the semaphores whose last view a Backend keeps.
const maxViews = 4096

// semView is what a Backend last saw of a semaphore's permits: at store
// revision rev, count live permits (at most; the count only errs upwards)
// taken with limit. A claim guarded by "no permit key of the semaphore was
// written after rev" then finds at most count permits: every permit key
// left has a mod revision at or below rev, so it was there, and live, at
// rev (deletions only lower the count). With count < limit the claim can
// take a permit in one transaction without reading first. The zero view
// (rev 0) says "no permits at all".
type semView struct {
	rev   int64
	limit int
	count int
}

// view returns the last view of key's semaphore (the zero view if none).
func (b *Backend) view(key string) semView {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.views[key]
}

// setView records v if it is newer than the view held.
func (b *Backend) setView(key string, v semView) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.views[key]; ok && cur.rev >= v.rev {
		return
	}
	if v.count == 0 {
		delete(b.views, key) // the zero view says no more than this one
		return
	}
	if len(b.views) >= maxViews {
		for k := range b.views { // drop any: a missing view only costs a read
			delete(b.views, k)
			break
		}
	}
	b.views[key] = v
}

// permitFreed notes that this backend deleted, at revision deleted, the
// permit of key created at revision created. The view's count drops only
// when that permit was counted in it: created at or before the view's
// revision and deleted after it.
func (b *Backend) permitFreed(key string, created, deleted int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.views[key]
	if !ok || created > v.rev || deleted <= v.rev || v.count == 0 {
		return
	}
	v.count--
	if v.count == 0 {
		delete(b.views, key)
	} else {
		b.views[key] = v
	}
}

// permitKV is a permit key read from the store.
type permitKV struct {
	kv  *mvccpb.KeyValue
	rec record
}

// limit is the limit the permit was taken with.
func (p permitKV) limit() int { return max(p.rec.Limit, 1) }

// splitPermits decodes permit keys into those that hold a permit at now
// and those of slots that have ended (which only wait for their lease to
// collect them), both in the order given.
func splitPermits(kvs []*mvccpb.KeyValue, now time.Time) (live, ended []permitKV) {
	for _, kv := range kvs {
		rec, _ := decode(kv.Value)
		p := permitKV{kv: kv, rec: rec}
		if rec.slotOver(now) {
			ended = append(ended, p)
		} else {
			live = append(live, p)
		}
	}
	return live, ended
}

// permit claims one of c.req.Limit permits of the key: the permit key
// <prefix><key> NUL <owner token>, bound to the claim's lease. One
// transaction puts it if the lock key does not exist and no permit key was
// written since the last view of the semaphore, which had a permit free
// (for a semaphore this backend has not seen: if there are no permit
// keys). Otherwise the transaction reads the lock key and the permits,
// oldest first: the claim then answers busy, a limit mismatch, or tries
// again on the fresh view. It tries again as long as the fresh view shows
// a free permit: a transaction fails its guard only when a permit key was
// written since the view (another claim was granted, or a minimum hold
// rebound a permit), so claims racing for a free semaphore are all
// granted until it is full, and busy then means the store showed it full.
// Only a claim that keeps losing to a churn of claims and releases for a
// sixth of its TTL (at least 100 ms) answers busy with a permit in view:
// the engine counts a claim whose reply comes after the renew deadline as
// lost, so it stops before that.
func (c *claim) permit(ctx context.Context, value []byte, now time.Time) (core.Lease, error) {
	b, key, limit := c.b, c.req.Key, c.req.Limit
	v := b.view(key)
	var live []permitKV
	var qv queueView // the queue before the claim, as last read (none yet)
	first := true    // no read yet: require the waiter to be first in line (or no queue)
	cleared := false
	start := time.Now()
	bound := max(c.req.TTL/6, 100*time.Millisecond)
	for attempt := 0; ; attempt++ {
		if attempt > 0 && time.Since(start) > bound {
			break
		}
		guard := compare(etcdserverpb.Compare_MOD, c.keys.lo, c.keys.hi, etcdserverpb.Compare_LESS, v.rev+1)
		if v.rev != 0 && (v.limit != limit || v.count >= limit) {
			// Full, or taken with another limit, when last seen: read.
			guard = compare(etcdserverpb.Compare_MOD, c.keys.lo, c.keys.hi, etcdserverpb.Compare_LESS, 0) // never true
		}
		base := v
		qcmp := c.queueCmp(first, qv.rev)
		resp, err := c.commit(ctx, func() *etcdserverpb.TxnRequest {
			noLock := compare(etcdserverpb.Compare_CREATE, c.keys.k, nil, etcdserverpb.Compare_EQUAL, 0)
			return c.claimTxn([]byte(c.h.ekey), value, []*etcdserverpb.Compare{noLock, guard}, qcmp)
		})
		if err != nil {
			return core.Lease{}, err
		}
		if resp.Succeeded {
			// The only write created the permit key: its create revision
			// is the transaction's revision, and the permits now are at
			// most those of the view it was guarded by, and this one.
			b.setView(key, semView{rev: resp.Header.Revision, limit: limit, count: base.count + 1})
			return c.succeed(resp.Header.Revision, now), nil
		}
		qv, first = c.readQueue(resp, 2), false
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			// The key is a mutex: held, or an ended slot lock.
			kv := kvs[0]
			if rec, ok := decode(kv.Value); ok && rec.slotOver(time.Now()) && !cleared {
				cleared = true
				if _, err := b.deleteIncarnations(ctx, kvs); err != nil {
					return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
				}
				v = semView{}
				continue
			}
			c.giveUp(ctx)()
			return core.Lease{}, core.LimitMismatch(key, 1, limit)
		}
		var ended []permitKV
		live, ended = splitPermits(resp.Responses[1].GetResponseRange().Kvs, time.Now())
		for _, p := range live {
			if p.rec.OwnerToken == c.req.OwnerToken {
				return c.own(ctx, p.kv, now), nil // our own claim, by an earlier attempt
			}
		}
		if len(live) > 0 && live[0].limit() != limit {
			c.giveUp(ctx)()
			return core.Lease{}, core.LimitMismatch(key, live[0].limit(), limit)
		}
		if len(live) == 0 && len(ended) > 0 && !cleared {
			cleared = true // collect ended slot permits now, not at their lease's end
			kvs := make([]*mvccpb.KeyValue, len(ended))
			for i, p := range ended {
				kvs[i] = p.kv
			}
			if _, err := b.deleteIncarnations(ctx, kvs); err != nil {
				return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
			}
		}
		v = semView{rev: resp.Header.Revision, limit: limit, count: len(live)}
		b.setView(key, v)
		if len(live)+qv.before >= limit || (c.wkey != "" && c.wait.rev == 0) {
			break // full, or the free permits are the turns of waiters before
		}
	}
	// Busy: every permit is taken (or, past the bound, other claims kept
	// taking the free ones first). Say which permit expires first.
	wait := c.giveUp(ctx)
	info := b.firstToExpire(ctx, key, live)
	wait()
	if len(live) >= limit {
		b.markBusy(key)
	}
	return core.Lease{}, core.Busy(key, info)
}

// firstToExpire describes the permit of live that expires first (nil when
// live is empty): the engine polls no later than that.
func (b *Backend) firstToExpire(ctx context.Context, key string, live []permitKV) *core.Info {
	if len(live) == 0 {
		return nil
	}
	kvs := make([]*mvccpb.KeyValue, len(live))
	for i, p := range live {
		kvs[i] = p.kv
	}
	list := b.infos(ctx, kvs, func(*mvccpb.KeyValue) string { return key })
	if len(list) == 0 {
		return nil
	}
	first := list[0]
	for _, i := range list[1:] {
		if i.Remaining > 0 && (first.Remaining <= 0 || i.Remaining < first.Remaining) {
			first = i
		}
	}
	return &first
}

// deleteIncarnations deletes each of kvs if its key is still bound to the
// same lease at the same create revision, so it never deletes a newer
// holder's key; one transaction per WithMaxTxnOps keys, each key guarded
// by a transaction of its own nested in it. It returns the keys deleted.
func (b *Backend) deleteIncarnations(ctx context.Context, kvs []*mvccpb.KeyValue) ([]string, error) {
	guard := func(kv *mvccpb.KeyValue) []clientv3.Cmp {
		k := string(kv.Key)
		return []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", kv.Lease),
			clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)}
	}
	var deleted []string
	if len(kvs) == 1 {
		kv := kvs[0]
		resp, err := b.cli.Txn(ctx).If(guard(kv)...).Then(clientv3.OpDelete(string(kv.Key))).Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			deleted = append(deleted, string(kv.Key))
		}
		return deleted, nil
	}
	for len(kvs) > 0 {
		part := kvs[:min(len(kvs), b.maxTxnOps)]
		kvs = kvs[len(part):]
		ops := make([]clientv3.Op, len(part))
		for i, kv := range part {
			ops[i] = clientv3.OpTxn(guard(kv), []clientv3.Op{clientv3.OpDelete(string(kv.Key))}, nil)
		}
		resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return deleted, err
		}
		for i, r := range resp.Responses {
			if t := r.GetResponseTxn(); t != nil && t.Succeeded {
				deleted = append(deleted, string(part[i].Key))
			}
		}
	}
	return deleted, nil
}

// Holders implements core.SemaphoreBackend: one transaction reads the lock
// key and the permits of key (oldest first), then their leases are read
// (32 at a time) for the time each has left.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	list, err := b.holders(clientv3.WithRequireLeader(ctx), key, false)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: holders: %w", err)
	}
	return list, nil
}

// holders lists the holders of key, oldest first; with first, only the
// oldest.
func (b *Backend) holders(ctx context.Context, key string, first bool) ([]core.Info, error) {
	k := b.etcdKey(key)
	lo, hi := b.permitRange(key)
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(k),
		clientv3.OpGet(lo, clientv3.WithRange(hi), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))).Commit()
	if err != nil {
		return nil, err
	}
	kvs := append(resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs...)
	keyOf := func(*mvccpb.KeyValue) string { return key }
	if !first {
		return b.infos(ctx, kvs, keyOf), nil
	}
	for _, kv := range kvs {
		if list := b.infos(ctx, []*mvccpb.KeyValue{kv}, keyOf); len(list) > 0 {
			return list, nil
		}
	}
	return nil, nil
}
