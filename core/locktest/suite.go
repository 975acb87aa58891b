package locktest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// env is one run of the suite: the harness plus helpers to build processes.
type env struct {
	t      *testing.T
	h      Harness
	prefix string
	ttl    time.Duration
}

// proc is one simulated process: a Locker over its own backend connection.
type proc struct {
	l     core.Locker
	c     *core.Client // the engine under l (l itself when Harness.Wrap is nil)
	fault *faultBackend
}

// Run runs the conformance suite. Each subtest is named after the rule it
// checks and says so when it fails.
func Run(t *testing.T, h Harness) {
	if h.NewBackend == nil {
		t.Fatal("locktest: Harness.NewBackend is nil")
	}
	e := &env{t: t, h: h, prefix: h.KeyPrefix + "lt-" + strings.ToLower(rand.Text()[:8]) + ":", ttl: h.TTL}
	if e.ttl <= 0 {
		e.ttl = 600 * time.Millisecond
	}
	cases := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"MutualExclusion", testMutualExclusion},
		{"BusyIsNotAcquiredAndFast", testBusyFast},
		{"NotReentrant", testNotReentrant},
		{"AcquireHonoursContext", testAcquireCtx},
		{"OutageIsNeverBusy", testOutageNotBusy},
		{"DeadlineKeptWhenStoreIgnoresContext", testDeadlineKept},
		{"WaiterWakesAfterRelease", testWaiterWakes},
		{"WaiterWakesByNotification", testWaiterNotified},
		{"ReleaseIsIdempotent", testReleaseIdempotent},
		{"ReleaseWorksWithCancelledContext", testReleaseCancelledCtx},
		{"StaleSessionCannotRenewOrRelease", testStaleSession},
		{"ReleaseReportsLeaseGone", testReleaseReportsGone},
		{"RenewalsKeepLockPastTTL", testRenewalsKeep},
		{"CrashedHolderFreesWithinTTL", testCrashFrees},
		{"LossSignalledWhenStolen", testLossStolen},
		{"LossSignalledWhenDeleted", testLossDeleted},
		{"LossSignalledWhenUnreachable", testLossUnreachable},
		{"LostLeaseKeptUntilReleased", testLostKeptUntilReleased},
		{"LostLeaseKeptUntilTTL", testLostKeptUntilTTL},
		{"TokensStrictlyIncrease", testTokens},
		{"TokensIncreaseUnderRace", testTokensRace},
		{"AmbiguousAcquireIsReconciled", testReconcile},
		{"FailedUndoIsRetried", testUndoRetried},
		{"SlotAllowsOneStartPerSlot", testSlot},
		{"MinHoldKeepsLockAfterRelease", testMinHold},
		{"InvalidKeysRejected", testBadKeys},
		{"InvalidOptionsRejected", testBadOptions},
		{"KeysRoundTrip", testKeysRoundTrip},
		{"SessionContextOutlivesAcquireContext", testSessionCtx},
		{"DoRunsUnderLock", testDo},
		{"AdminInspectListForceRelease", testAdmin},
		{"ManyGoroutinesManyKeys", testConcurrency},
		{"CloseReleasesAll", testClose},
		{"CloseUndoesClaimsInFlight", testCloseInFlight},
		{"CheckConfirmsHeldLease", testCheckHeld},
		{"CheckReportsLostLease", testCheckLost},
		{"CheckAfterReleaseIsErrReleased", testCheckReleased},
		{"CheckUnreachableIsNotLoss", testCheckUnreachable},
		{"SemaphoreUnsupportedWithoutBackend", testSemUnsupported},
		{"SemaphoreNeverMoreThanLimit", testSemNeverMore},
		{"SemaphoreFullIsBusyWithHolder", testSemFull},
		{"SemaphoreTokensStrictlyIncrease", testSemTokens},
		{"SemaphoreCrashedPermitFreesWithinTTL", testSemCrash},
		{"SemaphoreWaiterWakesByNotification", testSemNotified},
		{"SemaphoreLimitMismatch", testSemMismatch},
		{"SemaphoreHoldersListForceRelease", testSemHolders},
		{"SemaphoreCheckOnPermit", testSemCheck},
		{"SemaphoreRenewalsBatched", testSemRenewBatched},
		{"SemaphoreAmbiguousAcquireIsReconciled", testSemReconcile},
		{"QueueWaitNamesItself", testQueueWaiterID},
		{"QueueFIFOAcrossProcesses", testQueueFIFO},
		{"QueueDeadWaiterSkipped", testQueueDeadWaiter},
		{"QueueCancelledWaiterLeaves", testQueueCancelled},
		{"QueueNoBarging", testQueueNoBarging},
		{"QueueNoBargingOnSemaphore", testQueueSemaphore},
		{"QueueSemaphoreGrantsByFreePermits", testQueueSemaphoreGrant},
		{"QueueSemaphoreGrantPassesTurn", testQueueSemaphoreGrantPassesTurn},
		{"QueueLeaveOfFirstPassesTurn", testQueueLeavePassesTurn},
		{"QueueOneWakePerRelease", testQueueOneWake},
		{"QueueHandoffPrompt", testQueueHandoffPrompt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, e) })
	}
}

