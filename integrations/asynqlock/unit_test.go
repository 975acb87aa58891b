package asynqlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/asynqlock"
	"github.com/dislock/dislock/internal/testenv"
)

func TestKeyFuncs(t *testing.T) {
	ctx := context.Background()
	key := func(fn asynqlock.KeyFunc, task *asynq.Task) string {
		t.Helper()
		k, err := fn(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if got := key(asynqlock.ByType, asynq.NewTask("email:send", []byte("x"))); got != "email:send" {
		t.Errorf("ByType = %q", got)
	}
	a := key(asynqlock.ByTypeAndPayload, asynq.NewTask("t", []byte("a")))
	a2 := key(asynqlock.ByTypeAndPayload, asynq.NewTask("t", []byte("a")))
	b := key(asynqlock.ByTypeAndPayload, asynq.NewTask("t", []byte("b")))
	if a != a2 || a == b || !strings.HasPrefix(a, "t:") {
		t.Errorf("ByTypeAndPayload: a=%q a again=%q b=%q", a, a2, b)
	}
	long := key(asynqlock.ByTypeAndPayload, asynq.NewTask(strings.Repeat("x", 5000), make([]byte, 1<<20)))
	if len(long) > 600 || core.ValidateKey(asynqlock.DefaultPrefix+long) != nil {
		t.Errorf("ByTypeAndPayload of a long type: %d bytes, %v", len(long), core.ValidateKey(long))
	}
	if got := key(asynqlock.ByType, asynq.NewTask("bad\x00type", nil)); core.ValidateKey(got) != nil {
		t.Errorf("ByType of a type with NUL = %q, not a valid key", got)
	}
	byAcct := asynqlock.ByHeader("account")
	if got := key(byAcct, asynq.NewTaskWithHeaders("t", nil, map[string]string{"account": "42"})); got != "42" {
		t.Errorf("ByHeader = %q", got)
	}
	if got := key(byAcct, asynq.NewTask("t", nil)); got != "" {
		t.Errorf("ByHeader without the header = %q, want empty", got)
	}
	if _, err := asynqlock.ByTaskID(ctx, asynq.NewTask("t", nil)); err == nil {
		t.Error("ByTaskID outside asynq: no error")
	}
}

func TestNew_InvalidOptions(t *testing.T) {
	_, l, _ := lockers(t)
	cases := map[string]struct {
		l    core.Locker
		opts []asynqlock.Option
	}{
		"Locker":         {nil, nil},
		"Key":            {l, []asynqlock.Option{asynqlock.Key(nil)}},
		"Grace":          {l, []asynqlock.Option{asynqlock.Grace(-time.Second)}},
		"BusyDelay":      {l, []asynqlock.Option{asynqlock.BusyDelay(2*time.Second, time.Second)}},
		"OnBusy":         {l, []asynqlock.Option{asynqlock.OnBusy(asynqlock.Wait(-1))}},
		"OnExhausted":    {l, []asynqlock.Option{asynqlock.OnExhausted(asynqlock.RetryLater)}},
		"ReleaseTimeout": {l, []asynqlock.Option{asynqlock.ReleaseTimeout(0)}},
		"QuickRetries":   {l, []asynqlock.Option{asynqlock.QuickRetries(-1)}},
		"MaxWaiting":     {l, []asynqlock.Option{asynqlock.MaxWaiting(-1)}},
		"HandOffWait":    {l, []asynqlock.Option{asynqlock.HandOffWait(0)}},
		"HandOff":        {l, []asynqlock.Option{asynqlock.OnBusy(asynqlock.HandOff(0))}},
		"HandOff(1)":     {l, []asynqlock.Option{asynqlock.OnExhausted(asynqlock.HandOff(1))}},
	}
	for name, c := range cases {
		_, err := asynqlock.New(c.l, c.opts...)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want ErrInvalidOption naming it", name, err)
		}
	}
	for _, n := range []int{0, -1, core.MaxLimit + 1} {
		if _, err := asynqlock.New(l, asynqlock.Limit(n)); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "Limit") {
			t.Errorf("Limit(%d): err = %v, want ErrInvalidOption naming Limit", n, err)
		}
	}
}

