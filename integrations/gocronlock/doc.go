// Package gocronlock runs gocron v2 jobs once across many schedulers, on any
// dislock core.Locker (PostgreSQL, Redis, memlock).
//
// It offers three things; pick by what must hold across the schedulers.
//
//   - NewLocker, for gocron.WithDistributedLocker: every scheduler runs the
//     jobs, and each tick of a job runs on one of them only. Choose it to
//     spread jobs over the schedulers and keep working when any of them is
//     down, without a leader.
//   - NewElector, for gocron.WithDistributedElector: one scheduler, the
//     leader, runs every job; the others stand by and take over when it
//     closes (at once) or dies (about one TTL later). Choose it when the jobs
//     must all run in one place, or there are many fast jobs (one lock for
//     all of them instead of one per run).
//   - Wrap and NewTask: a lock taken inside the job itself, whose session
//     (fencing token, a context cancelled on lease loss) the job can use.
//     gocron's Locker interface cannot hand the lock to the job. Choose it
//     when the job writes to something that can check a fencing token, or
//     must stop as soon as it no longer holds the lock.
//
// They do not mix in one scheduler: with an Elector gocron ignores every
// Locker. A Task can run under either.
//
// # What stops an election
//
// NewElector waits (at most core.DefaultCampaignWait) for the campaign's
// first answer and returns an error for what no retry can mend: a bad
// option, an option the store rejects (a TTL longer than a ZooKeeper
// session allows), a key held as a semaphore, a closed core.Locker. Until
// that first answer IsLeader waits for it too (bounded by its ctx and
// core.DefaultCampaignWait), so that a job that starts immediately runs on
// the scheduler the store elected instead of being skipped everywhere;
// after it IsLeader answers from memory. A busy key or an unreachable store
// does not fail NewElector: the campaign goes on, and OnError hears of every
// failed attempt (without OnError they are logged through the
// core.Locker's logger, core.WithLogger). OnRevoked's cause says why
// leadership ended, core.ErrElectionClosed after the Elector's own Close.
// Observe reports who leads as it changes.
//
// # Each tick once: slots
//
// Schedulers' tickers never fire at exactly the same instant: clocks differ
// by milliseconds to seconds, and timers fire late under load. With a plain
// lock, a fast job finishes and releases before a later scheduler's ticker
// fires, so that scheduler runs the same tick again. Locker therefore takes
// a slot lock (core.ForSlot) for every job whose schedule it knows: at most
// one run starts per slot of the schedule, and the lock is kept until the
// slot is over, however fast the job. Slots are computed on the lock
// store's clock, so the schedulers' own clocks do not matter, and each slot
// is a window around a tick of the schedule: a start from the slot
// tolerance (default: 1s or half a slot, whichever is shorter) before the
// tick until the same tolerance before the next tick belongs to that tick,
// and the lock expires at the window's end. Starts that fire up to the
// tolerance early therefore find the previous tick's lock gone, and the
// starts of one tick on every scheduler count as one tick as long as they
// fall within the window.
//
// gocron passes a Locker only the job's name, so the Locker looks the
// schedule up: Attach it to the scheduler it is installed in, and give each
// job a unique name with gocron.WithName.
//
//	locker, _ := gocronlock.NewLocker(l)
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	_ = locker.Attach(s) // schedules come from s's jobs, by name
//
// Cron slots are computed in the scheduler's location. gocron shows it only
// in the times of its runs, so a scheduler made with gocron.WithLocation
// should be attached with the same location, which the Locker then uses
// from the first run on:
//
//	s, _ := gocron.NewScheduler(gocron.WithLocation(berlin), gocron.WithDistributedLocker(locker))
//	_ = locker.Attach(s, berlin)
//
// Without it the Locker learns the location from the times of the job's
// runs (a job started with gocron.WithStartDateTime at a time in another
// location shows that location until one of its runs has started); a run for
// which no time shows it takes no slot lock rather than guess one, and is
// reported as a job without a schedule.
//
// A run looks its job up in the attached scheduler at most a second, and
// never after gocron cancelled the run's context: gocron's loop does not
// answer while it stops its jobs (StopJobs, Shutdown), and a run waiting on
// it would hold the stop up until gocron's stop timeout, making StopJobs
// fail. A run that the stop cancelled, or that finds the scheduler
// shutting down, is skipped with the context's error (context.Canceled)
// and nothing is reported to OnError; a run the scheduler did not answer in
// time takes the schedule its job had at an earlier run.
//
// Cron jobs (gocron.CronJob, with or without seconds) and duration jobs
// (gocron.DurationJob) are found this way. For other kinds, or without
// Attach, register the schedule: Locker.Schedule(name, core.Every(d)) for
// gocron.DurationJob(d), Locker.Schedule(name, sched) with sched from Cron
// for gocron.CronJob. For a duration job, also start it at a multiple of
// the interval (gocron.WithStartAt) so that its ticks fall near the slots'
// boundaries. The Slot option sets a schedule for all other jobs; MinHold
// instead keeps a plain lock at least that long, which works when the
// schedulers' ticks spread over less than the hold and the hold is shorter
// than the interval. A job with none of these takes a plain lease, held
// while it runs: runs never overlap, but a fast job may run more than once
// per tick. The Locker reports that once per job to OnError, with an error
// matching ErrNoSchedule.
//
// A Locker makes one attempt per run, bounded by TryTimeout, and never
// waits: a run that starts late would be a duplicate. Unlock releases on a
// context of its own, bounded by ReleaseTimeout, because gocron hands it an
// already-cancelled context at shutdown; failures go to OnError and to the
// core.Locker's Observer (gocron drops them).
//
// # Up to n at once: Limit
//
// gocron's Locker holds its lock for the run, so a limit across schedulers
// fits it: with the Limit(n) option (every job of a Locker, or a Task) or
// Locker.Limit(job, n) (one job), a run takes one of the n permits of a
// semaphore on the job's key (core.Limit) instead of the lock, with its own
// fencing token, kept as the job's lock would be. For a job with a slot
// lock, at most n runs start per slot across all schedulers (the permits
// are kept until the slot ends); for a job with a plain lease, at most n
// runs go on at once, each permit held while its run runs and renewed like
// a lease; under MinHold each permit is kept at least that long. A run
// that finds all n permits taken is skipped like a busy one, with an error
// matching core.ErrNotAcquired. The store must hold semaphores (a
// core.SemaphoreBackend; checked when the Locker is built on a
// *core.Client). Every scheduler must use the same limit for a job: a run
// whose job is held under another limit is skipped, and OnError gets an
// error matching core.ErrLimitMismatch. An Elector has no limit: it elects
// one leader.
//
//	locker, _ := gocronlock.NewLocker(l)
//	_ = locker.Limit("reindex", 3) // up to 3 reindex runs at once, across all schedulers
//
// # Guarantees
//
//   - Locker: at most one run starts per slot of a job across all schedulers
//     sharing the store (for a job without a slot: no two runs overlap while
//     the lease holds); with a limit of n, n instead of one. A busy lock is an error matching core.ErrNotAcquired
//     and gocron skips that run; a store failure keeps its cause.
//   - Elector: IsLeader is true on at most one scheduler at a time, as long
//     as the machines' clocks run at the same rate: a leader's IsLeader
//     turns false when its local deadline passes (2/3 of the TTL after its
//     last renewal by default), before the store lets anyone else take over.
//     It costs no I/O and no allocation.
//   - Task: the job's context is cancelled, with cause core.ErrLeaseLost,
//     when the lock is lost, and the run then returns an error matching
//     core.ErrLeaseLost even if the job returned nil.
//
// # What is not guaranteed
//
//   - That a tick runs at all: if every scheduler is down, busy or cannot
//     reach the store, the tick is skipped, never run late.
//   - Mutual exclusion while a job runs past its slot: a slot lock ends with
//     its slot, so a job longer than its interval may overlap the next
//     tick's run on another scheduler, as it overlaps its own next run on a
//     single gocron scheduler. Use a Task with a lease for exclusion, or
//     gocron.WithSingletonMode for overlap on one scheduler.
//   - That a leader or lock holder has stopped acting when the next one
//     starts: a process that pauses (GC, a frozen VM) past its deadline may
//     still finish a write it had begun. A lease is not a fence; have the
//     protected resource reject writes that carry a fencing token
//     (Session.Token) smaller than the largest it has seen. Elector.Session
//     and a Task's session give the token.
//   - Exactly-once: a job that fails midway is not rerun elsewhere.
package gocronlock
