package locktest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of store-side waiter queues. They run when the engine runs the
// backend as a core.Queuer (core.QueuerOf) and are skipped otherwise. Each
// clause of core.Queuer's contract (the grant rule, places in line, dead
// waiters, turns) names the rules that check it: the waits through the
// engine here, the grant rule in queue_grant.go, the turns in
// queue_turns.go; the set-ups they share are here. A waiting Acquire on a
// Queuer sends every attempt with one Waiter id and the engine's queue TTL
// (2s), and re-attempts at least every third of it to keep its place in
// line.
//
// Existing rules that take a key right after a wait on it ended
// (AcquireHonoursContext) rely on the engine's Leave having run before
// Acquire returned: a waiter's place left behind would make the next
// TryAcquire busy (no barging) until the queue TTL ran out.

// queueRefresh is how often, at most, a queued wait re-attempts to keep its
// place (a third of the engine's 2s queue TTL, rounded down so that counts
// of attempts err on the generous side).
const queueRefresh = 600 * time.Millisecond

// noQueue is why a queue rule is skipped on a backend that keeps no queue.
const noQueue = "backend keeps no waiter queue (core.QueuerOf: not a core.Queuer, or a core.QueueKeeper that keeps none)"

// keepsQueue reports whether the engine runs b as a core.Queuer.
func keepsQueue(b core.Backend) bool {
	_, q := core.QueuerOf(b)
	return q
}

// queueProcs returns n processes, or skips the rule when the backend keeps
// no queue.
func queueProcs(t *testing.T, e *env, n int, opts ...core.ClientOption) []*proc {
	t.Helper()
	skipQueue(t, e)
	return procsIf(t, e, n, keepsQueue, noQueue, opts...)
}

// queueSetup returns n processes (queueProcs) and the subtest's key (key):
// the set-up most queue rules start from.
func queueSetup(t *testing.T, e *env, n int) ([]*proc, string) {
	t.Helper()
	return queueProcs(t, e, n), e.key(t)
}

// skipQueue skips a queue rule on a harness without release notifications:
// turns are notifications, so the rules cannot tell a turn from a poll
// there.
func skipQueue(t *testing.T, e *env) {
	t.Helper()
	skipIf(t, e.h.NoWatch, "queue turns need release notifications (NoWatch)")
}

// queueBackend is a Backend that keeps a waiter queue.
type queueBackend interface {
	core.Backend
	core.Queuer
}

// rawQueuer returns a new connection to the store, unwrapped, or skips the
// rule when the backend keeps no queue.
func rawQueuer(t *testing.T, e *env) queueBackend {
	t.Helper()
	skipQueue(t, e)
	q, ok := e.h.NewBackend(t).(queueBackend)
	skipIf(t, !ok || !keepsQueue(q), noQueue)
	return q
}

// startWait starts p's Acquire of key in the background and returns once it
// is queued on the store (an attempt with its Waiter was answered busy) and
// p's subscription to turns is in place, so that no turn meant for it is
// missed. The session, or the error, arrives on the returned channel; a
// session is released by whoever receives it.
func startWait(t *testing.T, rule string, p *proc, ctx context.Context, key string, opts ...core.Option) <-chan waitResult {
	t.Helper()
	out := make(chan waitResult, 1)
	n := p.fault.queuedBusy.Load()
	go func() {
		s, err := p.l.Acquire(ctx, key, opts...)
		out <- waitResult{s: s, err: err, at: time.Now()}
	}()
	if !waitFor(t, func() bool { return p.fault.queuedBusy.Load() > n }, 10*time.Second) {
		t.Fatalf("rule %q: the wait was never queued (no attempt with a Waiter answered busy)", rule)
	}
	if !waitFor(t, p.fault.watching.Load, 10*time.Second) {
		t.Fatalf("rule %q: the backend's WatchTurns never called ready", rule)
	}
	// An attempt sent before the subscription came up is followed by a
	// re-check (a release in between would have been missed): wait for a
	// busy attempt sent after it, so that no attempt of the wait is still
	// to come when the caller acts.
	ready := time.Unix(0, p.fault.readyAt.Load())
	if !waitFor(t, func() bool { return p.fault.queuedSince(ready) }, 10*time.Second) {
		t.Fatalf("rule %q: the wait made no attempt after its subscription came up", rule)
	}
	return out
}

