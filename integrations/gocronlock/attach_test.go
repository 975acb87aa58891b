package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the test's locations, whatever the system has

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/gocronlock"
)

// runContexts is a gocron.Locker that hands the context of every run's
// Lock to the test before passing the call on to a gocronlock Locker.
type runContexts struct {
	*gocronlock.Locker
	ctxs chan context.Context
}

func (l *runContexts) Lock(ctx context.Context, job string) (gocron.Lock, error) {
	select {
	case l.ctxs <- ctx:
	default:
	}
	return l.Locker.Lock(ctx, job)
}

// hookScheduler is a real gocron scheduler whose first request named at
// ("Jobs", or "NextRun" of one of the jobs it lists) calls hook before it
// is made; done is closed once that request has returned.
type hookScheduler struct {
	gocron.Scheduler
	at   string
	once sync.Once
	hook func()
	done chan struct{}
}

// hooked calls the hook if request is the one hooked and not made yet, and
// returns a func to call once request has returned.
func (s *hookScheduler) hooked(request string) func() {
	first := false
	if s.at == request {
		s.once.Do(func() { first = true; s.hook() })
	}
	if first {
		return func() { close(s.done) }
	}
	return func() {}
}

func (s *hookScheduler) Jobs() []gocron.Job {
	defer s.hooked("Jobs")()
	jobs := s.Scheduler.Jobs()
	for i, j := range jobs {
		jobs[i] = hookJob{Job: j, s: s}
	}
	return jobs
}

type hookJob struct {
	gocron.Job
	s *hookScheduler
}

func (j hookJob) NextRun() (time.Time, error) {
	defer j.s.hooked("NextRun")()
	return j.Job.NextRun()
}

// Rule: a run of an attached scheduler's job does not hold up the
// scheduler's StopJobs, nor report anything, when the stop begins while the
// run looks its job up (gocron's loop answers no request while it stops
// the jobs): StopJobs returns nil within gocron's stop timeout.
func TestAttachStopJobsNotHeldUp(t *testing.T) {
	for _, at := range []string{"Jobs", "NextRun"} {
		t.Run(at, func(t *testing.T) {
			var log errorLog
			_, l := newMemStore(t).logged(&log)
			rc := &runContexts{Locker: l, ctxs: make(chan context.Context, 1)}
			// Below gocron's own one-second bound on a job's request, so
			// that a run waiting for its request's answer outlasts it.
			const stopTimeout = 500 * time.Millisecond
			s := newScheduler(t, gocron.WithDistributedLocker(rc), gocron.WithStopTimeout(stopTimeout))
			type result struct {
				err  error
				took time.Duration
			}
			stopped := make(chan result, 1)
			hs := &hookScheduler{Scheduler: s, at: at, done: make(chan struct{})}
			hs.hook = func() {
				// The run's Lock is on its way: stop the jobs now, and let
				// the request go on once the stop has cancelled the run.
				var ctx context.Context
				select {
				case ctx = <-rc.ctxs: // sent before the Lock that called the hook
				default:
					t.Error("a request of the scheduler before any run's Lock")
					return
				}
				go func() {
					start := time.Now()
					err := s.StopJobs()
					stopped <- result{err, time.Since(start)}
				}()
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
					t.Error("StopJobs did not cancel the run's context")
				}
			}
			if err := l.Attach(hs); err != nil {
				t.Fatal(err)
			}
			ran := make(chan struct{}, 1)
			if _, err := s.NewJob(gocron.CronJob("0 3 * * *", false), gocron.NewTask(func() { ran <- struct{}{} }),
				gocron.WithName("nightly"), gocron.WithStartAt(gocron.WithStartImmediately())); err != nil {
				t.Fatal(err)
			}
			s.Start()
			r := within(t, stopped, 15*time.Second, "StopJobs return")
			if r.err != nil {
				t.Errorf("StopJobs = %v after %v: the run held the stop up", r.err, r.took.Round(time.Millisecond))
			}
			select {
			case <-ran:
				t.Error("the job ran although StopJobs cancelled the run before its lock")
			default:
			}
			if reports := log.take(); len(reports) != 0 {
				t.Errorf("reports at StopJobs, want none: %v", reports)
			}
			// The hooked request, which the run gave up on, ends once the
			// scheduler's loop answers it (gocron's own requests do not end
			// at its Shutdown).
			within(t, hs.done, 10*time.Second, "end of the hooked request")
		})
	}
}

// locationUnlike returns a tz database location whose wall clock is never
// time.Local's at 03:00 today, whatever time.Local is.
func locationUnlike(t *testing.T) *time.Location {
	t.Helper()
	for _, name := range []string{"Asia/Kathmandu", "America/St_Johns"} { // +5:45; -3:30 or -2:30
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		_, off := now.In(loc).Zone()
		_, local := now.Zone()
		if off != local {
			return loc
		}
	}
	t.Fatal("no location unlike time.Local")
	return nil
}

// Rule: an attached scheduler's cron job takes slot locks in the location
// the scheduler computes its runs in (gocron.WithLocation): learned from
// its runs' times, or given to Attach, which also holds for a job started at
// a time given in another location (gocron.WithStartDateTime).
func TestAttachCronInSchedulerLocation(t *testing.T) {
	zone := locationUnlike(t)
	for _, c := range []struct {
		name      string
		given     bool
		startInUT bool
	}{
		{"learned", false, false},
		{"given", true, false},
		{"given, started at a UTC time", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log errorLog
			a, l := newMemStore(t).logged(&log)
			s := newScheduler(t, gocron.WithLocation(zone), gocron.WithDistributedLocker(l))
			var err error
			if c.given {
				err = l.Attach(s, zone)
			} else {
				err = l.Attach(s)
			}
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan struct{}, 1)
			opts := []gocron.JobOption{gocron.WithName("nightly")}
			if c.startInUT {
				opts = append(opts, gocron.WithStartAt(gocron.WithStartDateTime(time.Now().Add(time.Hour).UTC())))
			}
			j, err := s.NewJob(gocron.CronJob("0 3 * * *", false), gocron.NewTask(func() { ran <- struct{}{} }), opts...)
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			if err := j.RunNow(); err != nil {
				t.Fatal(err)
			}
			within(t, ran, 10*time.Second, "run")
			ctx := context.Background()
			info, held, err := a.Inspect(ctx, gocronlock.DefaultPrefix+"nightly")
			if err != nil || !held {
				t.Fatalf("Inspect: held %v, %v: no slot lock (reports %v)", held, err, log.take())
			}
			// The store ends the lock the slot tolerance before the slot's end.
			end := info.ExpiresAt.Round(time.Minute).In(zone)
			if end.Hour() != 3 || end.Minute() != 0 {
				t.Errorf("slot ends %v, want 03:00 in the scheduler's location %v", end, zone)
			}
			if reports := log.take(); len(reports) != 0 {
				t.Errorf("reports %v, want none", reports)
			}
		})
	}
	var log errorLog
	_, l := newMemStore(t).logged(&log)
	s := newScheduler(t)
	for _, bad := range [][]*time.Location{{nil}, {zone, zone}} {
		if err := l.Attach(s, bad...); !errors.Is(err, core.ErrInvalidOption) {
			t.Errorf("Attach with locations %v: %v, want core.ErrInvalidOption", bad, err)
		}
	}
}