// TestWithLimit_NeedsSemaphores: Limit(n > 1) on a Locker whose backend
// has no semaphores fails in New, naming the option; Limit(1) is a
// mutex and works anywhere.
func TestWithLimit_NeedsSemaphores(t *testing.T) {
	c := testenv.MutexOnlyLocker(t)
	_, err := asynqlock.New(c, asynqlock.Limit(3))
	if !errors.Is(err, core.ErrInvalidOption) || !errors.Is(err, core.ErrUnsupported) || !strings.Contains(err.Error(), "Limit") {
		t.Errorf("err = %v, want ErrInvalidOption and ErrUnsupported naming Limit", err)
	}
	if _, err := asynqlock.New(c, asynqlock.Limit(1)); err != nil {
		t.Errorf("Limit(1) on a mutex-only backend: %v", err)
	}
}

// The option names match core's and gocronlock's (Limit), the deprecated
// With names still work and name themselves in errors, and only MustNew
// (and the deprecated Middleware) panic on a bad option.
func TestOptionNames(t *testing.T) {
	_, l, _ := lockers(t)
	for name, opt := range map[string]asynqlock.Option{
		"Limit":     asynqlock.Limit(0),
		"WithLimit": asynqlock.WithLimit(0),
		"Key":       asynqlock.Key(nil),
		"WithKey":   asynqlock.WithKey(nil),
	} {
		_, err := asynqlock.New(l, opt)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "asynqlock: "+name+":") {
			t.Errorf("%s: err = %v, want ErrInvalidOption naming %s", name, err, name)
		}
	}
	if _, err := asynqlock.New(l, asynqlock.Limit(2), asynqlock.Key(asynqlock.ByTaskID)); err != nil {
		t.Errorf("valid Limit and Key: %v", err)
	}
	if _, err := asynqlock.New(l, asynqlock.WithLimit(2), asynqlock.WithKey(asynqlock.ByTaskID)); err != nil {
		t.Errorf("valid WithLimit and WithKey: %v", err)
	}
	for name, mk := range map[string]func(core.Locker, ...asynqlock.Option) asynq.MiddlewareFunc{
		"MustNew":    asynqlock.MustNew,
		"Middleware": asynqlock.Middleware,
	} {
		if mk(l) == nil {
			t.Errorf("%s with valid options returned nil", name)
		}
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "Grace") {
					t.Errorf("%s with an invalid option: recovered %v, want a panic naming Grace", name, r)
				}
			}()
			mk(l, asynqlock.Grace(-1))
		}()
	}
}

func TestMiddleware_EmptyKeyRunsUnlocked(t *testing.T) {
	_, l, _ := lockers(t)
	mw := mustNew(t, l, asynqlock.Key(asynqlock.ByHeader("account")))
	ran := false
	err := mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		ran = true
		if _, ok := core.SessionFromContext(ctx); ok {
			t.Error("a task without key got a session")
		}
		return nil
	})).ProcessTask(context.Background(), asynq.NewTask("t", nil))
	if err != nil || !ran {
		t.Fatalf("err = %v, ran = %v", err, ran)
	}
}

func TestMiddleware_KeyErrorIsPermanent(t *testing.T) {
	_, l, _ := lockers(t)
	boom := errors.New("boom")
	mw := mustNew(t, l, asynqlock.Key(func(context.Context, *asynq.Task) (string, error) { return "", boom }))
	err := mw(noop()).ProcessTask(context.Background(), asynq.NewTask("t", nil))
	if !errors.Is(err, boom) || !errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("err = %v, want boom wrapped with SkipRetry", err)
	}
	// A key the Locker rejects is permanent too.
	mw = mustNew(t, l, asynqlock.Prefix(""), asynqlock.Key(func(context.Context, *asynq.Task) (string, error) {
		return strings.Repeat("k", core.MaxKeyLen+1), nil
	}))
	err = mw(noop()).ProcessTask(context.Background(), asynq.NewTask("t", nil))
	if !errors.Is(err, core.ErrInvalidKey) || !errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("err = %v, want ErrInvalidKey wrapped with SkipRetry", err)
	}
}

func noop() asynq.Handler {
	return asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })
}

