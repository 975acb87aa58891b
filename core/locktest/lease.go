package locktest

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testStaleSession(t *testing.T, e *env) {
	const rule = "a stale session can neither renew nor release a newer holder's lock"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k)
	stale := a.fault.ownerToken(k)
	a.fault.down.Store(true) // a is cut off; its lease runs out
	waitDone(t, rule, s, 5*e.ttl)
	// The new holder's lease must outlast the rule's remaining steps
	// without depending on timely renewals on a busy machine.
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k, core.TTL(checkTTL))
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
	a, b, k := e.pair(t)
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
	a, b, k := e.pair(t)
	mustAcquire(t, a, k)
	start := time.Now()
	a.fault.down.Store(true) // the holder "crashes": no renewal reaches the store
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k, core.Backoff(10*time.Millisecond, e.ttl/4))
	if err != nil {
		t.Fatalf("rule %q: %v", rule, err)
	}
	if d := time.Since(start); d > e.ttl+time.Second+e.h.ExpiryLag {
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
	skipIf(t, e.h.Steal == nil, "harness has no Steal")
	a, k := lossBehindBack(t, e, "a stolen lock is signalled as lost at the next renewal", "Steal", e.h.Steal)
	mustBusy(t, "after a loss the thief still holds the key", a, k)
}

func testLossDeleted(t *testing.T, e *env) {
	skipIf(t, e.h.Delete == nil, "harness has no Delete")
	lossBehindBack(t, e, "a lock deleted behind the holder's back is signalled as lost", "Delete", e.h.Delete)
}

// lossBehindBack acquires a key, has hook (the harness's Steal or Delete,
// named name) take it on the store's side, and checks rule: the holder
// learns of the loss at its next renewal, and can still Release. It
// returns the holder's process and the key.
func lossBehindBack(t *testing.T, e *env, rule, name string, hook func(context.Context, string) error) (*proc, string) {
	t.Helper()
	a := e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k)
	if err := hook(ctxT(t, 10*time.Second), k); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	expectLost(t, rule, s, e.ttl+2*time.Second)
	releaseLost(t, s)
	return a, k
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
	a, b, k := e.pair(t)
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
	a, b, k := e.pair(t)
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

func testClaimLife(t *testing.T, e *env) {
	const rule = "a claim's lease says the store keeps it for at least its TTL less its Slack"
	p := e.proc(t)
	k := e.key(t)
	// Claims one after another for longer than the TTL, so that whatever
	// the backend shares between claims (a lease) ages across its whole
	// life, then three that allow no slack.
	until := time.Now().Add(e.ttl * 3 / 2)
	for i, last := 0, -1; last < 0 || i < last+3; i++ {
		slack := e.ttl / 2
		if last < 0 && !time.Now().Before(until) {
			last = i
		}
		if last >= 0 {
			slack = 0
		}
		ctx := ctxT(t, 10*time.Second)
		req := core.AcquireRequest{Key: k, Owner: "locktest", OwnerToken: rand.Text(), TTL: e.ttl, Slack: slack}
		l, err := p.fault.Backend.TryAcquire(ctx, req)
		if err != nil {
			t.Fatalf("rule %q: claim %d: %v", rule, i, err)
		}
		// A millisecond of rounding: stores keep times in milliseconds.
		if !l.AcquiredAt.IsZero() && !l.ExpiresAt.IsZero() && l.ExpiresAt.Sub(l.AcquiredAt) < e.ttl-slack-time.Millisecond {
			t.Fatalf("rule %q: claim %d with TTL %v and slack %v is kept for %v", rule, i, e.ttl, slack, l.ExpiresAt.Sub(l.AcquiredAt))
		}
		// (A release that finds the claim expired, after a stalled store
		// call on a busy machine, is no concern of this rule.)
		if err := p.fault.Backend.Release(ctx, core.ReleaseRequest{Key: k, OwnerToken: req.OwnerToken}); err != nil && !errors.Is(err, core.ErrLeaseLost) {
			t.Fatalf("rule %q: release of claim %d: %v", rule, i, err)
		}
	}
}
