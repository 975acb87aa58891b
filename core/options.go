package core

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults used when no option says otherwise.
const (
	DefaultTTL            = 30 * time.Second
	DefaultSlotTolerance  = time.Second
	DefaultBackoffMin     = 10 * time.Millisecond
	DefaultBackoffMax     = time.Second
	DefaultReleaseTimeout = 5 * time.Second
	maxOwnerLen           = 256
)

// Option configures one acquisition. Options are plain values: applying the
// same options to many acquisitions gives each the same configuration.
// Invalid values are reported by the acquisition (or by New, for defaults) as
// an error matching ErrInvalidOption that names the option.
type Option func(*config)

// config is the resolved configuration of one acquisition.
type config struct {
	ttl, renewInterval, renewDeadline time.Duration
	owner                             string
	jitter, minHold                   time.Duration
	schedule                          Schedule
	tolerance                         time.Duration
	backoffMin, backoffMax            time.Duration
	limit                             int
	waiter                            string // set by the engine: the wait's place in a Queuer store
	errs                              []error
}

// MaxLimit is the largest number of permits Limit accepts.
const MaxLimit = 10000

// Limit turns the acquisition into one of n permits of a semaphore on the
// key: up to n sessions hold the key at once, each with its own lease,
// renewal, loss signal and fencing token (tokens strictly increase per key
// across all permits). Limit(1), the default, is a mutex. Every holder of a
// key must ask for the same n: a claim with another limit than the key's
// current holders fails with ErrLimitMismatch. n must be between 1 and
// MaxLimit; a backend without semaphores (not a SemaphoreBackend) answers
// n > 1 with ErrUnsupported.
func Limit(n int) Option {
	var err error
	if n < 1 || n > MaxLimit {
		err = invalidOption("Limit", "must be between 1 and %d, got %d", MaxLimit, n)
	}
	return checked(err, func(c *config) { c.limit = n })
}

// TTL sets the lease's time to live on the server (default 30s). Unless set
// explicitly, the renew interval is TTL/3 and the renew deadline 2/3 TTL.
func TTL(d time.Duration) Option {
	return checked(positive("TTL", d), func(c *config) { c.ttl = d })
}

// RenewInterval sets how often a held lease is renewed (default TTL/3). It
// must be shorter than the renew deadline.
func RenewInterval(d time.Duration) Option {
	return checked(positive("RenewInterval", d), func(c *config) { c.renewInterval = d })
}

// RenewDeadline sets how long after the send time of the last successful
// acquire or renewal the session still counts as held (default 2/3 TTL;
// after an acquire that the store keeps for less than the TTL, as Lease
// says, that much less). It
// must be shorter than the TTL, so that a holder that cannot renew knows it
// lost the lock before the server can grant it to anyone else; the margin
// (TTL - RenewDeadline) must cover clock-rate drift and the kill time of
// whatever the lock protects. The store keeps a lost lease's key for that
// margin: the engine never frees it, and only the holder's Release on the
// lost session frees it early.
func RenewDeadline(d time.Duration) Option {
	return checked(positive("RenewDeadline", d), func(c *config) { c.renewDeadline = d })
}

// WithOwner sets the human-readable owner stored with the lock (default
// host:pid). It is metadata only; ownership is checked with a random token.
func WithOwner(owner string) Option {
	var err error
	switch {
	case owner == "":
		err = invalidOption("Owner", "empty")
	case len(owner) > maxOwnerLen:
		err = invalidOption("Owner", "%d bytes, the limit is %d", len(owner), maxOwnerLen)
	case !utf8.ValidString(owner) || strings.IndexByte(owner, 0) >= 0:
		err = invalidOption("Owner", "must be valid UTF-8 without NUL")
	}
	return checked(err, func(c *config) { c.owner = owner })
}

// Jitter sleeps a uniformly random time in [0, max] before the first
// attempt, so that schedulers firing at the same instant do not all hit the
// store at once.
func Jitter(max time.Duration) Option {
	return checked(notNegative("Jitter", max), func(c *config) { c.jitter = max })
}

// MinHold keeps the lock at least d after acquisition: a Release before then
// leaves the lock to expire at acquisition + d instead of freeing it. This
// stops a fast job from running once on every node whose ticker fires a little
// later than the first one's.
func MinHold(d time.Duration) Option {
	return checked(notNegative("MinHold", d), func(c *config) { c.minHold = d })
}

// ForSlot switches to slot mode: at most one acquisition per slot of sched.
// The lease expires at the slot's end, computed on the store's clock by
// SlotEnd (the next tick less the tolerance), and is not renewed; Release leaves it held
// until then, and the session ends (ErrLeaseLost) when the slot does. The
// tolerance (SlotTolerance, default 1s) lets a start that fires slightly
// early belong to the coming slot. A slot acquisition costs two round trips:
// the store's clock, then the claim.
func ForSlot(sched Schedule) Option {
	var err error
	switch e, ok := sched.(every); {
	case sched == nil:
		err = invalidOption("ForSlot", "nil schedule")
	case ok && e <= 0:
		err = invalidOption("ForSlot", "Every: period must be positive, got %v", time.Duration(e))
	}
	return checked(err, func(c *config) { c.schedule = sched })
}