// TestMiddleware_BusyPolicies checks what each policy returns for a busy key
// (the asynq outcomes are checked against real servers in server_test.go).
func TestMiddleware_BusyPolicies(t *testing.T) {
	ctx := context.Background()
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"t")
	defer s.Release(ctx)
	task := asynq.NewTask("t", nil)
	cases := []struct {
		p     asynqlock.Policy
		check func(error) bool
	}{
		{asynqlock.RetryLater, func(err error) bool {
			var b *asynqlock.BusyError
			return errors.As(err, &b) && errors.Is(err, core.ErrNotAcquired) && !asynqlock.IsFailure(err) &&
				b.RetryIn >= 10*time.Millisecond && b.RetryIn <= 20*time.Millisecond &&
				asynqlock.RetryDelay(nil)(0, err, task) == b.RetryIn
		}},
		{asynqlock.Skip, func(err error) bool { return err == nil }},
		{asynqlock.Revoke, func(err error) bool {
			return errors.Is(err, asynq.RevokeTask) && errors.Is(err, core.ErrNotAcquired)
		}},
		{asynqlock.Archive, func(err error) bool {
			return errors.Is(err, asynq.SkipRetry) && errors.Is(err, core.ErrNotAcquired)
		}},
		{asynqlock.Wait(30 * time.Millisecond), func(err error) bool {
			return errors.Is(err, core.ErrNotAcquired) && !asynqlock.IsFailure(err)
		}},
	}
	for _, c := range cases {
		t.Run(c.p.String(), func(t *testing.T) {
			mw := mustNew(t, l, asynqlock.OnBusy(c.p), asynqlock.BusyDelay(10*time.Millisecond, 20*time.Millisecond))
			ran := false
			err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil })).ProcessTask(ctx, task)
			if ran {
				t.Error("handler ran while the key was busy")
			}
			if !c.check(err) {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func TestMiddleware_WaitRunsAfterHolder(t *testing.T) {
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"t")
	ctx := context.Background()
	released := make(chan time.Time, 1)
	mw := mustNew(t, l, asynqlock.OnBusy(asynqlock.Wait(10*time.Second)),
		asynqlock.Key(func(ctx context.Context, t *asynq.Task) (string, error) {
			// The middleware is about to wait: let the holder go.
			time.AfterFunc(20*time.Millisecond, func() { released <- time.Now(); s.Release(ctx) })
			return asynqlock.ByType(ctx, t)
		}))
	var started time.Time
	err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		started = time.Now()
		return nil
	})).ProcessTask(ctx, asynq.NewTask("t", nil))
	if err != nil {
		t.Fatal(err)
	}
	if rel := <-released; started.IsZero() || started.Before(rel) {
		t.Fatalf("handler started %v, holder released %v", started, rel)
	}
}

func TestMiddleware_SessionAndLeaseLoss(t *testing.T) {
	for _, how := range []string{"steal", "delete"} {
		t.Run(how, func(t *testing.T) {
			store, l, _ := lockers(t)
			mw := mustNew(t, l, asynqlock.LockOptions(core.TTL(150*time.Millisecond)))
			var cause error
			err := mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
				s, ok := core.SessionFromContext(ctx)
				if !ok || s.Key() != asynqlock.DefaultPrefix+"t" || s.Token() == 0 {
					t.Errorf("session in ctx: %v %v", s, ok)
				}
				if how == "steal" {
					store.Steal(s.Key())
				} else {
					store.Delete(s.Key())
				}
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(10 * time.Second):
					t.Error("ctx not cancelled on lease loss")
				}
				return nil // the handler does not notice
			})).ProcessTask(context.Background(), asynq.NewTask("t", nil))
			if !errors.Is(cause, core.ErrLeaseLost) {
				t.Errorf("ctx cause = %v, want ErrLeaseLost", cause)
			}
			if !errors.Is(err, core.ErrLeaseLost) || !asynqlock.IsFailure(err) {
				t.Errorf("err = %v, want a failure matching ErrLeaseLost", err)
			}
		})
	}
}

