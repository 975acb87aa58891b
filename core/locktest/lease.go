package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

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