// queueRaw queues waiter on key, which another holds, with one claim sent
// by b whose place is kept for wttl, and checks that the claim was
// answered busy; who names the waiter (in the messages and as the claim's
// Owner).
func queueRaw(t *testing.T, rule, who string, b core.Backend, key, waiter string, wttl time.Duration) {
	t.Helper()
	_, err := b.TryAcquire(ctxT(t, 10*time.Second), core.AcquireRequest{
		Key: key, Owner: who, OwnerToken: rand.Text(), TTL: checkTTL, Waiter: waiter, WaiterTTL: wttl})
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: %s's attempt = %v, want busy", rule, who, err)
	}
}

// testQueueWaiterID checks rule "a waiting Acquire on a Queuer names itself
// with one Waiter on all its attempts, another per Acquire, leaves the queue
// when it gives up, and TryAcquire sends no Waiter".
func testQueueWaiterID(t *testing.T, e *env) {
	const rule = "a waiting Acquire on a Queuer names itself with one Waiter on all its attempts, another per Acquire, leaves the queue when it gives up, and TryAcquire sends no Waiter"
	ps, k := queueSetup(t, e, 2)
	a, b := ps[0], ps[1]
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	defer s.Release(context.Background())
	mustBusy(t, rule, b, k)
	for range 2 {
		// Long enough for the store to answer at least once: a wait that
		// ctx ends before any answer is a failure, not busy.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := b.l.Acquire(ctx, k, core.Backoff(5*time.Millisecond, 20*time.Millisecond))
		cancel()
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("rule %q: Acquire = %v", rule, err)
		}
	}
	sent := b.fault.acquiresSent()
	if len(sent) < 4 || sent[0].waiter != "" {
		t.Fatalf("rule %q: attempts %+v: want a TryAcquire without Waiter, then two waits", rule, sent)
	}
	var ids []string
	for _, at := range sent[1:] {
		if at.waiter == "" {
			t.Fatalf("rule %q: an attempt of a wait sent no Waiter", rule)
		}
		if len(ids) == 0 || ids[len(ids)-1] != at.waiter {
			ids = append(ids, at.waiter)
		}
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Errorf("rule %q: two waits sent the Waiters %q, want one each, different", rule, ids)
	}
	// Each Leave is sent before its Acquire returns; on a slow store it
	// may reach the store after (core.DeadlineSlack).
	if !waitFor(t, func() bool { return b.fault.leaves.Load() >= 2 }, 10*time.Second) {
		t.Errorf("rule %q: %d Leave calls after two waits gave up, want 2", rule, b.fault.leaves.Load())
	}
	if s.Release(context.Background()) != nil {
		t.Fatal("Release failed")
	}
	s2 := mustAcquire(t, b, k) // the waits left: nobody is in line before a TryAcquire
	s2.Release(context.Background())
}

