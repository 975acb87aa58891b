package asynqlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/asynqlock"
)

// TestMiddleware_Limit: under Limit(3) three tasks of a key run at once
// (each with its own permit and fencing token) and a fourth is busy; when
// one of the three ends, the fourth runs.
func TestMiddleware_Limit(t *testing.T) {
	_, l, _ := lockers(t)
	ctx := context.Background()
	mw := mustNew(t, l, asynqlock.Limit(3), asynqlock.OnBusy(asynqlock.RetryLater), asynqlock.BusyDelay(0, 0))
	task := asynq.NewTask("t", nil)
	type run struct {
		token uint64
		stop  chan struct{}
	}
	started := make(chan run, 3)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			errs <- mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				s, ok := core.SessionFromContext(ctx)
				if !ok {
					return errors.New("no session in ctx")
				}
				r := run{token: s.Token(), stop: make(chan struct{})}
				started <- r
				<-r.stop
				return nil
			})).ProcessTask(ctx, task)
		}()
	}
	var runs []run
	tokens := map[uint64]bool{}
	for range 3 {
		select {
		case r := <-started:
			runs = append(runs, r)
			tokens[r.token] = true
		case err := <-errs:
			t.Fatalf("one of the first three tasks ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("three tasks of one key did not run at once under Limit(3)")
		}
	}
	if len(tokens) != 3 {
		t.Errorf("fencing tokens %v, want three distinct ones", tokens)
	}
	wantBusy(t, ctx, mw, task, "a fourth task, while three held the permits,")
	close(runs[0].stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil })).ProcessTask(ctx, task); err != nil || !ran {
		t.Fatalf("after a permit freed: err = %v, ran = %v", err, ran)
	}
	for _, r := range runs[1:] {
		close(r.stop)
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestMiddleware_LimitMismatch: a key held as a mutex (a server without
// Limit, or during a rolling change of it) is busy for a task under
// Limit(3): a bounce that uses no retry and says why.
func TestMiddleware_LimitMismatch(t *testing.T) {
	ctx := context.Background()
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"t")
	defer s.Release(ctx)
	for _, p := range []asynqlock.Policy{asynqlock.RetryLater, asynqlock.HandOff(1)} {
		mw := mustNew(t, l, asynqlock.Limit(3), asynqlock.OnBusy(p), asynqlock.HandOffWait(50*time.Millisecond))
		err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			t.Errorf("%v: the task ran while the key was held as a mutex", p)
			return nil
		})).ProcessTask(ctx, asynq.NewTask("t", nil))
		var b *asynqlock.BusyError
		if !errors.As(err, &b) || asynqlock.IsFailure(err) || !errors.Is(err, core.ErrLimitMismatch) {
			t.Errorf("%v: err = %v, want a *BusyError matching ErrLimitMismatch", p, err)
		}
	}
}

// TestMiddleware_LimitHandOff: under Limit(2) and HandOff, a task that
// finds both permits taken waits in line and runs as soon as one is
// released, without a bounce.
func TestMiddleware_LimitHandOff(t *testing.T) {
	_, holder, l := lockers(t)
	ctx := context.Background()
	key := asynqlock.DefaultPrefix + "t"
	var held []core.Session
	for range 2 {
		s, err := holder.TryAcquire(ctx, key, core.Limit(2))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	defer func() {
		for _, s := range held {
			s.Release(ctx)
		}
	}()
	w := watchedLocker{Locker: l, acquiring: make(chan string, 1)}
	mw := mustNew(t, w, asynqlock.Limit(2), asynqlock.HandOffWait(time.Minute))
	started, done := waitInLine(t, ctx, mw, w, asynq.NewTask("t", nil), "the busy task")
	runsOnRelease(t, held[0], started)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
