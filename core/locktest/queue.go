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

// Rules of store-side waiter queues. They run when the backend is a
// core.Queuer and are skipped otherwise. Each clause of core.Queuer's
// contract (the grant rule, places in line, dead waiters, turns) names the
// rules here that check it. A waiting Acquire on a Queuer
// sends every attempt with one Waiter id and the engine's queue TTL (2s),
// and re-attempts at least every third of it to keep its place in line.
//
// Existing rules that take a key right after a wait on it ended
// (AcquireHonoursContext) rely on the engine's Leave having run before
// Acquire returned: a waiter's place left behind would make the next
// TryAcquire busy (no barging) until the queue TTL ran out.

// queueRefresh is how often, at most, a queued wait re-attempts to keep its
// place (a third of the engine's 2s queue TTL, rounded down so that counts
// of attempts err on the generous side).
const queueRefresh = 600 * time.Millisecond

// queueProcs returns n processes, or skips the rule when the backend keeps
// no queue.
func queueProcs(t *testing.T, e *env, n int, opts ...core.ClientOption) []*proc {
	t.Helper()
	skipQueue(t, e)
	return procsWith[core.Queuer](t, e, n, "backend keeps no waiter queue (not a core.Queuer)", opts...)
}

// skipQueue skips a queue rule on a harness whose store keeps no queue
// (NoQueue), or has no release notifications: turns are notifications, so
// the rules cannot tell a turn from a poll there.
func skipQueue(t *testing.T, e *env) {
	t.Helper()
	switch {
	case e.h.NoQueue:
		t.Skip("the store keeps no waiter queue (NoQueue)")
	case e.h.NoWatch:
		t.Skip("queue turns need release notifications (NoWatch)")
	}
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
	if !ok {
		t.Skip("backend keeps no waiter queue (not a core.Queuer)")
	}
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

// waitResult is the outcome of a wait started in the background: its
// session, its error and when it returned.
type waitResult struct {
	s   core.Session
	err error
	at  time.Time
}

// acquired waits for the result of a wait on res, up to limit, and returns
// it: the wait acquired. A failed wait fails t; one with no result within
// limit fails t with late.
func acquired(t *testing.T, rule string, res <-chan waitResult, limit time.Duration, late string) waitResult {
	t.Helper()
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("rule %q: %v", rule, r.err)
		}
		return r
	case <-time.After(limit):
		t.Fatalf("rule %q: %s", rule, late)
		return waitResult{}
	}
}

// acquiredAt is acquired with the session released: it returns when the
// wait acquired.
func acquiredAt(t *testing.T, rule string, res <-chan waitResult, limit time.Duration, late string) time.Time {
	t.Helper()
	r := acquired(t, rule, res, limit, late)
	r.s.Release(context.Background())
	return r.at
}

