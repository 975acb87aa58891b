package asynqlock_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/asynqlock"
)

// Three tasks for one account, on a server with three workers: the
// middleware runs them one at a time. asynq runs on an in-process miniredis
// here and the locks live in memory; in production both would be real
// stores shared by every server.
func Example() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	locker, err := memlock.New()
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	var (
		mu               sync.Mutex
		running, maxSeen int
	)
	done := make(chan struct{}, 3)
	mw, err := asynqlock.New(locker,
		asynqlock.Key(asynqlock.ByHeader("account")), // one task per account at a time
	)
	if err != nil {
		panic(err) // an invalid option, named in the error
	}
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx) // s.Token() fences writes
		_ = s.Token()
		mu.Lock()
		running++
		maxSeen = max(maxSeen, running)
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // the work
		mu.Lock()
		running--
		mu.Unlock()
		done <- struct{}{}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              3,
		IsFailure:                asynqlock.IsFailure,       // a busy bounce consumes no retry
		RetryDelayFunc:           asynqlock.RetryDelay(nil), // and comes back soon
		DelayedTaskCheckInterval: 100 * time.Millisecond,    // bounced tasks move back to pending every 0.1s
		TaskCheckInterval:        100 * time.Millisecond,    // and are picked up within about 0.1s
		LogLevel:                 asynq.FatalLevel,
	})
	if err := srv.Start(mux); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	for i := 1; i <= 3; i++ {
		task := asynq.NewTaskWithHeaders("report:build", []byte(fmt.Sprint(i)), map[string]string{"account": "42"})
		if _, err := client.Enqueue(task); err != nil {
			panic(err)
		}
	}
	for range 3 {
		<-done
	}
	mu.Lock()
	fmt.Printf("3 tasks done, at most %d at a time\n", maxSeen)
	mu.Unlock()
	// Output: 3 tasks done, at most 1 at a time
}

// Four imports for one account, on a server with four workers: Limit(2)
// runs two of them at a time, never more. asynq runs on an in-process
// miniredis and the permits live in memory; in production both would be
// real stores shared by every server, and the limit would hold across all
// of them.
func ExampleLimit() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	locker, err := memlock.New()
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	var (
		mu               sync.Mutex
		running, maxSeen int
	)
	done := make(chan struct{}, 4)
	mw, err := asynqlock.New(locker,
		asynqlock.Key(asynqlock.ByHeader("account")),
		asynqlock.Limit(2), // up to two tasks per account at a time
	)
	if err != nil {
		panic(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("import:run", func(ctx context.Context, t *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx) // each of the two holds a permit with its own fencing token
		_ = s.Token()
		mu.Lock()
		running++
		maxSeen = max(maxSeen, running)
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // the work
		mu.Lock()
		running--
		mu.Unlock()
		done <- struct{}{}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              4,
		IsFailure:                asynqlock.IsFailure,
		RetryDelayFunc:           asynqlock.RetryDelay(nil),
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval:        100 * time.Millisecond,
		LogLevel:                 asynq.FatalLevel,
	})
	if err := srv.Start(mux); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	for i := 1; i <= 4; i++ {
		task := asynq.NewTaskWithHeaders("import:run", []byte(fmt.Sprint(i)), map[string]string{"account": "42"})
		if _, err := client.Enqueue(task); err != nil {
			panic(err)
		}
	}
	for range 4 {
		<-done
	}
	mu.Lock()
	fmt.Printf("4 tasks done, at most %d at a time\n", maxSeen)
	mu.Unlock()
	// Output: 4 tasks done, at most 2 at a time
}
