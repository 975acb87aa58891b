package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

type turn struct{ key, waiter string }

// watchTurns runs b.WatchTurns until the test ends and returns its turns.
func watchTurns(t *testing.T, b *redislock.Backend) <-chan turn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	turns := make(chan turn, 64)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := b.WatchTurns(ctx, func() { close(ready) }, func(key, waiter string) {
			turns <- turn{key, waiter}
		})
		if ctx.Err() == nil {
			t.Errorf("WatchTurns: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchTurns not ready")
	}
	return turns
}

func nextTurn(t *testing.T, turns <-chan turn) turn {
	t.Helper()
	select {
	case tn := <-turns:
		return tn
	case <-time.After(5 * time.Second):
		t.Fatal("no turn published")
	}
	return turn{}
}

// noTurn checks that nothing was published by the calls made so far: it
// publishes a marker of its own and expects it first.
func noTurn(t *testing.T, c redis.UniversalClient, prefix string, turns <-chan turn) {
	t.Helper()
	if err := c.Publish(context.Background(), prefix+":released", "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if tn := nextTurn(t, turns); tn.key != "marker" {
		t.Fatalf("published %+v, want nothing", tn)
	}
}

func waitReq(key string, i int, waiter string, ttl time.Duration) core.AcquireRequest {
	r := acquireReq(key, i)
	r.Waiter, r.WaiterTTL = waiter, ttl
	return r
}

func isBusy(err error, holder bool) bool {
	var na *core.NotAcquiredError
	return errors.As(err, &na) && (na.Holder != nil) == holder
}

type queueEnv struct {
	t      *testing.T
	c      redis.UniversalClient
	b      *redislock.Backend
	prefix string
	turns  <-chan turn
	ctx    context.Context
}

func newQueueEnv(t *testing.T) *queueEnv {
	c := sharedRedis(t)
	prefix := testenv.Name("dislocktest-")
	b := newBackend(t, c, prefix)
	return &queueEnv{t: t, c: c, b: b, prefix: prefix, turns: watchTurns(t, b), ctx: ctxT(t, 60*time.Second)}
}

func (e *queueEnv) grant(req core.AcquireRequest) core.Lease {
	e.t.Helper()
	l, err := e.b.TryAcquire(e.ctx, req)
	if err != nil {
		e.t.Fatalf("TryAcquire(%s, waiter %q): %v", req.Key, req.Waiter, err)
	}
	return l
}

func (e *queueEnv) busy(req core.AcquireRequest, holder bool) {
	e.t.Helper()
	_, err := e.b.TryAcquire(e.ctx, req)
	if !isBusy(err, holder) {
		e.t.Fatalf("TryAcquire(%s, waiter %q) = %v, want busy (holder known: %v)", req.Key, req.Waiter, err, holder)
	}
}

func (e *queueEnv) release(key string, i int) {
	e.t.Helper()
	if err := e.b.Release(e.ctx, core.ReleaseRequest{Key: key, OwnerToken: ownerToken(i)}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *queueEnv) wantTurn(key, waiter string) {
	e.t.Helper()
	if tn := nextTurn(e.t, e.turns); tn != (turn{key, waiter}) {
		e.t.Fatalf("turn %+v, want %s/%s", tn, key, waiter)
	}
}

// TestQueueKeysGone: a key's queue is two Redis keys while anyone is in
// line, and none once its last waiter is served.
func TestQueueKeysGone(t *testing.T) {
	e := newQueueEnv(t)
	q, qd := redislock.QueueKeys(e.prefix, "k")
	count := func() int64 {
		t.Helper()
		n, err := e.c.Exists(e.ctx, q, qd).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	e.grant(acquireReq("k", 0))
	e.busy(waitReq("k", 1, "w1", 10*time.Second), true)
	if n := count(); n != 2 {
		t.Fatalf("%d queue keys with a waiter in line, want 2", n)
	}
	e.release("k", 0)
	e.grant(waitReq("k", 1, "w1", 10*time.Second))
	if n := count(); n != 0 {
		t.Fatalf("%d queue keys left after the last waiter's grant", n)
	}
	e.release("k", 1)
}

// TestWatchGetsKeyOfTurn: a plain Watch consumer hears a turn as its key.
func TestWatchGetsKeyOfTurn(t *testing.T) {
	c := sharedRedis(t)
	prefix := testenv.Name("dislocktest-")
	b := newBackend(t, c, prefix)
	ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
	keys := make(chan string, 8)
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Watch(ctx, func() { close(ready) }, func(key string) { keys <- key })
	}()
	defer func() { cancel(); <-done }()
	<-ready
	if _, err := b.TryAcquire(ctx, acquireReq("k/1", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, waitReq("k/1", 1, "w", 10*time.Second)); !isBusy(err, true) {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k/1", OwnerToken: ownerToken(0)}); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-keys:
		if k != "k/1" {
			t.Fatalf("Watch got %q, want the key", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release message")
	}
}
