package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Watch implements core.Watcher with one watch on the prefix that reports
// deletions only: a release, a revoked or expired lease, a forced release.
// It requires a leader, so a member cut off from the cluster ends the watch
// instead of going silent, and the engine falls back to polling.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	return b.watchPrefix(ctx, 0, true, ready, func(events []*mvccpb.Event) {
		for _, ev := range events {
			if ev.Type == mvccpb.DELETE {
				if key, ok := b.lockKey(string(ev.Kv.Key)); ok {
					b.markFree(key) // the next claim writes at once
					fn(key)         // a lock, or one permit of a semaphore
				}
			}
		}
	})
}

// watchPrefix watches every key under the prefix from revision rev (0:
// from now; noPut: deletions only), requiring a leader, and gives fn the
// events of each watch response, in order; ready is called once the watch
// is in place. It returns when ctx ends, the leader is lost or the watch is
// cancelled (a compaction, say): the caller falls back to polling.
//
// With clientv3's own Watcher the watch is one gRPC stream of the Watch
// service on the client's connection, read by the goroutine that calls fn:
// clientv3's Watcher passes each response through three goroutines of its
// own before its reader gets it, and every Locker of a line reads every
// hand-off's events, at the moment of the hand-off. A client whose Watcher
// is not clientv3's (a namespace, a wrapper) is watched through it.
func (b *Backend) watchPrefix(ctx context.Context, rev int64, noPut bool, ready func(), fn func([]*mvccpb.Event)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	err := b.watchVia(wctx, rev, noPut, ready, fn)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (b *Backend) watchVia(ctx context.Context, rev int64, noPut bool, ready func(), fn func([]*mvccpb.Event)) error {
	if !b.txns.direct || reflect.TypeOf(b.cli.Watcher) != ownWatcherType {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		if noPut {
			opts = append(opts, clientv3.WithFilterPut())
		}
		for resp := range b.cli.Watch(ctx, b.prefix, opts...) {
			if err := resp.Err(); err != nil {
				return fmt.Errorf("etcdlock: watch: %w", err)
			}
			if resp.Created {
				ready()
			}
			fn(resp.Events)
		}
		return errors.New("etcdlock: watch: closed")
	}
	// next is the revision to watch from: rev, then the one after the
	// last event read. A stream that breaks (the connection lost, the
	// member gone) is opened again from there, as clientv3's Watcher does:
	// no event is missed (a grant, say, which only its waiter's watch
	// reports). A lost leader, a compaction or a cancellation ends the
	// watch.
	next, ready1 := rev, ready
	wait := 50 * time.Millisecond
	for {
		err := b.watchStream(ctx, next, noPut, func() {
			ready1()
			ready1 = func() {}
			wait = 50 * time.Millisecond
		}, func(resp *etcdserverpb.WatchResponse) {
			if next == 0 && resp.Created {
				next = resp.Header.Revision + 1 // from now: what comes after the watch's start
			}
			if n := len(resp.Events); n > 0 {
				next = resp.Events[n-1].Kv.ModRevision + 1
				fn(resp.Events)
			}
		})
		var se *streamError
		if !errors.As(err, &se) || ctx.Err() != nil || errors.Is(rpctypes.Error(se.err), rpctypes.ErrNoLeader) {
			return err
		}
		if c := status.Code(se.err); c != codes.Unavailable && c != codes.Internal {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// streamError is a watch stream that broke: opened, sent to or read from.
type streamError struct{ err error }

func (e *streamError) Error() string { return "etcdlock: watch: " + rpctypes.Error(e.err).Error() }
func (e *streamError) Unwrap() error { return rpctypes.Error(e.err) }

// watchStream opens one watch stream from revision rev (0: from now) and
// gives fn its responses until it breaks (a *streamError), is cancelled
// or compacted, or ctx ends. created is called at its creation.
func (b *Backend) watchStream(ctx context.Context, rev int64, noPut bool, created func(), fn func(*etcdserverpb.WatchResponse)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := etcdserverpb.NewWatchClient(b.cli.ActiveConnection()).Watch(ctx, b.txns.opts...)
	if err != nil {
		return &streamError{err}
	}
	create := &etcdserverpb.WatchCreateRequest{Key: []byte(b.prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(b.prefix)), StartRevision: rev}
	if noPut {
		create.Filters = []etcdserverpb.WatchCreateRequest_FilterType{etcdserverpb.WatchCreateRequest_NOPUT}
	}
	if err := stream.Send(&etcdserverpb.WatchRequest{RequestUnion: &etcdserverpb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
		return &streamError{err}
	}
	for {
		resp, err := stream.Recv()
		switch {
		case err != nil:
			return &streamError{err}
		case resp.CompactRevision != 0:
			return fmt.Errorf("etcdlock: watch: %w", rpctypes.ErrCompacted)
		case resp.Canceled:
			return fmt.Errorf("etcdlock: watch: cancelled: %s", resp.CancelReason)
		}
		if resp.Created {
			created()
		}
		fn(resp)
	}
}

// ownWatcherType is the type of clientv3's own Watcher.
var ownWatcherType = reflect.TypeOf(clientv3.NewWatchFromWatchClient(nil, nil))
