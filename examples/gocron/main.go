// Command gocron runs three gocron schedulers that share their jobs through
// dislock, twice: first electing one leader that runs every job (Elector),
// then running each tick of a job on one scheduler only (Locker).
//
// With no environment the three schedulers share an in-process memlock
// store. With DATABASE_URL set (postgres://…) they use PostgreSQL; with
// MYSQL_URL set (mysql://…) MySQL or MariaDB; with REDIS_URL set
// (redis://…) Redis. Each scheduler has its own
// Locker, as it would in its own process.
//
//	go -C examples run ./gocron
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go -C examples run ./gocron
//	MYSQL_URL=mysql://root@127.0.0.1:3306/test go -C examples run ./gocron
//	REDIS_URL=redis://127.0.0.1:6379/0 go -C examples run ./gocron
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/examples/internal/exenv"
	"github.com/dislock/dislock/integrations/gocronlock"
)

const schedulers = 3

func main() { exenv.Main("gocron example", run) }

// run shows the elector, then the locker, and prints what happens to out.
func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := &exenv.Printer{W: out}
	lockers, backend, closeAll, err := exenv.Lockers(ctx, schedulers)
	if err != nil {
		return err
	}
	defer closeAll()
	p.Printf("backend: %s\n", backend)
	// A fresh prefix per run keeps this run's keys apart from earlier runs'
	// on a shared server.
	prefix := gocronlock.Prefix("examples/gocron/" + strings.ToLower(rand.Text()[:8]) + "/")

	if err := electorDemo(ctx, p, lockers, prefix); err != nil {
		return err
	}
	return lockerDemo(ctx, p, lockers, prefix)
}

// electorDemo starts three schedulers with a distributed elector: only the
// leader runs the heartbeat job. Closing the leader's elector hands over to
// a standby at once.
func electorDemo(ctx context.Context, p *exenv.Printer, lockers []core.Locker, prefix gocronlock.Option) error {
	p.Printf("\n== elector: one leader runs every job ==\n")
	beats := make(chan beat, 16)
	elected := make(chan int, 8)
	electors := make([]*gocronlock.Elector, schedulers)
	scheds := make([]gocron.Scheduler, schedulers)
	defer func() {
		for i := range scheds {
			if scheds[i] != nil {
				_ = scheds[i].Shutdown()
			}
			if electors[i] != nil {
				_ = electors[i].Close()
			}
		}
	}()
	for i := range schedulers {
		name := fmt.Sprintf("scheduler-%d", i+1)
		el, err := gocronlock.NewElector(lockers[i], "leader", prefix,
			gocronlock.TTL(5*time.Second),
			gocronlock.LockOptions(core.WithOwner(name)),
			gocronlock.OnElected(func(s core.Session) {
				p.Printf("%s: elected leader (fencing token %d)\n", name, s.Token())
				elected <- i
			}),
			gocronlock.OnRevoked(func(err error) {
				p.Printf("%s: no longer leader (%v)\n", name, err)
			}))
		if err != nil {
			return err
		}
		electors[i] = el
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
		if err != nil {
			return err
		}
		scheds[i] = s
		_, err = s.NewJob(gocron.DurationJob(300*time.Millisecond), gocron.NewTask(func() {
			var token uint64
			if s := el.Session(); s != nil {
				token = s.Token()
			}
			p.Printf("%s: heartbeat (token %d)\n", name, token)
			select {
			case beats <- beat{i, time.Now()}:
			default:
			}
		}), gocron.WithName("heartbeat"))
		if err != nil {
			return err
		}
		s.Start()
	}

	leader, err := recv(ctx, elected)
	if err != nil {
		return err
	}
	if err := waitBeats(ctx, beats, leader, 3, time.Time{}); err != nil {
		return err
	}
	if info, ok, err := electors[(leader+1)%schedulers].Leader(ctx); err == nil && ok {
		p.Printf("the store says the leader is %s\n", info.Owner)
	}
	p.Printf("closing scheduler-%d's elector: it hands over at once\n", leader+1)
	closing := time.Now()
	if err := electors[leader].Close(); err != nil {
		return err
	}
	closed := time.Now()
	next, err := recv(ctx, elected)
	if err != nil {
		return err
	}
	p.Printf("scheduler-%d took over after %v\n", next+1, time.Since(closing).Round(10*time.Microsecond))
	return waitBeats(ctx, beats, next, 3, closed)
}

// lockerDemo starts three schedulers with a distributed locker and a job
// that runs every second: each tick runs on one scheduler only, the others
// find it busy and skip it.
func lockerDemo(ctx context.Context, p *exenv.Printer, lockers []core.Locker, prefix gocronlock.Option) error {
	const ticks = 3
	p.Printf("\n== locker: each tick runs on one scheduler ==\n")
	type tick struct {
		node int
		at   time.Time
	}
	runs := make(chan tick, 16)
	var (
		mu      sync.Mutex
		skipped int
		all     []time.Time // every run, on any scheduler
	)
	scheds := make([]gocron.Scheduler, schedulers)
	defer func() {
		for _, s := range scheds {
			if s != nil {
				_ = s.Shutdown()
			}
		}
	}()
	for i := range schedulers {
		name := fmt.Sprintf("scheduler-%d", i+1)
		locker, err := gocronlock.NewLocker(lockers[i], prefix,
			gocronlock.OnError(func(key string, err error) { p.Printf("%s: %s: %v\n", name, key, err) }))
		if err != nil {
			return err
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			return err
		}
		// gocron tells a Locker only the job's name: attached to the
		// scheduler, the Locker looks the job's schedule up by that name,
		// and each tick becomes a slot that runs once.
		if err := locker.Attach(s); err != nil {
			return err
		}
		scheds[i] = s
		_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
			now := time.Now()
			mu.Lock()
			all = append(all, now)
			mu.Unlock()
			p.Printf("%s: report for %s\n", name, now.Round(time.Second).Format(time.TimeOnly))
			select {
			case runs <- tick{i, now}:
			default:
			}
		}), gocron.WithName("report"),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				if errors.Is(err, core.ErrNotAcquired) {
					mu.Lock()
					skipped++
					mu.Unlock()
				}
			})))
		if err != nil {
			return err
		}
	}
	for _, s := range scheds {
		s.Start()
	}
	for range ticks {
		if _, err := recv(ctx, runs); err != nil {
			return err
		}
	}
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	// Counted after the shutdown: every run any scheduler made, also those
	// that started while the others were stopping.
	mu.Lock()
	defer mu.Unlock()
	seen := map[time.Time]int{}
	for _, at := range all {
		seen[at.Round(time.Second)]++
	}
	once := true
	for _, n := range seen {
		once = once && n == 1
	}
	p.Printf("%d ticks, %d runs, %d busy skips; each tick ran once: %v\n", len(seen), len(all), skipped, once)
	return nil
}

// recv waits for a value from ch or the end of ctx.
func recv[T any](ctx context.Context, ch <-chan T) (T, error) {
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// beat is one heartbeat run.
type beat struct {
	node int
	at   time.Time
}

// waitBeats waits for n heartbeats by node, ignoring those before since; a
// heartbeat by another scheduler after since is an error.
func waitBeats(ctx context.Context, ch <-chan beat, node, n int, since time.Time) error {
	for n > 0 {
		b, err := recv(ctx, ch)
		if err != nil {
			return err
		}
		switch {
		case b.at.Before(since):
		case b.node == node:
			n--
		default:
			return fmt.Errorf("scheduler-%d ran a job while scheduler-%d led", b.node+1, node+1)
		}
	}
	return nil
}
