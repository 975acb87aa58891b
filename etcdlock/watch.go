package etcdlock

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watch implements core.Watcher with one watch on the prefix that reports
// deletions only: a release, a revoked or expired lease, a forced release.
// It requires a leader, so a member cut off from the cluster ends the watch
// instead of going silent, and the engine falls back to polling.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	ch := b.cli.Watch(wctx, b.prefix, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for resp := range ch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("etcdlock: watch: %w", err)
		}
		if resp.Created {
			ready()
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				if key, ok := b.lockKey(string(ev.Kv.Key)); ok {
					b.markFree(key) // the next claim writes at once
					fn(key)         // a lock, or one permit of a semaphore
				}
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("etcdlock: watch: closed")
}
