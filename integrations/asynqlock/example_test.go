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
// here (serveAccountTasks) and the locks live in memory; in production both
// would be real stores shared by every server.
func Example() {
	locker, err := memlock.New()
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	mw, err := asynqlock.New(locker,
		asynqlock.Key(asynqlock.ByHeader("account")), // one task per account at a time
	)
	if err != nil {
		panic(err) // an invalid option, named in the error
	}
	m := newMeter(3)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx) // s.Token() fences writes
		_ = s.Token()
		m.work(50 * time.Millisecond)
		return nil
	})
	serveAccountTasks(mux, "report:build", 3, m)
	fmt.Printf("3 tasks done, at most %d at a time\n", m.peak)
	// Output: 3 tasks done, at most 1 at a time
}

// Four imports for one account, on a server with four workers: Limit(2)
// runs two of them at a time, never more. As in Example, asynq runs on an
// in-process miniredis and the permits live in memory; in production both
// would be real stores shared by every server, and the limit would hold
// across all of them.
func ExampleLimit() {
	locker, err := memlock.New()
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	mw, err := asynqlock.New(locker,
		asynqlock.Key(asynqlock.ByHeader("account")),
		asynqlock.Limit(2), // up to two tasks per account at a time
	)
	if err != nil {
		panic(err)
	}
	m := newMeter(4)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("import:run", func(ctx context.Context, t *asynq.Task) error {
		s, _ := core.SessionFromContext(ctx) // each of the two holds a permit with its own fencing token
		_ = s.Token()
		m.work(100 * time.Millisecond)
		return nil
	})
	serveAccountTasks(mux, "import:run", 4, m)
	fmt.Printf("4 tasks done, at most %d at a time\n", m.peak)
	// Output: 4 tasks done, at most 2 at a time
}

// meter counts the handlers running at once and the tasks done.
type meter struct {
	mu            sync.Mutex
	running, peak int
	done          chan struct{}
}

func newMeter(tasks int) *meter { return &meter{done: make(chan struct{}, tasks)} }

// work stands for a handler's work of duration d.
func (m *meter) work(d time.Duration) {
	m.mu.Lock()
	m.running++
	m.peak = max(m.peak, m.running)
	m.mu.Unlock()
	time.Sleep(d)
	m.mu.Lock()
	m.running--
	m.mu.Unlock()
	m.done <- struct{}{}
}

// serveAccountTasks enqueues n tasks of type typ for account 42 and serves
// them with mux on an asynq server of n workers, wired as every server
// behind asynqlock should be, until m has counted them all done. asynq runs
// on an in-process miniredis.
func serveAccountTasks(mux *asynq.ServeMux, typ string, n int, m *meter) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              n,
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
	for i := 1; i <= n; i++ {
		task := asynq.NewTaskWithHeaders(typ, []byte(fmt.Sprint(i)), map[string]string{"account": "42"})
		if _, err := client.Enqueue(task); err != nil {
			panic(err)
		}
	}
	for range n {
		<-m.done // after the handler's last write to m.peak
	}
}
