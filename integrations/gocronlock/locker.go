package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
)

// Locker implements gocron.Locker on a core.Locker. Pass it to
// gocron.WithDistributedLocker (every job) or gocron.WithDistributedJobLocker
// (one job). It is safe for concurrent use.
//
// Each run makes one lock attempt on prefix + job name, bounded by
// TryTimeout; a busy lock makes gocron skip the run. The kind of lock comes
// from the job's schedule, which gocron does not pass to a Locker: Attach
// the scheduler, and the Locker looks each job's schedule up by its name
// (gocron.WithName); or register it with Schedule, or set a default with
// the Slot or MinHold option. A job with none of these gets a plain lease
// that only keeps two runs from overlapping, and a fast run may then repeat
// on a scheduler whose ticker fires later; this is reported once per job to
// OnError, with an error matching ErrNoSchedule. With a limit (the Limit
// option, Locker.Limit) up to n runs of a job hold its lock at once.
type Locker struct {
	l   core.Locker
	cfg config

	mu        sync.RWMutex
	schedules map[string]core.Schedule
	attached  gocron.Scheduler
	derived   map[string]derived // schedules taken from attached, by job name
	loc       *time.Location     // attached's location: given to Attach, or seen in a last run's time
	limits    map[string]int     // limits registered with Limit, by job name
	warned    map[string]bool    // jobs reported with ErrNoSchedule
}

// derived is a job's schedule as taken from the attached scheduler: desc
// describes gocron's JobSchedule it came from; sched is nil when it has no
// slot equivalent, and why says why.
type derived struct {
	desc  string
	sched core.Schedule
	why   string
}

// ErrNoSchedule is matched (errors.Is) by the error a Locker reports to
// OnError, once per job, when it knows no schedule for the job and no Slot
// or MinHold option applies: the job's runs take plain leases, and a fast
// run may repeat on another scheduler whose ticker fires a little later.
// The message says how to fix it.
var ErrNoSchedule = errors.New("gocronlock: no schedule for the job: its runs take plain leases, and a fast run may repeat on a scheduler whose ticker fires later")

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a gocron.Locker that takes its locks from l. Options are
// validated here.
func NewLocker(l core.Locker, opts ...Option) (*Locker, error) {
	cfg, err := resolveConfig(forLocker, l, opts)
	if err != nil {
		return nil, err
	}
	return &Locker{l: l, cfg: cfg, schedules: make(map[string]core.Schedule),
		derived: make(map[string]derived), warned: make(map[string]bool), limits: make(map[string]int)}, nil
}

