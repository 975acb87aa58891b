package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of Session.Check, which every backend gets from core as a one-item
// Renew: they check that the backend's Renew tells a held lease from a lost
// one on the store itself, not from anything the client remembers.

// checkTTL is the lease of the Check rules: long enough that no renewal is
// due while a rule runs, so that only Check can have seen what the store did.
const checkTTL = 30 * time.Second

// testCheckHeld checks rule "Check on a held session is nil, renews it and
// moves its Deadline forward; the lock stays held".
func testCheckHeld(t *testing.T, e *env) {
	const rule = "Check on a held session is nil, renews it and moves its Deadline forward; the lock stays held"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	defer s.Release(context.Background())
	d0 := s.Deadline()
	before := a.fault.renews.Load()
	if err := s.Check(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("rule %q: Check = %v", rule, err)
	}
	if n := a.fault.renews.Load() - before; n < 1 {
		t.Errorf("rule %q: Check sent no Renew to the store", rule)
	}
	if !s.Deadline().After(d0) {
		t.Errorf("rule %q: Deadline %v did not move forward from %v", rule, s.Deadline(), d0)
	}
	if s.Err() != nil {
		t.Fatalf("rule %q: session ended: %v", rule, s.Err())
	}
	mustBusy(t, rule, b, k)
	if err := s.Check(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("rule %q: second Check = %v", rule, err)
	}
}

// checkLost runs Check on s, whose lease the store no longer has, and checks
// that it reports the loss and ends the session at once.
func checkLost(t *testing.T, rule string, s core.Session) {
	t.Helper()
	err := s.Check(ctxT(t, 10*time.Second))
	if !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("rule %q: Check = %v, want an error matching ErrLeaseLost", rule, err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatalf("rule %q: the session did not end when Check reported the loss", rule)
	}
	if !errors.Is(s.Err(), core.ErrLeaseLost) || !errors.Is(context.Cause(s.Context()), core.ErrLeaseLost) {
		t.Fatalf("rule %q: Err=%v cause=%v, want ErrLeaseLost", rule, s.Err(), context.Cause(s.Context()))
	}
	if err := s.Check(ctxT(t, 10*time.Second)); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("rule %q: Check after the loss = %v, want ErrLeaseLost again", rule, err)
	}
}

// testCheckLost checks rule "Check reports a lease the store no longer
// has (force-released, deleted or stolen) as ErrLeaseLost and ends the
// session", with each of the hooks the harness has.
func testCheckLost(t *testing.T, e *env) {
	const rule = "Check reports a lease the store no longer has (force-released, deleted or stolen) as ErrLeaseLost and ends the session"
	k := e.key(t)
	t.Run("ForceRelease", func(t *testing.T) {
		skipIf(t, e.h.NoAdmin, "backend has no Admin (NoAdmin)")
		a, b := e.proc(t), e.proc(t)
		adm, ok := b.l.(core.Admin)
		skipIf(t, !ok, "the Locker under test does not expose Admin")
		s := mustAcquire(t, a, k+"/force", core.TTL(checkTTL))
		if released, err := adm.ForceRelease(ctxT(t, 10*time.Second), s.Key()); err != nil || !released {
			t.Fatalf("ForceRelease = %v, %v", released, err)
		}
		checkLost(t, rule, s)
		releaseLost(t, s)
		s2 := mustAcquire(t, b, s.Key()) // free after the force release
		s2.Release(context.Background())
	})
	t.Run("Delete", func(t *testing.T) {
		skipIf(t, e.h.Delete == nil, "harness has no Delete")
		a, b := e.proc(t), e.proc(t)
		s := mustAcquire(t, a, k+"/delete", core.TTL(checkTTL))
		if err := e.h.Delete(ctxT(t, 10*time.Second), s.Key()); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		checkLost(t, rule, s)
		releaseLost(t, s)
		s2 := mustAcquire(t, b, s.Key())
		s2.Release(context.Background())
	})
	t.Run("Steal", func(t *testing.T) {
		skipIf(t, e.h.Steal == nil, "harness has no Steal")
		a := e.proc(t)
		s := mustAcquire(t, a, k+"/steal", core.TTL(checkTTL))
		if err := e.h.Steal(ctxT(t, 10*time.Second), s.Key()); err != nil {
			t.Fatalf("Steal: %v", err)
		}
		checkLost(t, rule, s)
		releaseLost(t, s)
		mustBusy(t, "after a loss that Check found, the thief still holds the key", a, s.Key())
	})
}

// testCheckReleased checks rule "Check on a released session returns
// ErrReleased without asking the store".
func testCheckReleased(t *testing.T, e *env) {
	const rule = "Check on a released session returns ErrReleased without asking the store"
	a := e.proc(t)
	k := e.key(t)
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := a.fault.renews.Load()
	if err := s.Check(ctxT(t, 10*time.Second)); !errors.Is(err, core.ErrReleased) {
		t.Fatalf("rule %q: Check = %v, want ErrReleased", rule, err)
	}
	if n := a.fault.renews.Load() - before; n != 0 {
		t.Errorf("rule %q: Check of a released session sent %d Renew calls", rule, n)
	}
}

// testCheckUnreachable checks rule "Check that cannot reach the store
// returns the store's error, not ErrLeaseLost, and the session stays held".
func testCheckUnreachable(t *testing.T, e *env) {
	const rule = "Check that cannot reach the store returns the store's error, not ErrLeaseLost, and the session stays held"
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k, core.TTL(checkTTL))
	defer s.Release(context.Background())
	a.fault.down.Store(true)
	err := s.Check(ctxT(t, 10*time.Second))
	a.fault.down.Store(false)
	if err == nil || errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("rule %q: Check = %v, want the store's error", rule, err)
	}
	if !errors.Is(err, errDown) {
		t.Errorf("rule %q: the store's error is not kept: %v", rule, err)
	}
	if s.Err() != nil {
		t.Fatalf("rule %q: the session ended: %v", rule, s.Err())
	}
	mustBusy(t, rule, b, k)
	if err := s.Check(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("rule %q: Check once the store answers again = %v", rule, err)
	}
}