// SlotTolerance sets how early a start may fire and still belong to the
// coming slot (default 1s). Keep it below the shortest slot.
func SlotTolerance(d time.Duration) Option {
	return checked(notNegative("SlotTolerance", d), func(c *config) { c.tolerance = d })
}

// Backoff bounds the polling interval of Acquire when the backend does not
// notify releases, or a notification is missed (defaults 10ms and 1s). The
// n-th wait is drawn uniformly from [min, min(max, min·2^n)], and never
// sleeps past the holder's known expiry.
func Backoff(min, max time.Duration) Option {
	var err error
	if min <= 0 || max < min {
		err = invalidOption("Backoff", "need 0 < min <= max, got min %v max %v", min, max)
	}
	return checked(err, func(c *config) { c.backoffMin, c.backoffMax = min, max })
}

// ValidateOptions reports the first invalid option, or invalid relation
// between options, without acquiring anything: integrations call it when
// they are configured, so a bad option fails then rather than at the first
// acquisition.
func ValidateOptions(opts ...Option) error {
	_, err := resolve(nil, opts)
	return err
}

// resolve applies defaults and opts and checks the relations between them.
func resolve(defaults, opts []Option) (config, error) {
	c := config{
		tolerance:  DefaultSlotTolerance,
		backoffMin: DefaultBackoffMin,
		backoffMax: DefaultBackoffMax,
	}
	for _, o := range defaults {
		if o != nil {
			o(&c)
		}
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		return c, c.errs[0]
	}
	if c.ttl == 0 {
		c.ttl = DefaultTTL
	}
	if c.renewDeadline == 0 {
		c.renewDeadline = c.ttl * 2 / 3
	}
	if c.renewInterval == 0 {
		c.renewInterval = c.ttl / 3
		if c.renewInterval >= c.renewDeadline {
			c.renewInterval = c.renewDeadline / 2
		}
	}
	switch {
	case c.renewDeadline >= c.ttl:
		return c, invalidOption("RenewDeadline", "%v must be shorter than the TTL %v", c.renewDeadline, c.ttl)
	case c.renewInterval >= c.renewDeadline:
		return c, invalidOption("RenewInterval", "%v must be shorter than the renew deadline %v", c.renewInterval, c.renewDeadline)
	case c.renewInterval < time.Millisecond:
		return c, invalidOption("RenewInterval", "%v is below the 1ms minimum", c.renewInterval)
	}
	if c.owner == "" {
		c.owner = processOwner()
	}
	return c, nil
}

// processOwner is host:pid, computed once.
var processOwner = sync.OnceValue(defaultOwner)

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// ClientOption configures a Client.
type ClientOption func(*clientConfig)

type clientConfig struct {
	defaults       []Option
	observer       Observer
	logger         *slog.Logger
	releaseTimeout time.Duration
	errs           []error
}

// WithDefaults sets options applied to every acquisition before its own.
// They are validated by New.
func WithDefaults(opts ...Option) ClientOption {
	return func(c *clientConfig) { c.defaults = append(c.defaults, opts...) }
}

// WithObserver adds an Observer; several compose in order. Nil is ignored.
func WithObserver(o Observer) ClientOption {
	return func(c *clientConfig) { c.observer = Observers(c.observer, o) }
}

// WithLogger sets the logger through which the Client and what runs on it
// report what no caller waits for: an Election's failed campaign attempts,
// unless it has its own OnError. Default slog.Default(); pass
// slog.New(slog.DiscardHandler) to silence it. Nil is rejected.
func WithLogger(l *slog.Logger) ClientOption {
	var err error
	if l == nil {
		err = invalidOption("Logger", "nil")
	}
	return checked(err, func(c *clientConfig) { c.logger = l })
}

// WithReleaseTimeout bounds releases, which run on a context detached from
// the caller's cancellation (default 5s).
func WithReleaseTimeout(d time.Duration) ClientOption {
	return checked(positive("ReleaseTimeout", d), func(c *clientConfig) { c.releaseTimeout = d })
}

// Option constructors check their value when they are called and return
// either the setter or an option that records the error, for the
// acquisition (or New) to report: checked, with the value checks positive
// and notNegative.
//
// zklock, asynqlock and gocronlock share these few lines in the module's
// internal/optcheck (their errors get their own prefix, "zklock.WithRoot:
// ..."). core keeps its own copy: it imports only the standard library, and
// exporting the helper from core would add API that users would see and not
// need. etcdlock and redislock, where only a few options can be invalid,
// append to their config's errs in those options; pg and mysqllock, whose
// options report errors alike, share that plumbing in internal/sqlbackend.
func checked[C errRecorder](err error, set func(C)) func(C) {
	if err != nil {
		return func(c C) { c.recordErr(err) }
	}
	return set
}

// errRecorder is a config that collects the errors of invalid options.
type errRecorder interface{ recordErr(error) }

func (c *config) recordErr(err error)       { c.errs = append(c.errs, err) }
func (c *clientConfig) recordErr(err error) { c.errs = append(c.errs, err) }

// positive is nil for v > 0, and otherwise option name's error.
func positive[T int | time.Duration](name string, v T) error {
	if v > 0 {
		return nil
	}
	return invalidOption(name, "must be positive, got %v", v)
}

// notNegative is nil for v >= 0, and otherwise option name's error.
func notNegative[T int | time.Duration](name string, v T) error {
	if v >= 0 {
		return nil
	}
	return invalidOption(name, "must not be negative, got %v", v)
}