// key returns a key unique to the subtest.
func (e *env) key(t *testing.T) string {
	return e.prefix + t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]
}

// proc builds a process with its own backend connection; it is closed when
// the test ends.
func (e *env) proc(t *testing.T, opts ...core.ClientOption) *proc {
	t.Helper()
	fb := newFault(e.h.NewBackend(t))
	all := append([]core.ClientOption{core.WithDefaults(core.TTL(e.ttl))}, e.h.ClientOptions...)
	c, err := core.New(fb.backend(), append(all, opts...)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	var l core.Locker = c
	if e.h.Wrap != nil {
		l = e.h.Wrap(c)
	}
	// Runs after Close (cleanups run last first), whose releases count.
	t.Cleanup(func() {
		if m := fb.limitMisuse(); len(m) > 0 {
			t.Errorf("rule %q: %d requests, the first: %s", "Renew and Release carry the Limit their lease was acquired with", len(m), m[0])
		}
	})
	t.Cleanup(func() { l.Close() })
	return &proc{l: l, c: c, fault: fb}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, p *proc, key string, opts ...core.Option) core.Session {
	t.Helper()
	s, err := p.l.TryAcquire(ctxT(t, 10*time.Second), key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return s
}

func mustBusy(t *testing.T, rule string, p *proc, key string) {
	t.Helper()
	s, err := p.l.TryAcquire(ctxT(t, 10*time.Second), key)
	if err == nil {
		s.Release(context.Background())
		t.Fatalf("rule %q: TryAcquire(%q) succeeded while another session holds it", rule, key)
	}
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: TryAcquire(%q) = %v, want an error matching ErrNotAcquired", rule, key, err)
	}
}

// waitDone waits for s to end within d and returns how long it took.
func waitDone(t *testing.T, rule string, s core.Session, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-s.Done():
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("rule %q: session not ended within %v", rule, d)
		return 0
	}
}

func testMutualExclusion(t *testing.T, e *env) {
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
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
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
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
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
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
	if _, q := b.fault.Backend.(core.Queuer); q && !waitFor(t, func() bool { return b.fault.leavesDone.Load() >= 1 }, 10*time.Second) {
		t.Fatalf("rule %q: the wait that gave up did not leave the store's queue", rule)
	}
	s2 := mustAcquire(t, c, k)
	s2.Release(context.Background())
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
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k) // a store that answered would say busy
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

