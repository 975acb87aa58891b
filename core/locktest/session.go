package locktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

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
	a, b, k := e.pair(t)
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
