// Command asynq runs two asynq workers that share a dislock lock, so that the
// tasks of one account run one at a time although both workers pick them up.
//
// With REDIS_URL unset it needs no server: asynq and the locks (redislock)
// use an in-process miniredis. With REDIS_URL set (for example
// redis://127.0.0.1:6379/0) both use that Redis; run the program on two
// machines at once and the tasks of one account still run one at a time.
//
//	go -C examples run ./asynq
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/examples/internal/exenv"
	"github.com/dislock/dislock/integrations/asynqlock"
	"github.com/dislock/dislock/redislock"
)

const (
	taskType = "report:build"
	tasks    = 4
	account  = "42"
)

func main() { exenv.Main("asynq example", run) }

// run enqueues the tasks, runs two workers until every task is done (or ctx
// ends), and prints what happens to out.
func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := &exenv.Printer{W: out}

	newClient, where, closeRedis, err := connect()
	if err != nil {
		return err
	}
	defer closeRedis()
	p.Printf("asynq and locks on %s\n", where)
	rdb := newClient()
	defer rdb.Close()
	queue := "dislock-example-" + strings.ToLower(rand.Text()[:8])
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	defer inspector.Close()
	defer inspector.DeleteQueue(queue, true) //nolint:errcheck // best effort

	done := make(chan int, tasks)
	var (
		mu      sync.Mutex
		running int
		overlap bool
	)
	for _, name := range []string{"worker-1", "worker-2"} {
		// Each worker has its own Redis client and Locker, as it would in
		// its own process.
		lockClient := newClient()
		defer lockClient.Close()
		locker, err := redislock.New(lockClient, redislock.WithPrefix("dislock-example"))
		if err != nil {
			return err
		}
		defer locker.Close()
		handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			s, _ := core.SessionFromContext(ctx)
			mu.Lock()
			running++
			overlap = overlap || running > 1
			mu.Unlock()
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			p.Printf("%s: runs task %s for account %s (fencing token %d)\n", name, t.Payload(), account, s.Token())
			select { // the work
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			p.Printf("%s: done task %s\n", name, t.Payload())
			var n int
			fmt.Sscan(string(t.Payload()), &n)
			done <- n
			return nil
		})
		mw, err := asynqlock.New(locker,
			asynqlock.Key(asynqlock.ByHeader("account")),
			asynqlock.BusyDelay(0, 500*time.Millisecond),
		)
		if err != nil {
			return err
		}
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.Handle(taskType, handler)
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Concurrency:              2,
			Queues:                   map[string]int{queue: 1},
			IsFailure:                asynqlock.IsFailure,
			RetryDelayFunc:           asynqlock.RetryDelay(nil),
			TaskCheckInterval:        50 * time.Millisecond,
			DelayedTaskCheckInterval: 200 * time.Millisecond,
			LogLevel:                 asynq.FatalLevel,
			ShutdownTimeout:          2 * time.Second,
			ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, t *asynq.Task, err error) {
				if errors.Is(err, core.ErrNotAcquired) {
					p.Printf("%s: task %s is busy (account %s held elsewhere): retry later, no retry used\n", name, t.Payload(), account)
					return
				}
				p.Printf("%s: task %s failed: %v\n", name, t.Payload(), err)
			}),
		})
		if err := srv.Start(mux); err != nil {
			return err
		}
		defer srv.Shutdown()
	}

	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	for i := 1; i <= tasks; i++ {
		t := asynq.NewTaskWithHeaders(taskType, []byte(fmt.Sprint(i)), map[string]string{"account": account})
		if _, err := client.EnqueueContext(ctx, t, asynq.Queue(queue), asynq.MaxRetry(3)); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
	}
	p.Printf("enqueued %d tasks for account %s\n", tasks, account)

	for n := 0; n < tasks; n++ {
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for tasks: %w", ctx.Err())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		return errors.New("two tasks of one account ran at the same time")
	}
	p.Printf("all %d tasks done, one at a time\n", tasks)
	return nil
}

// connect returns a function that makes clients of the Redis to use:
// REDIS_URL's, or an embedded miniredis (closed by closeFn).
func connect() (newClient func() *redis.Client, where string, closeFn func(), err error) {
	if u := os.Getenv("REDIS_URL"); u != "" {
		opt, err := redis.ParseURL(u)
		if err != nil {
			return nil, "", nil, errors.New("REDIS_URL is not a valid Redis URL")
		}
		where := "the Redis at REDIS_URL"
		var ignored []string
		for _, v := range exenv.Variables {
			if v != "REDIS_URL" && os.Getenv(v) != "" {
				ignored = append(ignored, v)
			}
		}
		if len(ignored) > 0 {
			where += " (" + strings.Join(ignored, ", ") + " also set, not used: asynq runs on Redis)"
		}
		return func() *redis.Client { return redis.NewClient(opt) }, where, func() {}, nil
	}
	m, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, err
	}
	newClient = func() *redis.Client { return redis.NewClient(&redis.Options{Addr: m.Addr()}) }
	return newClient, "an embedded miniredis (set REDIS_URL to use a real Redis)", m.Close, nil
}