func testDeadlineKept(t *testing.T, e *env) {
	const rule = "the caller's deadline is kept: TryAcquire and Acquire return within core.DeadlineSlack of ctx's end even when a store call ignores ctx, and a claim that lands after its caller left is undone"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	wait := e.ttl / 2
	thaw := make(chan struct{})
	var once sync.Once
	thawAll := func() { once.Do(func() { close(thaw) }) }
	t.Cleanup(thawAll)
	// Without the rule the calls below would wait for the thaw forever.
	stop := time.AfterFunc(wait+10*time.Second, thawAll)
	defer stop.Stop()
	a.fault.frozen.Store(&thaw)
	for name, acquire := range map[string]func(context.Context, string, ...core.Option) (core.Session, error){
		"TryAcquire": a.l.TryAcquire, "Acquire": a.l.Acquire,
	} {
		start := time.Now()
		_, err := acquire(ctxT(t, wait), k, core.TTL(60*time.Second))
		el := time.Since(start)
		notBusy(t, rule, name+" on a store call that ignores ctx", err, context.DeadlineExceeded)
		// The slack, plus room for a busy machine.
		if el > wait+core.DeadlineSlack+time.Second {
			t.Errorf("rule %q: %s returned %v after its deadline", rule, name, el-wait)
		}
	}
	a.fault.frozen.Store(nil)
	thawAll() // the claims reach the store now, after their callers left
	if !waitFor(t, func() bool { return a.fault.thawed.Load() == 2 }, 15*time.Second) {
		t.Fatalf("rule %q: the frozen claims did not return after the thaw", rule)
	}
	// A claim that landed is undone by the engine (else held for 60s).
	s, err := b.l.Acquire(ctxT(t, 10*time.Second), k, core.Backoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatalf("rule %q: a claim that landed after its caller left was not undone: %v", rule, err)
	}
	s.Release(context.Background())
}

func testWaiterWakes(t *testing.T, e *env) {
	const rule = "a waiter acquires promptly after the holder releases"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
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
	if e.h.NoWatch {
		t.Skip("backend has no release notifications (NoWatch)")
	}
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

func testReleaseIdempotent(t *testing.T, e *env) {
	const rule = "Release is idempotent and ends the session with ErrReleased"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	for i := 0; i < 3; i++ {
		if err := s.Release(context.Background()); err != nil {
			t.Fatalf("rule %q: Release #%d: %v", rule, i+1, err)
		}
	}
	if !errors.Is(s.Err(), core.ErrReleased) || !errors.Is(context.Cause(s.Context()), core.ErrReleased) {
		t.Fatalf("rule %q: Err=%v cause=%v", rule, s.Err(), context.Cause(s.Context()))
	}
	select {
	case <-s.Done():
	default:
		t.Fatalf("rule %q: Done not closed after Release", rule)
	}
	s2 := mustAcquire(t, b, k)
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("rule %q: late Release: %v", rule, err)
	}
	mustBusy(t, "a late Release of an old session does not free the new holder's lock", a, k)
	s2.Release(context.Background())
}

func testReleaseCancelledCtx(t *testing.T, e *env) {
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Release(ctx); err != nil {
		t.Fatalf("rule %q: %v", "Release works with a cancelled ctx", err)
	}
	s2 := mustAcquire(t, b, k)
	s2.Release(context.Background())
}

