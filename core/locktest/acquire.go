package locktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testMutualExclusion(t *testing.T, e *env) {
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k)
	mustBusy(t, "a held lock cannot be acquired by another process", b, k)
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	s2 := mustAcquire(t, b, k)
	mustBusy(t, "mutual exclusion holds after a hand-over", a, k)
	s2.Release(context.Background())
}

func testBusyFast(t *testing.T, e *env) {
	const rule = "busy is reported as ErrNotAcquired, with the holder when known, in one attempt"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k, core.WithOwner("holder-a"))
	defer s.Release(context.Background())
	start := time.Now()
	_, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k)
	if el := time.Since(start); el > e.ttl/2 {
		t.Errorf("rule %q: busy answer took %v", rule, el)
	}
	var na *core.NotAcquiredError
	if !errors.As(err, &na) || !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: got %v", rule, err)
	}
	if na.Holder != nil {
		if na.Holder.Owner != "holder-a" {
			t.Errorf("rule %q: holder owner %q, want holder-a", rule, na.Holder.Owner)
		}
		if !e.h.NoFencing && na.Holder.Token != s.Token() {
			t.Errorf("rule %q: holder token %d, want %d", rule, na.Holder.Token, s.Token())
		}
		if na.Holder.Remaining <= 0 || na.Holder.Remaining > e.ttl {
			t.Errorf("rule %q: holder remaining %v outside (0, %v]", rule, na.Holder.Remaining, e.ttl)
		}
	}
	if core.ErrorType(err) != "not_acquired" {
		t.Errorf("ErrorType = %q, want not_acquired", core.ErrorType(err))
	}
}

func testNotReentrant(t *testing.T, e *env) {
	a := e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	defer s.Release(context.Background())
	mustBusy(t, "locks are not reentrant: a key this process holds reads as busy", a, k)
}

func testAcquireCtx(t *testing.T, e *env) {
	const rule = "Acquire honours ctx: it returns ErrNotAcquired joined with ctx.Err() and leaves nothing held"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k)
	ctx, cancel := context.WithTimeout(context.Background(), e.ttl/2)
	defer cancel()
	start := time.Now()
	_, err := b.l.Acquire(ctx, k)
	if !errors.Is(err, core.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("rule %q: got %v", rule, err)
	}
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		t.Errorf("rule %q: the last busy answer is not in the chain: %v", rule, err)
	} else if !e.h.NoHolderInfo && (na.Holder == nil || na.Holder.Owner != s.Owner()) {
		t.Errorf("rule %q: the error does not name the holder %q: %v", rule, s.Owner(), err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("rule %q: the message spans lines: %q", rule, err)
	}
	if el := time.Since(start); el > e.ttl/2+time.Second {
		t.Errorf("rule %q: returned %v after the deadline", rule, el-e.ttl/2)
	}
	s.Release(context.Background())
	c := e.proc(t)
	// b left nothing behind; on a Queuer that includes its place in line,
	// which the engine's Leave takes out before Acquire returns, or, when
	// the store is slow to answer, within core.DeadlineSlack and then in
	// the background (a TryAcquire never overtakes a queued waiter).
	if b.fault.queues() && !waitFor(t, func() bool { return b.fault.leavesDone.Load() >= 1 }, 10*time.Second) {
		t.Fatalf("rule %q: the wait that gave up did not leave the store's queue", rule)
	}
	if !b.fault.queues() {
		// A backend the engine does not run as a core.Queuer (among them a
		// core.QueueKeeper whose store keeps no queue) is asked nothing of
		// the queue's protocol.
		const rule = "a wait on a backend that keeps no waiter queue sends no Waiter and no Leave"
		if n := b.fault.leaves.Load(); n != 0 {
			t.Errorf("rule %q: %d Leave calls", rule, n)
		}
		b.fault.mu.Lock()
		for _, a := range b.fault.sent {
			if a.waiter != "" {
				t.Errorf("rule %q: an attempt carried Waiter %q", rule, a.waiter)
				break
			}
		}
		b.fault.mu.Unlock()
	}
	s2 := acquireAfterCut(t, e, rule, c, k, b, s)
	s2.Release(context.Background())
}

