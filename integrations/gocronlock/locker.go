package gocronlock

import (
	"context"
	"errors"
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
// from the job's schedule, which gocron does not pass to a Locker: register
// it with Schedule under the job's name (gocron.WithName), or set a default
// with the Slot or MinHold option. A job with neither gets a plain lease that
// only keeps two runs from overlapping.
type Locker struct {
	l   core.Locker
	cfg config

	mu        sync.RWMutex
	schedules map[string]core.Schedule
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a gocron.Locker that takes its locks from l. Options are
// validated here.
func NewLocker(l core.Locker, opts ...Option) (*Locker, error) {
	if l == nil {
		return nil, invalid("Locker", "nil core.Locker")
	}
	cfg, err := resolveConfig(forLocker, opts)
	if err != nil {
		return nil, err
	}
	return &Locker{l: l, cfg: cfg, schedules: make(map[string]core.Schedule)}, nil
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
	k.mu.RUnlock()
	s, slot, err := k.cfg.try(ctx, k.l, key, sched)
	if err != nil {
		return nil, err
	}
	return &lock{s: s, slot: slot, cfg: &k.cfg}, nil
}

// try makes the one bounded attempt of a run. sched, when not nil, overrides
// the configured slot. slot reports whether the session is a slot lock.
func (c *config) try(ctx context.Context, l core.Locker, key string, sched core.Schedule) (s core.Session, slot bool, err error) {
	if sched == nil {
		sched = c.slot
	}
	opts := c.coreOptions()
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
		// A busy lock is the normal outcome on all schedulers but one; a
		// failure, or an attempt cut short by TryTimeout, is worth a report.
		if !errors.Is(err, core.ErrNotAcquired) || ctx.Err() == nil && tctx.Err() != nil {
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
