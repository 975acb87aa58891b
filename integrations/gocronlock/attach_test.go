package gocronlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/integrations/gocronlock"
)

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

// lockWithin runs l.Lock(job) and fails the test if it has not returned
// within limit.
func lockWithin(t *testing.T, l *gocronlock.Locker, job string, limit time.Duration) gocron.Lock {
	t.Helper()
	type result struct {
		lock gocron.Lock
		err  error
	}
	got := make(chan result, 1)
	go func() {
		lock, err := l.Lock(context.Background(), job)
		got <- result{lock, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("Lock(%q): %v", job, r.err)
		}
		return r.lock
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
	store := memlock.NewStore()
	a, _ := store.Locker()
	defer a.Close()
	var (
		mu      sync.Mutex
		reports []error
	)
	l, err := gocronlock.NewLocker(a, gocronlock.OnError(func(_ string, err error) {
		mu.Lock()
		reports = append(reports, err)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
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
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || !errors.Is(reports[0], gocronlock.ErrNoSchedule) || !strings.Contains(reports[0].Error(), "did not list its jobs") {
		t.Errorf("reports %v: want one ErrNoSchedule saying the scheduler did not answer", reports)
	}
}

// Rule: a cron job's slots are computed in the attached scheduler's
// location, as seen in the times of its runs; a run that cannot see it
// (NextRun fails) reads the crontab in time.Local for that run only, and a
// later run computes the slot in the scheduler's location.
func TestAttachLocationFromScheduler(t *testing.T) {
	t.Parallel()
	store := memlock.NewStore()
	a, _ := store.Locker()
	defer a.Close()
	l, err := gocronlock.NewLocker(a)
	if err != nil {
		t.Fatal(err)
	}
	job := &cronJob{name: "nightly", crontab: "0 3 * * *"}
	if err := l.Attach(&stallScheduler{jobs: []gocron.Job{job}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := gocronlock.DefaultPrefix + "nightly"
	slotEnd := func() time.Time {
		t.Helper()
		if err := lockWithin(t, l, "nightly", 10*time.Second).Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		info, held, err := a.Inspect(ctx, key)
		if err != nil || !held {
			t.Fatalf("Inspect: held %v, %v: no slot lock", held, err)
		}
		if _, err := a.ForceRelease(ctx, key); err != nil {
			t.Fatal(err)
		}
		return info.ExpiresAt.Round(time.Minute) // the store ends it just before the slot's end
	}
	// A zone whose 03:00 is never time.Local's, for any Local.
	_, off := time.Now().Zone()
	zone := time.FixedZone("sched", off+5*3600+1800)
	if end := slotEnd(); end.In(time.Local).Hour() != 3 || end.In(time.Local).Minute() != 0 {
		t.Fatalf("slot end %v without the scheduler's location: want 03:00 local time", end)
	}
	job.setNext(time.Now().Add(time.Hour).In(zone))
	end := slotEnd().In(zone)
	if end.Hour() != 3 || end.Minute() != 0 {
		t.Errorf("slot end %v: want 03:00 in the scheduler's location (a schedule computed in time.Local was kept)", end)
	}
}