// acquireAfterCut acquires key through c once held has been released, where
// the wait of w for key ended with its ctx. An acquire of w's that the ctx
// cut short may still take effect on the store after w's Acquire returned
// (a statement held up in a pooler's queue reaches the server after the
// release): the engine undoes it, once more after the backend's claim
// bound, and, never renewed, it runs out within the TTL. So when c finds key
// held by another than held, and w sent such an acquire, c waits for the
// key until that acquire can no longer take effect plus the TTL. A key
// still held by held, or held longer, fails the rule.
func acquireAfterCut(t *testing.T, e *env, rule string, c *proc, key string, w *proc, held core.Session) core.Session {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	s, err := c.l.TryAcquire(ctx, key)
	if err == nil {
		return s
	}
	if errors.Is(err, core.ErrLeaseLost) {
		return mustAcquire(t, c, key) // a reply past the renew deadline: try again
	}
	var na *core.NotAcquiredError
	sent, cut := w.fault.lastCut(key)
	if !errors.As(err, &na) || !cut || (na.Holder != nil && na.Holder.Token == held.Token()) {
		t.Fatalf("rule %q: TryAcquire(%q) after the holder's release: %v (holder's token %d; the wait sent an acquire its ctx cut short: %v)",
			rule, key, err, held.Token(), cut)
	}
	bound := time.Duration(0)
	if cb, ok := w.fault.Backend.(core.ClaimBounder); ok {
		bound = cb.ClaimBound()
	}
	until := sent.Add(bound).Add(e.ttl + time.Second)
	t.Logf("TryAcquire(%q) after the holder's release: %v; the wait's acquire sent at %v was cut short by its ctx: waiting until %v",
		key, err, sent.Format(time.StampMilli), until.Format(time.StampMilli))
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	s, err = c.l.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("rule %q: the key is still held after the cut acquire's claim bound and TTL: %v", rule, err)
	}
	return s
}

// notBusy fails t unless err is a failure matching every error in want,
// not ErrNotAcquired, and no *core.NotAcquiredError.
func notBusy(t *testing.T, rule, what string, err error, want ...error) {
	t.Helper()
	var na *core.NotAcquiredError
	if err == nil || errors.Is(err, core.ErrNotAcquired) || errors.As(err, &na) {
		t.Fatalf("rule %q: %s = %v, want a failure that does not match ErrNotAcquired", rule, what, err)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("rule %q: %s = %v, want it to match %v", rule, what, err, w)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("rule %q: %s: the message spans lines: %q", rule, what, err)
	}
}

func testOutageNotBusy(t *testing.T, e *env) {
	const rule = "an outage is never busy: a store that fails or does not answer yields its failure (the store's error, ctx's deadline), never ErrNotAcquired"
	a, b, k := e.pair(t)
	// A store that answered would say busy. The rule's steps take longer
	// than the default TTL: the holder's lease must outlast them without
	// depending on timely renewals on a busy machine.
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	defer s.Release(context.Background())
	wait := e.ttl / 2

	b.fault.down.Store(true)
	_, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k)
	notBusy(t, rule, "TryAcquire on a store that fails", err, errDown)
	_, err = b.l.Acquire(ctxT(t, wait), k)
	notBusy(t, rule, "Acquire on a store that fails", err, errDown, context.DeadlineExceeded)
	b.fault.down.Store(false)

	b.fault.hangClaim.Store(true)
	for name, acquire := range map[string]func(context.Context, string, ...core.Option) (core.Session, error){
		"TryAcquire": b.l.TryAcquire, "Acquire": b.l.Acquire,
	} {
		start := time.Now()
		_, err = acquire(ctxT(t, wait), k)
		notBusy(t, rule, name+" on a store that hangs", err, context.DeadlineExceeded)
		if el := time.Since(start); el > wait+time.Second {
			t.Errorf("rule %q: %s on a store that hangs returned %v after its deadline", rule, name, el-wait)
		}
	}
	b.fault.hangClaim.Store(false)
	mustBusy(t, rule, b, k) // the store answers again, and says busy
}

