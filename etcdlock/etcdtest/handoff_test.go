package etcdtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestHandoffNoRead checks that a release with waiters of several
// processes in line costs no read: the Locker whose waiter is next knows
// it from its watch, which follows the line, and tells it; the others do
// nothing. The hand-off to the first of four waiting Lockers costs their
// clients one unary call, the claim, not a read (and a read of the
// holder's lease) in every Locker with a waiter. The first waiter gets the
// key.
func TestHandoffNoRead(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("handoff")
	holder := newLocker(t, c.Client(t), prefix)
	cnt := &counter{}
	ttl := core.TTL(30 * time.Second)
	const n = 4
	waiters := make([]*core.Client, n)
	for i := range waiters {
		cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}
		cfg.DialOptions = append(cfg.DialOptions, cnt.options()...)
		waiters[i] = newLocker(t, etcdtest.NewClient(t, cfg), prefix)
		// An Acquire starts the Locker's turn watch.
		s, err := waiters[i].Acquire(testenv.Context(t, 10*time.Second), fmt.Sprint("warm", i), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Release(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
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
	time.Sleep(300 * time.Millisecond) // the waiters' attempts are over
	u0 := cnt.unary.Load()
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
	if u := cnt.unary.Load() - u0; u != 1 {
		t.Fatalf("the waiting Lockers sent %d unary calls for one hand-off; want 1: the next waiter's claim", u)
	}
}
