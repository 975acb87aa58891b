// Command quickstart shows dislock's core loop: two workers race for the
// same job, one runs it under the lock, the other sees it busy and then waits
// its turn.
//
// With no environment it runs on the in-process memlock backend. With
// DATABASE_URL set (postgres://…) it uses PostgreSQL; with REDIS_URL set
// (redis://…) it uses Redis.
//
//	go run ./examples/quickstart
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go run ./examples/quickstart
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// newLocker returns two Lockers acting as two processes, on the backend the
// environment selects, and a function that closes them.
func newLocker(ctx context.Context) (a, b core.Locker, name string, closeAll func(), err error) {
	switch {
	case os.Getenv("DATABASE_URL") != "":
		var lockers [2]*core.Client
		for i := range lockers {
			be, err := pg.Open(ctx, os.Getenv("DATABASE_URL"), pg.WithAutoMigrate())
			if err != nil {
				return nil, nil, "", nil, err
			}
			if lockers[i], err = core.New(be); err != nil {
				return nil, nil, "", nil, err
			}
		}
		return lockers[0], lockers[1], "PostgreSQL", func() { lockers[0].Close(); lockers[1].Close() }, nil
	case os.Getenv("REDIS_URL") != "":
		opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
		if err != nil {
			return nil, nil, "", nil, errors.New("REDIS_URL is not a valid redis:// URL")
		}
		rdb := redis.NewClient(opt)
		var lockers [2]*core.Client
		for i := range lockers {
			if lockers[i], err = redislock.New(rdb); err != nil {
				return nil, nil, "", nil, err
			}
		}
		return lockers[0], lockers[1], "Redis", func() { lockers[0].Close(); lockers[1].Close(); rdb.Close() }, nil
	}
	store := memlock.NewStore()
	la, _ := store.Locker()
	lb, _ := store.Locker()
	return la, lb, "memlock (in-process)", func() { la.Close(); lb.Close() }, nil
}

func run(ctx context.Context, out io.Writer) error {
	a, b, backend, closeAll, err := newLocker(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	fmt.Fprintln(out, "backend:", backend)
	key := fmt.Sprintf("quickstart/report-%d", time.Now().UnixNano())

	// Worker A takes the lock.
	s, err := a.TryAcquire(ctx, key, core.TTL(10*time.Second), core.WithOwner("worker-a"))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "worker-a: acquired, fencing token", s.Token())

	// Worker B finds it busy, and is told who holds it.
	_, err = b.TryAcquire(ctx, key, core.WithOwner("worker-b"))
	var busy *core.NotAcquiredError
	if errors.As(err, &busy) && busy.Holder != nil {
		fmt.Fprintln(out, "worker-b: busy, held by", busy.Holder.Owner)
	} else if !errors.Is(err, core.ErrNotAcquired) {
		return fmt.Errorf("worker-b: expected busy, got %v", err)
	}

	// Worker B waits; A finishes its work and releases.
	done := make(chan error, 1)
	go func() {
		done <- core.Do(ctx, b, key, func(ctx context.Context) error {
			s, _ := core.SessionFromContext(ctx)
			fmt.Fprintln(out, "worker-b: acquired after waiting, fencing token", s.Token())
			return nil
		}, core.WithOwner("worker-b"))
	}()
	time.Sleep(100 * time.Millisecond) // A's "work"
	fmt.Fprintln(out, "worker-a: releasing")
	if err := s.Release(ctx); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Fprintln(out, "done")
	return nil
}
