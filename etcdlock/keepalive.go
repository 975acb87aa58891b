package etcdlock

import (
	"context"
	"errors"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errClosed is what keepalives return once the Backend is closed.
var errClosed = errors.New("etcdlock: backend closed")

// keepalives sends lease keepalives on one LeaseKeepAlive stream that the
// Backend keeps open, so that a keepalive costs one message rather than a
// stream of its own. One goroutine reads the stream's replies and hands
// each to the caller waiting for that lease (replies come in request
// order); it runs while the stream is open and Close stops it and waits.
// The stream requires a leader: a member that loses its leader ends it,
// every waiting caller gets the error, and the next keepalive opens a new
// one.
type keepalives struct {
	cli *clientv3.Client

	mu      sync.Mutex // guards everything below, and serializes sends
	stream  etcdserverpb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	pending map[int64][]chan kaReply
	done    chan struct{} // closed when the reader of stream has ended
	closed  bool
}

type kaReply struct {
	ttl int64
	err error
}

func newKeepalives(cli *clientv3.Client) *keepalives {
	return &keepalives{cli: cli, pending: make(map[int64][]chan kaReply)}
}

// send queues a keepalive of each lease and returns one channel per lease
// that receives its reply, and the stream they went on.
func (k *keepalives) send(ids []int64) ([]chan kaReply, etcdserverpb.Lease_LeaseKeepAliveClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, nil, errClosed
	}
	if k.stream == nil {
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
		stream, err := etcdserverpb.NewLeaseClient(k.cli.ActiveConnection()).LeaseKeepAlive(ctx)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		k.stream, k.cancel, k.done = stream, cancel, make(chan struct{})
		go k.read(stream, k.done)
	}
	chans := make([]chan kaReply, len(ids))
	for i, id := range ids {
		c := make(chan kaReply, 1)
		chans[i] = c
		k.pending[id] = append(k.pending[id], c)
		if err := k.stream.Send(&etcdserverpb.LeaseKeepAliveRequest{ID: id}); err != nil {
			// The reader sees the broken stream too and fails every
			// waiting caller, these included.
			k.cancel()
			return chans, k.stream, nil
		}
	}
	return chans, k.stream, nil
}

// abandon ends stream if it is still the current one: a keepalive on it
// went unanswered for as long as its caller could wait, so the next one
// goes on a new stream (on whichever connection the client then picks).
func (k *keepalives) abandon(stream etcdserverpb.Lease_LeaseKeepAliveClient) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stream == stream && stream != nil {
		k.cancel()
	}
}

// read hands out the replies of stream until it fails, then fails every
// waiting caller and forgets the stream.
func (k *keepalives) read(stream etcdserverpb.Lease_LeaseKeepAliveClient, done chan struct{}) {
	defer close(done)
	for {
		resp, err := stream.Recv()
		k.mu.Lock()
		if err != nil {
			if k.stream == stream {
				k.cancel()
				k.stream = nil
			}
			for id, list := range k.pending {
				for _, c := range list {
					c <- kaReply{err: err}
				}
				delete(k.pending, id)
			}
			k.mu.Unlock()
			return
		}
		if list := k.pending[resp.ID]; len(list) > 0 {
			list[0] <- kaReply{ttl: resp.TTL}
			if len(list) == 1 {
				delete(k.pending, resp.ID)
			} else {
				k.pending[resp.ID] = list[1:]
			}
		}
		k.mu.Unlock()
	}
}

// keepAlive refreshes leases and returns their TTLs (0 for a lease that no
// longer exists), in order, or the first error. With abandon, a wait that
// ends with ctx also ends the stream (renewals wait until their sessions'
// deadlines: a stream that stays silent that long is stuck); claims, whose
// ctx may be short for reasons of their own, leave it open.
func (k *keepalives) keepAlive(ctx context.Context, ids []int64, abandon bool) ([]int64, error) {
	chans, stream, err := k.send(ids)
	if err != nil {
		return nil, err
	}
	ttls := make([]int64, len(ids))
	for i, c := range chans {
		select {
		case r := <-c:
			if r.err != nil {
				return nil, r.err
			}
			ttls[i] = r.ttl
		case <-ctx.Done():
			if abandon {
				k.abandon(stream)
			}
			return nil, ctx.Err()
		}
	}
	return ttls, nil
}

// close ends the stream and waits for its reader.
func (k *keepalives) close() {
	k.mu.Lock()
	k.closed = true
	done := k.done
	if k.cancel != nil {
		k.cancel()
	}
	k.mu.Unlock()
	if done != nil {
		<-done
	}
}
