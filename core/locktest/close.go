package locktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

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
