package etcdlock

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

// Renew implements core.Backend. One call is one round trip: one message
// per lease on the Backend's LeaseKeepAlive stream — one for all the
// sessions of one TTL, which share a lease — and, at the same time,
// transactions of up to 128 Gets that check each key is still bound to its
// session's lease with its fencing token: a live lease does not prove the
// key is still there (a release or ForceRelease deletes one key, and ends
// only that session).
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	// One attempt waits at most a sixth of the shortest TTL (at least
	// 100 ms): a member that hangs without closing the connection then
	// costs one attempt, and the engine's retry, before the deadline, goes
	// on a new keepalive stream and to the next member.
	attempt := time.Duration(math.MaxInt64)
	for _, r := range reqs {
		attempt = min(attempt, r.TTL/6)
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), max(attempt, 100*time.Millisecond))
	defer cancel()
	sent := time.Now()
	results := make([]error, len(reqs))
	hs := make([]held, len(reqs))
	var idx []int // requests to send
	b.mu.Lock()
	for _, r := range reqs {
		if h, ok := b.held[r.OwnerToken]; ok {
			h.seen = sent
			b.held[r.OwnerToken] = h
		}
	}
	b.mu.Unlock()
	for i, r := range reqs {
		h, ok := b.lookup(r.OwnerToken)
		if !ok || h.key != r.Key || h.ekey != b.recordKey(r.Key, r.OwnerToken, r.Limit) || h.rev == 0 {
			results[i] = core.Gone(r.Key, "not held by this backend")
			continue
		}
		hs[i] = h
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return results, nil
	}

	var (
		wg     sync.WaitGroup
		ttls   []int64
		kaErr  error
		chunks = (len(idx) + b.maxTxnOps - 1) / b.maxTxnOps
		kvs    = make([]*mvccpb.KeyValue, len(reqs))
		txErrs = make([]error, chunks)
	)
	// One keepalive per lease: the sessions of one TTL share one.
	var ids []int64
	slot := make(map[int64]int) // lease → its index in ids
	for _, i := range idx {
		if _, ok := slot[hs[i].lease]; !ok {
			slot[hs[i].lease] = len(ids)
			ids = append(ids, hs[i].lease)
		}
	}
	wg.Go(func() { ttls, kaErr = b.ka.keepAlive(ctx, ids, true) })
	for c := range chunks {
		part := idx[c*b.maxTxnOps : min(len(idx), (c+1)*b.maxTxnOps)]
		wg.Go(func() {
			ops := make([]clientv3.Op, len(part))
			for j, i := range part {
				ops[j] = clientv3.OpGet(hs[i].ekey) // WithKeysOnly would drop the lease ID
			}
			resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				txErrs[c] = err
				return
			}
			for j, i := range part {
				if r := resp.Responses[j].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
					kvs[i] = r.Kvs[0]
				}
			}
		})
	}
	wg.Wait()

	if kaErr != nil {
		return nil, fmt.Errorf("etcdlock: renew: keepalive: %w", kaErr)
	}
	failed := 0
	var firstErr error
	for j, i := range idx {
		if err := txErrs[j/b.maxTxnOps]; err != nil {
			results[i] = fmt.Errorf("etcdlock: renew: %w", err)
			firstErr = results[i]
			failed++
			continue
		}
		h, kv := hs[i], kvs[i]
		switch {
		case ttls[slot[h.lease]] <= 0:
			results[i] = core.Gone(reqs[i].Key, "lease expired or revoked")
		case kv == nil:
			results[i] = core.Gone(reqs[i].Key, "key deleted")
		case kv.Lease != h.lease || kv.ModRevision != h.rev:
			results[i] = core.Gone(reqs[i].Key, "held by another owner")
		}
		if results[i] != nil {
			// The lease holds no key of this session any more: nothing to
			// undo.
			if lease := b.forget(reqs[i].OwnerToken); lease != 0 {
				wg.Go(func() { _ = b.revoke(ctx, lease) })
			}
		}
	}
	for j, id := range ids {
		if ttls[j] > 0 {
			b.leaseRefreshed(id, sent)
		} else {
			b.retire(id) // expired or revoked: its sessions are lost
		}
	}
	b.sweep(ctx, &wg, sent)
	wg.Wait()
	if failed == len(reqs) {
		return nil, firstErr
	}
	return results, nil
}

// maxSweep bounds the keys one Renew call sweeps.
const maxSweep = 32

// sweep deletes, owner-checked, the keys bound to this backend's shared
// leases whose sessions no Renew has asked for in longer than the lease's
// TTL: a session that ended without a release that reached the store (it
// was lost and never released, or its release failed), or a claim whose
// undo failed. With a lease of its own such a key would have expired by
// now; the shared lease, renewed for the other sessions, would keep it
// held. The deletes run on wg, under ctx.
func (b *Backend) sweep(ctx context.Context, wg *sync.WaitGroup, now time.Time) {
	type orphan struct {
		token string
		h     held
	}
	var list []orphan
	b.mu.Lock()
	for token, h := range b.held {
		if b.leaseByID[h.lease] == nil || now.Sub(h.seen) <= time.Duration(h.seconds)*time.Second {
			continue
		}
		list = append(list, orphan{token, h})
		if len(list) == maxSweep {
			break
		}
	}
	b.mu.Unlock()
	for _, o := range list {
		wg.Go(func() {
			h := o.h
			rev := h.rev
			if rev == 0 {
				// A claim whose outcome was never known: find it by its
				// owner token.
				resp, err := b.cli.Get(ctx, h.ekey)
				if err != nil {
					return
				}
				if len(resp.Kvs) > 0 {
					if rec, ok := decode(resp.Kvs[0].Value); ok && rec.OwnerToken == o.token {
						rev = resp.Kvs[0].ModRevision
					}
				}
			}
			if rev != 0 {
				if _, err := b.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.LeaseValue(h.ekey), "=", h.lease),
						clientv3.Compare(clientv3.ModRevision(h.ekey), "=", rev)).
					Then(clientv3.OpDelete(h.ekey)).Commit(); err != nil {
					return
				}
			}
			if lease := b.forget(o.token); lease != 0 {
				_ = b.revoke(ctx, lease)
			}
		})
	}
}