// returnsByDeadline checks that TryAcquire and Acquire of k by p, on a ctx
// that ends after wait, fail with the ctx's error within core.DeadlineSlack
// of its end (plus room for a busy machine). Their claims ask for a TTL of
// 60s, so that one the store applied stays until it is undone.
func returnsByDeadline(t *testing.T, rule, on string, p *proc, k string, wait time.Duration) {
	t.Helper()
	for name, acquire := range map[string]func(context.Context, string, ...core.Option) (core.Session, error){
		"TryAcquire": p.l.TryAcquire, "Acquire": p.l.Acquire,
	} {
		start := time.Now()
		_, err := acquire(ctxT(t, wait), k, core.TTL(60*time.Second))
		el := time.Since(start)
		notBusy(t, rule, name+" on "+on, err, context.DeadlineExceeded)
		if el > wait+core.DeadlineSlack+time.Second {
			t.Errorf("rule %q: %s returned %v after its deadline", rule, name, el-wait)
		}
	}
}

func testDeadlineKept(t *testing.T, e *env) {
	const rule = "the caller's deadline is kept: TryAcquire and Acquire return within core.DeadlineSlack of ctx's end even when a store call ignores ctx, and a claim that lands after its caller left is undone"
	fa := newFault(e.h.NewBackend(t))
	fa.ignoresCtx = true // the engine must not count on the backend here
	a, b, k := e.procOf(t, fa), e.proc(t), e.key(t)
	wait := e.ttl / 2
	thaw := make(chan struct{})
	var once sync.Once
	thawAll := func() { once.Do(func() { close(thaw) }) }
	t.Cleanup(thawAll)
	// Without the rule the calls below would wait for the thaw forever.
	stop := time.AfterFunc(wait+10*time.Second, thawAll)
	defer stop.Stop()
	a.fault.frozen.Store(&thaw)
	returnsByDeadline(t, rule, "a store call that ignores ctx", a, k, wait)
	a.fault.frozen.Store(nil)
	thawAll() // the claims reach the store now, after their callers left
	if !waitFor(t, func() bool { return a.fault.thawed.Load() == 2 }, 15*time.Second) {
		t.Fatalf("rule %q: the frozen claims did not return after the thaw", rule)
	}
	// A claim that landed is undone by the engine (else held for 60s).
	mustUndo(t, rule, "a claim that landed after its caller left", b, k)
}

func testEndsWithContext(t *testing.T, e *env) {
	const rule = "a backend whose calls end with their ctx does so: TryAcquire and Acquire on a store that stopped answering return within core.DeadlineSlack of ctx's end, with ctx's error (two tries of one key at once too, and a ctx cancelled with no deadline), and a claim the store applied is undone once it answers again"
	const workers = "the backend's calls are handed to the engine's call workers (not a core.ContextBound)"
	if e.h.Stall == nil {
		if endsWithCtx(e.proc(t).fault.Backend) {
			t.Fatalf("rule %q: the backend says its calls end with their ctx (core.ContextBound), and Harness.Stall is not set to check it", rule)
		}
		t.Skip(workers)
	}
	sb, stall, resume := e.h.Stall(t)
	skipIf(t, !endsWithCtx(sb), workers)
	a, b, k := e.procOf(t, newFault(sb)), e.proc(t), e.key(t)
	t.Cleanup(resume)
	mustAcquire(t, a, e.key(t)).Release(context.Background()) // connections open
	wait := e.ttl / 2
	stall()
	returnsByDeadline(t, rule, "a store that stopped answering", a, k, wait)
	// Two tries of one key at once from one process: the one that comes
	// second is not answered busy because the first is on its way.
	k2 := e.key(t)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := a.l.TryAcquire(ctxT(t, wait), k2, core.TTL(60*time.Second))
			errs <- err
		}()
	}
	for range 2 {
		notBusy(t, rule, "one of two tries of a key at once on a store that stopped answering", <-errs, context.DeadlineExceeded)
	}
	// A ctx that is cancelled, with no deadline: a driver that only sets
	// its connection's deadline from ctx's does not end this call by itself.
	k3 := e.key(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cut := time.AfterFunc(wait, cancel)
	defer cut.Stop()
	start := time.Now()
	_, err := a.l.TryAcquire(ctx, k3, core.TTL(60*time.Second))
	if el := time.Since(start); el > wait+core.DeadlineSlack+time.Second {
		t.Errorf("rule %q: TryAcquire returned %v after its ctx was cancelled", rule, el-wait)
	}
	notBusy(t, rule, "TryAcquire on a store that stopped answering, its ctx cancelled", err, context.Canceled)
	resume()
	// A claim the store applied is undone by the engine (else held for 60s).
	mustUndo(t, rule, "a claim applied while the store did not answer", b, k)
	mustUndo(t, rule, "a claim of two tries at once applied while the store did not answer", b, k2)
	mustUndo(t, rule, "a claim applied while the store did not answer, its ctx cancelled", b, k3)
}

