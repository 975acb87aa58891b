package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// A store that keeps waiters in line hands a released key to the first of
// them only: with 16 waiting processes one release costs one claim, not 16,
// and the key goes round in arrival order.
func TestQueueHandoffWakesOneInOrder(t *testing.T) {
	st := memlock.NewStore()
	const n = 16
	key := "queue-handoff"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	holder := newClient(t, st.Backend())
	s, err := holder.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu    sync.Mutex
		order []int
	)
	backends := make([]*memlock.Backend, n)
	var wg sync.WaitGroup
	for i := range n {
		backends[i] = st.Backend()
		c := newClient(t, backends[i])
		before := len(st.Waiting(key))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A long poll backoff: only a turn can explain a prompt wake.
			ws, err := c.Acquire(ctx, key, core.Backoff(10*time.Second, 10*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := ws.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		// Queue them one after the other, so the arrival order is known.
		for len(st.Waiting(key)) == before {
			if ctx.Err() != nil {
				t.Fatal("waiter never queued")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("acquisition order %v, want arrival order 0..%d", order, n-1)
		}
	}
	total := 0
	for _, b := range backends {
		total += b.Stats().Acquires
	}
	// Each waiter: one busy attempt that queued it, one claim on its turn;
	// a refresh of its place now and then (every queue TTL/3) is allowed.
	if total > 3*n {
		t.Fatalf("%d claims for %d hand-offs, want at most %d", total, n, 3*n)
	}
	t.Logf("%d claims for %d hand-offs", total, n)
	if w := st.Waiting(key); len(w) != 0 {
		t.Fatalf("queue left with %v", w)
	}
}

// A wait that ends without the lock leaves the line at once: the one behind
// it gets the key on the next release, not after the place expired.
func TestQueueCancelledWaiterLeaves(t *testing.T) {
	st := memlock.NewStore()
	key := "queue-cancel"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := make([]*core.Client, 3)
	for i := range cs {
		c := newClient(t, st.Backend())
		cs[i] = c
	}
	s, err := cs[0].TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := cs[1].Acquire(wctx, key, core.Backoff(10*time.Second, 10*time.Second))
		gaveUp <- err
	}()
	for len(st.Waiting(key)) < 1 {
		time.Sleep(time.Millisecond)
	}
	got := make(chan core.Session, 1)
	go func() {
		s, err := cs[2].Acquire(ctx, key, core.Backoff(10*time.Second, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	for len(st.Waiting(key)) < 2 {
		time.Sleep(time.Millisecond)
	}
	wcancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("cancelled wait acquired")
	}
	if w := st.Waiting(key); len(w) != 1 {
		t.Fatalf("queue after the cancelled wait left: %v, want one waiter", w)
	}
	start := time.Now()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case s2 := <-got:
		// The place of the cancelled wait would have kept the key from it
		// for the queue TTL (2s).
		if took := time.Since(start); took > 1500*time.Millisecond {
			t.Fatalf("next waiter took %v", took)
		}
		s2.Release(ctx)
	case <-ctx.Done():
		t.Fatal("next waiter never acquired")
	}
}