// testQueueWaiterID checks rule "a waiting Acquire on a Queuer names itself
// with one Waiter on all its attempts, another per Acquire, leaves the queue
// when it gives up, and TryAcquire sends no Waiter".
func testQueueWaiterID(t *testing.T, e *env) {
	const rule = "a waiting Acquire on a Queuer names itself with one Waiter on all its attempts, another per Acquire, leaves the queue when it gives up, and TryAcquire sends no Waiter"
	ps := queueProcs(t, e, 2)
	a, b := ps[0], ps[1]
	k := e.key(t)
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
	ps := queueProcs(t, e, waiters+1)
	k := e.key(t)
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
	base := e.key(t)
	// The dead waiter is of another process, or of the waiting process
	// itself (an earlier Acquire whose Leave was lost): the live waiter's
	// attempts keep its own place, never the dead one's.
	for _, where := range []string{"OtherProcess", "SameProcess"} {
		t.Run(where, func(t *testing.T) {
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
			k := base + "/" + where
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
}

// testQueueCancelled checks rule "a waiter whose ctx ends, or whose Locker
// closes, leaves the queue: the next waiter gets the key at the release, as
// if it had never queued".
func testQueueCancelled(t *testing.T, e *env) {
	const rule = "a waiter whose ctx ends, or whose Locker closes, leaves the queue: the next waiter gets the key at the release, as if it had never queued"
	base := e.key(t)
	for _, how := range []string{"Cancel", "Close"} {
		t.Run(how, func(t *testing.T) {
			ps := queueProcs(t, e, 3)
			a, w1, w2 := ps[0], ps[1], ps[2]
			k := base + "/" + how
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
}

// turnLog subscribes to a Queuer's turns and keeps those of one key.
type turnLog struct {
	key   string
	turns chan string
	stop  func()
	// skip names waiters whose turns expect passes over: turns a store may
	// send but need not.
	skip map[string]bool
}

func watchTurns(t *testing.T, rule string, q core.Queuer, key string) *turnLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &turnLog{key: key, turns: make(chan string, 64)}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		q.WatchTurns(ctx, func() { once.Do(func() { close(ready) }) }, func(k, waiter string) {
			if k == key {
				select {
				case l.turns <- waiter:
				default:
				}
			}
		})
	}()
	l.stop = func() { cancel(); <-done }
	t.Cleanup(l.stop)
	select {
	case <-ready:
	case <-done:
		t.Fatalf("rule %q: WatchTurns ended before it was ready", rule)
	case <-time.After(10 * time.Second):
		t.Fatalf("rule %q: WatchTurns never called ready", rule)
	}
	return l
}

// expect waits for the next turn of the key and checks it names waiter.
func (l *turnLog) expect(t *testing.T, rule, what, waiter string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case got := <-l.turns:
			if l.skip[got] {
				continue
			}
			if got != waiter {
				t.Errorf("rule %q: %s: the turn named %q, want %q", rule, what, got, waiter)
			}
			return
		case <-timeout:
			t.Errorf("rule %q: %s: no turn within 5s", rule, what)
			return
		}
	}
}

// testQueueNoBarging checks rule "on a Queuer a caller that did not wait
// never overtakes a queued waiter, nor after a ForceRelease or the expiry
// of the holder's lease; a release or a ForceRelease tells the first
// waiter, a grant takes it out of line; a Leave while the key is held and a
// release with nobody queued send no turn; a free key with waiters is not
// held", with raw Backend calls.
func testQueueNoBarging(t *testing.T, e *env) {
	const rule = "on a Queuer a caller that did not wait never overtakes a queued waiter, nor after a ForceRelease or the expiry of the holder's lease; a release or a ForceRelease tells the first waiter, a grant takes it out of line; a Leave while the key is held and a release with nobody queued send no turn; a free key with waiters is not held"
	holder, waiter, other := rawQueuer(t, e), rawQueuer(t, e), rawQueuer(t, e)
	q := newRawQueue(t, e, rule, 0)
	k, ctx := q.key, q.ctx
	// Turns are read where the waiters queued: a store need tell no other
	// process (core.Queuer).
	turns := watchTurns(t, rule, waiter, k)

	h := q.req("")
	l0 := q.grant(holder, h, "the first claim")
	w0, w1, w2 := "w0-"+rand.Text(), "w1-"+rand.Text(), "w2-"+rand.Text()
	q.busy(other, q.req(w0), "a waiter on a held key")
	q.busy(waiter, q.req(w1), "a second waiter on a held key")
	// A turn sent for this Leave would name w1 and come before the
	// release's: the turns that follow would each be one behind.
	if err := other.Leave(ctx, k, w0); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
	q.release(holder, h)
	turns.expect(t, rule, "release with a waiter queued", w1)
	adm, isAdmin := other.(core.Admin)
	isAdmin = isAdmin && !e.h.NoAdmin
	if isAdmin {
		if info, held, err := adm.Inspect(ctx, k); err != nil || held {
			t.Errorf("rule %q: Inspect of a free key with a waiter = %+v %v %v, want free", rule, info, held, err)
		}
		list, err := adm.List(ctx, k)
		if err != nil || slices.ContainsFunc(list, func(i core.Info) bool { return i.Key == k }) {
			t.Errorf("rule %q: List of a free key with a waiter = %+v %v, want it absent", rule, list, err)
		}
	}
	q.busy(other, q.req(""), "a TryAcquire without Waiter while a waiter is queued on the free key")
	q.busy(waiter, q.req(w2), "a second waiter while the first is queued on the free key")
	g1 := q.req(w1)
	l1 := q.grant(waiter, g1, "the first waiter on the free key")
	if !e.h.NoFencing && l1.Token <= l0.Token {
		t.Errorf("rule %q: token %d after %d", rule, l1.Token, l0.Token)
	}
	q.release(waiter, g1)
	turns.expect(t, rule, "release with the second waiter queued", w2)
	q.busy(holder, q.req(""), "a TryAcquire without Waiter while the second waiter is queued")
	g2 := q.req(w2)
	q.grant(waiter, g2, "the second waiter")
	q.release(waiter, g2) // nobody queued: no turn
	// Both grants took their waiter out of line: the key is anyone's.
	h = q.req("")
	q.grant(holder, h, "a TryAcquire once every waiter got its turn")
	q.release(holder, h) // nobody queued: no turn
	if err := holder.Leave(ctx, k, "nobody-"+rand.Text()); err != nil {
		t.Errorf("rule %q: Leave of a waiter not in line = %v, want nil", rule, err)
	}
	// freshTurn queues a new waiter on a held key and releases it: the
	// turn expected names that waiter, so a turn sent since the last one
	// expected, which would come first, is caught.
	freshTurn := func(what string) string {
		t.Helper()
		h := q.req("")
		q.grant(holder, h, "a claim")
		w := "w-" + rand.Text()
		q.busy(waiter, q.req(w), "a waiter")
		q.release(holder, h)
		turns.expect(t, rule, what, w)
		return w
	}
	w3 := freshTurn("the first turn after a release with nobody queued")
	// The queue outlives its holder: a ForceRelease tells the first waiter.
	g3 := q.req(w3)
	q.grant(waiter, g3, "the waiter told its turn")
	w4 := "w4-" + rand.Text()
	q.busy(waiter, q.req(w4), "a second waiter of the holder's process")
	if isAdmin {
		if released, err := adm.ForceRelease(ctx, k); err != nil || !released {
			t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
		}
		turns.expect(t, rule, "ForceRelease with a waiter queued", w4)
		q.busy(holder, q.req(""), "a TryAcquire without Waiter after a ForceRelease, a waiter queued")
	} else {
		q.release(waiter, g3)
		turns.expect(t, rule, "release with a waiter queued", w4)
	}
	g4 := q.req(w4)
	q.grant(waiter, g4, "the waiter told by the ForceRelease")
	q.release(waiter, g4)
	// A lease that expires keeps the queue too: the waiter, trying again,
	// gets the key, and a caller that did not wait is busy until it does.
	// The store need not tell the waiter when the lease runs out, but may
	// (a ZooKeeper waiter's backend times the holder's lease).
	short := q.req("")
	short.TTL = 300 * time.Millisecond
	q.grant(holder, short, "a short lease")
	w5 := "w5-" + rand.Text()
	turns.skip = map[string]bool{w5: true}
	g5 := q.req(w5)
	q.busy(waiter, g5, "a waiter on a short lease")
	granted := waitFor(t, func() bool {
		q.busy(holder, q.req(""), "a TryAcquire without Waiter, a waiter queued, before and after the lease expired")
		_, err := waiter.TryAcquire(ctx, g5)
		if err != nil && !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("rule %q: the waiter's try = %v", rule, err)
		}
		return err == nil
	}, 10*time.Second)
	if !granted {
		t.Fatalf("rule %q: the waiter did not get the key within 10s of the holder's lease of %v", rule, short.TTL)
	}
	q.release(waiter, g5)
	w6 := freshTurn("the first turn after an expiry and a release with nobody queued")
	if err := waiter.Leave(ctx, k, w6); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}

// testQueueSemaphore checks rule "on a Queuer semaphore a queued waiter is
// not overtaken for a freed permit by a caller that did not wait".
func testQueueSemaphore(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a queued waiter is not overtaken for a freed permit by a caller that did not wait"
	holder, waiter, other := rawQueuer(t, e), rawQueuer(t, e), rawQueuer(t, e)
	if _, ok := holder.(core.SemaphoreBackend); !ok {
		t.Skip("backend has no semaphores (not a core.SemaphoreBackend)")
	}
	q := newRawQueue(t, e, rule, 2)
	q.grant(holder, q.req(""), "a permit")
	q.grant(holder, q.req(""), "a permit")
	w := "w-" + rand.Text()
	q.busy(waiter, q.req(w), "a waiter on a full semaphore")
	q.release(holder, q.held[0])
	q.busy(other, q.req(""), "a TryAcquire without Waiter, the permit freed for a waiter")
	g := q.req(w)
	q.grant(waiter, g, "the waiter's claim of the freed permit")
	q.release(waiter, g)
}

// testQueueLeavePassesTurn checks rule "when the first waiter of a free key
// leaves, the next waiter is told at once".
func testQueueLeavePassesTurn(t *testing.T, e *env) {
	const rule = "when the first waiter of a free key leaves, the next waiter is told at once"
	log := &acquireLog{}
	ps := queueProcs(t, e, 2, core.WithObserver(log))
	a, w := ps[0], ps[1]
	raw := rawQueuer(t, e)
	k := e.key(t)
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	first := "first-" + rand.Text()
	queueRaw(t, rule, "the first waiter", raw, k, first, time.Minute)
	res := startWait(t, rule, w, ctxT(t, 30*time.Second), k, core.Backoff(20*time.Second, 20*time.Second))
	s.Release(context.Background()) // the turn is the first waiter's, who is not listening
	// Leave soon after one of w's attempts was answered busy: its next
	// refresh of its place is then a good while away, so only the turn
	// Leave sends explains a prompt wake.
	expectWokenAfterBusy(t, rule, "the first waiter's Leave", w, time.Now().Add(-queueRefresh/3), log, res, func() {
		if err := raw.Leave(ctxT(t, 10*time.Second), k, first); err != nil {
			t.Fatalf("rule %q: Leave = %v", rule, err)
		}
	})
}

// testQueueOneWake checks rule "on a Queuer one release wakes one waiter
// across all processes: a hand-off costs at most two attempts, besides the
// waits' refreshes of their places".
func testQueueOneWake(t *testing.T, e *env) {
	const rule = "on a Queuer one release wakes one waiter across all processes: a hand-off costs at most two attempts, besides the waits' refreshes of their places"
	const waiters = 8
	ps := queueProcs(t, e, waiters+1)
	k := e.key(t)
	s := mustAcquire(t, ps[0], k, core.TTL(checkTTL))
	ctx := ctxT(t, 60*time.Second)
	results := make([]<-chan waitResult, waiters)
	for i := range waiters {
		// A long poll backoff: only turns (and refreshes) make attempts.
		results[i] = startWait(t, rule, ps[i+1], ctx, k, core.Backoff(20*time.Second, 20*time.Second))
	}
	base := make([]int64, waiters)
	for i := range waiters {
		base[i] = ps[i+1].fault.attempts.Load()
	}
	start := time.Now()
	s.Release(context.Background())
	var wg sync.WaitGroup
	waited := make([]time.Duration, waiters)
	errs := make(chan error, waiters)
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case r := <-results[i]:
				if r.err != nil {
					errs <- r.err
					return
				}
				waited[i] = r.at.Sub(start)
				r.s.Release(context.Background())
			case <-time.After(45 * time.Second):
				errs <- fmt.Errorf("rule %q: waiter %d never got the key", rule, i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var attempts, allowed int64
	for i := range waiters {
		attempts += ps[i+1].fault.attempts.Load() - base[i]
		allowed += 2 + int64(waited[i]/queueRefresh) + 1
	}
	t.Logf("%d hand-offs: %d attempts (allowed %d)", waiters, attempts, allowed)
	if attempts > allowed {
		t.Errorf("rule %q: %d attempts for %d hand-offs, want at most %d (2 each plus refreshes over the waits %v)",
			rule, attempts, waiters, allowed, waited)
	}
}

// polledShare is the share of hand-offs in testQueueHandoffPrompt that may
// be granted at a queued wait's fallback poll rather than after a turn: a
// poll that happens to be in flight when the release before it lands.
const polledShare = 0.1

// testQueueHandoffPrompt checks rule "on a Queuer every waiter is told its
// turn: waiters that call Acquire at once on a key never used before, from
// one process or several, each get the key within a few round trips of the
// release before theirs, never at the fallback poll" — of a lock, and of a
// semaphore's permits.
func testQueueHandoffPrompt(t *testing.T, e *env) {
	const rule = "on a Queuer every waiter is told its turn: waiters that call Acquire at once on a key never used before, from one process or several, each get the key within a few round trips of the release before theirs, never at the fallback poll"
	ps := queueProcs(t, e, 4)
	_, sem := ps[0].fault.Backend.(core.SemaphoreBackend)
	for _, c := range []struct {
		name  string
		ps    []*proc
		limit int
	}{{"OneLocker", ps[:1], 1}, {"FourLockers", ps, 1}, {"SemaphoreOneLocker", ps[:1], 2}, {"SemaphoreFourLockers", ps, 2}} {
		t.Run(c.name, func(t *testing.T) {
			if c.limit > 1 && !sem {
				t.Skip("backend has no semaphores (not a core.SemaphoreBackend)")
			}
			handoffPrompt(t, e, rule, c.ps, c.limit)
		})
	}
}

// handoffPrompt runs rounds of 16 waiters from ps on fresh keys (permits of
// a semaphore of limit when limit > 1) and checks that the waiters were
// granted after a turn told to them, not at their fallback poll: an attempt
// that took the key without a turn since the wait's attempt before it. (A
// count, not a time: a loaded machine slows turns and polls alike.) The
// lags, from the release that freed a permit to the acquisition it
// allowed, are logged.
func handoffPrompt(t *testing.T, e *env, rule string, ps []*proc, limit int) {
	const waiters, rounds = 16, 3
	ctx := ctxT(t, 60*time.Second)
	opts := []core.Option{core.TTL(checkTTL)}
	if limit > 1 {
		opts = append(opts, core.Limit(limit))
	}
	// Bring every subscription up first: a turn sent before a
	// subscription is in place is caught by the re-check that follows
	// it, which is not what this rule measures.
	for _, p := range ps {
		s, err := p.l.Acquire(ctx, e.key(t)+"-warm", opts...)
		if err != nil {
			t.Fatalf("warm-up acquire: %v", err)
		}
		s.Release(context.Background())
		if !waitFor(t, p.fault.watching.Load, 10*time.Second) {
			t.Fatalf("rule %q: the backend's WatchTurns never called ready", rule)
		}
	}
	var lags []time.Duration
	keys := map[string]bool{}
	for r := range rounds {
		k := fmt.Sprintf("%s-%d", e.key(t), r)
		keys[k] = true
		got := make([]time.Time, waiters)
		released := make([]time.Time, waiters)
		errs := make(chan error, waiters)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range waiters {
			p := ps[i%len(ps)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				s, err := p.l.Acquire(ctx, k, opts...)
				if err != nil {
					errs <- err
					return
				}
				got[i] = time.Now()
				time.Sleep(time.Millisecond) // the work under the lock
				released[i] = time.Now()
				if err := s.Release(context.Background()); err != nil {
					errs <- err
				}
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("rule %q: %v", rule, err)
		}
		// The first limit acquisitions wait for nobody; the n-th after
		// them for the n-th release.
		slices.SortFunc(got, time.Time.Compare)
		slices.SortFunc(released, time.Time.Compare)
		for i, g := range got {
			from := t0
			if i >= limit {
				from = released[i-limit]
			}
			lags = append(lags, max(g.Sub(from), 0))
		}
	}
	slices.Sort(lags)
	p50, p90, worst := lags[len(lags)/2], lags[len(lags)*9/10], lags[len(lags)-1]
	t.Logf("%d hand-offs: lag p50 %v, p90 %v, max %v", len(lags), p50, p90, worst)
	fs := make([]*faultBackend, len(ps))
	for i, p := range ps {
		fs[i] = p.fault
	}
	polled, grants := polledGrants(fs, keys)
	t.Logf("%d grants after a wait, %d of them without a turn", grants, polled)
	if allowed := int(polledShare * float64(rounds*(waiters-limit))); polled > allowed {
		t.Errorf("rule %q: %d of %d waiters were granted at their fallback poll, without a turn (allowed %d; lag p50 %v, p90 %v, max %v)",
			rule, polled, grants, allowed, p50, p90, worst)
	}
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

func newSemQueue(t *testing.T, e *env, rule string) *semQueue {
	t.Helper()
	holder, wait := rawQueuer(t, e), rawQueuer(t, e)
	if _, ok := holder.(core.SemaphoreBackend); !ok {
		t.Skip("backend has no semaphores (not a core.SemaphoreBackend)")
	}
	q := &semQueue{rawQueue: newRawQueue(t, e, rule, semQueueLimit), holder: holder, wait: wait}
	q.turns = watchTurns(t, rule, wait, q.key) // where the waiters queued
	for range semQueueLimit {
		q.grant(holder, q.req(""), "a holder's permit")
	}
	return q
}

// releaseHeld releases the i-th permit granted, with the holder's backend.
func (q *semQueue) releaseHeld(i int) {
	q.t.Helper()
	q.release(q.holder, q.held[i])
}

// testQueueSemaphoreGrant checks rule "on a Queuer semaphore a waiter is
// granted a permit when fewer live waiters are queued before it than
// permits are free, and answered busy otherwise".
func testQueueSemaphoreGrant(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a waiter is granted a permit when fewer live waiters are queued before it than permits are free, and answered busy otherwise"
	q := newSemQueue(t, e, rule)
	w1, w2, w3 := "w1-"+rand.Text(), "w2-"+rand.Text(), "w3-"+rand.Text()
	q.busy(q.wait, q.req(w1), "the first waiter on a full semaphore")
	q.busy(q.wait, q.req(w2), "the second waiter on a full semaphore")
	q.busy(q.wait, q.req(w3), "the third waiter on a full semaphore")
	q.releaseHeld(0)
	q.releaseHeld(1) // two permits free, three waiters
	q.busy(q.wait, q.req(w3), "the third waiter, two waiters before it and two permits free")
	l2 := q.grant(q.wait, q.req(w2), "the second waiter, one waiter before it and two permits free")
	// w2 is out of line: one permit free, w1 first, w3 behind it.
	q.busy(q.wait, q.req(w3), "the third waiter, one waiter before it and one permit free")
	q.busy(q.holder, q.req(""), "a claim without a Waiter while live waiters hold every free permit's turn")
	l1 := q.grant(q.wait, q.req(w1), "the first waiter, nobody before it and one permit free")
	// Tokens increase in the order of the grants, not of the line
	// (core.SemaphoreBackend).
	if !e.h.NoFencing && l1.Token <= l2.Token {
		t.Errorf("rule %q: the first waiter, granted after the second, got token %d after %d", rule, l1.Token, l2.Token)
	}
	q.busy(q.wait, q.req(w3), "the last waiter on a full semaphore")
	if err := q.wait.Leave(q.ctx, q.key, w3); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}

// testQueueSemaphoreGrantPassesTurn checks rule "on a Queuer semaphore a
// grant that leaves a permit free tells the next live waiter its turn".
func testQueueSemaphoreGrantPassesTurn(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a grant that leaves a permit free tells the next live waiter its turn"
	q := newSemQueue(t, e, rule)
	w1, w2 := "w1-"+rand.Text(), "w2-"+rand.Text()
	q.busy(q.wait, q.req(w1), "the first waiter on a full semaphore")
	q.busy(q.wait, q.req(w2), "the second waiter on a full semaphore")
	q.releaseHeld(0)
	q.turns.expect(t, rule, "a permit's release with waiters queued", w1)
	q.releaseHeld(1)
	q.turns.expect(t, rule, "a second permit's release, the first waiter still in line", w1)
	q.grant(q.wait, q.req(w1), "the first waiter, two permits free")
	q.turns.expect(t, rule, "a grant that leaves a permit free", w2)
	q.grant(q.wait, q.req(w2), "the second waiter, one permit free")
	// The last grant left no permit free and nobody in line: no turn; the
	// next turn on the key is the one a release sends for a new waiter.
	w3 := "w3-" + rand.Text()
	q.busy(q.wait, q.req(w3), "a waiter on a full semaphore")
	q.releaseHeld(2)
	q.turns.expect(t, rule, "the first turn after grants that left no permit free", w3)
	if err := q.wait.Leave(q.ctx, q.key, w3); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}

// testQueueSemaphoreTurns checks rule "on a Queuer semaphore the turns are
// a mutex's: a permit's release, a ForceRelease and a Leave of the first
// waiter while a permit is free tell the first live waiter by name; a
// release with nobody queued sends none".
func testQueueSemaphoreTurns(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore the turns are a mutex's: a permit's release, a ForceRelease and a Leave of the first waiter while a permit is free tell the first live waiter by name; a release with nobody queued sends none"
	q := newSemQueue(t, e, rule)
	w1, w2, w3 := "w1-"+rand.Text(), "w2-"+rand.Text(), "w3-"+rand.Text()
	q.busy(q.wait, q.req(w1), "the first waiter on a full semaphore")
	q.busy(q.wait, q.req(w2), "the second waiter on a full semaphore")
	q.releaseHeld(0)
	q.turns.expect(t, rule, "a permit's release with waiters queued", w1)
	if err := q.wait.Leave(q.ctx, q.key, w1); err != nil {
		t.Fatalf("rule %q: Leave = %v", rule, err)
	}
	q.turns.expect(t, rule, "a Leave of the first waiter while a permit is free", w2)
	q.grant(q.wait, q.req(w2), "the second waiter, first in line, one permit free")
	if adm, ok := q.holder.(core.Admin); ok && !e.h.NoAdmin {
		q.busy(q.wait, q.req(w3), "a waiter on a full semaphore")
		if released, err := adm.ForceRelease(q.ctx, q.key); err != nil || !released {
			t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
		}
		q.turns.expect(t, rule, "a ForceRelease with a waiter queued", w3)
		// It freed every permit at once: a store that tells the first
		// waiter once per permit freed may tell it again.
		q.turns.skip = map[string]bool{w3: true}
		q.grant(q.wait, q.req(w3), "the waiter told by the ForceRelease")
		q.held = q.held[:0]
		q.grant(q.holder, q.req(""), "a permit")
		q.grant(q.holder, q.req(""), "a permit")
	}
	// Nobody is queued: this release sends no turn, and the next turn
	// expected names a new waiter, so that a turn sent for it comes first
	// and is caught.
	last := len(q.held) - 1
	q.releaseHeld(last)
	q.grant(q.holder, q.req(""), "a permit freed with nobody queued")
	w4 := "w4-" + rand.Text()
	q.busy(q.wait, q.req(w4), "a waiter on a full semaphore")
	q.releaseHeld(last + 1)
	q.turns.expect(t, rule, "the first turn after a release with nobody queued", w4)
	if err := q.wait.Leave(q.ctx, q.key, w4); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}