func TestMiddleware_PanicReleases(t *testing.T) {
	store, l, _ := lockers(t)
	mw := mustNew(t, l)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the handler's panic", r)
			}
		}()
		mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			if !store.Held(asynqlock.DefaultPrefix + "t") {
				t.Error("key not held while the handler runs")
			}
			panic("boom")
		})).ProcessTask(context.Background(), asynq.NewTask("t", nil))
	}()
	if store.Held(asynqlock.DefaultPrefix + "t") {
		t.Error("key still held after the handler panicked")
	}
}

// TestMiddleware_GraceReleasesHungHandler: a handler that ignores its
// context keeps the lock only until the task's deadline plus the grace.
func TestMiddleware_GraceReleasesHungHandler(t *testing.T) {
	store, l, _ := lockers(t)
	mw := mustNew(t, l, asynqlock.Grace(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	unblock := make(chan struct{})
	returned := make(chan error, 1)
	go func() {
		returned <- mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			<-unblock // ignores ctx
			return nil
		})).ProcessTask(ctx, asynq.NewTask("t", nil))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for store.Held(asynqlock.DefaultPrefix+"t") || time.Now().Before(deadlineOf(ctx)) {
		if time.Now().After(deadline) {
			t.Fatal("key still held long after deadline + grace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-returned:
		t.Fatalf("handler returned early: %v", err)
	default:
	}
	close(unblock)
	if err := <-returned; err != nil {
		t.Fatalf("err = %v", err)
	}
}

func deadlineOf(ctx context.Context) time.Time { d, _ := ctx.Deadline(); return d }

func TestRetryDelay_Fallback(t *testing.T) {
	task := asynq.NewTask("t", nil)
	f := asynqlock.RetryDelay(func(n int, err error, _ *asynq.Task) time.Duration { return time.Duration(n) * time.Hour })
	if got := f(3, errors.New("x"), task); got != 3*time.Hour {
		t.Errorf("fallback delay = %v", got)
	}
	busy := &asynqlock.BusyError{Key: "k", RetryIn: 2 * time.Second, Err: core.ErrNotAcquired}
	if got := f(3, errors.Join(errors.New("wrapped"), busy), task); got != 2*time.Second {
		t.Errorf("busy delay = %v", got)
	}
	if got := asynqlock.RetryDelay(nil)(0, errors.New("x"), task); got < 15*time.Second {
		t.Errorf("default fallback delay = %v, want asynq's default (>= 15s)", got)
	}
	if asynqlock.IsFailure(nil) || !asynqlock.IsFailure(errors.New("x")) || !asynqlock.IsFailure(core.ErrNotAcquired) {
		t.Error("IsFailure: only *BusyError is not a failure")
	}
}

// watchedLocker reports every Acquire (a wait) on acquiring.
type watchedLocker struct {
	core.Locker
	acquiring chan string
}

func (w watchedLocker) Acquire(ctx context.Context, key string, opts ...core.Option) (core.Session, error) {
	w.acquiring <- key
	return w.Locker.Acquire(ctx, key, opts...)
}

// waitInLine runs task through mw (on w) in a goroutine and returns once it
// waits for the lock (what names it). The task's handler sends the time it
// starts on started; what ProcessTask returned comes on done.
func waitInLine(t *testing.T, ctx context.Context, mw asynq.MiddlewareFunc, w watchedLocker, task *asynq.Task, what string) (started <-chan time.Time, done <-chan error) {
	t.Helper()
	start := make(chan time.Time, 1)
	end := make(chan error, 1)
	go func() {
		end <- mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			start <- time.Now()
			return nil
		})).ProcessTask(ctx, task)
	}()
	select {
	case <-w.acquiring:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not wait in line", what)
	}
	return start, end
}