// mustUndo checks that p acquires k within 15s: the claims of k that
// returnsByDeadline left behind were undone.
func mustUndo(t *testing.T, rule, what string, p *proc, k string) {
	t.Helper()
	s, err := p.l.Acquire(ctxT(t, 15*time.Second), k, core.Backoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatalf("rule %q: %s was not undone: %v", rule, what, err)
	}
	s.Release(context.Background())
}

func testWaiterWakes(t *testing.T, e *env) {
	const rule = "a waiter acquires promptly after the holder releases"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k)
	got := make(chan core.Session, 1)
	errc := make(chan error, 1)
	n := b.fault.attempts.Load()
	go func() {
		s2, err := b.l.Acquire(ctxT(t, 30*time.Second), k, core.Backoff(10*time.Millisecond, 500*time.Millisecond))
		if err != nil {
			errc <- err
			return
		}
		got <- s2
	}()
	// Let the waiter find the lock busy at least once.
	if !waitFor(t, func() bool { return b.fault.attempts.Load() > n }, 10*time.Second) {
		t.Fatalf("rule %q: the waiter made no attempt", rule)
	}
	released := time.Now()
	s.Release(context.Background())
	select {
	case s2 := <-got:
		if d := time.Since(released); d > 2*time.Second {
			t.Errorf("rule %q: took %v after release", rule, d)
		}
		s2.Release(context.Background())
	case err := <-errc:
		t.Fatalf("rule %q: Acquire: %v", rule, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("rule %q: waiter never acquired", rule)
	}
}

func testWaiterNotified(t *testing.T, e *env) {
	const rule = "with release notifications a waiter wakes on the release, not on its poll timer"
	skipIf(t, e.h.NoWatch, "backend has no release notifications (NoWatch)")
	log := &acquireLog{}
	a, b := e.proc(t), e.proc(t, core.WithObserver(log))
	k := e.key(t)
	// A first wait makes b subscribe; wait until the subscription is in place.
	subscribe(t, rule, a, b, k+"-warm")
	s := mustAcquire(t, a, k, core.TTL(30*time.Second))
	// Once its first attempt is answered busy, the waiter sleeps 20s unless
	// woken (on a Queuer it refreshes its place in line every third of the
	// queue TTL: the Observer's Wake tells that poll from the notification).
	waitNotified(t, rule, b, log, func() { s.Release(context.Background()) },
		func(ctx context.Context) (core.Session, error) {
			return b.l.Acquire(ctx, k, core.Backoff(20*time.Second, 20*time.Second))
		})
}

