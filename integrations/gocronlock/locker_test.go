package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/gocronlock"
)

// tickCase is one run of three schedulers sharing a job through a Locker.
type tickCase struct {
	name string
	// def returns the job's definition on a scheduler whose clock reads now.
	def func(now time.Time) (gocron.JobDefinition, []gocron.JobOption)
	// sched is registered with Locker.Schedule; nil registers nothing.
	sched core.Schedule
	opts  []gocronlock.Option
	work  time.Duration   // how long a run lasts
	offs  []time.Duration // clock offsets; default lateOffsets
	// dupes says the case shows the failure this package fixes: some tick
	// runs on more than one scheduler.
	dupes bool
	// attach makes each Locker take the schedule from its scheduler
	// (Locker.Attach) instead of a registration.
	attach bool
}

// The three schedulers' clocks: one exact, one whose ticker fires 150ms late,
// one whose clock is 1.3s behind (its ticks fire 300ms after the others'
// second boundaries, and it believes it is running the previous second).
var lateOffsets = []time.Duration{0, -150 * time.Millisecond, -1300 * time.Millisecond}

// Clocks all ahead of the store's: every tick fires 100-300ms before the
// second boundary on the store's clock (one clock is 1.2s ahead).
var earlyOffsets = []time.Duration{1200 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond}

const ticks = 5

func everySecondCron(time.Time) (gocron.JobDefinition, []gocron.JobOption) {
	return gocron.CronJob("* * * * * *", true), nil
}

func everySecondAligned(now time.Time) (gocron.JobDefinition, []gocron.JobOption) {
	return gocron.DurationJob(time.Second),
		[]gocron.JobOption{gocron.WithStartAt(gocron.WithStartDateTime(nextSecond(now)))}
}

// Rule: with WithDistributedLocker on three schedulers whose tickers fire up
// to 300ms apart (one clock 1.3s off), every tick of a 1s job runs exactly
// once across the three, for cron and duration schedules, for a fast job and
// for one that runs longer than the interval, and also when every scheduler
// fires before the tick on the store's clock (all clocks ahead, one by 1.2s). Runs are recorded in the store
// (a PostgreSQL table, a Redis list); consecutive runs must be about one
// interval apart: a duplicate shows as a gap of at most 300ms, a missed tick
// as a gap of about 2s.
func TestLockerRunsEachTickOnce(t *testing.T) {
	cronSched, err := gocronlock.Cron("* * * * * *", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []tickCase{
		{name: "fast-cron", def: everySecondCron, sched: cronSched},
		{name: "long-duration", def: everySecondAligned, sched: core.Every(time.Second), work: 1500 * time.Millisecond},
		{name: "fast-cron-early-clocks", def: everySecondCron, sched: cronSched, offs: earlyOffsets},
		{name: "fast-cron-attached", def: everySecondCron, attach: true},
	}
	forEachStore(t, func(t *testing.T, e *env) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				testTicks(t, e, tc)
			})
		}
	})
}

// Rule: a default slot (Slot option) and a min hold (MinHold option) also
// keep a fast job to one run per tick; a plain lease does not, which is the
// failure the other rules guard against (it shows the check can fail).
func TestLockerDefaultsMemlock(t *testing.T) {
	e := newEnv(t, "memlock")
	cases := []tickCase{
		{name: "default-slot", def: everySecondCron, opts: []gocronlock.Option{gocronlock.Slot(core.Every(time.Second))}},
		{name: "min-hold", def: everySecondCron, opts: []gocronlock.Option{gocronlock.MinHold(700 * time.Millisecond)}},
		{name: "plain-lease-duplicates", def: everySecondCron, dupes: true},
		{name: "attached-duration", def: everySecondAligned, attach: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testTicks(t, e, tc)
		})
	}
}

