package asynqlock_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/asynqlock"
)

// TestServers_OneAtATime: two servers, many tasks for one key with
// different payloads (which asynq's Unique would not deduplicate): their
// handler runs never overlap and every task completes, without using up
// retries; with the locks in memory, in the same Redis (redislock), and
// in MySQL.
func TestServers_OneAtATime(t *testing.T) { onEachStore(t, oneAtATime) }

func oneAtATime(t *testing.T, e *env, la, lb core.Locker) {
	const n = 12
	type span struct{ start, end time.Time }
	var (
		mu    sync.Mutex
		spans []span
	)
	done := make(chan struct{}, n)
	h := func(ctx context.Context, _ *asynq.Task) error {
		s := span{start: time.Now()}
		select {
		case <-time.After(15 * time.Millisecond): // the work
		case <-ctx.Done():
			return ctx.Err()
		}
		s.end = time.Now()
		mu.Lock()
		spans = append(spans, s)
		mu.Unlock()
		done <- struct{}{}
		return nil
	}
	for _, l := range []core.Locker{la, lb} {
		cfg := wired()
		cfg.Concurrency = 3
		e.serve(cfg, asynqlock.MustNew(l, asynqlock.BusyDelay(0, 0)), h)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.enqueue(fmt.Sprintf(`{"n":%d}`, i)).ID
	}
	for i := 0; i < n; i++ {
		recv(t, done, "all tasks to run")
	}
	for _, id := range ids {
		e.completed(id, 0)
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
	for i := 1; i < len(spans); i++ {
		if spans[i].start.Before(spans[i-1].end) {
			t.Errorf("run %d started %v before run %d ended", i, spans[i-1].end.Sub(spans[i].start), i-1)
		}
	}
}

// TestServers_BusyKeepsRetryBudget: with IsFailure and RetryDelay wired in,
// a task bounced by RetryLater is retried again and again without its retry
// count growing, and runs once the holder lets go.
func TestServers_BusyKeepsRetryBudget(t *testing.T) {
	e := newEnv(t)
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"job")
	busy := make(chan error, 100)
	ran := make(chan struct{}, 1)
	cfg := wired()
	cfg.ErrorHandler = busyCounter(busy)
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.OnBusy(asynqlock.RetryLater), asynqlock.BusyDelay(0, 0)), func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	})
	id := e.enqueue("x", asynq.MaxRetry(1)).ID
	for i := 0; i < 3; i++ {
		recv(t, busy, "a busy bounce")
	}
	e.bounced(id, "after 3 busy bounces")
	s.Release(context.Background())
	recv(t, ran, "the handler to run")
	e.completed(id, 0)
}

// TestServers_ExhaustedWaits: on a task's last attempt asynq would archive
// any error, so a busy task is not bounced but waits (the default
// OnExhausted) and runs after the holder — also when another task already
// waits for the key (HandOff would bounce it otherwise).
func TestServers_ExhaustedWaits(t *testing.T) {
	e := newEnv(t)
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"job")
	busy := make(chan error, 100)
	ran := make(chan time.Time, 2)
	cfg := wired()
	cfg.ErrorHandler = busyCounter(busy)
	e.serve(cfg, asynqlock.MustNew(l), func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	})
	ids := []string{
		e.enqueue("x", asynq.MaxRetry(0), asynq.Timeout(waitLong)).ID,
		e.enqueue("y", asynq.MaxRetry(0), asynq.Timeout(waitLong)).ID,
	}
	for _, id := range ids {
		e.waitState(id, asynq.TaskStateActive)
	}
	released := time.Now()
	s.Release(context.Background())
	for range ids {
		if start := recv(t, ran, "the handler to run"); start.Before(released) {
			t.Error("handler ran before the holder released")
		}
	}
	for _, id := range ids {
		e.waitState(id, asynq.TaskStateCompleted)
	}
	if len(busy) != 0 {
		t.Errorf("%d busy errors reached asynq on the last attempt, want 0", len(busy))
	}
}

