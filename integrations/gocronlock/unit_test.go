package gocronlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/gocronlock"
	"github.com/dislock/dislock/internal/testenv"
)

// Rule: invalid options, and options that do not apply to a constructor,
// are rejected up front with an error matching core.ErrInvalidOption.
func TestOptionsRejected(t *testing.T) {
	l := newMemStore(t).open()
	fn := func(context.Context, core.Session) error { return nil }
	cases := map[string]error{}
	_, cases["Locker TTL(0)"] = gocronlock.NewLocker(l, gocronlock.TTL(0))
	_, cases["Locker OnElected"] = gocronlock.NewLocker(l, gocronlock.OnElected(func(core.Session) {}))
	_, cases["Locker Slot(nil)"] = gocronlock.NewLocker(l, gocronlock.Slot(nil))
	_, cases["Locker Slot+MinHold"] = gocronlock.NewLocker(l, gocronlock.Slot(core.Every(time.Minute)), gocronlock.MinHold(time.Second))
	_, cases["Locker nil"] = gocronlock.NewLocker(nil)
	_, cases["Elector MinHold"] = gocronlock.NewElector(l, "k", gocronlock.MinHold(time.Second))
	_, cases["Elector Retry(0)"] = gocronlock.NewElector(l, "k", gocronlock.Retry(0))
	_, cases["Elector bad lock option"] = gocronlock.NewElector(l, "k", gocronlock.LockOptions(core.TTL(-1)))
	_, cases["Locker bad lock option"] = gocronlock.NewLocker(l, gocronlock.LockOptions(core.RenewInterval(time.Hour)))
	_, cases["Wrap bad lock option"] = gocronlock.Wrap(l, "k", fn, gocronlock.LockOptions(core.TTL(-1)))
	_, cases["Wrap Retry"] = gocronlock.Wrap(l, "k", fn, gocronlock.Retry(time.Second))
	_, cases["Wrap TryTimeout(0)"] = gocronlock.Wrap(l, "k", fn, gocronlock.TryTimeout(0))
	_, cases["Wrap nil fn"] = gocronlock.Wrap(l, "k", nil)
	_, cases["Task Jitter(-1)"] = gocronlock.NewTask(l, "k", fn, gocronlock.Jitter(-1))
	for name, err := range cases {
		if !errors.Is(err, core.ErrInvalidOption) {
			t.Errorf("%s: got %v, want core.ErrInvalidOption", name, err)
		}
	}
	if _, err := gocronlock.Wrap(l, "bad\x00key", fn); !errors.Is(err, core.ErrInvalidKey) {
		t.Errorf("Wrap with a NUL in the key: %v, want core.ErrInvalidKey", err)
	}
}

// Rule: a limit out of range, a limit where it does not apply (the
// Elector), and a limit above 1 on a store without semaphores are rejected
// up front, naming the option.
func TestLimitRejected(t *testing.T) {
	l := newMemStore(t).open()
	plain := testenv.MutexOnlyLocker(t)
	fn := func(context.Context, core.Session) error { return nil }
	cases := map[string]error{}
	_, cases["Locker Limit(0)"] = gocronlock.NewLocker(l, gocronlock.Limit(0))
	_, cases["Locker Limit(MaxLimit+1)"] = gocronlock.NewLocker(l, gocronlock.Limit(core.MaxLimit+1))
	_, cases["Wrap Limit(-1)"] = gocronlock.Wrap(l, "k", fn, gocronlock.Limit(-1))
	_, cases["Elector Limit"] = gocronlock.NewElector(l, "k", gocronlock.Limit(2))
	_, cases["Locker Limit on a mutex-only store"] = gocronlock.NewLocker(plain, gocronlock.Limit(2))
	_, cases["Wrap Limit on a mutex-only store"] = gocronlock.Wrap(plain, "k", fn, gocronlock.Limit(2))
	k, err := gocronlock.NewLocker(l)
	if err != nil {
		t.Fatal(err)
	}
	cases["Locker.Limit(-1)"] = k.Limit("job", -1)
	kp, err := gocronlock.NewLocker(plain, gocronlock.Limit(1))
	if err != nil {
		t.Fatalf("Limit(1) on a mutex-only store: %v", err)
	}
	cases["Locker.Limit on a mutex-only store"] = kp.Limit("job", 3)
	for name, err := range cases {
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "Limit") {
			t.Errorf("%s: got %v, want core.ErrInvalidOption naming Limit", name, err)
		}
		if strings.Contains(name, "mutex-only") && !errors.Is(err, core.ErrUnsupported) {
			t.Errorf("%s: got %v, want core.ErrUnsupported too", name, err)
		}
	}
	if err := k.Limit("bad\x00", 2); !errors.Is(err, core.ErrInvalidKey) {
		t.Errorf("Locker.Limit with a bad job name: %v", err)
	}
	if err := kp.Limit("job", 1); err != nil {
		t.Errorf("Locker.Limit(1) on a mutex-only store: %v", err)
	}
}

