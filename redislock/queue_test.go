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

func TestQueueFIFO(t *testing.T) {
	const rule = "waiters get the key in the order they queued; no barging by a caller without a place"
	e := newQueueEnv(t)
	const ttl = 10 * time.Second
	e.grant(acquireReq("k", 0))
	for i, w := range []string{"w1", "w2", "w3"} {
		e.busy(waitReq("k", i+1, w, ttl), true)
	}
	e.busy(waitReq("k", 2, "w2", ttl), true) // a refresh keeps w2's place
	e.release("k", 0)
	e.wantTurn("k", "w1")
	e.busy(acquireReq("k", 9), false)         // no barging
	e.busy(waitReq("k", 3, "w3", ttl), false) // not w3's turn
	e.busy(waitReq("k", 4, "w4", ttl), false) // w4 queues behind
	e.grant(waitReq("k", 1, "w1", ttl))
	e.release("k", 1)
	e.wantTurn("k", "w2")
	e.grant(waitReq("k", 2, "w2", ttl))
	e.release("k", 2)
	e.wantTurn("k", "w3")
	e.grant(waitReq("k", 3, "w3", ttl))
	e.release("k", 3)
	e.wantTurn("k", "w4")
	l := e.grant(waitReq("k", 4, "w4", ttl))
	e.release("k", 4)
	// Nobody is left: the release published nothing, and the queue is gone.
	noTurn(t, e.c, e.prefix, e.turns)
	q, qd := redislock.QueueKeys(e.prefix, "k")
	if n, err := e.c.Exists(e.ctx, q, qd).Result(); err != nil || n != 0 {
		t.Fatalf("rule %q: %d queue keys left (%v)", rule, n, err)
	}
	// The next claim still counts up.
	if l2 := e.grant(acquireReq("k", 5)); l2.Token <= l.Token {
		t.Fatalf("rule %q: token %d after %d", rule, l2.Token, l.Token)
	}
	e.release("k", 5)
	noTurn(t, e.c, e.prefix, e.turns)
}

// TestQueueExpiredWaiterSkipped: a waiter whose place expired does not
// block the ones behind it.
func TestQueueExpiredWaiterSkipped(t *testing.T) {
	e := newQueueEnv(t)
	e.grant(acquireReq("k", 0))
	e.busy(waitReq("k", 1, "dead", 50*time.Millisecond), true)
	e.busy(waitReq("k", 2, "live", 10*time.Second), true)
	time.Sleep(100 * time.Millisecond) // let "dead"'s place expire
	e.release("k", 0)
	e.wantTurn("k", "live")
	e.grant(waitReq("k", 2, "live", 10*time.Second))
	e.release("k", 2)
	noTurn(t, e.c, e.prefix, e.turns)
	// A late attempt of the dead waiter queues anew, behind nobody.
	e.grant(waitReq("k", 1, "dead", time.Second))
	e.release("k", 1)
	noTurn(t, e.c, e.prefix, e.turns)
}

// TestQueueLeave: Leave of the first waiter of a free key passes the turn
// on; others leave quietly.
func TestQueueLeave(t *testing.T) {
	e := newQueueEnv(t)
	const ttl = 10 * time.Second
	e.grant(acquireReq("k", 0))
	for i, w := range []string{"w1", "w2", "w3", "w4"} {
		e.busy(waitReq("k", i+1, w, ttl), true)
	}
	// Leaving while the key is held, or from the middle, tells nobody.
	if err := e.b.Leave(e.ctx, "k", "w2"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Leave(e.ctx, "k", "w1"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Leave(e.ctx, "k", "nobody"); err != nil {
		t.Fatal(err)
	}
	noTurn(t, e.c, e.prefix, e.turns)
	e.release("k", 0)
	e.wantTurn("k", "w3")
	// w3 gives up on its turn: w4 is told.
	if err := e.b.Leave(e.ctx, "k", "w3"); err != nil {
		t.Fatal(err)
	}
	e.wantTurn("k", "w4")
	e.grant(waitReq("k", 4, "w4", ttl))
	e.release("k", 4)
	noTurn(t, e.c, e.prefix, e.turns)
}

func TestQueueAfterExpiryAndForceRelease(t *testing.T) {
	const rule = "the queue holds after the holder's lease expires and after ForceRelease"
	e := newQueueEnv(t)
	const ttl = 10 * time.Second
	short := acquireReq("k", 0)
	short.TTL = 100 * time.Millisecond
	first := e.grant(short)
	e.busy(waitReq("k", 1, "w1", ttl), true)
	e.busy(waitReq("k", 2, "w2", ttl), true)
	// The lease expires: nothing is published, the record is gone, and the
	// queue still decides.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := e.c.Exists(e.ctx, redislock.LockKey(e.prefix, "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rule %q: lease did not expire", rule)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.busy(acquireReq("k", 9), false)
	e.busy(waitReq("k", 2, "w2", ttl), false)
	l1 := e.grant(waitReq("k", 1, "w1", ttl))
	if l1.Token <= first.Token {
		t.Fatalf("rule %q: token %d after %d", rule, l1.Token, first.Token)
	}
	ok, err := e.b.ForceRelease(e.ctx, "k")
	if err != nil || !ok {
		t.Fatalf("ForceRelease = %v %v", ok, err)
	}
	e.wantTurn("k", "w2")
	l2 := e.grant(waitReq("k", 2, "w2", ttl))
	if l2.Token <= l1.Token {
		t.Fatalf("rule %q: token %d after %d", rule, l2.Token, l1.Token)
	}
	e.release("k", 2)
	noTurn(t, e.c, e.prefix, e.turns)
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