func testStaleSession(t *testing.T, e *env) {
	const rule = "a stale session can neither renew nor release a newer holder's lock"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	stale := a.fault.ownerToken(k)
	a.fault.down.Store(true) // a is cut off; its lease runs out
	waitDone(t, rule, s, 5*e.ttl)
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k)
	if err != nil {
		t.Fatalf("rule %q: b could not take over: %v", rule, err)
	}
	defer s2.Release(context.Background())
	a.fault.down.Store(false)
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("rule %q: Release of the stale session: %v", rule, err)
	}
	ctx := ctxT(t, 10*time.Second)
	res, err := a.fault.Backend.Renew(ctx, []core.RenewRequest{{Key: k, OwnerToken: stale, TTL: e.ttl}})
	if err != nil {
		t.Fatalf("rule %q: Renew: %v", rule, err)
	}
	if len(res) != 1 || !errors.Is(res[0], core.ErrLeaseLost) {
		t.Fatalf("rule %q: stale Renew = %v, want ErrLeaseLost", rule, res)
	}
	if err := a.fault.Backend.Release(ctx, core.ReleaseRequest{Key: k, OwnerToken: stale}); !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("rule %q: stale Release = %v, want a no-op that says so (ErrLeaseGone)", rule, err)
	}
	mustBusy(t, rule, e.proc(t), k)
	if s2.Err() != nil {
		t.Fatalf("rule %q: new holder lost its lease: %v", rule, s2.Err())
	}
}

func testRenewalsKeep(t *testing.T, e *env) {
	const rule = "renewals keep a lock past its TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	d0 := s.Deadline()
	select {
	case <-s.Done():
		t.Fatalf("rule %q: session ended: %v", rule, s.Err())
	case <-time.After(3 * e.ttl):
	}
	mustBusy(t, rule, b, k)
	if s.Err() != nil {
		t.Fatalf("rule %q: %v", rule, s.Err())
	}
	if !s.Deadline().After(d0) {
		t.Fatalf("rule %q: deadline did not move forward", rule)
	}
	s.Release(context.Background())
}

func testCrashFrees(t *testing.T, e *env) {
	const rule = "a lock whose holder stops renewing frees within the TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	mustAcquire(t, a, k)
	start := time.Now()
	a.fault.down.Store(true) // the holder "crashes": no renewal reaches the store
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k, core.Backoff(10*time.Millisecond, e.ttl/4))
	if err != nil {
		t.Fatalf("rule %q: %v", rule, err)
	}
	if d := time.Since(start); d > e.ttl+time.Second {
		t.Errorf("rule %q: took %v (TTL %v)", rule, d, e.ttl)
	}
	s2.Release(context.Background())
}

func expectLost(t *testing.T, rule string, s core.Session, within time.Duration) {
	t.Helper()
	waitDone(t, rule, s, within)
	if !errors.Is(s.Err(), core.ErrLeaseLost) || !errors.Is(context.Cause(s.Context()), core.ErrLeaseLost) {
		t.Fatalf("rule %q: Err=%v cause=%v, want ErrLeaseLost", rule, s.Err(), context.Cause(s.Context()))
	}
	if core.ErrorType(s.Err()) != "lease_lost" {
		t.Errorf("ErrorType = %q", core.ErrorType(s.Err()))
	}
}

// releaseLost releases a lost session, which must succeed while the store is
// reachable.
func releaseLost(t *testing.T, s core.Session) {
	t.Helper()
	if err := s.Release(context.Background()); err != nil {
		t.Errorf("Release after loss: %v", err)
	}
}

func testLossStolen(t *testing.T, e *env) {
	if e.h.Steal == nil {
		t.Skip("harness has no Steal")
	}
	const rule = "a stolen lock is signalled as lost at the next renewal"
	a := e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	if err := e.h.Steal(ctxT(t, 10*time.Second), k); err != nil {
		t.Fatalf("Steal: %v", err)
	}
	expectLost(t, rule, s, e.ttl+2*time.Second)
	releaseLost(t, s)
	mustBusy(t, "after a loss the thief still holds the key", a, k)
}

func testLossDeleted(t *testing.T, e *env) {
	if e.h.Delete == nil {
		t.Skip("harness has no Delete")
	}
	const rule = "a lock deleted behind the holder's back is signalled as lost"
	a := e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	if err := e.h.Delete(ctxT(t, 10*time.Second), k); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	expectLost(t, rule, s, e.ttl+2*time.Second)
	releaseLost(t, s)
}

