package asynqlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/asynqlock"
)

// A backlog on one key, on two asynq servers wired as the README says, with
// the locks in the same Redis (redislock, one Locker and Redis client per
// server, as in two processes).

const (
	work     = 30 * time.Millisecond // the handler's time
	servers  = 2
	workers  = 5 // Concurrency of each server
	hotKey   = "hot"
	otherKey = "other"
)

// The bounds the drains must meet. Their serial, handler-bound times are
// 20 × 30ms = 0.6s and 200 × 30ms = 6s; the bounds leave room for the
// start (the first dequeues) and for a loaded machine.
const (
	limit20  = 2 * time.Second
	limit200 = 15 * time.Second
)

// drainRig is two servers whose handler takes work and records, per
// account, overlapping runs and completions.
type drainRig struct {
	e       *env
	done    chan string // the account of every completed task
	mu      sync.Mutex
	running map[string]int
	overlap map[string]int  // runs that started while another of the key ran
	times   []time.Duration // when the other key's tasks completed, in the last drain
	// hotBefore is how many tasks of the hot key had completed when the
	// other key's last one did, in the last drain.
	hotBefore int
	bounces   atomic.Int64 // busy bounces, quick or not
	quick     atomic.Int64 // quick ones (no retry delay)
}

func (r *drainRig) countBounce(_ context.Context, _ *asynq.Task, err error) {
	var b *asynqlock.BusyError
	if errors.As(err, &b) {
		r.bounces.Add(1)
		if b.RetryIn == 0 {
			r.quick.Add(1)
		}
	}
}

func newDrainRig(tb testing.TB) *drainRig {
	tb.Helper()
	r := &drainRig{e: newEnv(tb), done: make(chan string, 4096),
		running: map[string]int{}, overlap: map[string]int{}}
	for _, l := range redislockers(tb, servers) {
		r.serveREADME(l)
	}
	return r
}

// serveREADME starts a server wired exactly as the README's asynq section
// says; only the queue, the logging, the shutdown timeout and the error
// handler (which counts bounces) are the test's.
func (r *drainRig) serveREADME(l core.Locker) {
	e := r.e
	mux := asynq.NewServeMux()
	mux.Use(asynqlock.MustNew(l, asynqlock.Key(asynqlock.ByHeader("account"))))
	mux.HandleFunc("job", r.handle)
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency:              workers,
		IsFailure:                asynqlock.IsFailure,
		RetryDelayFunc:           asynqlock.RetryDelay(nil),
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval:        100 * time.Millisecond,

		Queues:          map[string]int{e.queue: 1},
		LogLevel:        asynq.FatalLevel,
		ShutdownTimeout: 3 * time.Second,
		ErrorHandler:    asynq.ErrorHandlerFunc(r.countBounce),
	})
	if err := srv.Start(mux); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Shutdown)
}

func (r *drainRig) handle(ctx context.Context, t *asynq.Task) error {
	acct := t.Headers()["account"]
	r.mu.Lock()
	r.running[acct]++
	if r.running[acct] > 1 {
		r.overlap[acct]++
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running[acct]--
		r.mu.Unlock()
	}()
	select {
	case <-time.After(work):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	r.done <- acct
	return nil
}

// drain enqueues n tasks for the hot key, then m for the other key, and
// waits until all of them completed. It returns how long each key took,
// from the first enqueue to its last completion, and the IDs of the tasks.
func (r *drainRig) drain(n, m int, limit time.Duration) (hot, other time.Duration, ids []string) {
	r.e.t.Helper()
	start := time.Now()
	for i := range n + m {
		acct := hotKey
		if i >= n {
			acct = otherKey
		}
		task := asynq.NewTaskWithHeaders("job", fmt.Appendf(nil, "%s-%d", acct, i), map[string]string{"account": acct})
		ids = append(ids, r.e.enqueueTask(task).ID)
	}
	left := map[string]int{hotKey: n, otherKey: m}
	took := map[string]time.Duration{}
	r.times = r.times[:0]
	timeout := time.After(limit)
	for left[hotKey]+left[otherKey] > 0 {
		select {
		case acct := <-r.done:
			if acct == otherKey {
				r.times = append(r.times, time.Since(start).Round(time.Millisecond))
			}
			if left[acct]--; left[acct] == 0 {
				took[acct] = time.Since(start)
				if acct == otherKey {
					r.hotBefore = n - left[hotKey]
				}
			}
		case <-timeout:
			r.e.t.Fatalf("after %v: %d of %d tasks of the hot key and %d of %d of the other key still to run",
				limit, left[hotKey], n, left[otherKey], m)
		}
	}
	return took[hotKey], took[otherKey], ids
}

func (r *drainRig) overlaps() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := map[string]int{}
	for k, v := range r.overlap {
		o[k] = v
	}
	return o
}

// serial is the time n tasks take one after the other.
func serial(n int) time.Duration { return time.Duration(n) * work }

// TestREADMEWiring_Drain: 20 tasks on one key, on two servers wired as the
// README says, all complete within limit20, never two at once, and without
// using a retry.
func TestREADMEWiring_Drain(t *testing.T) {
	r := newDrainRig(t)
	const n = 20
	hot, _, ids := r.drain(n, 0, waitLong)
	t.Logf("%d tasks × %v on one key, %d servers: drained in %v (%.2f × serial), %d bounces (%d quick)",
		n, work, servers, hot, float64(hot)/float64(serial(n)), r.bounces.Load(), r.quick.Load())
	if hot > limit20 {
		t.Errorf("%d tasks drained in %v, want at most %v", n, hot, limit20)
	}
	if o := r.overlaps(); len(o) != 0 {
		t.Errorf("runs of one key overlapped: %v", o)
	}
	for _, id := range ids {
		r.e.completed(id, 0)
	}
}

// TestREADMEWiring_OtherKeyFlows: while 200 tasks of one key drain (within
// limit200), 20 tasks of another key, enqueued behind them, drain at their
// own rate: all of them complete before half of the hot key's have. The
// hot key does not take every worker (with Wait(0), the other key waits for
// the whole backlog). Both keys drain in the same run, so a slow machine
// slows both alike.
func TestREADMEWiring_OtherKeyFlows(t *testing.T) {
	r := newDrainRig(t)
	const n, m = 200, 20
	hot, other, _ := r.drain(n, m, 60*time.Second)
	t.Logf("%d tasks on one key drained in %v (%.2f × serial); %d tasks of another key alongside in %v (%.2f × serial), %d of the hot key's done by then; %d bounces (%d quick)",
		n, hot, float64(hot)/float64(serial(n)), m, other, float64(other)/float64(serial(m)), r.hotBefore, r.bounces.Load(), r.quick.Load())
	if hot > limit200 {
		t.Errorf("%d tasks of the hot key drained in %v, want at most %v", n, hot, limit200)
	}
	if r.hotBefore > n/2 {
		t.Errorf("the other key's %d tasks drained in %v, once %d of the hot key's %d had: want at most %d (completed at %v)",
			m, other, r.hotBefore, n, n/2, r.times)
	}
	if hot < serial(n) {
		t.Errorf("%d tasks of the hot key drained in %v, less than their serial time %v", n, hot, serial(n))
	}
	if o := r.overlaps(); len(o) != 0 {
		t.Errorf("runs of one key overlapped: %v", o)
	}
}