func testTicks(t *testing.T, e *env, tc tickCase) {
	offs := tc.offs
	if offs == nil {
		offs = lateOffsets
	}
	clocks := startClocks(t, offs...)
	rec := e.recorder(t)
	job := "tick-" + tc.name
	ran := make(chan struct{}, 64)
	var (
		mu       sync.Mutex
		skips    = make([]int, len(offs))
		late     int         // claims undone for a reply past their deadline: each may cost its tick
		stopping atomic.Bool // set before the schedulers shut down
	)
	scheds := make([]*scheduler, len(offs))
	for i := range offs {
		opts := append([]gocronlock.Option{gocronlock.OnError(func(key string, err error) {
			if tc.dupes && errors.Is(err, gocronlock.ErrNoSchedule) {
				return // the plain lease this case shows is reported
			}
			if errors.Is(err, core.ErrLeaseLost) {
				// A claim answered past its renew deadline (a store
				// slowed by the other suites' commits): the engine
				// undid it, rightly not busy. The runs' gaps show
				// whether a tick was lost.
				t.Logf("node %d: OnError(%q): %v", i, key, err)
				return
			}
			t.Errorf("node %d: OnError(%q): %v", i, key, err)
		})}, tc.opts...)
		locker, err := gocronlock.NewLocker(e.locker(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if tc.sched != nil {
			if err := locker.Schedule(job, tc.sched); err != nil {
				t.Fatal(err)
			}
		}
		s := newScheduler(t, gocron.WithClock(clocks.clocks[i]), gocron.WithDistributedLocker(locker))
		if tc.attach {
			if err := locker.Attach(s); err != nil {
				t.Fatal(err)
			}
		}
		def, jopts := tc.def(clocks.clocks[i].Now())
		jopts = append(jopts, gocron.WithName(job),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				// An attempt that the schedulers' shutdown cuts short is
				// no busy answer: it fails with the job's cancelled ctx.
				if stopping.Load() && errors.Is(err, context.Canceled) {
					return
				}
				if !errors.Is(err, core.ErrNotAcquired) && !errors.Is(err, core.ErrLeaseLost) {
					t.Errorf("node %d: lock error does not match core.ErrNotAcquired: %v", i, err)
				}
				mu.Lock()
				skips[i]++
				if errors.Is(err, core.ErrLeaseLost) {
					late++
				}
				mu.Unlock()
			})))
		_, err = s.NewJob(def, gocron.NewTask(func(ctx context.Context) {
			if err := rec.record(ctx, i); err != nil {
				t.Errorf("node %d: record run: %v", i, err)
			}
			select {
			case ran <- struct{}{}:
			default:
			}
			if tc.work > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(tc.work):
				}
			}
		}), jopts...)
		if err != nil {
			t.Fatalf("NewJob: %v", err)
		}
		scheds[i] = s
	}
	for _, s := range scheds {
		s.Start()
	}
	timeout := time.After(ticks*time.Second + 10*time.Second)
	for n := 0; n < ticks; n++ {
		select {
		case <-ran:
		case <-timeout:
			t.Fatalf("only %d runs", n)
		}
	}
	stopping.Store(true)
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
	clocks.Stop()

	runs, err := rec.runs(context.Background())
	if err != nil {
		t.Fatalf("read runs: %v", err)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].at.Before(runs[j].at) })
	mu.Lock()
	t.Logf("%d runs; lock refusals per scheduler: %v", len(runs), skips)
	mu.Unlock()
	if len(runs) < ticks {
		t.Fatalf("%d runs recorded, want at least %d", len(runs), ticks)
	}
	var short, long []string
	for i := 1; i < len(runs); i++ {
		gap := runs[i].at.Sub(runs[i-1].at)
		desc := fmt.Sprintf("node %d then node %d after %v", runs[i-1].node, runs[i].node, gap.Round(time.Millisecond))
		switch {
		case gap < 450*time.Millisecond:
			short = append(short, desc)
		case gap > 1550*time.Millisecond:
			long = append(long, desc)
		}
	}
	if tc.dupes {
		if len(short) == 0 {
			t.Errorf("expected duplicate runs with a plain lease, got none")
		}
		return
	}
	if len(short) > 0 {
		t.Errorf("ticks ran twice: %v", short)
	}
	mu.Lock()
	defer mu.Unlock()
	// A claim the store answered too late is undone, rightly: no tick
	// may start twice, so that tick may start nowhere. Only such a claim
	// excuses a missed tick.
	if len(long) > late {
		t.Errorf("ticks did not run: %v (%d claims answered too late)", long, late)
	}
	total := 0
	for _, n := range skips {
		total += n
	}
	if total < len(runs) {
		t.Errorf("only %d refused attempts for %d runs on three schedulers: the schedulers did not compete", total, len(runs))
	}
}

// Rule: a scheduler shut down while a job holds its lock releases the lock,
// although gocron hands Unlock an already-cancelled context.
func TestShutdownReleasesLock(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		admin := e.locker(t)
		locker, err := gocronlock.NewLocker(e.locker(t), quiet(t)) // a plain lease on purpose
		if err != nil {
			t.Fatal(err)
		}
		s := newScheduler(t, gocron.WithDistributedLocker(locker))
		started := make(chan struct{})
		var jobCtx context.Context
		if _, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func(ctx context.Context) {
			jobCtx = ctx
			close(started)
			<-ctx.Done()
		}), gocron.WithName("busy"), gocron.WithStartAt(gocron.WithStartImmediately())); err != nil {
			t.Fatal(err)
		}
		s.Start()
		within(t, started, 5*time.Second, "job start")
		ctx := context.Background()
		key := gocronlock.DefaultPrefix + "busy"
		if _, held, err := admin.Inspect(ctx, key); err != nil || !held {
			t.Fatalf("Inspect while the job runs: held %v, %v", held, err)
		}
		if err := s.Shutdown(); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if jobCtx.Err() == nil {
			t.Fatal("gocron did not cancel the job's context")
		}
		if info, held, err := admin.Inspect(ctx, key); err != nil || held {
			t.Errorf("after Shutdown: held %v (%+v), %v; want released", held, info, err)
		}
	})
}
