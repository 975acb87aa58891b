package asynqlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/asynqlock"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"github.com/dislock/dislock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The fixtures of this package's tests. The middleware's own tests call it
// directly on Lockers of an in-memory store; the server tests (newEnv) run
// real asynq servers on the Redis of testenv.Redis. Each env uses its own
// queue and removes it afterwards; the locks live in a memlock store unless
// a test says otherwise.

// lockers returns two Lockers on one in-memory store, acting as two
// processes.
func lockers(t *testing.T) (*memlock.Store, core.Locker, core.Locker) {
	t.Helper()
	store := memlock.NewStore()
	a, err := store.Locker()
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.Locker()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return store, a, b
}

// heldElsewhere returns a session on key of one of two Lockers on one
// in-memory store (lockers), and the other: key is held by another process
// than l. The session is released when the test ends, after the cleanups
// registered later have run (a server that e.serve started is shut down
// first, so no task of its runs once the key is free).
func heldElsewhere(t *testing.T, key string) (core.Session, core.Locker) {
	t.Helper()
	_, holder, l := lockers(t)
	s := testenv.Hold(t, context.Background(), holder, key)
	t.Cleanup(func() { s.Release(context.Background()) })
	return s, l
}

// runsOnRelease releases s and checks that the waiting task, whose start
// time comes on started, runs after the release and within a second of it:
// woken by it.
func runsOnRelease(t *testing.T, s core.Session, started <-chan time.Time) {
	t.Helper()
	released := time.Now()
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-started:
		if at.Before(released) {
			t.Error("the waiter ran before the release")
		}
		if d := at.Sub(released); d > time.Second {
			t.Errorf("the waiter ran %v after the release, want it woken by the release", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not run after the release")
	}
}

func mustNew(t *testing.T, l core.Locker, opts ...asynqlock.Option) asynq.MiddlewareFunc {
	t.Helper()
	mw, err := asynqlock.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// wantBusy runs task through mw with a handler that must not run, and
// returns the *BusyError it is bounced with (what names the task).
func wantBusy(t *testing.T, ctx context.Context, mw asynq.MiddlewareFunc, task *asynq.Task, what string) *asynqlock.BusyError {
	t.Helper()
	err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Errorf("%s ran while the key was busy", what)
		return nil
	})).ProcessTask(ctx, task)
	var b *asynqlock.BusyError
	if !errors.As(err, &b) || asynqlock.IsFailure(err) {
		t.Fatalf("%s: err = %v, want a *BusyError", what, err)
	}
	return b
}

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

// reportErrors is an asynq ErrorHandler that sends on ch the task errors
// for which which holds, dropping those that find ch full.
func reportErrors(ch chan<- error, which func(error) bool) asynq.ErrorHandler {
	return asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		if which(err) {
			select {
			case ch <- err:
			default:
			}
		}
	})
}

// busyCounter is an asynq ErrorHandler that reports busy bounces.
func busyCounter(ch chan<- error) asynq.ErrorHandler {
	return reportErrors(ch, func(err error) bool { return errors.Is(err, core.ErrNotAcquired) })
}

// byAccount enqueues a task whose key (with ByHeader("account")) is acct.
func (e *env) byAccount(acct string, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	return e.enqueueTask(asynq.NewTaskWithHeaders("job", []byte(acct), map[string]string{"account": acct}), opts...)
}

// redislockers returns n Lockers on the Redis of testenv.Redis, each with
// its own client (as in n processes), sharing a prefix of the test's own.
func redislockers(tb testing.TB, n int) []core.Locker {
	tb.Helper()
	prefix := testenv.Name("asynqlock-test")
	var ls []core.Locker
	for range n {
		opt, err := redis.ParseURL(testenv.Redis(tb))
		if err != nil {
			tb.Fatal(err)
		}
		c := redis.NewClient(opt)
		l, err := redislock.New(c, redislock.WithPrefix(prefix))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { l.Close(); c.Close() })
		ls = append(ls, l)
	}
	return ls
}

// onEachStore runs f as subtests, each on a fresh env with the Lockers of
// two servers: on one in-memory store (lockers), in the same Redis
// (redislockers), and in one MySQL lock table (mysqllockers).
func onEachStore(t *testing.T, f func(t *testing.T, e *env, la, lb core.Locker)) {
	t.Run("memlock", func(t *testing.T) {
		e := newEnv(t)
		_, la, lb := lockers(t)
		f(t, e, la, lb)
	})
	for _, s := range []struct {
		name    string
		lockers func(testing.TB, int) []core.Locker
	}{{"redislock", redislockers}, {"mysql", mysqllockers}} {
		t.Run(s.name, func(t *testing.T) {
			e := newEnv(t)
			ls := s.lockers(t, 2)
			f(t, e, ls[0], ls[1])
		})
	}
}

// mysqllockers returns n Lockers, each with its own pool, on a lock table
// of their own on the MySQL of testenv.MySQL.
func mysqllockers(tb testing.TB, n int) []core.Locker {
	tb.Helper()
	_, admin := mysqltest.DB(tb)
	table := mysqltest.Table(tb, admin, "asynqlock_")
	var ls []core.Locker
	for range n {
		_, db := mysqltest.DB(tb)
		l, err := mysqllock.New(context.Background(), db, mysqllock.WithTable(table))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	return ls
}