// Rule: Cron parses crontabs as gocron.CronJob does, in the given location
// unless the crontab names one.
func TestCron(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	at := time.Date(2025, 1, 15, 13, 59, 30, 0, time.UTC)
	for _, c := range []struct {
		spec    string
		seconds bool
		loc     *time.Location
		want    time.Time
	}{
		{"*/5 * * * *", false, time.UTC, time.Date(2025, 1, 15, 14, 0, 0, 0, time.UTC)},
		{"30 * * * * *", true, time.UTC, time.Date(2025, 1, 15, 14, 0, 30, 0, time.UTC)},
		{"0 9 * * *", false, ny, time.Date(2025, 1, 15, 14, 0, 0, 0, time.UTC)},
		{"CRON_TZ=UTC 0 9 * * *", false, ny, time.Date(2025, 1, 16, 9, 0, 0, 0, time.UTC)},
		{"@hourly", false, time.UTC, time.Date(2025, 1, 15, 14, 0, 0, 0, time.UTC)},
	} {
		s, err := gocronlock.Cron(c.spec, c.seconds, c.loc)
		if err != nil {
			t.Errorf("Cron(%q): %v", c.spec, err)
			continue
		}
		if got := s.Next(at); !got.Equal(c.want) {
			t.Errorf("Cron(%q).Next(%v) = %v, want %v", c.spec, at, got.UTC(), c.want)
		}
	}
	for _, bad := range []string{"", "* * *", "61 * * * *"} {
		if _, err := gocronlock.Cron(bad, false, nil); !errors.Is(err, core.ErrInvalidOption) {
			t.Errorf("Cron(%q): %v, want core.ErrInvalidOption", bad, err)
		}
	}
	// Steps and ranges outside their field are errors naming the field, not
	// a silently different schedule (*/61 would be hourly).
	for _, c := range []struct {
		spec    string
		seconds bool
		want    string
	}{
		{"*/61 * * * *", false, "minute field"},
		{"0 */25 * * *", false, "hour field"},
		{"*/61 * * * * *", true, "second field"},
		{"0 5-70 * * * *", true, "minute field"},
		{"*/30 * * * * *", false, "withSeconds"},
	} {
		_, err := gocronlock.Cron(c.spec, c.seconds, nil)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Cron(%q, %v): %v, want core.ErrInvalidOption naming %q", c.spec, c.seconds, err, c.want)
		}
	}
}

