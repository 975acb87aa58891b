package locktest

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of the queue's turns (core.Queuer): who is told, and when, that
// the grant rule may now let it in, with raw Backend calls (turnLog) and
// through the engine's waits.

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
	ps, k := queueSetup(t, e, waiters+1)
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
	for _, err := range sent(&wg, errs) {
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
			skipIf(t, c.limit > 1 && !sem, noSemaphores)
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
		for _, err := range sent(&wg, errs) {
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

// testQueueSemaphoreGrantPassesTurn checks rule "on a Queuer semaphore a
// grant that leaves a permit free tells the next live waiter its turn".
func testQueueSemaphoreGrantPassesTurn(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a grant that leaves a permit free tells the next live waiter its turn"
	q, w := newSemQueue(t, e, rule, 2)
	q.releaseHeld(0)
	q.turns.expect(t, rule, "a permit's release with waiters queued", w[0])
	q.releaseHeld(1)
	q.turns.expect(t, rule, "a second permit's release, the first waiter still in line", w[0])
	q.grant(q.wait, q.req(w[0]), "the first waiter, two permits free")
	q.turns.expect(t, rule, "a grant that leaves a permit free", w[1])
	q.grant(q.wait, q.req(w[1]), "the second waiter, one permit free")
	// The last grant left no permit free and nobody in line: no turn; the
	// next turn on the key is the one a release sends for a new waiter.
	w3 := q.queueWaiter("a waiter on a full semaphore")
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
	q, w := newSemQueue(t, e, rule, 2)
	q.releaseHeld(0)
	q.turns.expect(t, rule, "a permit's release with waiters queued", w[0])
	if err := q.wait.Leave(q.ctx, q.key, w[0]); err != nil {
		t.Fatalf("rule %q: Leave = %v", rule, err)
	}
	q.turns.expect(t, rule, "a Leave of the first waiter while a permit is free", w[1])
	q.grant(q.wait, q.req(w[1]), "the second waiter, first in line, one permit free")
	if adm, ok := q.holder.(core.Admin); ok && !e.h.NoAdmin {
		w3 := q.queueWaiter("a waiter on a full semaphore")
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
	w4 := q.queueWaiter("a waiter on a full semaphore")
	q.releaseHeld(last + 1)
	q.turns.expect(t, rule, "the first turn after a release with nobody queued", w4)
	if err := q.wait.Leave(q.ctx, q.key, w4); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}