func testLossUnreachable(t *testing.T, e *env) {
	const rule = "loss is signalled within the renew deadline when the store is unreachable, before the TTL runs out"
	a := e.proc(t)
	k := e.key(t)
	before := time.Now()
	s := mustAcquire(t, a, k)
	a.fault.down.Store(true)
	expectLost(t, rule, s, 5*e.ttl)
	// Default renew deadline is 2/3 TTL from the acquire's send time.
	if lostAt := time.Since(before); lostAt >= e.ttl {
		t.Errorf("rule %q: loss signalled %v after acquire, not before the TTL %v", rule, lostAt, e.ttl)
	}
	if !s.Deadline().Before(before.Add(e.ttl)) {
		t.Errorf("rule %q: deadline %v not before the TTL", rule, s.Deadline().Sub(before))
	}
	a.fault.down.Store(false)
	releaseLost(t, s)
}

// lostToStall acquires k on a, makes a's renewals hang (a store that is slow
// rather than down) and waits for the loss. It returns the session and the
// instant before the acquire was sent: the store keeps the key at least
// until before + TTL.
func lostToStall(t *testing.T, e *env, a *proc, k string) (core.Session, time.Time) {
	t.Helper()
	before := time.Now()
	s := mustAcquire(t, a, k)
	a.fault.stallRenew.Store(true)
	t.Cleanup(func() { a.fault.stallRenew.Store(false) })
	expectLost(t, "loss is signalled at the renew deadline while renewals hang", s, 5*e.ttl)
	return s, before
}

func testLostKeptUntilReleased(t *testing.T, e *env) {
	const rule = "a lost lease's key stays held until its holder calls Release (its work has stopped), and Release frees it"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	s, before := lostToStall(t, e, a, k)
	s2, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k)
	answered := time.Now()
	if err == nil {
		s2.Release(context.Background())
		if answered.Before(before.Add(e.ttl)) {
			t.Fatalf("rule %q: another process acquired the key %v after the holder's loss, %v before its TTL ran out",
				rule, answered.Sub(before), before.Add(e.ttl).Sub(answered))
		}
		t.Skipf("the busy check came after the TTL (%v): machine too slow for this TTL", answered.Sub(before))
	}
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: TryAcquire after the loss = %v", rule, err)
	}
	a.fault.stallRenew.Store(false)
	releaseLost(t, s)
	s3 := mustAcquire(t, b, k) // free at once after the holder's Release
	s3.Release(context.Background())
}

func testLostKeptUntilTTL(t *testing.T, e *env) {
	const rule = "a lost lease that its holder does not release is freed by the store's TTL, not before"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	_, before := lostToStall(t, e, a, k)
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k, core.Backoff(5*time.Millisecond, e.ttl/8))
	if err != nil {
		t.Fatalf("rule %q: %v", rule, err)
	}
	defer s2.Release(context.Background())
	// The store applied the holder's last renewal no earlier than before;
	// allow 5ms for the store's expiry resolution.
	if at := time.Since(before); at < e.ttl-5*time.Millisecond {
		t.Fatalf("rule %q: another process acquired the key %v after the holder's acquire, before the TTL %v", rule, at, e.ttl)
	}
}

func testTokens(t *testing.T, e *env) {
	if e.h.NoFencing {
		t.Skip("backend has no fencing tokens (NoFencing)")
	}
	const rule = "fencing tokens strictly increase across releases and expiries, and renewals keep them"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	var last uint64
	check := func(s core.Session) {
		t.Helper()
		if s.Token() <= last {
			t.Fatalf("rule %q: token %d after %d", rule, s.Token(), last)
		}
		last = s.Token()
	}
	for i := 0; i < 4; i++ {
		p := a
		if i%2 == 1 {
			p = b
		}
		s := mustAcquire(t, p, k)
		check(s)
		s.Release(context.Background())
	}
	// Expiry: a is cut off, b takes over after the TTL.
	s := mustAcquire(t, a, k)
	check(s)
	a.fault.down.Store(true)
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	check(s2)
	tok := s2.Token()
	time.Sleep(e.ttl) // several renewals happen (not an assertion by itself)
	if s2.Token() != tok || s2.Err() != nil {
		t.Fatalf("rule %q: token changed on renewal or session lost: %v", rule, s2.Err())
	}
	s2.Release(context.Background())
	a.fault.down.Store(false)
	s3 := mustAcquire(t, a, k)
	check(s3)
	s3.Release(context.Background())
}

