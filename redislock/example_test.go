package redislock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/redislock"
)

// Example takes a lock on Redis (here miniredis, so the example runs with no
// server), shows that a second process is turned away, and releases it.
func Example() {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true) // TTLs run on the clock, as on a real server
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()

	ctx := context.Background()
	// Two processes, each with its own Redis client and Locker.
	rdbA := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdbA.Close()
	a, err := redislock.New(rdbA, redislock.WithPrefix("myapp"))
	if err != nil {
		panic(err)
	}
	defer a.Close()
	rdbB := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdbB.Close()
	b, err := redislock.New(rdbB, redislock.WithPrefix("myapp"))
	if err != nil {
		panic(err)
	}
	defer b.Close()

	s, err := a.TryAcquire(ctx, "nightly-report", core.WithOwner("worker-a"))
	if err != nil {
		panic(err)
	}
	fmt.Println("a holds", s.Key())

	_, err = b.TryAcquire(ctx, "nightly-report")
	var busy *core.NotAcquiredError
	if errors.As(err, &busy) {
		fmt.Println("b: busy, held by", busy.Holder.Owner)
	}

	if err := s.Release(ctx); err != nil {
		panic(err)
	}
	s2, err := b.TryAcquire(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	fmt.Println("b holds it now; token increased:", s2.Token() > s.Token())
	s2.Release(ctx)

	// Output:
	// a holds nightly-report
	// b: busy, held by worker-a
	// b holds it now; token increased: true
}

// Example_semaphore lets at most two holders of a key run at once: a third
// claim is turned away until a permit is released.
func Example_semaphore() {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	locker, err := redislock.New(rdb, redislock.WithPrefix("myapp"))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	ctx := context.Background()
	a, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	if err != nil {
		panic(err)
	}
	b, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	if err != nil {
		panic(err)
	}
	_, err = locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("third permit busy:", errors.Is(err, core.ErrNotAcquired))
	holders, err := locker.Holders(ctx, "exports")
	if err != nil {
		panic(err)
	}
	fmt.Println("holders:", len(holders), "of", holders[0].Limit, "- tokens increase:", b.Token() > a.Token())

	a.Release(ctx)
	c, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("after a release:", err == nil)
	if err == nil {
		c.Release(ctx)
	}
	b.Release(ctx)
	// Output:
	// third permit busy: true
	// holders: 2 of 2 - tokens increase: true
	// after a release: true
}
