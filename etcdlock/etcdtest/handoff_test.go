package etcdtest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// turnReads counts the transactions that read at a past revision: the
// Backend's reads of a key and its queue after a deletion (tellTurns), and
// nothing else it sends.
type turnReads struct{ n atomic.Int64 }

func (r *turnReads) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*etcdserverpb.TxnRequest); ok {
			for _, op := range append(txn.Success, txn.Failure...) {
				if rr := op.GetRequestRange(); rr != nil && rr.Revision != 0 {
					r.n.Add(1)
					break
				}
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// TestHandoffNoRead checks that the release of a lock with waiters of
// several processes in line costs no read: the Locker whose waiter is
// next knows it from its watch, which follows the line, and tells it; the
// Lockers whose waiters are further back do nothing. (Each used to read
// the key and its queue, and the holder's lease, after every release.)
// The first waiter gets the key.
func TestHandoffNoRead(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("handoff")
	holder := newLocker(t, c.Client(t), prefix)
	reads := &turnReads{}
	ttl := core.TTL(30 * time.Second)
	const n = 4
	waiters := make([]*core.Client, n)
	watches := make([]etcdtest.Counter, n) // a Locker's watch of the line is up once its client has one
	for i := range waiters {
		cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}
		cfg.DialOptions = append(watches[i].DialOptions(), reads.option())
		waiters[i] = newLocker(t, etcdtest.NewClient(t, cfg), prefix)
	}
	held, err := holder.TryAcquire(testenv.Context(t, 10*time.Second), "k", ttl)
	if err != nil {
		t.Fatal(err)
	}
	queue := func() int64 {
		r, err := admin.Get(testenv.Context(t, 5*time.Second), prefix+"\x00q\x00k\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int, n)
	for i, w := range waiters {
		go func() {
			s, err := w.Acquire(ctx, "k", ttl)
			if err != nil {
				return
			}
			got <- i
			<-ctx.Done()
			s.Release(context.Background())
		}()
		// In line one after the other: the order of the hand-off.
		deadline := time.Now().Add(10 * time.Second)
		for queue() < int64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d not in line within 10s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	up := testenv.WaitFor(10*time.Second, func() bool {
		for i := range watches {
			if watches[i].Watches.Load() == 0 {
				return false
			}
		}
		return true
	})
	if !up {
		t.Fatal("the waiting Lockers' watches not all up within 10s")
	}
	r0 := reads.n.Load()
	if err := held.Release(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-got:
		if i != 0 {
			t.Fatalf("waiter %d got the key first, not waiter 0", i)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter got the key within 10s of the release")
	}
	time.Sleep(300 * time.Millisecond) // reads that other Lockers would make
	if r := reads.n.Load() - r0; r != 0 {
		t.Fatalf("the waiting Lockers read the key and its queue %d times for one hand-off; want 0", r)
	}
}