func testReconcile(t *testing.T, e *env) {
	const rule = "an acquire whose reply is lost is reconciled: nothing stays held until the TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	a.fault.loseReply.Store(true)
	_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.TTL(60*time.Second))
	a.fault.loseReply.Store(false)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: want a backend error, got %v", rule, err)
	}
	if !errors.Is(err, errReplyLost) {
		t.Errorf("rule %q: the cause is not kept: %v", rule, err)
	}
	s := mustAcquire(t, b, k) // would be busy for 60s if orphaned
	s.Release(context.Background())
}

func testUndoRetried(t *testing.T, e *env) {
	const rule = "the undo of an ambiguous acquire that fails is retried until it succeeds: nothing stays held until the TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	a.fault.loseReply.Store(true)
	a.fault.failRelease.Store(true) // the undo sent at once fails too
	_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.TTL(60*time.Second))
	a.fault.loseReply.Store(false)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: want a backend error, got %v", rule, err)
	}
	mustBusy(t, "the claim whose reply was lost is held until its undo succeeds", b, k)
	a.fault.failRelease.Store(false)
	start := time.Now()
	s, err := b.l.Acquire(ctxT(t, 15*time.Second), k, core.Backoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatalf("rule %q: the orphaned claim was not undone: %v", rule, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("rule %q: undone only after %v", rule, d)
	}
	s.Release(context.Background())
}

// waitFor polls cond every 10ms for up to d.
func waitFor(t *testing.T, cond func() bool, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testSlot(t *testing.T, e *env) {
	if e.h.NoSlots {
		t.Skip("backend has no slot mode (NoSlots)")
	}
	const rule = "slot mode allows one start per slot, computed on the store's clock, and the next slot starts afresh"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	slot := 2 * time.Second
	sched := core.Every(slot)
	opts := []core.Option{core.ForSlot(sched), core.SlotTolerance(100 * time.Millisecond)}
	now, err := a.fault.Backend.Now(ctxT(t, 10*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	// Start just after a slot boundary so the whole check fits in one slot.
	next := sched.Next(now)
	time.Sleep(next.Sub(now) + 150*time.Millisecond)
	s := mustAcquire(t, a, k, opts...)
	if _, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k, opts...); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: second start in the same slot: %v", rule, err)
	}
	// The session ends with the slot, and the next slot starts afresh.
	expectLost(t, "a slot session ends when its slot does", s, slot+time.Second)
	s2, err := b.l.Acquire(ctxT(t, 2*slot+5*time.Second), k, opts...)
	if err != nil {
		t.Fatalf("rule %q: next slot: %v", rule, err)
	}
	if !e.h.NoFencing && s2.Token() <= s.Token() {
		t.Errorf("rule %q: token did not increase: %d then %d", rule, s.Token(), s2.Token())
	}
	// Release keeps a slot lock until the slot ends.
	if err := s2.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, opts...); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: start after Release in the same slot: %v", rule, err)
	}
}

