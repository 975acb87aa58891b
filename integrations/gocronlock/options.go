package gocronlock

import (
	"fmt"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// Defaults used when no option says otherwise.
const (
	DefaultPrefix         = "gocron:"
	DefaultTryTimeout     = 2 * time.Second
	DefaultReleaseTimeout = 5 * time.Second
	DefaultElectorJitter  = 100 * time.Millisecond
	DefaultElectorRetry   = time.Second
)

// Option configures NewLocker, NewElector, Wrap and NewTask. Options that do
// not apply to a constructor are rejected by it with an error matching
// core.ErrInvalidOption that names the option.
type Option func(*config)

// scope says which constructors an option applies to.
type scope uint8

const (
	forLocker scope = 1 << iota
	forTask
	forElector
	forAll = forLocker | forTask | forElector
)

var scopeNames = map[scope]string{forLocker: "NewLocker", forTask: "Wrap/NewTask", forElector: "NewElector"}

type config struct {
	prefix         string
	ttl            time.Duration
	jitter         time.Duration
	jitterSet      bool
	lockOpts       []core.Option
	tryTimeout     time.Duration
	releaseTimeout time.Duration
	minHold        time.Duration
	slot           core.Schedule
	tolerance      time.Duration
	toleranceSet   bool
	onError        func(key string, err error)
	onElected      func(core.Session)
	onRevoked      func(error)
	retry          time.Duration
	limit          int

	used []usedOption
	optcheck.Errs
}

type usedOption struct {
	name  string
	scope scope
}

// optPrefix names gocronlock in the errors of its options.
const optPrefix optcheck.Prefix = "gocronlock: "

// invalid returns the error of an invalid value given to option name.
var invalid = optPrefix.Invalid

func (c *config) use(name string, s scope) { c.used = append(c.used, usedOption{name, s}) }

// option is an Option named name, for the constructors in scope s, that
// applies set, or records err when the value given was invalid: core's
// checked (optcheck.Checked for the packages built on core), with the
// option's use recorded first.
func option(name string, s scope, err error, set func(*config)) Option {
	return func(c *config) {
		c.use(name, s)
		if err != nil {
			c.RecordErr(err)
			return
		}
		set(c)
	}
}

// positive is nil for d > 0, and otherwise option name's error.
func positive(name string, d time.Duration) error { return optcheck.Positive(optPrefix, name, d) }

// notNegative is nil for d >= 0, and otherwise option name's error.
func notNegative(name string, d time.Duration) error {
	return optcheck.NotNegative(optPrefix, name, d)
}

// resolveConfig applies opts for the constructor s of a scheduler lock on
// l and checks them, and l: it must be set, and have semaphores when Limit
// asks for more than one permit.
func resolveConfig(s scope, l core.Locker, opts []Option) (config, error) {
	if l == nil {
		return config{}, invalid("Locker", "nil core.Locker")
	}
	c := config{
		prefix:         DefaultPrefix,
		tryTimeout:     DefaultTryTimeout,
		releaseTimeout: DefaultReleaseTimeout,
		retry:          DefaultElectorRetry,
	}
	if s == forElector {
		c.jitter = DefaultElectorJitter
	}
	if err := optcheck.Apply(&c, opts); err != nil {
		return c, err
	}
	for _, u := range c.used {
		if u.scope&s == 0 {
			return c, invalid(u.name, "does not apply to %s", scopeNames[s])
		}
	}
	if c.slot != nil && c.minHold > 0 {
		return c, invalid("MinHold", "cannot be combined with Slot: a slot lock is already kept until the slot ends")
	}
	// Bad core options (LockOptions) fail now, not at the first run.
	if err := core.ValidateOptions(c.coreOptions(c.limit)...); err != nil {
		return c, err
	}
	return c, semaphores("Limit", l, c.limit)
}

// coreOptions returns the core options common to every acquisition, with
// limit permits (a mutex when limit is 0 or 1).
func (c *config) coreOptions(limit int) []core.Option {
	var opts []core.Option
	if c.ttl > 0 {
		opts = append(opts, core.TTL(c.ttl))
	}
	if c.jitter > 0 {
		opts = append(opts, core.Jitter(c.jitter))
	}
	if limit > 1 {
		opts = append(opts, core.Limit(limit))
	}
	return append(opts, c.lockOpts...)
}

// Limit lets up to n runs of a job (of a Task's key) hold its lock at once
// across all schedulers, instead of one: each run takes one of the n
// permits of a semaphore on the key (core.Limit(n)), with its own fencing
// token, and only the kind of lock decides for how long. Under a slot lock
// (a job whose schedule is known, the Slot option) the permit is kept until
// the slot ends, so at most n runs start per tick; under a plain lease it is
// held while the run runs, so at most n runs go on at once; under MinHold it
// is kept at least that long. A run that finds all n permits taken is
// skipped, as with a busy lock. For a Locker, Locker.Limit sets the limit of
// one job instead. n must be between 1 and core.MaxLimit (1, the default, is
// a plain lock), and the core.Locker's store must hold semaphores (a
// core.SemaphoreBackend; checked here when it is a *core.Client). Every
// scheduler must use the same limit for a job: a run whose job is held
// under another limit is skipped with an error matching
// core.ErrLimitMismatch, which OnError sees.
func Limit(n int) Option {
	return option("Limit", forLocker|forTask, checkLimit("Limit", n), func(c *config) { c.limit = n })
}

// checkLimit validates a limit given by option opt.
func checkLimit(opt string, n int) error {
	if n < 1 || n > core.MaxLimit {
		return invalid(opt, "must be between 1 and %d, got %d", core.MaxLimit, n)
	}
	return nil
}

// semaphores reports an error naming opt when a limit of n > 1 cannot work
// on l: l is a *core.Client whose backend has no semaphores.
func semaphores(opt string, l core.Locker, n int) error {
	if n <= 1 {
		return nil
	}
	if c, ok := l.(*core.Client); ok {
		if _, ok := c.Backend().(core.SemaphoreBackend); !ok {
			return fmt.Errorf("%w: gocronlock: %s: %d permits need a store with semaphores, and %s has none: %w",
				core.ErrInvalidOption, opt, n, c.Backend().Name(), core.ErrUnsupported)
		}
	}
	return nil
}

// Prefix is put before every lock key (default DefaultPrefix): a Locker
// locks prefix + job name, Wrap and NewElector prefix + key. It may be empty.
func Prefix(p string) Option {
	return func(c *config) { c.use("Prefix", forAll); c.prefix = p }
}

// TTL sets the lease TTL of lease-mode locks (Locker jobs without a slot,
// tasks, the leader lock). It defaults to the core.Locker's default (30s
// unless configured otherwise). A leader that dies is replaced about one TTL
// later.
func TTL(d time.Duration) Option {
	return option("TTL", forAll, positive("TTL", d), func(c *config) { c.ttl = d })
}

// Jitter waits a uniformly random time in [0, max] before each attempt
// (core.Jitter). NewElector defaults to DefaultElectorJitter so that
// schedulers started together do not campaign at the same instant; the
// others default to no jitter. Under a slot lock keep it well below the
// slot tolerance.
func Jitter(max time.Duration) Option {
	return option("Jitter", forAll, notNegative("Jitter", max), func(c *config) { c.jitter, c.jitterSet = max, true })
}

// LockOptions adds core options to every acquisition (owner, renew
// interval, renew deadline, ...). They are applied after the options this
// package derives, so they win.
func LockOptions(opts ...core.Option) Option {
	return func(c *config) { c.use("LockOptions", forAll); c.lockOpts = append(c.lockOpts, opts...) }
}

// TryTimeout bounds the single lock attempt a run makes (default
// DefaultTryTimeout). A run never waits for a busy lock: a late start
// would be a duplicate. When the attempt times out, the core.Locker first
// releases the claim that may have reached the store (bounded by its own
// release timeout), and the run is then skipped.
func TryTimeout(d time.Duration) Option {
	return option("TryTimeout", forLocker|forTask, positive("TryTimeout", d), func(c *config) { c.tryTimeout = d })
}

// ReleaseTimeout bounds the release after a run (default
// DefaultReleaseTimeout). The release runs on a context detached from the
// job's, which gocron has already cancelled at shutdown.
func ReleaseTimeout(d time.Duration) Option {
	return option("ReleaseTimeout", forLocker|forTask, positive("ReleaseTimeout", d), func(c *config) { c.releaseTimeout = d })
}

// Slot locks each run to one slot of sched (core.ForSlot): at most one run
// starts per slot across all schedulers, and the lock is kept until the slot
// ends, so a fast job does not run again on a scheduler whose ticker fires a
// little later. For a Locker it is the default for jobs without a schedule
// registered with Locker.Schedule; for Wrap it is the task's schedule.
func Slot(sched core.Schedule) Option {
	var err error
	if sched == nil {
		err = invalid("Slot", "nil schedule")
	}
	return option("Slot", forLocker|forTask, err, func(c *config) { c.slot = sched })
}

// SlotTolerance sets how early a start may fire and still belong to the
// coming slot. By default it is 1s or half the slot, whichever is shorter.
// Each slot lock covers the window from the tolerance before a tick to the
// tolerance before the next (core.SlotEnd), so that early starts of the next
// tick find it free. It sets core.SlotTolerance for the job's slot locks.
func SlotTolerance(d time.Duration) Option {
	return option("SlotTolerance", forLocker|forTask, notNegative("SlotTolerance", d), func(c *config) { c.tolerance, c.toleranceSet = d, true })
}

// MinHold keeps a lease-mode lock at least d after it was taken
// (core.MinHold): a run that ends sooner leaves the lock to expire then, so
// schedulers whose tickers fire up to d later skip the tick. Choose d longer
// than the spread of the schedulers' tickers and shorter than the interval.
// For a Locker it applies to jobs without a slot schedule. Slot locks are
// more precise; see Slot.
func MinHold(d time.Duration) Option {
	return option("MinHold", forLocker|forTask, notNegative("MinHold", d), func(c *config) { c.minHold = d })
}

// OnError is called with the lock key and the error when a lock attempt
// fails for another reason than a busy lock, when a release fails, and when
// a lease-mode lock was lost while its job ran (noticed by a renewal, or by
// the release, which then finds the lease gone from the store: an error
// matching core.ErrLeaseLost). gocron drops these errors
// (it ignores Unlock's result). fn is called synchronously and must be
// safe for concurrent use. Release failures and losses also reach the
// core.Locker's Observer.
//
// For NewElector it is called, from the campaign goroutine, with the leader
// key and the error of every campaign attempt that failed for another
// reason than a busy key (core.OnError); without it the failures are
// logged through the core.Locker's logger (core.WithLogger).
func OnError(fn func(key string, err error)) Option {
	return func(c *config) { c.use("OnError", forAll); c.onError = fn }
}

// OnElected is called, from the campaign goroutine, when this scheduler
// becomes leader, with the leader session (owner, fencing token). Keep it
// short.
func OnElected(fn func(core.Session)) Option {
	return func(c *config) { c.use("OnElected", forElector); c.onElected = fn }
}

// OnRevoked is called, from the campaign goroutine, when this scheduler
// stops being leader, with the cause: an error matching core.ErrLeaseLost,
// core.ErrReleased after Resign, core.ErrElectionClosed after the Elector's
// Close, or core.ErrClosed when the core.Locker was closed. Keep it short.
func OnRevoked(fn func(error)) Option {
	return func(c *config) { c.use("OnRevoked", forElector); c.onRevoked = fn }
}

// Retry sets the pause between campaign attempts after a failure or a
// resignation (default DefaultElectorRetry, jittered ±50%). Standbys wait
// for the leader lock and are woken by its release.
func Retry(d time.Duration) Option {
	return option("Retry", forElector, positive("Retry", d), func(c *config) { c.retry = d })
}