// TestServers_Policies: each busy policy leads to the asynq outcome it
// promises.
func TestServers_Policies(t *testing.T) {
	cases := []struct {
		p     asynqlock.Policy
		check func(e *env, id string)
	}{
		{asynqlock.Skip, func(e *env, id string) { e.waitState(id, asynq.TaskStateCompleted) }},
		{asynqlock.Revoke, func(e *env, id string) { e.waitGone(id) }},
		{asynqlock.Archive, func(e *env, id string) {
			if info := e.waitState(id, asynq.TaskStateArchived); !strings.Contains(info.LastErr, "busy") {
				t.Errorf("archived with last error %q", info.LastErr)
			}
		}},
		{asynqlock.Wait(waitLong), nil},
		{asynqlock.HandOff(1), nil},
	}
	for _, c := range cases {
		t.Run(c.p.String(), func(t *testing.T) {
			e := newEnv(t)
			s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"job")
			ran := make(chan time.Time, 1)
			e.serve(wired(), asynqlock.MustNew(l, asynqlock.OnBusy(c.p)), func(context.Context, *asynq.Task) error {
				ran <- time.Now()
				return nil
			})
			id := e.enqueue("x", asynq.Timeout(waitLong)).ID
			if c.check != nil {
				c.check(e, id)
				if len(ran) != 0 {
					t.Error("handler ran while the key was busy")
				}
				return
			}
			// Wait, HandOff: the task is being worked on (waiting) until the
			// holder goes.
			e.waitState(id, asynq.TaskStateActive)
			released := time.Now()
			s.Release(context.Background())
			if start := recv(t, ran, "the handler to run"); start.Before(released) {
				t.Error("handler ran before the holder released")
			}
			e.waitState(id, asynq.TaskStateCompleted)
		})
	}
}

// TestServers_LeaseLoss: when the lock is stolen while the handler runs, the
// handler's context is cancelled with ErrLeaseLost, and the task fails and is
// retried (counting one retry) even though the handler returned nil.
func TestServers_LeaseLoss(t *testing.T) {
	e := newEnv(t)
	store, l, _ := lockers(t)
	started := make(chan string, 1)
	causes := make(chan error, 1)
	done := make(chan struct{}, 1)
	failures := make(chan error, 10)
	cfg := wired()
	cfg.ErrorHandler = reportErrors(failures, asynqlock.IsFailure)
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.LockOptions(core.TTL(300*time.Millisecond)), asynqlock.BusyDelay(0, 0)),
		func(ctx context.Context, _ *asynq.Task) error {
			if n, _ := asynq.GetRetryCount(ctx); n > 0 {
				done <- struct{}{}
				return nil
			}
			s, ok := core.SessionFromContext(ctx)
			if !ok {
				return errors.New("no session in ctx")
			}
			started <- s.Key()
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
			case <-time.After(waitLong):
				causes <- errors.New("ctx not cancelled")
			}
			return nil
		})
	id := e.enqueue("x").ID
	key := recv(t, started, "the handler to start")
	if !store.Steal(key) {
		t.Fatalf("key %q not held while the handler runs", key)
	}
	if cause := recv(t, causes, "the handler's ctx to end"); !errors.Is(cause, core.ErrLeaseLost) {
		t.Errorf("ctx cause = %v, want ErrLeaseLost", cause)
	}
	if err := recv(t, failures, "the task to fail"); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("task failed with %v, want ErrLeaseLost", err)
	}
	recv(t, done, "the retry to run")
	e.completed(id, 1)
}

// TestServers_PanicReleases: a panicking handler (asynq recovers the panic)
// does not leave its key locked.
func TestServers_PanicReleases(t *testing.T) {
	e := newEnv(t)
	store, l, _ := lockers(t)
	panicked := make(chan error, 1)
	cfg := wired()
	cfg.ErrorHandler = reportErrors(panicked, asynq.IsPanicError)
	key := asynqlock.DefaultPrefix + "job"
	e.serve(cfg, asynqlock.MustNew(l), func(context.Context, *asynq.Task) error {
		if !store.Held(key) {
			t.Error("key not held while the handler runs")
		}
		panic("boom")
	})
	id := e.enqueue("x", asynq.MaxRetry(0)).ID
	recv(t, panicked, "the panic to reach asynq")
	if store.Held(key) {
		t.Error("key still held after the handler panicked")
	}
	e.waitState(id, asynq.TaskStateArchived)
}

