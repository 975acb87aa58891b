package locktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// testReleaseReportsGone checks that a holder whose lease the store no
// longer has — force-released, then taken by another owner, or simply
// gone — hears of it from Release when no renewal told it first: its
// critical section may not have been exclusive. The lease is long, so that
// no renewal comes between the force-release and the Release.
func testReleaseReportsGone(t *testing.T, e *env) {
	skipIf(t, e.h.NoAdmin, "backend has no Admin (NoAdmin): nothing can take the key behind the holder's back")
	const rule = "a Release that finds the lease gone from the store returns an error matching ErrLeaseLost and ErrLeaseGone, ends the session as lost and frees nothing of another owner's; a second Release returns nil"
	const ttl = 30 * time.Second // renewals every 10s: none in between
	cases := []struct {
		name     string
		opts     []core.Option
		takeOver bool // another owner claims the key before the Release
	}{
		{"taken over", nil, true},
		{"gone, min hold", []core.Option{core.MinHold(ttl)}, false},
		{"permit taken over", []core.Option{core.Limit(semLimit)}, true},
	}
	a, b := e.proc(t), e.proc(t)
	_, sem := a.fault.Backend.(core.SemaphoreBackend)
	for i, c := range cases {
		if i == 2 && !sem {
			t.Logf("%s: skipped, backend has no semaphores", c.name)
			continue
		}
		k := e.key(t) + "/" + string(rune('a'+i))
		opts := append([]core.Option{core.TTL(ttl)}, c.opts...)
		s := mustAcquire(t, a, k, opts...)
		if released, err := a.c.ForceRelease(ctxT(t, 10*time.Second), k); err != nil || !released {
			t.Fatalf("%s: ForceRelease = %v, %v", c.name, released, err)
		}
		var other core.Session
		if c.takeOver {
			other = mustAcquire(t, b, k, opts...)
		}
		err := s.Release(context.Background())
		if !errors.Is(err, core.ErrLeaseLost) || !errors.Is(err, core.ErrLeaseGone) {
			t.Errorf("rule %q: %s: Release = %v", rule, c.name, err)
		}
		select {
		case <-s.Done():
		default:
			t.Errorf("rule %q: %s: Done not closed after Release", rule, c.name)
		}
		if !errors.Is(s.Err(), core.ErrLeaseLost) || !errors.Is(context.Cause(s.Context()), core.ErrLeaseLost) {
			t.Errorf("rule %q: %s: Err = %v, context cause = %v, want lost", rule, c.name, s.Err(), context.Cause(s.Context()))
		}
		if err := s.Release(context.Background()); err != nil {
			t.Errorf("rule %q: %s: second Release = %v", rule, c.name, err)
		}
		if other != nil {
			if err := other.Check(ctxT(t, 10*time.Second)); err != nil {
				t.Errorf("rule %q: %s: the new owner's lease after the old holder's Release: %v", rule, c.name, err)
			}
			if err := other.Release(context.Background()); err != nil {
				t.Errorf("rule %q: %s: the new owner's Release = %v", rule, c.name, err)
			}
		}
	}
}

func testReleaseIdempotent(t *testing.T, e *env) {
	const rule = "Release is idempotent and ends the session with ErrReleased"
	a, b, k := e.pair(t)
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
	a, b, k := e.pair(t)
	s := mustAcquire(t, a, k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Release(ctx); err != nil {
		t.Fatalf("rule %q: %v", "Release works with a cancelled ctx", err)
	}
	s2 := mustAcquire(t, b, k)
	s2.Release(context.Background())
}

func testClose(t *testing.T, e *env) {
	const rule = "Close releases every session, ends them with ErrClosed and refuses new acquisitions"
	a, b, k := e.pair(t)
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
	a, b, k := e.pair(t)
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