// TestMiddleware_HandOff: with the key held elsewhere, the first busy task
// waits for the lock and runs as soon as the holder releases; a busy task
// that finds the place in line taken is bounced, quickly (no retry delay)
// within the QuickRetries burst and after BusyDelay beyond it; once the key
// has not changed hands for a second, bounces are no longer quick.
func TestMiddleware_HandOff(t *testing.T) {
	_, holder, l := lockers(t)
	ctx := context.Background()
	key := asynqlock.DefaultPrefix + "t"
	s := testenv.Hold(t, ctx, holder, key)
	w := watchedLocker{Locker: l, acquiring: make(chan string, 1)}
	// 8 a second, in bursts of 2.
	mw := mustNew(t, w, asynqlock.QuickRetries(8), asynqlock.BusyDelay(10*time.Millisecond, 20*time.Millisecond))
	task := asynq.NewTask("t", nil)
	started, waiter := waitInLine(t, ctx, mw, w, task, "the first busy task")
	bounce := func() time.Duration {
		t.Helper()
		b := wantBusy(t, ctx, mw, task, "a second task")
		if len(w.acquiring) != 0 {
			t.Fatal("a second task waited: the line holds one per key")
		}
		return b.RetryIn
	}
	for i := range 2 {
		if d := bounce(); d != 0 {
			t.Errorf("bounce %d: retry in %v, want 0 (quick)", i, d)
		}
	}
	if d := bounce(); d < 10*time.Millisecond || d > 20*time.Millisecond {
		t.Errorf("bounce beyond the burst: retry in %v, want BusyDelay", d)
	}
	// The bucket fills again, but the key has not changed hands for longer
	// than a second: its holder runs long.
	time.Sleep(1200 * time.Millisecond)
	if d := bounce(); d == 0 {
		t.Error("bounce after the key stood still for a second: quick, want BusyDelay")
	}
	runsOnRelease(t, s, started)
	if err := <-waiter; err != nil {
		t.Errorf("waiter: %v", err)
	}
	// The line is free again: the next busy task waits.
	s = testenv.Hold(t, ctx, holder, key)
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err := mw(noop()).ProcessTask(wctx, task)
	var b *asynqlock.BusyError
	if len(w.acquiring) != 1 || !errors.As(err, &b) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after the hand-off: waited %d, err = %v; want a wait that stops short of the deadline and bounces", len(w.acquiring), err)
	}
	<-w.acquiring
	// A wait that the task's own cancellation ends is an ordinary failure.
	cctx, ccancel := context.WithCancel(ctx)
	go func() { <-w.acquiring; ccancel() }()
	err = mw(noop()).ProcessTask(cctx, task)
	if !errors.Is(err, context.Canceled) || !asynqlock.IsFailure(err) {
		t.Errorf("wait cancelled by the task's context: err = %v, want an ordinary failure", err)
	}
	s.Release(ctx)
}

// TestMiddleware_HandOffWait: a HandOff waiter whose own bound runs out is
// bounced with a *BusyError (no retry used), and its place in line goes to
// the next busy task.
func TestMiddleware_HandOffWait(t *testing.T) {
	ctx := context.Background()
	key := asynqlock.DefaultPrefix + "t"
	s, l := heldElsewhere(t, key)
	defer s.Release(ctx)
	w := watchedLocker{Locker: l, acquiring: make(chan string, 2)}
	mw := mustNew(t, w, asynqlock.HandOffWait(100*time.Millisecond))
	task := asynq.NewTask("t", nil)
	for i := range 2 {
		start := time.Now()
		err := mw(noop()).ProcessTask(ctx, task)
		var b *asynqlock.BusyError
		if !errors.As(err, &b) || asynqlock.IsFailure(err) {
			t.Fatalf("waiter %d: err = %v, want a *BusyError", i, err)
		}
		if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
			t.Errorf("waiter %d bounced after %v, want about HandOffWait (100ms)", i, d)
		}
		if len(w.acquiring) != 1 {
			t.Fatalf("waiter %d: %d waits, want 1 (the place in line is free again)", i, len(w.acquiring))
		}
		<-w.acquiring
	}
}

// A lease taken over while the handler ran, with no renewal in between to
// notice (TTL 1m), is found by the release after the handler: the task
// fails as after a loss seen by a renewal, so asynq retries it.
func TestMiddleware_LossFoundAtRelease(t *testing.T) {
	store, l, _ := lockers(t)
	mw := mustNew(t, l, asynqlock.LockOptions(core.TTL(time.Minute)))
	err := mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx)
		store.Steal(s.Key())
		return nil
	})).ProcessTask(context.Background(), asynq.NewTask("t", nil))
	if !errors.Is(err, core.ErrLeaseLost) || !asynqlock.IsFailure(err) {
		t.Errorf("err = %v, want a failure matching ErrLeaseLost", err)
	}
}