func testConcurrency(t *testing.T, e *env) {
	const rule = "many goroutines on many keys never hold one key twice"
	procs := []*proc{e.proc(t), e.proc(t)}
	k := e.key(t)
	const workers, keys, rounds = 8, 3, 15
	var mu sync.Mutex
	holders := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := procs[w%len(procs)]
			for r := 0; r < rounds; r++ {
				key := fmt.Sprintf("%s/%d", k, (w+r)%keys)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				s, err := p.l.Acquire(ctx, key, core.Backoff(time.Millisecond, 20*time.Millisecond))
				cancel()
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				holders[key]++
				n := holders[key]
				mu.Unlock()
				if n != 1 {
					errs <- fmt.Errorf("rule %q: %d holders of %s", rule, n, key)
				}
				mu.Lock()
				holders[key]--
				mu.Unlock()
				if err := s.Release(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for _, err := range sent(&wg, errs) {
		t.Error(err)
	}
}

func testBadKeys(t *testing.T, e *env) {
	a := e.proc(t)
	for name, k := range map[string]string{
		"empty":   "",
		"toolong": e.prefix + strings.Repeat("k", core.MaxKeyLen),
		"badutf8": e.prefix + "\xff\xfe",
		"nul":     e.prefix + "a\x00b",
	} {
		_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k)
		if !errors.Is(err, core.ErrInvalidKey) || !strings.Contains(err.Error(), "key") {
			t.Errorf("rule %q: %s key: got %v", "bad keys are rejected with ErrInvalidKey naming the key", name, err)
		}
		_, err = a.l.Acquire(ctxT(t, 10*time.Second), k)
		if !errors.Is(err, core.ErrInvalidKey) {
			t.Errorf("Acquire with %s key: %v", name, err)
		}
	}
}

func testBadOptions(t *testing.T, e *env) {
	a := e.proc(t)
	k := e.key(t)
	for _, c := range []struct {
		name string
		opts []core.Option
	}{
		{"TTL", []core.Option{core.TTL(0)}},
		{"TTL", []core.Option{core.TTL(-time.Second)}},
		{"RenewInterval", []core.Option{core.TTL(time.Second), core.RenewDeadline(500 * time.Millisecond), core.RenewInterval(500 * time.Millisecond)}},
		{"RenewDeadline", []core.Option{core.TTL(time.Second), core.RenewDeadline(time.Second)}},
		{"Jitter", []core.Option{core.Jitter(-1)}},
		{"MinHold", []core.Option{core.MinHold(-1)}},
		{"ForSlot", []core.Option{core.ForSlot(nil)}},
		{"Owner", []core.Option{core.WithOwner("")}},
		{"Backoff", []core.Option{core.Backoff(0, time.Second)}},
	} {
		_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, c.opts...)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("rule %q: %s: got %v", "invalid options are rejected with ErrInvalidOption naming the option", c.name, err)
		}
	}
	// Nothing was written: the key is free.
	s := mustAcquire(t, a, k)
	s.Release(context.Background())
}

func testKeysRoundTrip(t *testing.T, e *env) {
	const rule = "any valid key works, up to MaxKeyLen bytes"
	a, b := e.proc(t), e.proc(t)
	keys := []string{
		e.prefix + "with space",
		e.prefix + "braces{x}y}{",
		e.prefix + "crlf\r\n*3\r\n$3\r\nDEL",
		e.prefix + "quote'\"; DROP TABLE x;--",
		e.prefix + "ünïcødé-鍵-🔒",
	}
	long := e.prefix + "long-"
	keys = append(keys, long+strings.Repeat("x", core.MaxKeyLen-len(long)))
	for _, k := range keys {
		s, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k)
		if err != nil {
			t.Errorf("rule %q: %q: %v", rule, k, err)
			continue
		}
		if s.Key() != k {
			t.Errorf("Key() = %q, want %q", s.Key(), k)
		}
		mustBusy(t, rule, b, k)
		if !e.h.NoAdmin {
			if adm, ok := a.l.(core.Admin); ok {
				info, held, err := adm.Inspect(ctxT(t, 10*time.Second), k)
				if err != nil || !held || info.Key != k {
					t.Errorf("rule %q: Inspect(%q) = %+v %v %v", rule, k, info, held, err)
				}
			}
		}
		s.Release(context.Background())
	}
}
