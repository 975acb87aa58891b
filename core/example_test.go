package core_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// Take a lock, work while it is held, release it. memlock stands in for a
// real backend (pg.New, redislock.New) here; the code is the same.
func Example() {
	ctx := context.Background()
	locker, err := memlock.New()
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	s, err := locker.TryAcquire(ctx, "reports/daily", core.TTL(30*time.Second))
	if errors.Is(err, core.ErrNotAcquired) {
		// The store answered: another process holds the lock.
		fmt.Println("another process is running the report")
		return
	}
	if err != nil {
		// The store failed or did not answer in time: an outage, never a
		// reason to skip quietly.
		panic(err)
	}
	defer s.Release(ctx)

	// s.Context() is cancelled if the lease is lost: do the work under it,
	// and pass s.Token() to anything that can reject stale writers.
	fmt.Println("holding", s.Key(), "with fencing token", s.Token())
	// Output: holding reports/daily with fencing token 1
}

// Do waits for the lock, runs the function with a context that is cancelled
// if the lease is lost, and releases the lock.
func ExampleDo() {
	locker, _ := memlock.New()
	defer locker.Close()
	err := core.Do(context.Background(), locker, "migrations", func(ctx context.Context) error {
		s, _ := core.SessionFromContext(ctx)
		fmt.Println("migrating under token", s.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// migrating under token 1
	// err: <nil>
}

// TryDo runs the function only if the lock is free, and skips it when
// another process holds it. A store that fails is an error, never a skip.
func ExampleTryDo() {
	a, b, closeBoth := twoProcesses() // two Lockers that see each other's locks
	defer closeBoth()
	ctx := context.Background()

	report := func(ctx context.Context) error {
		fmt.Println("running the report")
		return nil
	}
	held, _ := a.TryAcquire(ctx, "reports/daily")
	ran, err := core.TryDo(ctx, b, "reports/daily", report)
	fmt.Println("while held elsewhere: ran", ran, "err", err)
	held.Release(ctx)

	ran, err = core.TryDo(ctx, b, "reports/daily", report)
	fmt.Println("once free: ran", ran, "err", err)
	// Output:
	// while held elsewhere: ran false err <nil>
	// running the report
	// once free: ran true err <nil>
}

// A second process finds the lock busy; the error says who holds it.
func ExampleLocker_TryAcquire() {
	a, b, closeBoth := twoProcesses() // two Lockers that see each other's locks
	defer closeBoth()
	ctx := context.Background()

	s, _ := a.TryAcquire(ctx, "job", core.WithOwner("worker-a"))
	defer s.Release(ctx)
	_, err := b.TryAcquire(ctx, "job")
	var busy *core.NotAcquiredError
	if errors.As(err, &busy) {
		fmt.Println("busy; held by", busy.Holder.Owner)
	}
	// Output: busy; held by worker-a
}

// ForSlot gives one start per schedule slot across all machines, however
// their tickers drift.
func ExampleForSlot() {
	a, b, closeBoth := twoProcesses() // two Lockers that see each other's locks
	defer closeBoth()
	ctx := context.Background()
	everyHour := core.ForSlot(core.Every(time.Hour))

	s, err := a.TryAcquire(ctx, "hourly-sync", everyHour)
	fmt.Println("a starts:", err == nil)
	s.Release(ctx) // kept until the hour ends
	_, err = b.TryAcquire(ctx, "hourly-sync", everyHour)
	fmt.Println("b starts:", err == nil)
	// Output:
	// a starts: true
	// b starts: false
}

// CampaignContext elects one leader among many processes; IsLeader costs
// nothing.
func ExampleCampaignContext() {
	locker, _ := memlock.New()
	defer locker.Close()
	elected := make(chan struct{})
	e, err := core.CampaignContext(context.Background(), locker, "scheduler-leader",
		core.OnElected(func(core.Session) { close(elected) }))
	if err != nil {
		panic(err)
	}
	defer e.Close()
	<-elected
	fmt.Println("leader:", e.IsLeader())
	// Output: leader: true
}

// Observe follows who leads: the current leader first, then each new one.
// Two processes campaign; when the leader closes its election, the other
// takes over and the observer hears of it at once.
func ExampleElection_Observe() {
	ctx := context.Background()
	a, b, closeBoth := twoProcesses()
	defer closeBoth()

	first, err := core.CampaignContext(ctx, a, "scheduler-leader", core.WithLockOptions(core.WithOwner("node-a")))
	if err != nil {
		panic(err)
	}
	second, err := core.CampaignContext(ctx, b, "scheduler-leader", core.WithLockOptions(core.WithOwner("node-b")))
	if err != nil {
		panic(err)
	}
	defer second.Close()

	leaders, err := second.Observe(ctx)
	if err != nil {
		panic(err) // core.ErrUnsupported: the Locker has no Admin
	}
	// next skips the moments nobody leads (a zero Info).
	next := func() string {
		for l := range leaders {
			if l.Owner != "" {
				return l.Owner
			}
		}
		return "(closed)"
	}
	fmt.Println("leader:", next())
	first.Close() // resigns: node-b takes over
	fmt.Println("leader:", next())
	// Output:
	// leader: node-a
	// leader: node-b
}

// Limit makes a key a semaphore: up to n sessions hold it at once, each
// with its own lease, renewal, loss signal and fencing token. Here at most
// two exports run at a time, across every process using the store.
func ExampleLimit() {
	ctx := context.Background()
	locker, _ := memlock.New()
	defer locker.Close()

	a, _ := locker.TryAcquire(ctx, "exports", core.Limit(2))
	b, _ := locker.TryAcquire(ctx, "exports", core.Limit(2))
	_, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("third export:", errors.Is(err, core.ErrNotAcquired))

	holders, _ := locker.Holders(ctx, "exports")
	fmt.Println("holders:", len(holders), "of", holders[0].Limit)

	// Every holder of a key must ask for the same limit.
	_, err = locker.TryAcquire(ctx, "exports")
	fmt.Println("as a mutex:", errors.Is(err, core.ErrLimitMismatch))

	a.Release(ctx)
	c, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("after a release:", err == nil, c.Token() > b.Token())
	b.Release(ctx)
	c.Release(ctx)
	// Output:
	// third export: true
	// holders: 2 of 2
	// as a mutex: true
	// after a release: true true
}

// Check asks the store, in one round trip, whether it still holds the
// session's lease: the last thing to do before a step that cannot be undone
// on a resource that cannot check fencing tokens.
func ExampleSession_Check() {
	ctx := context.Background()
	locker, _ := memlock.New()
	defer locker.Close()

	s, _ := locker.TryAcquire(ctx, "payouts")
	defer s.Release(ctx)
	if err := s.Check(ctx); err != nil {
		fmt.Println("not sending: ", err)
		return
	}
	fmt.Println("still the holder: sending the payout")
	// Output: still the holder: sending the payout
}

// twoProcesses returns two Lockers on one memlock store, which see each
// other's locks as two processes on one real store do, and a func that
// closes them (b first).
func twoProcesses() (a, b *core.Client, closeBoth func()) {
	store := memlock.NewStore()
	a, _ = store.Locker()
	b, _ = store.Locker()
	return a, b, func() {
		_ = b.Close()
		_ = a.Close()
	}
}
