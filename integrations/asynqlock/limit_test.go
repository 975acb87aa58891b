package asynqlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/asynqlock"
)

// mutexOnly hides every optional interface of a backend: a store without
// semaphores.
type mutexOnly struct{ core.Backend }

// TestWithLimit_NeedsSemaphores: Limit(n > 1) on a Locker whose backend
// has no semaphores fails in New, naming the option; Limit(1) is a
// mutex and works anywhere.
func TestWithLimit_NeedsSemaphores(t *testing.T) {
	c, err := core.New(mutexOnly{memlock.NewStore().Backend()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = asynqlock.New(c, asynqlock.Limit(3))
	if !errors.Is(err, core.ErrInvalidOption) || !errors.Is(err, core.ErrUnsupported) || !strings.Contains(err.Error(), "Limit") {
		t.Errorf("err = %v, want ErrInvalidOption and ErrUnsupported naming Limit", err)
	}
	if _, err := asynqlock.New(c, asynqlock.Limit(1)); err != nil {
		t.Errorf("Limit(1) on a mutex-only backend: %v", err)
	}
}

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
	err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Error("a fourth task ran while three held the permits")
		return nil
	})).ProcessTask(ctx, task)
	var b *asynqlock.BusyError
	if !errors.As(err, &b) || asynqlock.IsFailure(err) {
		t.Fatalf("fourth task: err = %v, want a *BusyError", err)
	}
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
	started := make(chan time.Time, 1)
	done := make(chan error, 1)
	go func() {
		done <- mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			started <- time.Now()
			return nil
		})).ProcessTask(ctx, asynq.NewTask("t", nil))
	}()
	select {
	case <-w.acquiring:
	case <-time.After(10 * time.Second):
		t.Fatal("the busy task did not wait in line")
	}
	runsOnRelease(t, held[0], started)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// limitRig counts the handler runs of one key under Limit(n): running
// now, the most at once, and whether n ran at once. The first n runs each
// wait until n run at once (at most waitLong), so that a limit below n
// shows as a timeout.
type limitRig struct {
	n       int
	mu      sync.Mutex
	running int
	most    int
	full    chan struct{}
	done    chan struct{}
}

func newLimitRig(n, tasks int) *limitRig {
	return &limitRig{n: n, full: make(chan struct{}), done: make(chan struct{}, tasks)}
}

func (r *limitRig) handle(ctx context.Context, _ *asynq.Task) error {
	r.mu.Lock()
	r.running++
	r.most = max(r.most, r.running)
	if r.running == r.n {
		select {
		case <-r.full:
		default:
			close(r.full)
		}
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}()
	select {
	case <-r.full:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(waitLong):
		return errors.New("n runs never overlapped")
	}
	select {
	case <-time.After(10 * time.Millisecond): // the work
	case <-ctx.Done():
		return ctx.Err()
	}
	r.done <- struct{}{}
	return nil
}

// TestServers_Limit: two servers of 3 workers each, Limit(3) and the
// default HandOff, 15 tasks of one key: 3 run at once and never more, every
// task completes, and busy bounces use no retry.
func TestServers_Limit(t *testing.T) {
	e := newEnv(t)
	_, la, lb := lockers(t)
	limitAcrossServers(t, e, la, lb)
}

// TestServers_Limit_Stores: the same with the permits in a store the
// servers share (see forEachStore), each server with its own client.
func TestServers_Limit_Stores(t *testing.T) {
	forEachStore(t, func(t *testing.T, la, lb core.Locker) {
		if _, ok := la.(*core.Client).Backend().(core.SemaphoreBackend); !ok {
			t.Skip("no semaphores on this store")
		}
		limitAcrossServers(t, newEnv(t), la, lb)
	})
}

func limitAcrossServers(t *testing.T, e *env, la, lb core.Locker) {
	const n, tasks = 3, 15
	r := newLimitRig(n, tasks)
	for _, l := range []core.Locker{la, lb} {
		cfg := wired()
		cfg.Concurrency = 3
		e.serve(cfg, asynqlock.MustNew(l, asynqlock.Limit(n), asynqlock.BusyDelay(0, 0)), r.handle)
	}
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = e.enqueue(string(rune('a' + i))).ID
	}
	for range tasks {
		recv(t, r.done, "every task to run")
	}
	for _, id := range ids {
		e.completed(id, 0)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.most != n {
		t.Errorf("at most %d tasks of the key ran at once, want exactly %d", r.most, n)
	}
}
