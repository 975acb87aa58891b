package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/gocronlock"
)

// Three schedulers share a job through a Locker. All three fire the job's
// first tick at once; it runs on one of them, the others skip it. With
// PostgreSQL or Redis each scheduler would be a separate process with its
// own pg.New / redislock.New Locker; memlock's Lockers on one Store stand in
// for them here.
func ExampleNewLocker() {
	store := memlock.NewStore()
	var runs, skipped atomic.Int32
	done := make(chan struct{}, 3)
	var scheds []gocron.Scheduler
	for range 3 {
		l, _ := store.Locker()
		defer l.Close()
		locker, err := gocronlock.NewLocker(l)
		if err != nil {
			panic(err)
		}
		s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		// gocron gives a Locker only the job's name: attached to the
		// scheduler, the Locker looks the job's schedule up by that name,
		// so that each tick is a slot that runs once.
		_ = locker.Attach(s)
		_, err = s.NewJob(gocron.DurationJob(time.Hour),
			gocron.NewTask(func() { runs.Add(1); done <- struct{}{} }),
			gocron.WithName("report"),
			gocron.WithStartAt(gocron.WithStartImmediately()),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				if errors.Is(err, core.ErrNotAcquired) {
					skipped.Add(1)
				}
				done <- struct{}{}
			})))
		if err != nil {
			panic(err)
		}
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		s.Start()
	}
	for range 3 {
		<-done
	}
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	fmt.Println("runs:", runs.Load(), "skipped:", skipped.Load())
	// Output: runs: 1 skipped: 2
}

// Three schedulers elect one leader, which runs every job. Closing the
// leader's Elector hands leadership to a standby at once.
func ExampleNewElector() {
	store := memlock.NewStore()
	elected := make(chan string, 8)
	var electors []*gocronlock.Elector
	for i := range 3 {
		l, _ := store.Locker()
		defer l.Close()
		el, err := gocronlock.NewElector(l, "leader",
			gocronlock.TTL(10*time.Second),
			gocronlock.LockOptions(core.WithOwner(fmt.Sprintf("scheduler-%d", i))),
			gocronlock.OnElected(func(s core.Session) { elected <- s.Owner() }))
		if err != nil {
			panic(err)
		}
		defer el.Close()
		electors = append(electors, el)

		s, _ := gocron.NewScheduler(gocron.WithDistributedElector(el))
		defer func() { _ = s.Shutdown() }()
		_, _ = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() {}))
		s.Start()
	}

	first := <-elected
	leaders := 0
	for _, el := range electors {
		if el.IsLeader(context.Background()) == nil {
			leaders++
		}
	}
	fmt.Println("leaders:", leaders)
	info, _, _ := electors[0].Leader(context.Background())
	fmt.Println("store agrees:", info.Owner == first)

	for _, el := range electors {
		if el.IsLeader(context.Background()) == nil {
			_ = el.Close() // hands over at once
		}
	}
	second := <-elected
	fmt.Println("new leader is another scheduler:", second != first)
	// Output:
	// leaders: 1
	// store agrees: true
	// new leader is another scheduler: true
}

// A task that needs its lock: the session's fencing token goes with every
// write, and ctx ends if the lease is lost.
func ExampleNewTask() {
	l, _ := memlock.New()
	defer l.Close()
	done := make(chan struct{})
	task, err := gocronlock.NewTask(l, "billing", func(ctx context.Context, s core.Session) error {
		defer close(done)
		fmt.Printf("holding %s with fencing token %d\n", s.Key(), s.Token())
		// Pass s.Token() to the store being written, which rejects tokens
		// smaller than the largest it has seen; stop when ctx ends.
		return ctx.Err()
	}, gocronlock.TTL(30*time.Second))
	if err != nil {
		panic(err)
	}
	s, _ := gocron.NewScheduler()
	_, _ = s.NewJob(gocron.DurationJob(time.Hour), task, gocron.WithStartAt(gocron.WithStartImmediately()))
	s.Start()
	<-done
	_ = s.Shutdown()
	// Output: holding gocron:billing with fencing token 1
}
