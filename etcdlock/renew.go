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
// per lease on the Backend's LeaseKeepAlive stream, and, at the same time, transactions of up to 128 Gets that check each key is still bound
// to its session's lease with its fencing token — a live lease does not
// prove the key is still there.
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
	wg.Go(func() {
		ids := make([]int64, len(idx))
		for j, i := range idx {
			ids[j] = hs[i].lease
		}
		ttls, kaErr = b.ka.keepAlive(ctx, ids, true)
	})
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
		case ttls[j] <= 0:
			results[i] = core.Gone(reqs[i].Key, "lease expired or revoked")
		case kv == nil:
			results[i] = core.Gone(reqs[i].Key, "key deleted")
		case kv.Lease != h.lease || kv.CreateRevision != h.rev:
			results[i] = core.Gone(reqs[i].Key, "held by another owner")
		}
		if results[i] != nil {
			// The lease holds no key of ours any more: nothing to undo.
			b.forget(reqs[i].OwnerToken)
		} else {
			b.refreshed(reqs[i].OwnerToken, h.lease, sent)
		}
	}
	if failed == len(reqs) {
		return nil, firstErr
	}
	return results, nil
}
