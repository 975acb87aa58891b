package locktest

import (
	"context"
	"crypto/rand"
	"errors"
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
		e.ttl = time.Second
	}
	// The rules live in files by topic: acquire.go (exclusion, busy,
	// contexts, waiters, keys and options), release.go (Release and
	// Close), lease.go (renewal, expiry and loss), tokens.go (fencing, also
	// under a race, and ambiguous claims), slot.go, session.go, admin.go,
	// check.go, semaphore*.go and queue*.go; wait.go has the helpers of
	// waits.
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
		{"CallsEndWithContext", testEndsWithContext},
		{"WaiterWakesAfterRelease", testWaiterWakes},
		{"WaiterWakesByNotification", testWaiterNotified},
		{"ReleaseIsIdempotent", testReleaseIdempotent},
		{"ReleaseWorksWithCancelledContext", testReleaseCancelledCtx},
		{"StaleSessionCannotRenewOrRelease", testStaleSession},
		{"ReleaseReportsLeaseGone", testReleaseReportsGone},
		{"RenewalsKeepLockPastTTL", testRenewalsKeep},
		{"CrashedHolderFreesWithinTTL", testCrashFrees},
		{"ClaimKeptForTTLLessSlack", testClaimLife},
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
		{"SemaphoreRacingTriesAllGranted", testSemTriesAllGranted},
		{"SemaphoreTokensStrictlyIncrease", testSemTokens},
		{"SemaphoreCrashedPermitFreesWithinTTL", testSemCrash},
		{"SemaphoreWaiterWakesByNotification", testSemNotified},
		{"SemaphoreLimitMismatch", testSemMismatch},
		{"SemaphoreHoldersListForceRelease", testSemHolders},
		{"SemaphoreCheckOnPermit", testSemCheck},
		{"SemaphoreRenewalsBatched", testSemRenewBatched},
		{"SemaphoreMinHoldKeepsPermitAfterRelease", testSemMinHold},
		{"SemaphoreAmbiguousAcquireIsReconciled", testSemReconcile},
		{"QueueWaitNamesItself", testQueueWaiterID},
		{"QueueFIFOAcrossProcesses", testQueueFIFO},
		{"QueueDeadWaiterSkipped", testQueueDeadWaiter},
		{"QueueCancelledWaiterLeaves", testQueueCancelled},
		{"QueueNoBarging", testQueueNoBarging},
		{"QueueNoBargingOnSemaphore", testQueueSemaphore},
		{"QueueSemaphoreGrantsByFreePermits", testQueueSemaphoreGrant},
		{"QueueSemaphoreGrantPassesTurn", testQueueSemaphoreGrantPassesTurn},
		{"QueueSemaphoreTurns", testQueueSemaphoreTurns},
		{"QueueLeaveOfFirstPassesTurn", testQueueLeavePassesTurn},
		{"QueueOneWakePerRelease", testQueueOneWake},
		{"QueueHandoffPrompt", testQueueHandoffPrompt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "TokensIncreaseUnderRace" || c.name == "QueueHandoffPrompt" {
				alone.Lock()
				defer alone.Unlock()
			} else {
				alone.RLock()
				defer alone.RUnlock()
			}
			c.fn(t, e)
		})
	}
}

// alone keeps the token race (TokensIncreaseUnderRace), which loads the
// store and the machine with many processes racing for one key as fast as
// they can, from running beside any other rule of the harnesses running in
// parallel in the test binary: their timing cases, whose leases are short,
// would otherwise pay for its load. The hand-off rule (QueueHandoffPrompt),
// which both loads the store and bounds its own latency, runs alone too.
var alone sync.RWMutex

// key returns a key unique to the subtest.
func (e *env) key(t *testing.T) string {
	return e.prefix + t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]
}

// cases runs fn as a subtest of the rule per name, each with a key of its
// own under the rule's key (key + "/" + name).
func (e *env) cases(t *testing.T, names []string, fn func(t *testing.T, name, k string)) {
	base := e.key(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) { fn(t, name, base+"/"+name) })
	}
}

// pair returns two processes (proc) and the subtest's key (key): the
// set-up most rules start from.
func (e *env) pair(t *testing.T) (a, b *proc, k string) {
	t.Helper()
	return e.proc(t), e.proc(t), e.key(t)
}

// skipIf skips the rule when cond holds: the backend or the harness lacks
// what the rule needs, and why says what.
func skipIf(t *testing.T, cond bool, why string) {
	t.Helper()
	if cond {
		t.Skip(why)
	}
}

// procsWith returns n processes (proc), or skips the rule with lacks when
// the backend is not an I: a rule of an optional interface.
func procsWith[I any](t *testing.T, e *env, n int, lacks string, opts ...core.ClientOption) []*proc {
	t.Helper()
	return procsIf(t, e, n, func(b core.Backend) bool { _, ok := b.(I); return ok }, lacks, opts...)
}

// procsIf returns n processes (proc), or skips the rule with lacks when has
// reports false of the backend.
func procsIf(t *testing.T, e *env, n int, has func(core.Backend) bool, lacks string, opts ...core.ClientOption) []*proc {
	t.Helper()
	ps := []*proc{e.proc(t, opts...)}
	skipIf(t, !has(ps[0].fault.Backend), lacks)
	for len(ps) < n {
		ps = append(ps, e.proc(t, opts...))
	}
	return ps
}

// proc builds a process with its own backend connection; it is closed when
// the test ends.
func (e *env) proc(t *testing.T, opts ...core.ClientOption) *proc {
	t.Helper()
	return e.procOf(t, newFault(e.h.NewBackend(t)), opts...)
}

// procOf builds a process on fb.
func (e *env) procOf(t *testing.T, fb *faultBackend, opts ...core.ClientOption) *proc {
	t.Helper()
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
	ctx := ctxT(t, 10*time.Second)
	s, err := p.l.TryAcquire(ctx, key, opts...)
	for try := 1; try < 3 && errors.Is(err, core.ErrLeaseLost); try++ {
		// A reply that came past the renew deadline (a stalled machine):
		// the engine refused the session and undid the claim. A rule's
		// set-up tries again; what the rule checks comes after.
		t.Logf("TryAcquire(%q): %v; trying again", key, err)
		s, err = p.l.TryAcquire(ctx, key, opts...)
	}
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

// sent waits for the goroutines of wg, which send their errors on errs,
// and returns the errors they sent.
func sent(wg *sync.WaitGroup, errs chan error) []error {
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return all
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