// TestServers_ByTaskID: under a server the task ID is in the context, and
// ByTaskID keys the lock by it.
func TestServers_ByTaskID(t *testing.T) {
	e := newEnv(t)
	_, l, _ := lockers(t)
	keys := make(chan string, 1)
	e.serve(wired(), asynqlock.MustNew(l, asynqlock.Key(asynqlock.ByTaskID)), func(ctx context.Context, _ *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx)
		keys <- s.Key()
		return nil
	})
	id := e.enqueue("x").ID
	if got, want := recv(t, keys, "the handler to run"), asynqlock.DefaultPrefix+"id:"+id; got != want {
		t.Errorf("lock key %q, want %q", got, want)
	}
	e.waitState(id, asynq.TaskStateCompleted)
}

// serveHotKey holds key "hot" elsewhere and serves the env's queue on
// three workers behind a middleware keyed by ByHeader("account") (with
// opts), whose handler sends each task's account on ran.
func (e *env) serveHotKey(t *testing.T, opts ...asynqlock.Option) (s core.Session, ran <-chan string) {
	t.Helper()
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"hot")
	accounts := make(chan string, 20)
	cfg := wired()
	cfg.Concurrency = 3
	opts = append([]asynqlock.Option{asynqlock.Key(asynqlock.ByHeader("account"))}, opts...)
	e.serve(cfg, asynqlock.MustNew(l, opts...), func(_ context.Context, task *asynq.Task) error {
		accounts <- task.Headers()["account"]
		return nil
	})
	return s, accounts
}

// TestServers_HotKeyLeavesWorkers: while a key is held elsewhere and has a
// backlog, HandOff lets one of its tasks wait and bounces the others, so
// that the server's other workers run other keys' tasks (under Wait(0) the
// backlog would take all three workers until the holder lets go).
func TestServers_HotKeyLeavesWorkers(t *testing.T) {
	e := newEnv(t)
	s, ran := e.serveHotKey(t)
	enqueue := func(acct string) {
		e.enqueueTask(asynq.NewTaskWithHeaders("job", []byte(acct), map[string]string{"account": acct}), asynq.Timeout(waitLong))
	}
	const hot, other = 10, 5
	for range hot {
		enqueue("hot")
	}
	for i := range other {
		enqueue(fmt.Sprint("other-", i))
	}
	for range other {
		if acct := recv(t, ran, "the other keys' tasks to run"); acct == "hot" {
			t.Fatal("a task of the held key ran")
		}
	}
	s.Release(context.Background())
	for range hot {
		if acct := recv(t, ran, "the hot key's tasks to run after the release"); acct != "hot" {
			t.Fatalf("task of %q ran twice", acct)
		}
	}
}

// TestServers_HandOffWaitFreesSmallServer: on a server of Concurrency 1, a
// task waiting in HandOff's line for a key held elsewhere gives its worker
// back after HandOffWait, bounced without using a retry, so that another
// key's task runs while the holder runs on; after the release the task
// completes, never having been counted as failed.
func TestServers_HandOffWaitFreesSmallServer(t *testing.T) {
	e := newEnv(t)
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"hot")
	busy := make(chan error, 100)
	ran := make(chan string, 10)
	cfg := wired()
	cfg.Concurrency = 1
	cfg.ErrorHandler = busyCounter(busy)
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.Key(asynqlock.ByHeader("account")),
		asynqlock.HandOffWait(300*time.Millisecond), asynqlock.BusyDelay(0, 0)),
		func(_ context.Context, task *asynq.Task) error {
			ran <- task.Headers()["account"]
			return nil
		})
	// The deadline is far beyond the test's patience: without the bound the
	// only worker would wait for it.
	hot := e.byAccount("hot", asynq.Timeout(5*time.Minute)).ID
	e.waitState(hot, asynq.TaskStateActive)
	e.byAccount("other", asynq.Timeout(time.Minute))
	if acct := recv(t, ran, "the other key's task to run"); acct != "other" {
		t.Fatalf("task of %q ran while its key was held", acct)
	}
	recv(t, busy, "a busy bounce of the waiter")
	e.bounced(hot, "the bounced waiter")
	s.Release(context.Background())
	if acct := recv(t, ran, "the hot task to run after the release"); acct != "hot" {
		t.Fatalf("task of %q ran twice", acct)
	}
	e.completed(hot, 0)
}

