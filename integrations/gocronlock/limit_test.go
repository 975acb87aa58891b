package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/gocronlock"
)

// Rule: with Limit(2), two runs of a lease-mode job hold its lock at once,
// on two schedulers, each with its own fencing token; a third is refused
// with core.ErrNotAcquired, and runs once one of the two unlocks.
// Locker.Limit sets one job's limit, over the option's.
func TestLockerLimitLease(t *testing.T) {
	store := newMemStore(t)
	a, b := store.open(), store.open()
	la, err := gocronlock.NewLocker(a, gocronlock.Limit(2), quiet(t))
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := gocronlock.NewLocker(b, gocronlock.Limit(2), quiet(t))
	ctx := context.Background()
	l1 := mustLock(t, la, "sync", "first Lock under Limit(2)")
	l2 := mustLock(t, lb, "sync", "second Lock under Limit(2)")
	if _, err := la.Lock(ctx, "sync"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("third Lock under Limit(2): %v, want core.ErrNotAcquired", err)
	}
	holders, err := a.Holders(ctx, gocronlock.DefaultPrefix+"sync")
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 2 || holders[0].Token == holders[1].Token || holders[0].Limit != 2 {
		t.Errorf("holders %+v, want two permits of 2 with distinct tokens", holders)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := mustLock(t, la, "sync", "Lock after one of two unlocked")
	_ = l2.Unlock(ctx)
	_ = l3.Unlock(ctx)

	// One job of three at once; Limit(0) goes back to the option's 2.
	if err := la.Limit("batch", 3); err != nil {
		t.Fatal(err)
	}
	var held []gocron.Lock
	for i := range 3 {
		lk, err := la.Lock(ctx, "batch")
		if err != nil {
			t.Fatalf("Lock %d of batch under Locker.Limit 3: %v", i, err)
		}
		held = append(held, lk)
	}
	if _, err := la.Lock(ctx, "batch"); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("fourth Lock of batch: %v, want core.ErrNotAcquired", err)
	}
	for _, lk := range held {
		_ = lk.Unlock(ctx)
	}
	if err := la.Limit("batch", 0); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		lk, err := la.Lock(ctx, "batch")
		if err != nil {
			t.Fatalf("Lock %d of batch back under Limit(2): %v", i, err)
		}
		defer lk.Unlock(ctx)
	}
	if _, err := la.Lock(ctx, "batch"); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("third Lock of batch back under Limit(2): %v, want core.ErrNotAcquired", err)
	}
}

// Rule: under a slot lock, Limit(2) lets two runs start per slot: the
// permits outlive Unlock until the slot ends, and a third start in the slot
// is refused.
func TestLockerLimitSlot(t *testing.T) {
	a := newMemStore(t).open()
	l, err := gocronlock.NewLocker(a, gocronlock.Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Schedule("hourly", core.Every(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		lock, err := l.Lock(ctx, "hourly")
		if err != nil {
			t.Fatalf("start %d in the slot under Limit(2): %v", i, err)
		}
		_ = lock.Unlock(ctx)
	}
	if _, err := l.Lock(ctx, "hourly"); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("third start in the slot: %v, want core.ErrNotAcquired", err)
	}
}

// Rule: a scheduler whose limit for a job differs from the one the job's
// current holders took it with skips the run with an error matching
// core.ErrLimitMismatch, and OnError sees it.
func TestLockerLimitMismatch(t *testing.T) {
	store := newMemStore(t)
	a, b := store.open(), store.open()
	la, _ := gocronlock.NewLocker(a, gocronlock.Limit(2), quiet(t))
	var reported []error
	lb, _ := gocronlock.NewLocker(b, gocronlock.OnError(func(_ string, err error) {
		if !errors.Is(err, gocronlock.ErrNoSchedule) {
			reported = append(reported, err)
		}
	}))
	ctx := context.Background()
	defer mustLock(t, la, "sync", "Lock under Limit(2)").Unlock(ctx)
	if _, err := lb.Lock(ctx, "sync"); !errors.Is(err, core.ErrLimitMismatch) {
		t.Errorf("Lock as a mutex of a job held under Limit(2): %v, want core.ErrLimitMismatch", err)
	}
	if len(reported) != 1 || !errors.Is(reported[0], core.ErrLimitMismatch) {
		t.Errorf("OnError got %v, want the mismatch", reported)
	}
}

// Rule: Wrap with Limit(2) runs two tasks of a key at once and refuses a
// third with core.ErrNotAcquired without calling it.
func TestTaskLimit(t *testing.T) {
	l := newMemStore(t).open()
	started := make(chan struct{}, 2)
	stop := make(chan struct{})
	run, err := gocronlock.Wrap(l, "k", func(ctx context.Context, s core.Session) error {
		started <- struct{}{}
		<-stop
		return nil
	}, gocronlock.Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- run(ctx) }()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-errs:
			t.Fatalf("a task ended before two ran: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("two tasks did not run at once under Limit(2)")
		}
	}
	if err := run(ctx); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("third task: %v, want core.ErrNotAcquired", err)
	}
	close(stop)
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// Rule: three gocron schedulers run a job every 50ms under Limit(2),
// each run held longer than the interval: two runs go on at once across the
// schedulers, never three. Each scheduler runs one at a time itself
// (singleton mode), so more than two at once could only come from the
// lock. Runs on memlock, and on PostgreSQL and Redis once their stores hold
// semaphores.
func TestLockerLimitAcrossSchedulers(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		if _, ok := e.backend(t).(core.SemaphoreBackend); !ok {
			t.Skipf("%s has no semaphores yet", e.name)
		}
		const n, runs = 2, 8
		var (
			mu            sync.Mutex
			running, most int
			done          int
		)
		full := make(chan struct{})
		finished := make(chan struct{})
		job := func(ctx context.Context) {
			mu.Lock()
			running++
			most = max(most, running)
			if running == n {
				select {
				case <-full:
				default:
					close(full)
				}
			}
			mu.Unlock()
			// The first runs wait until n run at once: a limit below n
			// shows as the timeout below.
			select {
			case <-full:
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			select {
			case <-time.After(100 * time.Millisecond): // the work
			case <-ctx.Done():
			}
			mu.Lock()
			running--
			done++
			if done == runs {
				close(finished)
			}
			mu.Unlock()
		}
		for range 3 {
			locker, err := gocronlock.NewLocker(e.locker(t), gocronlock.Limit(n), quiet(t))
			if err != nil {
				t.Fatal(err)
			}
			s := newScheduler(t, gocron.WithDistributedLocker(locker))
			if _, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(job),
				gocron.WithName("limited"), gocron.WithSingletonMode(gocron.LimitModeReschedule)); err != nil {
				t.Fatal(err)
			}
			s.Start()
		}
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d runs finished", done)
		}
		select {
		case <-full:
		default:
			t.Fatalf("%d runs never overlapped across the schedulers under Limit(%d)", n, n)
		}
		mu.Lock()
		defer mu.Unlock()
		if most != n {
			t.Errorf("at most %d runs at once, want %d", most, n)
		}
	})
}