func testMinHold(t *testing.T, e *env) {
	const rule = "with MinHold a Release before the hold ends leaves the lock to expire then"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	hold := 2 * e.ttl
	start := time.Now()
	s := mustAcquire(t, a, k, core.MinHold(hold))
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustBusy(t, rule, b, k)
	s2, err := b.l.Acquire(ctxT(t, 5*hold+5*time.Second), k, core.Backoff(10*time.Millisecond, e.ttl/4))
	if err != nil {
		t.Fatalf("rule %q: %v", rule, err)
	}
	if d := time.Since(start); d < hold-50*time.Millisecond {
		t.Errorf("rule %q: freed after %v, min hold %v", rule, d, hold)
	}
	s2.Release(context.Background())
	// A release after the hold frees at once.
	s3 := mustAcquire(t, a, k, core.MinHold(time.Millisecond))
	time.Sleep(5 * time.Millisecond)
	s3.Release(context.Background())
	s4 := mustAcquire(t, b, k)
	s4.Release(context.Background())
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

type ctxKey struct{}

func testSessionCtx(t *testing.T, e *env) {
	const rule = "the session outlives the acquiring ctx and keeps its values"
	a := e.proc(t)
	k := e.key(t)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	s, err := a.l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-s.Done():
		t.Fatalf("rule %q: session ended with its acquire ctx: %v", rule, s.Err())
	case <-time.After(e.ttl):
	}
	if s.Context().Value(ctxKey{}) != "v" {
		t.Errorf("rule %q: value not carried", rule)
	}
	if s.Context().Err() != nil || s.Err() != nil {
		t.Errorf("rule %q: ctx err %v, session err %v", rule, s.Context().Err(), s.Err())
	}
	if got, ok := core.SessionFromContext(core.WithSession(context.Background(), s)); !ok || got != s {
		t.Errorf("SessionFromContext lost the session")
	}
	s.Release(context.Background())
}

func testDo(t *testing.T, e *env) {
	const rule = "Do runs fn under the lock and releases it; a loss during fn is reported"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	ran := false
	err := core.Do(ctxT(t, 10*time.Second), a.l, k, func(ctx context.Context) error {
		ran = true
		s, ok := core.SessionFromContext(ctx)
		if !ok || s.Key() != k {
			return errors.New("no session in ctx")
		}
		mustBusy(t, rule, b, k)
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("rule %q: Do = %v, ran %v", rule, err, ran)
	}
	s := mustAcquire(t, b, k) // released
	s.Release(context.Background())
	fnErr := errors.New("job failed")
	if err := core.Do(ctxT(t, 10*time.Second), a.l, k, func(context.Context) error { return fnErr }); !errors.Is(err, fnErr) {
		t.Fatalf("rule %q: fn error not returned: %v", rule, err)
	}
	// A loss while fn runs: fn's ctx is cancelled and Do reports ErrLeaseLost.
	err = core.Do(ctxT(t, 10*time.Second), a.l, k, func(ctx context.Context) error {
		a.fault.down.Store(true)
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), core.ErrLeaseLost) {
			return fmt.Errorf("cause %v", context.Cause(ctx))
		}
		return nil
	})
	a.fault.down.Store(false)
	if !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("rule %q: Do after a loss = %v", rule, err)
	}
}