// TestServers_HandOffStopsBeforeDeadline: a waiter whose deadline comes
// before HandOffWait stops waiting a little before it and is bounced, so
// that the deadline does not turn the wait into a failure that uses a retry.
func TestServers_HandOffStopsBeforeDeadline(t *testing.T) {
	e := newEnv(t)
	_, l := heldElsewhere(t, asynqlock.DefaultPrefix+"job")
	busy := make(chan error, 100)
	cfg := wired()
	cfg.ErrorHandler = busyCounter(busy)
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.HandOffWait(time.Hour), asynqlock.BusyDelay(0, 0)),
		func(context.Context, *asynq.Task) error {
			t.Error("handler ran while the key was held")
			return nil
		})
	id := e.enqueue("x", asynq.Timeout(2*time.Second), asynq.MaxRetry(3)).ID
	err := recv(t, busy, "the waiter's bounce")
	var b *asynqlock.BusyError
	if !errors.As(err, &b) {
		t.Fatalf("the waiter ended with %v, want a *BusyError", err)
	}
	info, err := e.insp.GetTaskInfo(e.queue, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Retried != 0 {
		t.Errorf("after the waiter's deadline: retried %d, want 0 (last error %q)", info.Retried, info.LastErr)
	}
}

// TestServers_ExhaustedHandOffBounded: a backlog of tasks on their last
// attempt (MaxRetry(0)) for a key held elsewhere does not take every worker
// of the server: one waits in HandOff's line (until its deadline), the
// others wait at most HandOffWait and are archived with the busy error, and
// other keys' tasks run meanwhile. After the release the one in line runs.
func TestServers_ExhaustedHandOffBounded(t *testing.T) {
	e := newEnv(t)
	s, ran := e.serveHotKey(t, asynqlock.HandOffWait(200*time.Millisecond))
	const hot, other = 8, 4
	var ids []string
	for range hot {
		ids = append(ids, e.byAccount("hot", asynq.MaxRetry(0), asynq.Timeout(5*time.Minute)).ID)
	}
	for i := range other {
		e.byAccount(fmt.Sprint("other-", i), asynq.MaxRetry(0), asynq.Timeout(time.Minute))
	}
	for range other {
		if acct := recv(t, ran, "the other keys' tasks to run"); acct == "hot" {
			t.Fatal("a task of the held key ran")
		}
	}
	// Every hot task but the one in line is archived; that one is active.
	var waiting string
	deadline := time.Now().Add(waitLong)
	for waiting == "" {
		archived := 0
		for _, id := range ids {
			info, err := e.insp.GetTaskInfo(e.queue, id)
			if err != nil {
				t.Fatal(err)
			}
			switch info.State {
			case asynq.TaskStateArchived:
				archived++
				if !strings.Contains(info.LastErr, "busy") {
					t.Fatalf("hot task archived with %q, want the busy error", info.LastErr)
				}
			case asynq.TaskStateActive:
				waiting = id
			}
		}
		if archived != hot-1 {
			waiting = ""
		}
		if waiting == "" {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d hot tasks archived, want all but the one in line", archived, hot)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	s.Release(context.Background())
	if acct := recv(t, ran, "the waiting hot task to run after the release"); acct != "hot" {
		t.Fatalf("task of %q ran twice", acct)
	}
	e.waitState(waiting, asynq.TaskStateCompleted)
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
// task completes, and busy bounces use no retry; with the permits in
// memory, and in the same Redis (redislock).
func TestServers_Limit(t *testing.T) { onEachStore(t, limitAcrossServers) }

func limitAcrossServers(t *testing.T, e *env, la, lb core.Locker) {
	if _, ok := la.(*core.Client).Backend().(core.SemaphoreBackend); !ok {
		t.Skip("the store has no semaphores")
	}
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
