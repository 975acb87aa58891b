package asynqlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dislock/dislock/integrations/asynqlock"
)

// byAccount enqueues a task whose key (with ByHeader("account")) is acct.
func (e *env) byAccount(acct string, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	return e.enqueueTask(asynq.NewTaskWithHeaders("job", []byte(acct), map[string]string{"account": acct}), opts...)
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
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"job")
	defer s.Release(context.Background())
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
	s, l := heldElsewhere(t, asynqlock.DefaultPrefix+"hot")
	ran := make(chan string, 20)
	cfg := wired()
	cfg.Concurrency = 3
	e.serve(cfg, asynqlock.MustNew(l, asynqlock.Key(asynqlock.ByHeader("account")),
		asynqlock.HandOffWait(200*time.Millisecond)),
		func(_ context.Context, task *asynq.Task) error {
			ran <- task.Headers()["account"]
			return nil
		})
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