func testAdmin(t *testing.T, e *env) {
	if e.h.NoAdmin {
		t.Skip("backend has no Admin (NoAdmin)")
	}
	const rule = "Admin inspects, lists by prefix and force-releases; the victim learns of it at its next renewal"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	adm, ok := b.l.(core.Admin)
	if !ok {
		t.Skip("the Locker under test does not expose Admin")
	}
	ctx := ctxT(t, 10*time.Second)
	if _, held, err := adm.Inspect(ctx, k); err != nil || held {
		t.Fatalf("rule %q: Inspect free key: held=%v err=%v", rule, held, err)
	}
	s1 := mustAcquire(t, a, k+"/1", core.WithOwner("owner-1"))
	s2 := mustAcquire(t, a, k+"/2", core.WithOwner("owner-2"))
	other := mustAcquire(t, a, e.prefix+"zz-other")
	defer other.Release(context.Background())
	info, held, err := adm.Inspect(ctx, k+"/1")
	if err != nil || !held || info.Owner != "owner-1" || info.Key != k+"/1" {
		t.Fatalf("rule %q: Inspect = %+v %v %v", rule, info, held, err)
	}
	if !e.h.NoFencing && info.Token != s1.Token() {
		t.Errorf("rule %q: Inspect token %d, session %d", rule, info.Token, s1.Token())
	}
	if info.ExpiresAt.IsZero() || (!info.AcquiredAt.IsZero() && !info.ExpiresAt.After(info.AcquiredAt)) {
		t.Errorf("rule %q: Inspect times %+v", rule, info)
	}
	list, err := adm.List(ctx, k+"/")
	if err != nil || len(list) != 2 {
		t.Fatalf("rule %q: List = %+v %v", rule, list, err)
	}
	seen := map[string]bool{}
	for _, i := range list {
		seen[i.Key] = true
	}
	if !seen[k+"/1"] || !seen[k+"/2"] {
		t.Fatalf("rule %q: List = %+v", rule, list)
	}
	released, err := adm.ForceRelease(ctx, k+"/1")
	if err != nil || !released {
		t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
	}
	expectLost(t, rule, s1, e.ttl+2*time.Second)
	if released, err := adm.ForceRelease(ctx, k+"/1"); err != nil || released {
		t.Fatalf("rule %q: ForceRelease of a free key = %v %v", rule, released, err)
	}
	s2.Release(context.Background())
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
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testClose(t *testing.T, e *env) {
	const rule = "Close releases every session, ends them with ErrClosed and refuses new acquisitions"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	var ss []core.Session
	for i := 0; i < 3; i++ {
		ss = append(ss, mustAcquire(t, a, fmt.Sprintf("%s/%d", k, i)))
	}
	if err := a.l.Close(); err != nil {
		t.Fatalf("rule %q: Close: %v", rule, err)
	}
	for i, s := range ss {
		select {
		case <-s.Done():
		default:
			t.Fatalf("rule %q: session %d not ended", rule, i)
		}
		if !errors.Is(s.Err(), core.ErrClosed) {
			t.Errorf("rule %q: session %d Err = %v", rule, i, s.Err())
		}
		s2 := mustAcquire(t, b, s.Key()) // free at once
		s2.Release(context.Background())
	}
	if _, err := a.l.TryAcquire(ctxT(t, time.Second), k); !errors.Is(err, core.ErrClosed) {
		t.Fatalf("rule %q: TryAcquire after Close = %v", rule, err)
	}
	if err := a.l.Close(); err != nil {
		t.Fatalf("rule %q: second Close: %v", rule, err)
	}
}

func testCloseInFlight(t *testing.T, e *env) {
	const rule = "Close cuts acquisitions in flight short and undoes their claims before it closes the backend: nothing is left held"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	holder := mustAcquire(t, b, k+"/busy")
	defer holder.Release(context.Background())
	a.fault.stallClaim.Store(true) // the claim lands, its reply never comes
	errs := make(chan error, 2)
	go func() {
		_, err := a.l.Acquire(ctxT(t, 30*time.Second), k, core.TTL(60*time.Second))
		errs <- err
	}()
	go func() { // a waiter on a busy key
		_, err := a.l.Acquire(ctxT(t, 30*time.Second), k+"/busy")
		errs <- err
	}()
	select {
	case <-a.fault.claimed:
	case <-time.After(10 * time.Second):
		t.Fatalf("rule %q: the claim did not reach the store", rule)
	}
	start := time.Now()
	if err := a.l.Close(); err != nil {
		t.Errorf("rule %q: Close: %v", rule, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("rule %q: Close took %v", rule, d)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, core.ErrClosed) {
			t.Errorf("rule %q: the acquisition Close cut short returned %v, want ErrClosed", rule, err)
		}
	}
	s := mustAcquire(t, b, k) // would be busy for 60s if orphaned
	s.Release(context.Background())
}
