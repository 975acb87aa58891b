package gocronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/gocronlock"
	"github.com/dislock/dislock/internal/testenv"
)

// Rule: a wrapped task whose lease is lost while it runs sees its context
// cancelled with cause core.ErrLeaseLost, and the run returns an error
// matching core.ErrLeaseLost (reported to OnError too).
func TestTaskLeaseLost(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		admin := e.locker(t)
		sessions := make(chan core.Session, 1)
		causes := make(chan error, 1)
		reported := make(chan error, 4)
		task, err := gocronlock.NewTask(e.locker(t), "report", func(ctx context.Context, s core.Session) error {
			if got, ok := core.SessionFromContext(ctx); !ok || got != s {
				t.Errorf("ctx does not carry the session")
			}
			sessions <- s
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil
		}, gocronlock.TTL(time.Second), gocronlock.OnError(func(_ string, err error) { reported <- err }))
		if err != nil {
			t.Fatal(err)
		}
		runErrs := make(chan error, 1)
		s := newScheduler(t)
		if _, err := s.NewJob(gocron.DurationJob(time.Hour), task,
			gocron.WithStartAt(gocron.WithStartImmediately()),
			gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { runErrs <- err }))); err != nil {
			t.Fatal(err)
		}
		s.Start()
		sess := within(t, sessions, 5*time.Second, "the task to start")
		if sess.Key() != gocronlock.DefaultPrefix+"report" || sess.Token() == 0 {
			t.Errorf("session key %q token %d", sess.Key(), sess.Token())
		}
		// Someone else breaks the lock; the holder learns at its next renewal.
		if ok, err := admin.ForceRelease(context.Background(), sess.Key()); err != nil || !ok {
			t.Fatalf("ForceRelease: %v, %v", ok, err)
		}
		if cause := within(t, causes, 3*time.Second, "cancel of the task ctx"); !errors.Is(cause, core.ErrLeaseLost) {
			t.Errorf("task ctx cause %v, want core.ErrLeaseLost", cause)
		}
		if err := within(t, runErrs, 3*time.Second, "error from the run"); !errors.Is(err, core.ErrLeaseLost) {
			t.Errorf("run returned %v, want core.ErrLeaseLost", err)
		}
		if len(reported) == 0 { // by the time the run returned
			t.Error("loss not reported to OnError")
		} else if err := <-reported; !errors.Is(err, core.ErrLeaseLost) {
			t.Errorf("OnError got %v, want core.ErrLeaseLost", err)
		}
		if err := s.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
}

// Rule: a wrapped task on a busy lock returns an error matching
// core.ErrNotAcquired without running; when free, it runs with the session
// and releases afterwards.
func TestTaskBusyMemlock(t *testing.T) {
	e := newEnv(t, "memlock")
	other := e.locker(t)
	ctx := context.Background()
	calls := 0
	run, err := gocronlock.Wrap(e.locker(t), "job", func(ctx context.Context, s core.Session) error {
		calls++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	held := testenv.Hold(t, ctx, other, gocronlock.DefaultPrefix+"job")
	if err := run(ctx); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("busy run returned %v, want core.ErrNotAcquired", err)
	}
	if calls != 0 {
		t.Errorf("fn ran on a busy lock")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx); err != nil || calls != 1 {
		t.Errorf("free run: %v, calls %d", err, calls)
	}
	if _, ok, _ := other.Inspect(ctx, gocronlock.DefaultPrefix+"job"); ok {
		t.Errorf("lock still held after the run")
	}
}

// Rule: a lease taken from the run while fn ran, with no renewal in between
// to notice (TTL 1m), is found by the release: the run returns the loss —
// joined with fn's error when fn failed — and OnError sees it once.
func TestTaskLossFoundAtRelease(t *testing.T) {
	e := newEnv(t, "memlock")
	admin := e.locker(t)
	for _, want := range []error{nil, errors.New("job failed")} {
		var reported []error
		run, err := gocronlock.Wrap(e.locker(t), "found", func(ctx context.Context, s core.Session) error {
			if ok, err := admin.ForceRelease(ctx, s.Key()); err != nil || !ok {
				t.Fatalf("ForceRelease: %v, %v", ok, err)
			}
			return want
		}, gocronlock.TTL(time.Minute), gocronlock.OnError(func(_ string, err error) { reported = append(reported, err) }))
		if err != nil {
			t.Fatal(err)
		}
		err = run(context.Background())
		if !errors.Is(err, core.ErrLeaseLost) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("fn returned %v: run = %v, want the loss (and fn's error)", want, err)
		}
		if len(reported) != 1 || !errors.Is(reported[0], core.ErrLeaseLost) {
			t.Errorf("fn returned %v: OnError got %v, want the loss once", want, reported)
		}
	}
}
