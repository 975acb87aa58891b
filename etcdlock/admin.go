package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

// holderInfo describes the holder of kv. For a lease lock the remaining
// time is read from the holder's lease: etcd reports it in whole seconds,
// rounded down, so Remaining is that plus half a second, at most the
// lease's granted TTL. It is 0 (unknown) when the lease cannot be read.
func (b *Backend) holderInfo(ctx context.Context, key string, kv *mvccpb.KeyValue, rec record) *core.Info {
	now := time.Now()
	// A lock's token is its key's mod revision: a release that grants
	// the key puts it over the old one (grant.go). A permit is never put
	// again while held, and its min hold's move to a lease of its own
	// keeps its create revision.
	info := &core.Info{Key: key, Owner: rec.Owner, Token: uint64(kv.ModRevision)}
	if rec.Limit > 1 {
		info.Limit = rec.Limit
		info.Token = uint64(kv.CreateRevision)
	}
	if rec.Acquired != 0 {
		info.AcquiredAt = time.UnixMilli(rec.Acquired)
	}
	if rec.SlotEnd != 0 {
		info.ExpiresAt = time.UnixMilli(rec.SlotEnd)
		info.Remaining = info.ExpiresAt.Sub(now)
		return info
	}
	if kv.Lease == 0 {
		return info
	}
	ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.TTL < 0 {
		return info
	}
	rem := time.Duration(ttl.TTL)*time.Second + 500*time.Millisecond
	if g := time.Duration(ttl.GrantedTTL) * time.Second; g > 0 && rem > g {
		rem = g
	}
	info.Remaining = rem
	info.ExpiresAt = now.Add(rem)
	return info
}

// Inspect implements core.Admin: a read of the key and of its permits,
// and a read of the holder's lease. For a semaphore it describes the
// oldest permit.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return core.Info{}, false, err
	}
	list, err := b.holders(clientv3.WithRequireLeader(ctx), key, true)
	if err != nil {
		return core.Info{}, false, fmt.Errorf("etcdlock: inspect: %w", err)
	}
	if len(list) == 0 {
		return core.Info{}, false, nil
	}
	return list[0], true, nil
}

// info describes a lock or permit key; false when it no longer holds a
// lock (an ended slot, or a lease that just expired).
func (b *Backend) info(ctx context.Context, key string, kv *mvccpb.KeyValue) (core.Info, bool) {
	rec, _ := decode(kv.Value)
	if rec.slotOver(time.Now()) {
		return core.Info{}, false
	}
	i := b.holderInfo(ctx, key, kv, rec)
	if rec.SlotEnd == 0 && kv.Lease != 0 && i.Remaining == 0 {
		if ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL < 0 {
			return core.Info{}, false
		}
	}
	return *i, true
}

// infoParallel is how many lease reads infos has in flight at once.
const infoParallel = 32

// infos describes each of kvs (lock or permit keys of key, or of the key
// keyOf names), in order, leaving out those that no longer hold a lock.
// The lease reads run in parallel.
func (b *Backend) infos(ctx context.Context, kvs []*mvccpb.KeyValue, keyOf func(*mvccpb.KeyValue) string) []core.Info {
	out := make([]core.Info, len(kvs))
	ok := make([]bool, len(kvs))
	sem := make(chan struct{}, infoParallel)
	var wg sync.WaitGroup
	for i, kv := range kvs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], ok[i] = b.info(ctx, keyOf(kv), kv)
		})
	}
	wg.Wait()
	list := out[:0]
	for i := range out {
		if ok[i] {
			list = append(list, out[i])
		}
	}
	return list
}

// listPage is how many keys one List read returns.
const listPage = 500

// List implements core.Admin: prefix reads of up to 500 keys, and one lease
// read per lease lock or permit (32 at a time). The result is sorted by
// key, and a semaphore's permits by token (oldest first), one Info each.
// Locks taken or freed during the walk may or may not appear.
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	start := b.etcdKey(prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	keyOf := func(kv *mvccpb.KeyValue) string { k, _ := b.lockKey(string(kv.Key)); return k }
	var list []core.Info
	for {
		resp, err := b.cli.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(listPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return nil, fmt.Errorf("etcdlock: list: %w", err)
		}
		kvs := make([]*mvccpb.KeyValue, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			if _, ok := b.lockKey(string(kv.Key)); ok {
				kvs = append(kvs, kv) // not a waiter key
			}
		}
		list = append(list, b.infos(ctx, kvs, keyOf)...)
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	slices.SortStableFunc(list, func(x, y core.Info) int {
		return cmp.Or(strings.Compare(x.Key, y.Key), cmp.Compare(x.Token, y.Token))
	})
	return list, nil
}

// ForceRelease implements core.Admin: it deletes exactly the incarnation of
// the key it read (same lease, same create revision), or of each permit of
// a semaphore, which wakes waiters. It never revokes a holder's lease:
// the other sessions of the holder's Backend share it. A holder learns of the loss at its next renewal, which finds
// its key gone.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return false, err
	}
	ctx = clientv3.WithRequireLeader(ctx)
	k := b.etcdKey(key)
	lo, hi := b.permitRange(key)
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(k), clientv3.OpGet(lo, clientv3.WithRange(hi))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdlock: force release: %w", err)
	}
	kvs := append(resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs...)
	if len(kvs) == 0 {
		return false, nil
	}
	now := time.Now()
	live := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		rec, _ := decode(kv.Value)
		live[string(kv.Key)] = !rec.slotOver(now)
	}
	deleted, err := b.deleteIncarnations(ctx, kvs)
	if err != nil {
		return false, fmt.Errorf("etcdlock: force release: %w", err)
	}
	released := false
	for _, ekey := range deleted {
		released = released || live[ekey]
	}
	return released, nil
}
