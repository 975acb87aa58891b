package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

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