// testQueueFIFO checks rule "on a Queuer, waiters in separate processes get
// the key in the order they queued".
func testQueueFIFO(t *testing.T, e *env) {
	const rule = "on a Queuer, waiters in separate processes get the key in the order they queued"
	const waiters = 5
	ps, k := queueSetup(t, e, waiters+1)
	s := mustAcquire(t, ps[0], k, core.TTL(checkTTL))
	order := make(chan int, waiters)
	errc := make(chan error, waiters)
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	for i := 1; i <= waiters; i++ {
		// Short polls: every waiter keeps trying, and only the store's
		// order can keep them in line.
		res := startWait(t, rule, ps[i], ctx, k, core.Backoff(10*time.Millisecond, 50*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := <-res
			if r.err != nil {
				errc <- r.err
				return
			}
			order <- i // before the release: the next one cannot have it yet
			r.s.Release(context.Background())
		}()
	}
	s.Release(context.Background())
	wg.Wait()
	close(order)
	close(errc)
	for err := range errc {
		t.Fatalf("rule %q: %v", rule, err)
	}
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if want := []int{1, 2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("rule %q: acquired in the order %v, want %v", rule, got, want)
	}
}

// testQueueDeadWaiter checks rule "a waiter that stopped trying keeps its
// place until its WaiterTTL runs out, and then no longer blocks the ones
// behind it".
func testQueueDeadWaiter(t *testing.T, e *env) {
	const rule = "a waiter that stopped trying keeps its place until its WaiterTTL runs out, and then no longer blocks the ones behind it"
	// The dead waiter is of another process, or of the waiting process
	// itself (an earlier Acquire whose Leave was lost): the live waiter's
	// attempts keep its own place, never the dead one's.
	e.cases(t, []string{"OtherProcess", "SameProcess"}, func(t *testing.T, where, k string) {
		ps := queueProcs(t, e, 2)
		a, w := ps[0], ps[1]
		// In the same process, the dead waiter has the WaiterTTL that
		// the live one's attempts send (the engine's queue TTL), as
		// an earlier Acquire of that process had.
		var raw core.Backend = w.fault.Backend
		wttl := 2 * time.Second
		if where == "OtherProcess" {
			raw, wttl = rawQueuer(t, e), e.ttl/2
		}
		s := mustAcquire(t, a, k, core.TTL(checkTTL))
		sent := time.Now()
		queueRaw(t, rule, "the dead waiter", raw, k, "dead-"+rand.Text(), wttl)
		res := startWait(t, rule, w, ctxT(t, 30*time.Second), k, core.Backoff(10*time.Millisecond, 100*time.Millisecond))
		s.Release(context.Background()) // the turn goes to the dead waiter
		limit := wttl + 10*time.Second
		at := acquiredAt(t, rule, res, limit, fmt.Sprintf("the waiter behind a dead one did not get the key within %v", limit))
		// The store kept the dead waiter's place until at least sent +
		// wttl (its clock ran from after sent); allow 50ms for its
		// resolution.
		if d := at.Sub(sent); d < wttl-50*time.Millisecond {
			t.Errorf("rule %q: the waiter behind got the key %v after the dead one queued, before its WaiterTTL %v", rule, d, wttl)
		}
		if d := at.Sub(sent); d > wttl+3*time.Second {
			t.Errorf("rule %q: the waiter behind got the key only %v after the dead one queued (WaiterTTL %v)", rule, d, wttl)
		}
	})
}

// testQueueCancelled checks rule "a waiter whose ctx ends, or whose Locker
// closes, leaves the queue: the next waiter gets the key at the release, as
// if it had never queued".
func testQueueCancelled(t *testing.T, e *env) {
	const rule = "a waiter whose ctx ends, or whose Locker closes, leaves the queue: the next waiter gets the key at the release, as if it had never queued"
	e.cases(t, []string{"Cancel", "Close"}, func(t *testing.T, how, k string) {
		ps := queueProcs(t, e, 3)
		a, w1, w2 := ps[0], ps[1], ps[2]
		s := mustAcquire(t, a, k, core.TTL(checkTTL))
		// w1's place would outlive the rule if it stayed: only its
		// leaving explains w2 getting the key at the release.
		w1.fault.waiterTTL.Store(int64(time.Minute))
		ctx1, cancel1 := context.WithCancel(context.Background())
		defer cancel1()
		res1 := startWait(t, rule, w1, ctx1, k, core.Backoff(20*time.Second, 20*time.Second))
		res2 := startWait(t, rule, w2, ctxT(t, 60*time.Second), k, core.Backoff(20*time.Second, 20*time.Second))
		want := error(context.Canceled)
		if how == "Close" {
			want = core.ErrClosed
			if err := w1.l.Close(); err != nil {
				t.Errorf("rule %q: Close: %v", rule, err)
			}
		} else {
			cancel1()
		}
		select {
		case r := <-res1:
			if !errors.Is(r.err, want) {
				t.Fatalf("rule %q: the wait cut short returned %v, want %v", rule, r.err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("rule %q: the wait cut short did not return", rule)
		}
		released := time.Now()
		s.Release(context.Background())
		at := acquiredAt(t, rule, res2, 15*time.Second, "the next waiter did not get the key within 15s: the wait cut short kept its place")
		if d := at.Sub(released); d > 5*time.Second {
			t.Errorf("rule %q: the next waiter got the key %v after the release", rule, d)
		}
	})
}

// rawQueue is the set-up of the rules that check the queue with raw
// Backend calls: claims of one fresh key — of a mutex, or of permits of a
// semaphore of limit when limit > 1 — and checks of their answers.
type rawQueue struct {
	t         *testing.T
	rule, key string
	limit     int
	ctx       context.Context
	held      []core.AcquireRequest // the claims granted, in order
}

func newRawQueue(t *testing.T, e *env, rule string, limit int) *rawQueue {
	return &rawQueue{t: t, rule: rule, key: e.key(t), limit: limit, ctx: ctxT(t, 30*time.Second)}
}

// req is a new claim of the key, queued as waiter unless waiter is empty.
func (q *rawQueue) req(waiter string) core.AcquireRequest {
	r := core.AcquireRequest{Key: q.key, Owner: "raw", OwnerToken: rand.Text(), TTL: checkTTL, Limit: q.limit}
	if waiter != "" {
		r.Waiter, r.WaiterTTL = waiter, checkTTL
	}
	return r
}

// grant checks that b grants r (what names it) and releases it when the
// rule ends.
func (q *rawQueue) grant(b core.Backend, r core.AcquireRequest, what string) core.Lease {
	q.t.Helper()
	l, err := b.TryAcquire(q.ctx, r)
	if err != nil {
		q.t.Fatalf("rule %q: %s: TryAcquire = %v, want granted", q.rule, what, err)
	}
	q.held = append(q.held, r)
	q.t.Cleanup(func() {
		b.Release(context.Background(), core.ReleaseRequest{Key: q.key, OwnerToken: r.OwnerToken, Limit: q.limit})
	})
	return l
}

// busy checks that b answers r (what names it) busy; a grant is undone.
func (q *rawQueue) busy(b core.Backend, r core.AcquireRequest, what string) {
	q.t.Helper()
	if _, err := b.TryAcquire(q.ctx, r); !errors.Is(err, core.ErrNotAcquired) {
		if err == nil {
			b.Release(q.ctx, core.ReleaseRequest{Key: q.key, OwnerToken: r.OwnerToken, Limit: q.limit})
		}
		q.t.Fatalf("rule %q: %s: TryAcquire = %v, want busy", q.rule, what, err)
	}
}

// release releases the lease r claimed, with b.
func (q *rawQueue) release(b core.Backend, r core.AcquireRequest) {
	q.t.Helper()
	if err := b.Release(q.ctx, core.ReleaseRequest{Key: q.key, OwnerToken: r.OwnerToken, Limit: q.limit}); err != nil {
		q.t.Fatalf("rule %q: release: %v", q.rule, err)
	}
}

// semQueue is the raw set-up of the semaphore grant rules: a limit-3
// semaphore on a fresh key, a holder's three permits, and a turn log.
type semQueue struct {
	*rawQueue
	holder, wait queueBackend
	turns        *turnLog
}

const semQueueLimit = 3

// newSemQueue returns a semQueue whose semaphore is full, and the names of
// the waiters it then queued, in order: each was answered busy.
func newSemQueue(t *testing.T, e *env, rule string, waiters int) (*semQueue, []string) {
	t.Helper()
	holder, wait := rawQueuer(t, e), rawQueuer(t, e)
	_, sem := holder.(core.SemaphoreBackend)
	skipIf(t, !sem, noSemaphores)
	q := &semQueue{rawQueue: newRawQueue(t, e, rule, semQueueLimit), holder: holder, wait: wait}
	q.turns = watchTurns(t, rule, wait, q.key) // where the waiters queued
	for range semQueueLimit {
		q.grant(holder, q.req(""), "a holder's permit")
	}
	ws := make([]string, waiters)
	for i := range ws {
		ws[i] = q.queueWaiter(fmt.Sprintf("waiter %d on a full semaphore", i+1))
	}
	return q, ws
}

// queueWaiter queues a new waiter, whose claim is answered busy (what
// names it in the messages), and returns its name.
func (q *semQueue) queueWaiter(what string) string {
	q.t.Helper()
	w := "w-" + rand.Text()
	q.busy(q.wait, q.req(w), what)
	return w
}

// releaseHeld releases the i-th permit granted, with the holder's backend.
func (q *semQueue) releaseHeld(i int) {
	q.t.Helper()
	q.release(q.holder, q.held[i])
}