// Limit sets how many runs of the job named job (as set with
// gocron.WithName) may hold its lock at once across all schedulers, as the
// Limit option does for every job: n permits of a semaphore, each kept as
// the job's lock would be (until the slot ends under a slot lock, while the
// run runs under a lease). n = 1 makes the job's lock a plain one whatever
// the Limit option says; n = 0 removes the registration, and the Limit
// option applies again. n must be between 0 and core.MaxLimit, and n > 1
// needs a store with semaphores.
func (k *Locker) Limit(job string, n int) error {
	if err := core.ValidateKey(k.cfg.prefix + job); err != nil {
		return err
	}
	if n != 0 {
		if err := checkLimit("Locker.Limit", n); err != nil {
			return err
		}
		if err := semaphores("Locker.Limit", k.l, n); err != nil {
			return err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if n == 0 {
		delete(k.limits, job)
		return nil
	}
	k.limits[job] = n
	return nil
}

// Attach makes the Locker take each job's schedule from s, the scheduler it
// was installed in with gocron.WithDistributedLocker or
// gocron.WithDistributedJobLocker, so that no job needs Schedule: at a run,
// the job is looked up by name (gocron.WithName) among s.Jobs(), and a
// gocron.CronJob (with or without seconds) or a gocron.DurationJob takes
// slot locks as if registered with Schedule (Cron, core.Every). A schedule
// registered with Schedule wins. Jobs of other kinds (daily, weekly,
// monthly, random durations, one-time), jobs whose name several jobs with
// different schedules share, and jobs not found fall back to the Slot and
// MinHold options, or else to a plain lease reported with ErrNoSchedule.
// Give each job a unique name.
//
// Cron slots are computed in s's location. Pass it as loc when s was made
// with gocron.WithLocation (gocron's default is time.Local); without loc the
// Locker learns it from the times of s's runs (a job's last run, or else
// its next run, for that run only), and a run that cannot see it takes no
// slot lock, as if its job had no schedule, rather than guess.
//
// A run waits for s at most a second, and never past its context, which
// gocron cancels when it stops the job (StopJobs, Shutdown): s does not
// answer while it stops its jobs, and a run waiting on it would hold the
// stop up. A run whose context ended, or whose scheduler is shutting down,
// is skipped with an error, without a report to OnError; a run that s did
// not answer in time takes the schedule its job had at an earlier run.
func (k *Locker) Attach(s gocron.Scheduler, loc ...*time.Location) error {
	if s == nil {
		return invalid("Attach", "nil scheduler")
	}
	if len(loc) > 1 {
		return invalid("Attach", "%d locations: give the scheduler's one location at most", len(loc))
	}
	var given *time.Location
	if len(loc) == 1 {
		if loc[0] == nil {
			return invalid("Attach", "nil location")
		}
		given = loc[0]
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.attached = s
	k.loc = given
	clear(k.derived)
	return nil
}

// lookupTimeout bounds a run's look-up of its job in the attached
// scheduler, as gocron bounds its own requests of a job. The scheduler's
// loop does not answer while it stops its jobs (StopJobs, Shutdown), and a
// run waiting on it would hold up that stop.
const lookupTimeout = time.Second

// errShuttingDown is the error of a run whose attached scheduler lists no
// jobs at all, as gocron answers only once it is shutting down (and about to
// cancel the run's context): it matches context.Canceled.
var errShuttingDown = fmt.Errorf("the attached scheduler is shutting down: %w", context.Canceled)

// lookup is what a run learned from the attached scheduler.
type lookup struct {
	listed bool           // the scheduler listed its jobs (false: it is shutting down)
	found  []gocron.Job   // its jobs of the run's name
	loc    *time.Location // its location as seen in found[0]'s run times, when looked for
	exact  bool           // loc is from a last run: the scheduler's clock in its location
}

// fromScheduler returns the schedule of job in the attached scheduler, or
// nil and why there is none; an error when the run must not go on: its
// context ended, or the scheduler is shutting down. It costs one request
// to the scheduler's loop per run, and more only while the scheduler's
// location is unknown and the job's schedule is not derived yet. A
// scheduler that does not answer within lookupTimeout leaves the run with
// the schedule derived last for job, if any.
func (k *Locker) fromScheduler(ctx context.Context, job string) (core.Schedule, string, error) {
	k.mu.RLock()
	s := k.attached
	k.mu.RUnlock()
	if s == nil {
		return nil, "", nil
	}
	r, answered := k.lookUp(ctx, s, job)
	if ctx.Err() != nil {
		return nil, "", context.Cause(ctx)
	}
	if answered && !r.listed {
		return nil, "", errShuttingDown
	}
	if !answered {
		k.mu.RLock()
		d, cached := k.derived[job]
		k.mu.RUnlock()
		if cached {
			return d.sched, d.why, nil
		}
		return nil, fmt.Sprintf("the attached scheduler did not list its jobs within %v", lookupTimeout), nil
	}
	if len(r.found) == 0 {
		return nil, "the attached scheduler has no job of that name", nil
	}
	desc := describe(r.found[0].Schedule())
	for _, j := range r.found[1:] {
		if describe(j.Schedule()) != desc {
			return nil, "several jobs of the attached scheduler have that name, with different schedules", nil
		}
	}
	k.mu.RLock()
	d, ok := k.derived[job]
	k.mu.RUnlock()
	if ok && d.desc == desc {
		return d.sched, d.why, nil
	}
	d = derived{desc: desc}
	keep := true
	switch v := r.found[0].Schedule().(type) {
	case gocron.CronJobSchedule:
		var loc *time.Location
		if !hasTZ(v.Crontab) {
			loc, keep = k.location(r)
		}
		if loc == nil && !hasTZ(v.Crontab) {
			d.why = "the attached scheduler's location is not known yet: it shows in the times of its runs; pass it to Attach"
			keep = false
			break
		}
		sched, err := Cron(v.Crontab, cronFields(v.Crontab) == 6, loc)
		if err != nil {
			d.why = err.Error()
		} else {
			d.sched = sched
		}
	case gocron.DurationJobSchedule:
		if v.Duration > 0 {
			d.sched = core.Every(v.Duration)
		} else {
			d.why = "the job's duration is not positive"
		}
	default:
		d.why = fmt.Sprintf("a job of type %T has no slot schedule here; register one with Schedule", v)
	}
	if keep {
		k.mu.Lock()
		k.derived[job] = d
		k.mu.Unlock()
	}
	return d.sched, d.why, nil
}

// lookUp lists s's jobs of the name job and, when a schedule is to be
// derived for a cron job in a location not known yet, looks for the
// location in the job's run times. It gives up (false) after lookupTimeout
// or when ctx ends; the requests it gave up on end when the scheduler's
// loop answers them, at its Shutdown, or after gocron's own one-second
// bound on a job's request.
func (k *Locker) lookUp(ctx context.Context, s gocron.Scheduler, job string) (lookup, bool) {
	got := make(chan lookup, 1)
	go func() {
		var r lookup
		defer func() { got <- r }()
		jobs := s.Jobs()
		if jobs == nil {
			return // gocron lists no jobs only once it is shutting down
		}
		r.listed = true
		for _, j := range jobs {
			if j.Name() == job {
				r.found = append(r.found, j)
			}
		}
		if len(r.found) == 0 || !k.needLocation(job, r.found[0].Schedule()) || ctx.Err() != nil {
			// A job's own requests are bounded by gocron's second only, not
			// by its shutdown: none once the run has been given up.
			return
		}
		// A last run is the scheduler's clock read in its location; a next
		// run is too, unless the job was started at a time given in
		// another location (gocron.WithStartDateTime).
		if last, err := r.found[0].LastRun(); err == nil && !last.IsZero() {
			r.loc, r.exact = last.Location(), true
		} else if next, err := r.found[0].NextRun(); err == nil && !next.IsZero() {
			r.loc = next.Location()
		}
	}()
	t := time.NewTimer(lookupTimeout)
	defer t.Stop()
	select {
	case r := <-got:
		return r, true
	case <-t.C:
	case <-ctx.Done():
	}
	return lookup{}, false
}

// needLocation reports whether a run of job with schedule js must find the
// attached scheduler's location: a cron job without its own TZ=, whose
// schedule is not derived yet, on a scheduler whose location is not known.
func (k *Locker) needLocation(job string, js gocron.JobSchedule) bool {
	v, ok := js.(gocron.CronJobSchedule)
	if !ok || hasTZ(v.Crontab) {
		return false
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	d, derived := k.derived[job]
	return k.loc == nil && !(derived && d.desc == describe(js))
}

// location returns the attached scheduler's location: the one given to
// Attach, or learned from a last run, or else the one r saw (remembered
// when it came from a last run). exact reports whether a schedule derived
// in it may be kept for later runs; nil when it is unknown.
func (k *Locker) location(r lookup) (loc *time.Location, exact bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loc != nil {
		return k.loc, true
	}
	if r.loc != nil && r.exact {
		k.loc = r.loc
	}
	return r.loc, r.exact
}

// hasTZ reports whether crontab names its own location.
func hasTZ(crontab string) bool {
	f := strings.Fields(crontab)
	return len(f) > 0 && (strings.HasPrefix(f[0], "TZ=") || strings.HasPrefix(f[0], "CRON_TZ="))
}

// describe identifies a gocron JobSchedule by its type and fields.
func describe(js gocron.JobSchedule) string { return fmt.Sprintf("%T%+v", js, js) }

// cronFields counts the fields of a crontab, without its TZ= prefix.
func cronFields(crontab string) int {
	f := strings.Fields(crontab)
	if hasTZ(crontab) {
		f = f[1:]
	}
	return len(f)
}

// warnNoSchedule reports, once per job, that job runs under plain leases.
func (k *Locker) warnNoSchedule(job, key, why string) {
	k.mu.Lock()
	done := k.warned[job]
	k.warned[job] = true
	attached := k.attached != nil
	k.mu.Unlock()
	if done {
		return
	}
	fix := "fix: call Locker.Attach with the scheduler, register the schedule with Locker.Schedule, or set the Slot or MinHold option"
	if attached {
		fix = "fix: register the schedule with Locker.Schedule, or set the Slot or MinHold option"
	}
	if why != "" {
		why = " (" + why + ")"
	}
	k.cfg.report(key, fmt.Errorf("%w: job %q%s; %s", ErrNoSchedule, job, why, fix))
}

// Schedule registers the schedule of the job named job (as set with
// gocron.WithName), so that its runs take slot locks (core.ForSlot): at most
// one run per slot across all schedulers, kept until the slot ends. Use
// core.Every(d) for gocron.DurationJob(d) and Cron for gocron.CronJob. A nil
// sched removes the registration.
func (k *Locker) Schedule(job string, sched core.Schedule) error {
	if err := core.ValidateKey(k.cfg.prefix + job); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if sched == nil {
		delete(k.schedules, job)
		return nil
	}
	k.schedules[job] = sched
	return nil
}

// Lock implements gocron.Locker. gocron calls it before every run with the
// job's long-lived context and name; an error skips the run. A busy lock
// yields an error matching core.ErrNotAcquired; other errors keep their
// cause and are also passed to OnError.
func (k *Locker) Lock(ctx context.Context, job string) (gocron.Lock, error) {
	key := k.cfg.prefix + job
	k.mu.RLock()
	sched := k.schedules[job]
	limit, ok := k.limits[job]
	k.mu.RUnlock()
	if !ok {
		limit = k.cfg.limit
	}
	if sched == nil {
		var (
			why string
			err error
		)
		sched, why, err = k.fromScheduler(ctx, job)
		if err != nil {
			// gocron is stopping the job: the run is skipped, as its lock
			// attempt would be, and there is nothing to report.
			return nil, fmt.Errorf("gocronlock: %s: no lock attempt: %w", key, err)
		}
		if sched == nil && k.cfg.slot == nil && k.cfg.minHold <= 0 {
			k.warnNoSchedule(job, key, why)
		}
	}
	s, slot, err := k.cfg.try(ctx, k.l, key, sched, limit)
	if err != nil {
		return nil, err
	}
	return &lock{s: s, slot: slot, cfg: &k.cfg}, nil
}

// try makes the one bounded attempt of a run, on one of limit permits (a
// plain lock when limit is 0 or 1). sched, when not nil, overrides the
// configured slot. slot reports whether the session is a slot lock.
func (c *config) try(ctx context.Context, l core.Locker, key string, sched core.Schedule, limit int) (s core.Session, slot bool, err error) {
	if sched == nil {
		sched = c.slot
	}
	opts := c.coreOptions(limit)
	if sched != nil {
		tol := c.slotTolerance(sched, time.Now())
		opts = append(opts, core.ForSlot(sched), core.SlotTolerance(tol))
	} else if c.minHold > 0 {
		opts = append(opts, core.MinHold(c.minHold))
	}
	tctx, cancel := context.WithTimeout(ctx, c.tryTimeout)
	defer cancel()
	s, err = l.TryAcquire(tctx, key, opts...)
	if err != nil {
		// A busy lock is the normal outcome on all schedulers but one, and
		// a shutdown (gocron cancelled ctx) needs no report; a failure,
		// including an attempt cut short by TryTimeout, is worth one.
		if !errors.Is(err, core.ErrNotAcquired) && ctx.Err() == nil {
			c.report(key, err)
		}
		return nil, false, err
	}
	return s, sched != nil, nil
}

// release gives s up on a detached, bounded context and reports a failure,
// and a lease lost while the job ran, to OnError.
func (c *config) release(ctx context.Context, s core.Session, slot bool) error {
	if cause := s.Err(); cause != nil && !slot && errors.Is(cause, core.ErrLeaseLost) {
		c.report(s.Key(), cause)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.releaseTimeout)
	defer cancel()
	if err := s.Release(rctx); err != nil {
		c.report(s.Key(), err)
		return err
	}
	return nil
}

func (c *config) report(key string, err error) {
	if c.onError != nil {
		c.onError(key, err)
	}
}

// lock is a held run lock.
type lock struct {
	s    core.Session
	slot bool
	cfg  *config
}

// Unlock implements gocron.Lock. It releases on a context detached from ctx
// (gocron passes an already-cancelled one at shutdown), bounded by
// ReleaseTimeout. Under a slot or a min hold the lock stays until the slot or
// hold ends. It returns the release error, which gocron drops; OnError sees
// it too.
func (l *lock) Unlock(ctx context.Context) error {
	return l.cfg.release(ctx, l.s, l.slot)
}
