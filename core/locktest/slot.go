package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testSlot(t *testing.T, e *env) {
	skipIf(t, e.h.NoSlots, "backend has no slot mode (NoSlots)")
	const rule = "slot mode allows one start per slot, computed on the store's clock, and the next slot starts afresh"
	a, b, k := e.pair(t)
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
	a, b, k := e.pair(t)
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