// Rule: Lock makes one attempt; a busy job lock is an error matching
// core.ErrNotAcquired; Unlock with a cancelled context still releases a
// lease lock; keys are prefix + job name.
func TestLockerBusyAndUnlock(t *testing.T) {
	store := newMemStore(t)
	a, b := store.open(), store.open()
	la, err := gocronlock.NewLocker(a, gocronlock.Prefix("jobs/"))
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := gocronlock.NewLocker(b, gocronlock.Prefix("jobs/"))
	ctx := context.Background()
	lock := mustLock(t, la, "sync", "first Lock")
	if !store.Held("jobs/sync") {
		t.Errorf("key jobs/sync not held")
	}
	start := time.Now()
	if _, err := lb.Lock(ctx, "sync"); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("second Lock: %v, want core.ErrNotAcquired", err)
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("busy Lock took %v: it must not wait", d)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := lock.Unlock(cancelled); err != nil {
		t.Errorf("Unlock with a cancelled ctx: %v", err)
	}
	if store.Held("jobs/sync") {
		t.Errorf("key still held after Unlock")
	}
	lock, err = lb.Lock(ctx, "sync")
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	_ = lock.Unlock(ctx)
}

// Rule: a registered schedule makes a slot lock that outlives Unlock until
// the slot ends; removing the registration goes back to the default.
func TestLockerScheduleSlot(t *testing.T) {
	a := newMemStore(t).open()
	l, _ := gocronlock.NewLocker(a)
	if err := l.Schedule("hourly", core.Every(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lock := mustLock(t, l, "hourly", "first Lock in the slot")
	_ = lock.Unlock(ctx)
	if _, err := l.Lock(ctx, "hourly"); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("second Lock in the same slot: %v, want core.ErrNotAcquired", err)
	}
	if err := l.Schedule("other", nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Schedule("bad\x00", core.Every(time.Hour)); !errors.Is(err, core.ErrInvalidKey) {
		t.Errorf("Schedule with a bad name: %v", err)
	}
}

// Rule: a lock attempt is bounded by TryTimeout, and a slow store is
// reported to OnError; a failed release is returned by Unlock and reported.
func TestLockerFailuresReported(t *testing.T) {
	store := memlock.NewStore()
	backend := store.Backend()
	c, err := core.New(backend)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var reported []error
	l, _ := gocronlock.NewLocker(c, gocronlock.TryTimeout(50*time.Millisecond), gocronlock.ReleaseTimeout(50*time.Millisecond),
		gocronlock.OnError(func(_ string, err error) {
			if errors.Is(err, gocronlock.ErrNoSchedule) {
				return // these jobs take plain leases on purpose
			}
			mu.Lock()
			reported = append(reported, err)
			mu.Unlock()
		}))
	ctx := context.Background()

	// The attempt gives up after TryTimeout; core then releases the claim
	// that may have reached the store, which costs one more (slow) call.
	backend.SetLatency(300 * time.Millisecond)
	start := time.Now()
	if _, err := l.Lock(ctx, "slow"); err == nil {
		t.Fatal("Lock on a slow store succeeded")
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("Lock took %v with a 50ms TryTimeout and 300ms latency", d)
	}
	backend.SetLatency(0)

	lock := mustLock(t, l, "job", "Lock on a store back to speed")
	backend.SetDown(true)
	if err := lock.Unlock(ctx); !errors.Is(err, memlock.ErrUnavailable) {
		t.Errorf("Unlock on a down store: %v, want memlock.ErrUnavailable", err)
	}
	backend.SetDown(false)
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 2 || !errors.Is(reported[1], memlock.ErrUnavailable) {
		t.Errorf("OnError got %v, want the timeout and the release failure", reported)
	}
}

// Rule: a job with no known schedule (no Schedule, no attached scheduler
// that has it, no Slot or MinHold) is reported once per job to OnError with
// an error matching ErrNoSchedule that says how to fix it; an attached
// scheduler supplies the schedule of its cron and duration jobs, so that
// their runs take slot locks kept after Unlock, with no registration.
func TestLockerScheduleFromScheduler(t *testing.T) {
	store := newMemStore(t)
	var log errorLog
	_, l := store.logged(&log)
	ctx := context.Background()
	lockUnlock := func(job string) {
		t.Helper()
		if err := mustLock(t, l, job, "lockUnlock").Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lockUnlock("plain")
	lockUnlock("plain")
	lockUnlock("other")
	reports := log.take()
	if len(reports) != 2 {
		t.Fatalf("%d reports for two jobs without a schedule, want one each: %v", len(reports), reports)
	}
	for _, err := range reports {
		if !errors.Is(err, gocronlock.ErrNoSchedule) || !strings.Contains(err.Error(), "Attach") {
			t.Errorf("report %v: want ErrNoSchedule naming the fix", err)
		}
	}

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	// s is never started, so its runs' times cannot show its location:
	// give it, gocron's default.
	if err := l.Attach(s, time.Local); err != nil {
		t.Fatal(err)
	}
	task := gocron.NewTask(func() {})
	for _, j := range []struct {
		name string
		def  gocron.JobDefinition
	}{
		{"cron-job", gocron.CronJob("0 * * * *", false)},
		{"seconds-job", gocron.CronJob("0 0 * * * *", true)},
		{"duration-job", gocron.DurationJob(time.Hour)},
		{"daily-job", gocron.DailyJob(1, gocron.NewAtTimes(gocron.NewAtTime(3, 0, 0)))},
	} {
		if _, err := s.NewJob(j.def, task, gocron.WithName(j.name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, job := range []string{"cron-job", "seconds-job", "duration-job"} {
		lockUnlock(job)
		if !store.Held(gocronlock.DefaultPrefix + job) {
			t.Errorf("%s: the lock is not kept after Unlock: no slot lock", job)
		}
	}
	lockUnlock("daily-job")
	if reports := log.take(); len(reports) != 1 || !errors.Is(reports[0], gocronlock.ErrNoSchedule) || !strings.Contains(reports[0].Error(), "daily-job") {
		t.Errorf("reports %v: want one ErrNoSchedule for daily-job", reports)
	}
	if err := l.Attach(nil); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("Attach(nil): %v", err)
	}
}

// stallScheduler is a gocron.Scheduler whose Jobs answers with jobs while
// stalled is false, and otherwise blocks until release is closed, as
// gocron's loop does while it stops its jobs.
type stallScheduler struct {
	gocron.Scheduler
	mu      sync.Mutex
	jobs    []gocron.Job
	stalled bool
	release chan struct{}
}

func (s *stallScheduler) Jobs() []gocron.Job {
	s.mu.Lock()
	stalled, jobs := s.stalled, s.jobs
	s.mu.Unlock()
	if stalled {
		<-s.release
		return nil
	}
	return jobs
}

func (s *stallScheduler) stall() {
	s.mu.Lock()
	s.stalled = true
	s.mu.Unlock()
}

// cronJob is a gocron.Job with a crontab, whose NextRun fails until next
// is set.
type cronJob struct {
	gocron.Job
	name, crontab string
	mu            sync.Mutex
	next          time.Time
}

func (j *cronJob) Name() string                      { return j.name }
func (j *cronJob) Schedule() gocron.JobSchedule      { return gocron.CronJobSchedule{Crontab: j.crontab} }
func (j *cronJob) setNext(t time.Time)               { j.mu.Lock(); j.next = t; j.mu.Unlock() }
func (j *cronJob) LastRun() (time.Time, error)       { return time.Time{}, nil }
func (j *cronJob) NextRuns(int) ([]time.Time, error) { return nil, nil }
func (j *cronJob) NextRun() (time.Time, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.next.IsZero() {
		return time.Time{}, gocron.ErrJobNotFound
	}
	return j.next, nil
}

// mustLock takes job's lock on l, failing the test if it cannot; what says
// which Lock it is.
func mustLock(t *testing.T, l *gocronlock.Locker, job, what string) gocron.Lock {
	t.Helper()
	lock, err := l.Lock(context.Background(), job)
	if err != nil {
		t.Fatalf("%s: Lock(%q): %v", what, job, err)
	}
	return lock
}

// lockWithin runs l.Lock(job) and fails the test if it has not returned
// within limit.
func lockWithin(t *testing.T, l *gocronlock.Locker, job string, limit time.Duration) gocron.Lock {
	t.Helper()
	got := testenv.Async(func() (gocron.Lock, error) { return l.Lock(context.Background(), job) })
	select {
	case r := <-got:
		if r.Err != nil {
			t.Fatalf("Lock(%q): %v", job, r.Err)
		}
		return r.V
	case <-time.After(limit):
		t.Fatalf("Lock(%q) still waiting on the scheduler after %v", job, limit)
		return nil
	}
}

// Rule: a run does not wait for an attached scheduler that does not list
// its jobs (gocron's loop while it stops them) longer than the look-up's
// bound: it takes the schedule derived last for its job, or else runs
// under a plain lease and says why through OnError.
func TestAttachLookupBounded(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	var log errorLog
	a, l := store.logged(&log)
	job := &cronJob{name: "hourly", crontab: "TZ=UTC 0 * * * *"}
	s := &stallScheduler{jobs: []gocron.Job{job}, release: make(chan struct{})}
	defer close(s.release)
	if err := l.Attach(s); err != nil {
		t.Fatal(err)
	}
	if err := lockWithin(t, l, "hourly", 10*time.Second).Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !store.Held(gocronlock.DefaultPrefix + "hourly") {
		t.Fatal("no slot lock from the attached scheduler's cron job")
	}
	s.stall()
	if _, err := a.ForceRelease(context.Background(), gocronlock.DefaultPrefix+"hourly"); err != nil {
		t.Fatal(err)
	}
	if err := lockWithin(t, l, "hourly", 10*time.Second).Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !store.Held(gocronlock.DefaultPrefix + "hourly") {
		t.Error("a stalled look-up dropped the schedule derived before: no slot lock")
	}
	if err := lockWithin(t, l, "never-seen", 10*time.Second).Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reports := log.take(); len(reports) != 1 || !errors.Is(reports[0], gocronlock.ErrNoSchedule) || !strings.Contains(reports[0].Error(), "did not list its jobs") {
		t.Errorf("reports %v: want one ErrNoSchedule saying the scheduler did not answer", reports)
	}
}

// Rule: a cron job's slots are computed in the attached scheduler's
// location, as seen in the times of its runs; a run that cannot see it
// (NextRun fails, no last run) takes no slot lock rather than guess a
// location, says why through OnError and keeps nothing, and a later run
// computes the slot in the scheduler's location.
func TestAttachLocationFromScheduler(t *testing.T) {
	t.Parallel()
	var log errorLog
	store := newMemStore(t)
	a, l := store.logged(&log)
	job := &cronJob{name: "nightly", crontab: "0 3 * * *"}
	if err := l.Attach(&stallScheduler{jobs: []gocron.Job{job}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := gocronlock.DefaultPrefix + "nightly"
	if err := lockWithin(t, l, "nightly", 10*time.Second).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if store.Held(key) {
		t.Fatal("a slot lock kept without the scheduler's location")
	}
	if reports := log.take(); len(reports) != 1 || !errors.Is(reports[0], gocronlock.ErrNoSchedule) || !strings.Contains(reports[0].Error(), "location") {
		t.Errorf("reports %v: want one ErrNoSchedule saying the location is not known", reports)
	}
	// A zone whose 03:00 is never time.Local's, for any Local.
	_, off := time.Now().Zone()
	zone := time.FixedZone("sched", off+5*3600+1800)
	job.setNext(time.Now().Add(time.Hour).In(zone))
	if err := lockWithin(t, l, "nightly", 10*time.Second).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	info, held, err := a.Inspect(ctx, key)
	if err != nil || !held {
		t.Fatalf("Inspect: held %v, %v: no slot lock", held, err)
	}
	end := info.ExpiresAt.Round(time.Minute).In(zone) // the store ends it just before the slot's end
	if end.Hour() != 3 || end.Minute() != 0 {
		t.Errorf("slot end %v: want 03:00 in the scheduler's location", end)
	}
}
