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
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/asynqlock"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"github.com/dislock/dislock/redislock"
)

// These tests run real asynq servers on the Redis of testenv.Redis. Each test
// uses its own queue and removes it afterwards; the locks live in a memlock
// store unless a test says otherwise.

const waitLong = 30 * time.Second

type env struct {
	t      testing.TB
	rdb    redis.UniversalClient
	queue  string
	client *asynq.Client
	insp   *asynq.Inspector
}

func newEnv(t testing.TB) *env {
	t.Helper()
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal("DISLOCK_TEST_REDIS is not a valid Redis URL")
	}
	rdb := redis.NewClient(opt)
	e := &env{t: t, rdb: rdb, queue: testenv.Name("asynqlock-test-"),
		client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb)}
	// Registered first, so it runs after the servers have shut down.
	t.Cleanup(func() {
		if err := e.insp.DeleteQueue(e.queue, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Errorf("delete queue: %v", err)
		}
		e.client.Close()
		e.insp.Close()
		rdb.Close()
	})
	return e
}

// wired is the Config every user should have: busy bounces cost no retry
// and come back quickly; other failures are retried at once in tests.
func wired() asynq.Config {
	return asynq.Config{
		IsFailure:      asynqlock.IsFailure,
		RetryDelayFunc: asynqlock.RetryDelay(func(int, error, *asynq.Task) time.Duration { return 0 }),
	}
}

// serve starts an asynq server on the test's queue with h behind mw.
func (e *env) serve(cfg asynq.Config, mw asynq.MiddlewareFunc, h asynq.HandlerFunc) {
	e.t.Helper()
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 2
	}
	cfg.Queues = map[string]int{e.queue: 1}
	cfg.TaskCheckInterval = 20 * time.Millisecond
	cfg.DelayedTaskCheckInterval = 100 * time.Millisecond
	cfg.ShutdownTimeout = 3 * time.Second
	cfg.LogLevel = asynq.FatalLevel
	srv := asynq.NewServerFromRedisClient(e.rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.Handle("job", h)
	if err := srv.Start(mux); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Shutdown)
}

func (e *env) enqueue(payload string, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	return e.enqueueTask(asynq.NewTask("job", []byte(payload)), opts...)
}

func (e *env) enqueueTask(task *asynq.Task, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	opts = append([]asynq.Option{asynq.Queue(e.queue), asynq.Retention(time.Hour)}, opts...)
	info, err := e.client.Enqueue(task, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// waitState polls the Inspector until task id is in state want.
func (e *env) waitState(id string, want asynq.TaskState) *asynq.TaskInfo {
	e.t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		info, err := e.insp.GetTaskInfo(e.queue, id)
		if err != nil {
			e.t.Fatalf("task %s: %v", id, err)
		}
		if info.State == want {
			return info
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("task %s is %v (retried %d, last error %q), want %v", id, info.State, info.Retried, info.LastErr, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// completed waits until task id completes and checks that it used
// retries retries (busy bounces must not count).
func (e *env) completed(id string, retries int) {
	e.t.Helper()
	if info := e.waitState(id, asynq.TaskStateCompleted); info.Retried != retries {
		e.t.Errorf("task %s completed with retried %d, want %d: busy bounces must not count", id, info.Retried, retries)
	}
}

// bounced checks that task id has been bounced as busy (what says when):
// no retry used, and its last error is the busy one.
func (e *env) bounced(id, what string) {
	e.t.Helper()
	info, err := e.insp.GetTaskInfo(e.queue, id)
	if err != nil {
		e.t.Fatal(err)
	}
	if info.Retried != 0 || !strings.Contains(info.LastErr, "busy") {
		e.t.Errorf("%s: retried %d (want 0), last error %q (want busy)", what, info.Retried, info.LastErr)
	}
}

// waitGone polls the Inspector until task id no longer exists.
func (e *env) waitGone(id string) {
	e.t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		info, err := e.insp.GetTaskInfo(e.queue, id)
		if errors.Is(err, asynq.ErrTaskNotFound) {
			return
		}
		if err != nil {
			e.t.Fatalf("task %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("task %s is still %v", id, info.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLong):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// busyCounter is an asynq ErrorHandler that reports busy bounces.
func busyCounter(ch chan<- error) asynq.ErrorHandler {
	return asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		if errors.Is(err, core.ErrNotAcquired) {
			select {
			case ch <- err:
			default:
			}
		}
	})
}

// TestServers_OneAtATime: two servers, many tasks for one key with
// different payloads (which asynq's Unique would not deduplicate): their
// handler runs never overlap and every task completes, without using up
// retries.
func TestServers_OneAtATime(t *testing.T) {
	e := newEnv(t)
	_, la, lb := lockers(t)
	oneAtATime(t, e, la, lb)
}

// TestServers_OneAtATime_Stores: the same with the locks in a store the
// servers share, each server with its own client: the same Redis
// (redislock), and MySQL.
func TestServers_OneAtATime_Stores(t *testing.T) {
	forEachStore(t, func(t *testing.T, la, lb core.Locker) { oneAtATime(t, newEnv(t), la, lb) })
}

// forEachStore runs fn with two Lockers on each shared store, as two
// processes would have: Redis (redislock) and MySQL (mysqllock).
func forEachStore(t *testing.T, fn func(t *testing.T, la, lb core.Locker)) {
	for _, s := range []struct {
		name    string
		lockers func(t *testing.T) (core.Locker, core.Locker)
	}{{"redislock", redislockers}, {"mysql", mysqllockers}} {
		t.Run(s.name, func(t *testing.T) {
			la, lb := s.lockers(t)
			fn(t, la, lb)
		})
	}
}

// mysqllockers returns two Lockers on a lock table of its own on the MySQL
// of testenv.MySQL, each with its own pool.
func mysqllockers(t *testing.T) (core.Locker, core.Locker) {
	t.Helper()
	_, admin := mysqltest.DB(t)
	table := mysqltest.Table(t, admin, "asynqlock_")
	var ls []core.Locker
	for range 2 {
		_, db := mysqltest.DB(t)
		l, err := mysqllock.New(context.Background(), db, mysqllock.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	return ls[0], ls[1]
}

// redislockers returns two Lockers on the Redis of testenv.Redis, each with
// its own client, sharing a prefix of the test's own.
func redislockers(t *testing.T) (core.Locker, core.Locker) {
	t.Helper()
	prefix := testenv.Name("asynqlock-test")
	var ls []core.Locker
	for range 2 {
		opt, err := redis.ParseURL(testenv.Redis(t))
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opt)
		l, err := redislock.New(c, redislock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(); c.Close() })
		ls = append(ls, l)
	}
	return ls[0], ls[1]
}

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
			defer s.Release(context.Background())
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
	cfg.ErrorHandler = asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		if asynqlock.IsFailure(err) {
			failures <- err
		}
	})
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
	cfg.ErrorHandler = asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		if asynq.IsPanicError(err) {
			panicked <- err
		}
	})
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

// TestServers_HotKeyLeavesWorkers: while a key is held elsewhere and has a
// backlog, HandOff lets one of its tasks wait and bounces the others, so
// that the server's other workers run other keys' tasks (under Wait(0) the
// backlog would take all three workers until the holder lets go).
func TestServers_HotKeyLeavesWorkers(t *testing.T) {
	e := newEnv(t)
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"hot")
	ran := make(chan string, 20)
	cfg := wired()
	cfg.Concurrency = 3
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.Key(asynqlock.ByHeader("account"))), func(_ context.Context, task *asynq.Task) error {
		ran <- task.Headers()["account"]
		return nil
	})
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
