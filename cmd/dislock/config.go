package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/cronspec"
	"github.com/dislock/dislock/pg"
)

// Key prefixes, as in the original tool.
const (
	keyPrefix      = "cronjob-lock:"
	schedulePrefix = "cronjob-lock:schedule:"
	leasePrefix    = "cronjob-lock:lease:"
)

// Default values of the settings that have one.
const (
	defaultTTL      = 60 * time.Second
	defaultGrace    = 10 * time.Second
	defaultURLEnv   = "DATABASE_URL"
	minTTL          = time.Second
	minLeaseDefault = time.Second
	maxLeaseDefault = 10 * time.Second
)

// Exit codes.
const (
	exitOK        = 0
	exitFailure   = 1
	exitUsage     = 2
	exitFree      = 3  // status: the lock is free
	exitLeaseLost = 75 // EX_TEMPFAIL
)

// spec describes one setting: its flag, its environment variable, its default
// and its help text.
type spec struct {
	flag, env, def, arg, help string
}

// The settings. Flags win over environment variables, which win over defaults.
var (
	specKey        = spec{"key", "LOCK_KEY", "", "NAME", "lock name (required); the locks are " + schedulePrefix + "NAME and " + leasePrefix + "NAME"}
	specSchedule   = spec{"schedule", "CRON_SCHEDULE", "", "SPEC", "cron schedule of the job, for the schedule strategy: 5 fields (no seconds field), or @hourly, @daily, @every 10m, @every 30s…; a value, range or step outside its field is an error"}
	specStrategy   = spec{"strategy", "LOCK_STRATEGY", "schedule", "LIST", "schedule, lease, or both (schedule,lease): schedule runs the command at most once per schedule slot, lease keeps others out while it runs"}
	specLimit      = spec{"limit", "LOCK_LIMIT", "1", "N", "run the command only if fewer than N instances of LOCK_KEY run (1 to " + strconv.Itoa(core.MaxLimit) + "; needs the lease strategy and a backend with semaphores): each instance holds one of N permits of the lease, with its own DISLOCK_TOKEN"}
	specTable      = spec{"table", "LOCK_TABLE", "", "NAME", "PostgreSQL or MySQL table of the locks (schema.table allowed, on MySQL db.table; default " + pg.DefaultTable + ", created on the first run if missing); a named table must exist unless --create-table is given"}
	specCreate     = spec{"create-table", "DISLOCK_CREATE_TABLE", "", "", "let a run create the table named by LOCK_TABLE when it is missing (1 or true; the default table is always created); status, list and release never create a table"}
	specTTL        = spec{"ttl", "RUN_LOCK_TTL_SECONDS", "60", "SECONDS", "lease time to live on the server; the lease is renewed while the command runs"}
	specInterval   = spec{"lease-interval", "LOCK_LEASE_INTERVAL", "", "SECONDS", "lease renewal interval (default TTL×0.3, clamped to 1s…10s); shorter than the TTL"}
	specJitter     = spec{"jitter", "LOCK_JITTER_SECONDS", "0", "SECONDS", "sleep a random time up to this long before taking the lock"}
	specOnLoss     = spec{"on-lease-loss", "LOCK_ON_LEASE_LOSS", "terminate", "POLICY", "what to do when the lease is lost: terminate (the command's process group, exit 75) or continue"}
	specLogLevel   = spec{"log-level", "CRONJOB_LOCK_LOG_LEVEL", "WARNING", "LEVEL", "DEBUG, INFO, WARNING or ERROR; at WARNING a run that succeeds, or is skipped because the lock is held, prints nothing, and INFO adds a line when the command starts and exits"}
	specGrace      = spec{"grace", "DISLOCK_GRACE_SECONDS", "10", "SECONDS", "time between SIGTERM and SIGKILL when the command is terminated after a lease loss (shortened when the lease would expire first, and to at most 1s when the store refused the lease), or when it left processes running"}
	specBusyExit   = spec{"busy-exit-code", "DISLOCK_BUSY_EXIT_CODE", "0", "CODE", "exit code when the lock is held elsewhere and the command does not start"}
	specURLEnv     = spec{"url-env", "DISLOCK_URL_ENV", defaultURLEnv, "NAME", "environment variable holding the backend URL (subcommands; the run form names it as its first argument)"}
	specWait       = spec{"wait", "LOCK_WAIT_SECONDS", "0", "DURATION", "with the lease strategy, wait up to this long (seconds, or 90s, 5m…) for a held lease, in the store's first-come first-served queue, before taking the busy path; 0 does not wait"}
	specTimeout    = spec{"timeout", "DISLOCK_TIMEOUT_SECONDS", "30", "SECONDS", "give up on a backend that does not answer (connecting, or one call) within this long: exit 1, never the busy path"}
	specForce      = spec{"force", "", "", "", "release: break the lock whoever holds it"}
	specVersion    = spec{"version", "", "", "", "print the version and exit"}
	specAllForHelp = []spec{specKey, specSchedule, specStrategy, specLimit, specWait, specTable, specTTL, specInterval, specJitter, specOnLoss, specLogLevel, specGrace, specBusyExit, specTimeout, specURLEnv, specCreate, specForce, specVersion}
)

// name is how messages refer to a setting: the environment variable and the flag.
func (s spec) name() string {
	if s.env == "" {
		return "--" + s.flag
	}
	return s.env + " (--" + s.flag + ")"
}

// usageError is a configuration or usage error (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func badSetting(s spec, format string, args ...any) error {
	return usagef("%s: %s", s.name(), fmt.Sprintf(format, args...))
}

// Subcommands.
const (
	subRun     = ""
	subStatus  = "status"
	subList    = "list"
	subRelease = "release"
)

// invocation is a parsed command line.
type invocation struct {
	sub     string   // subRun or a subcommand
	args    []string // the subcommand's positional arguments
	help    bool
	version bool

	urlEnv string // name of the variable holding the backend URL
	url    string
	table  string
	create bool // create a missing LOCK_TABLE (run form only)
	force  bool

	level   slog.Level
	timeout time.Duration // bound of connecting and of each store call

	run runConfig // subRun only
}

// runConfig is the configuration of the run form.
type runConfig struct {
	command       []string
	key           string
	schedule      core.Schedule
	slotTolerance time.Duration
	scheduleSpec  string
	useSchedule   bool
	useLease      bool
	ttl           time.Duration
	ttlSet        bool // RUN_LOCK_TTL_SECONDS was given
	intervalSet   bool // LOCK_LEASE_INTERVAL was given
	interval      time.Duration
	renewDeadline time.Duration
	wait          time.Duration // how long to wait for a held lease; 0: one attempt
	intervalWarn  string
	jitter        time.Duration
	onLossCont    bool
	grace         time.Duration
	busyExit      int
	limit         int // permits of the lease; 1: a mutex
}

func (r *runConfig) scheduleKey() string { return schedulePrefix + r.key }
func (r *runConfig) leaseKey() string    { return leasePrefix + r.key }

// settings resolves each setting from the flags that were set, then the
// environment, then the default.
type settings struct {
	flags  map[string]string
	getenv func(string) (string, bool)
}

func (s *settings) get(sp spec) string {
	if v, ok := s.flags[sp.flag]; ok {
		return v
	}
	if sp.env != "" {
		if v, ok := s.getenv(sp.env); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
	}
	return sp.def
}

// has reports whether the setting was given by a flag or the environment.
func (s *settings) has(sp spec) bool {
	if _, ok := s.flags[sp.flag]; ok {
		return true
	}
	if sp.env == "" {
		return false
	}
	v, ok := s.getenv(sp.env)
	return ok && strings.TrimSpace(v) != ""
}

// newFlagSet defines every flag as a string; values are checked afterwards so
// that each error names both the flag and its environment variable.
func newFlagSet() (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("dislock", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, sp := range specAllForHelp {
		if sp.flag == specForce.flag || sp.flag == specCreate.flag || sp.flag == specVersion.flag {
			continue
		}
		fs.String(sp.flag, sp.def, sp.help)
	}
	force := fs.Bool(specForce.flag, false, specForce.help)
	fs.Bool(specCreate.flag, false, specCreate.help)
	fs.Bool(specVersion.flag, false, specVersion.help)
	return fs, force
}

// parseArgs parses the command line (without the program name) and the
// environment. Errors are *usageError.
func parseArgs(args []string, getenv func(string) (string, bool)) (*invocation, error) {
	fs, force := newFlagSet()
	inv := &invocation{}
	if len(args) > 0 {
		switch args[0] {
		case subStatus, subList, subRelease:
			inv.sub = args[0]
			args = args[1:]
		}
	}
	var pos []string
	var err error
	if inv.sub == subRun {
		err = fs.Parse(args)
		pos = fs.Args()
	} else {
		pos, err = parseInterspersed(fs, args)
	}
	if errors.Is(err, flag.ErrHelp) {
		inv.help = true
		return inv, nil
	}
	if err != nil {
		return nil, usagef("%v (see dislock --help)", err)
	}
	set := map[string]string{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = f.Value.String() })
	if _, ok := set[specVersion.flag]; ok {
		inv.version = true
		return inv, nil
	}
	st := &settings{flags: set, getenv: getenv}
	inv.force = *force
	if inv.level, err = parseLevel(st.get(specLogLevel)); err != nil {
		return nil, badSetting(specLogLevel, "%v", err)
	}
	if inv.timeout, err = parseSeconds(st.get(specTimeout)); err != nil {
		return nil, badSetting(specTimeout, "%v", err)
	}
	if inv.timeout < 100*time.Millisecond {
		return nil, badSetting(specTimeout, "must be at least 100ms, got %v", inv.timeout)
	}
	inv.table = st.get(specTable)
	if inv.sub == subRun {
		if inv.create, err = parseBool(st.get(specCreate)); err != nil {
			return nil, badSetting(specCreate, "%v", err)
		}
	} else if _, ok := set[specCreate.flag]; ok {
		// DISLOCK_CREATE_TABLE in the environment, set for the runs, is
		// ignored: status, list and release never create anything.
		return nil, badSetting(specCreate, "only a run creates a table; status, list and release never do")
	}

	switch inv.sub {
	case subRun:
		if _, ok := set[specURLEnv.flag]; ok {
			inv.urlEnv = st.get(specURLEnv)
		} else {
			if len(pos) == 0 {
				return nil, usagef("missing URL_ENV: usage: dislock [flags] URL_ENV [--] command [args…] (see dislock --help)")
			}
			inv.urlEnv, pos = pos[0], pos[1:]
		}
		if len(pos) > 0 && pos[0] == "--" {
			pos = pos[1:]
		}
		if len(pos) == 0 {
			return nil, usagef("missing command: usage: dislock [flags] URL_ENV [--] command [args…] (see dislock --help)")
		}
		if err := parseRun(st, &inv.run); err != nil {
			return nil, err
		}
		inv.run.command = pos
	case subStatus, subRelease:
		if len(pos) != 1 {
			return nil, usagef("usage: dislock %s [flags] KEY (exactly one key, as shown by dislock list)", inv.sub)
		}
		if err := checkKey(pos[0], 0); err != nil {
			return nil, usagef("KEY: %v", err)
		}
		inv.urlEnv = st.get(specURLEnv)
	case subList:
		if len(pos) > 1 {
			return nil, usagef("usage: dislock list [flags] [PREFIX]")
		}
		inv.urlEnv = st.get(specURLEnv)
	}
	inv.args = pos
	if inv.sub == subRelease && !inv.force {
		return nil, usagef("release breaks the lock whoever holds it; repeat with --force to confirm")
	}
	if inv.sub != subRelease && inv.force {
		return nil, usagef("--force is only for dislock release")
	}
	if !validEnvName(inv.urlEnv) {
		// The value is not quoted: it may be the URL itself, password
		// included.
		if strings.Contains(inv.urlEnv, "://") || strings.Contains(inv.urlEnv, "@") {
			return nil, usagef("URL_ENV: the argument looks like a URL; put the URL in an environment variable and pass the variable's name (e.g. DATABASE_URL=… dislock DATABASE_URL command)")
		}
		return nil, usagef("URL_ENV: the argument is not an environment variable name (letters, digits and _, not starting with a digit)")
	}
	u, ok := getenv(inv.urlEnv)
	u = strings.TrimSpace(u)
	if !ok {
		return nil, usagef("URL_ENV: the environment variable %s that should hold the backend URL is not set", inv.urlEnv)
	}
	if u == "" {
		return nil, usagef("URL_ENV: the environment variable %s that should hold the backend URL is empty", inv.urlEnv)
	}
	inv.url = u
	return inv, nil
}

// parseInterspersed parses flags that may come before or after positional
// arguments; "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > 0 && len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// parseRun checks the settings of the run form.
func parseRun(st *settings, r *runConfig) error {
	r.key = st.get(specKey)
	if r.key == "" {
		if _, ok := st.getenv(specKey.env); ok {
			return badSetting(specKey, "required: the name of the lock (%s is set but empty)", specKey.env)
		}
		return badSetting(specKey, "required: the name of the lock")
	}
	if err := checkKey(r.key, len(schedulePrefix)); err != nil {
		return badSetting(specKey, "%v", err)
	}

	var err error
	strategy := strings.ToLower(st.get(specStrategy))
	for _, part := range strings.Split(strategy, ",") {
		switch strings.TrimSpace(part) {
		case "schedule":
			if r.useSchedule {
				return badSetting(specStrategy, "schedule given twice in %q", strategy)
			}
			r.useSchedule = true
		case "lease":
			if r.useLease {
				return badSetting(specStrategy, "lease given twice in %q", strategy)
			}
			r.useLease = true
		default:
			return badSetting(specStrategy, "%q is not schedule, lease or schedule,lease", strategy)
		}
	}

	if r.limit, err = parseLimit(st.get(specLimit)); err != nil {
		return badSetting(specLimit, "%v", err)
	}
	if r.limit > 1 && !r.useLease {
		return badSetting(specLimit, "%d counts the instances that run, which takes the lease strategy: set %s to lease or schedule,lease (it is %q)",
			r.limit, specStrategy.name(), strategy)
	}

	r.scheduleSpec = st.get(specSchedule)
	if r.useSchedule {
		if r.scheduleSpec == "" {
			if _, ok := st.getenv(specSchedule.env); ok {
				return badSetting(specSchedule, "required by the schedule strategy (%s is set but empty)", specSchedule.env)
			}
			return badSetting(specSchedule, "required by the schedule strategy")
		}
		sched, tol, err := parseSchedule(r.scheduleSpec)
		if err != nil {
			return badSetting(specSchedule, "%q: %v", r.scheduleSpec, err)
		}
		r.schedule, r.slotTolerance = sched, tol
	}

	if r.ttl, err = parseSeconds(st.get(specTTL)); err != nil {
		return badSetting(specTTL, "%v", err)
	}
	if r.ttl < minTTL {
		return badSetting(specTTL, "must be at least %v, got %v", minTTL, r.ttl)
	}
	r.ttlSet = st.has(specTTL)
	if st.has(specInterval) {
		r.intervalSet = true
		if r.interval, err = parseSeconds(st.get(specInterval)); err != nil {
			return badSetting(specInterval, "%v", err)
		}
	}
	if err := r.setTTL(r.ttl); err != nil {
		return err
	}

	if r.wait, err = parseSeconds(st.get(specWait)); err != nil {
		return badSetting(specWait, "%v", err)
	}
	if r.wait < 0 {
		return badSetting(specWait, "must not be negative, got %v", r.wait)
	}
	if r.wait > 0 && !r.useLease {
		return badSetting(specWait, "%v waits for a held lease, which takes the lease strategy: set %s to lease or schedule,lease (it is %q); a schedule slot that has run is not waited for",
			r.wait, specStrategy.name(), strategy)
	}
	return r.parseRest(st)
}

// setTTL sets the lease's TTL and what follows from it: the renew deadline
// and, unless LOCK_LEASE_INTERVAL was given, the renewal interval.
func (r *runConfig) setTTL(ttl time.Duration) error {
	r.ttl = ttl
	r.intervalWarn = ""
	r.renewDeadline = r.ttl * 2 / 3
	if r.intervalSet {
		switch {
		case r.interval < 10*time.Millisecond:
			return badSetting(specInterval, "must be at least 10ms, got %v", r.interval)
		case r.interval >= r.ttl:
			return badSetting(specInterval, "%v must be shorter than %s %v", r.interval, specTTL.env, r.ttl)
		case r.interval >= r.renewDeadline:
			// Renewals this sparse leave little room: the session counts as
			// lost halfway between the interval and the TTL.
			r.renewDeadline = r.interval + (r.ttl-r.interval)/2
			r.intervalWarn = fmt.Sprintf("%s %v is more than 2/3 of %s %v: a single failed renewal loses the lease",
				specInterval.env, r.interval, specTTL.env, r.ttl)
		}
	} else {
		r.interval = min(max(r.ttl*3/10, minLeaseDefault), maxLeaseDefault)
		if r.interval >= r.renewDeadline {
			r.interval = r.ttl / 3
		}
	}
	if err := core.ValidateOptions(core.TTL(r.ttl), core.RenewInterval(r.interval), core.RenewDeadline(r.renewDeadline)); err != nil {
		return badSetting(specInterval, "with %s %v: %v", specTTL.env, r.ttl, err)
	}
	return nil
}

// parseRest checks the settings of the run form that follow the lease's.
func (r *runConfig) parseRest(st *settings) error {
	var err error

	if r.jitter, err = parseSeconds(st.get(specJitter)); err != nil {
		return badSetting(specJitter, "%v", err)
	}
	if r.jitter < 0 {
		return badSetting(specJitter, "must not be negative, got %v", r.jitter)
	}

	switch strings.ToLower(st.get(specOnLoss)) {
	case "terminate":
	case "continue":
		r.onLossCont = true
	default:
		return badSetting(specOnLoss, "%q is not terminate or continue", st.get(specOnLoss))
	}

	if r.grace, err = parseSeconds(st.get(specGrace)); err != nil {
		return badSetting(specGrace, "%v", err)
	}
	if r.grace < 0 {
		return badSetting(specGrace, "must not be negative, got %v", r.grace)
	}

	code, err := strconv.Atoi(st.get(specBusyExit))
	if err != nil || code < 0 || code > 255 {
		return badSetting(specBusyExit, "%q is not an exit code from 0 to 255", st.get(specBusyExit))
	}
	r.busyExit = code
	return nil
}

// parseLimit reads LOCK_LIMIT: a whole number from 1 to core.MaxLimit.
func parseLimit(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a whole number of instances from 1 to %d", s, core.MaxLimit)
	case n < 1 || n > core.MaxLimit:
		return 0, fmt.Errorf("must be from 1 to %d, got %d", core.MaxLimit, n)
	}
	return n, nil
}

// parseBool reads a yes/no setting: 1, true, yes or on; 0, false, no, off
// or empty.
func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "", "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not 1/true/yes/on or 0/false/no/off", s)
}

// parseSeconds reads a number of seconds ("60", "0.5") or a Go duration ("1m30s").
func parseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e9 {
			return 0, fmt.Errorf("%q is not a usable number of seconds", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	return 0, fmt.Errorf("%q is not a number of seconds", s)
}

// parseSchedule parses a standard cron spec (5 fields, descriptors such as
// @hourly, @every 10m, and a CRON_TZ= prefix) and returns it with the slot
// tolerance that suits it. @every slots are aligned to the Unix epoch so that
// every machine agrees on them; other specs are evaluated in the local time
// zone unless CRON_TZ says otherwise.
func parseSchedule(specText string) (core.Schedule, time.Duration, error) {
	if rest, ok := strings.CutPrefix(strings.TrimSpace(specText), "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, 0, fmt.Errorf("@every: %v", err)
		}
		if d < time.Second {
			return nil, 0, fmt.Errorf("@every needs at least 1s, got %v", d)
		}
		return core.Every(d), min(core.DefaultSlotTolerance, d/4), nil
	}
	specText = sundaySeven(specText)
	if err := cronspec.Check(specText, false); err != nil {
		var fc *cronspec.FieldCountError
		if errors.As(err, &fc) {
			return nil, 0, fmt.Errorf("%v; there is no seconds field: for a schedule finer than a minute use @every, e.g. @every 30s", err)
		}
		return nil, 0, err
	}
	s, err := cron.ParseStandard(specText)
	if err != nil {
		return nil, 0, err
	}
	if s.Next(time.Now()).IsZero() {
		// robfig/cron looks five years ahead: a date that never comes
		// (0 0 30 2 *) has no slot, and a run could never claim one.
		return nil, 0, errors.New("never fires: no date matches it (in the next five years)")
	}
	return core.ScheduleFunc(func(t time.Time) time.Time { return s.Next(t.In(time.Local)) }), core.DefaultSlotTolerance, nil
}

// parseLevel maps CRONJOB_LOCK_LOG_LEVEL to a slog level.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "DEBUG":
		return slog.LevelDebug, nil
	case "INFO":
		return slog.LevelInfo, nil
	case "WARNING", "WARN", "":
		return slog.LevelWarn, nil
	case "ERROR", "CRITICAL", "FATAL":
		return slog.LevelError, nil
	}
	return slog.LevelWarn, fmt.Errorf("%q is not DEBUG, INFO, WARNING or ERROR", s)
}

// checkKey checks a key as the user typed it; prefix is the length of the
// longest prefix the CLI puts before it, so that a key that is too long is
// counted as the user's.
func checkKey(key string, prefix int) error {
	for i, r := range key {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("contains a control character (%q at byte %d); a key is one line of printable text", r, i)
		}
	}
	if max := core.MaxKeyLen - prefix; len(key) > max {
		if prefix > 0 {
			return fmt.Errorf("%d bytes, at most %d (the locks' keys add the prefix %s)", len(key), max, schedulePrefix)
		}
		return fmt.Errorf("%d bytes, at most %d", len(key), max)
	}
	if err := core.ValidateKey(key); err != nil {
		return errors.New(strings.TrimPrefix(strings.TrimPrefix(err.Error(), core.ErrInvalidKey.Error()+": "), "key: "))
	}
	return nil
}

// sundaySeven rewrites the day-of-week field of a 5-field spec so that 7,
// which crontab accepts for Sunday as 0 is, reads as 0: "7" becomes "0",
// and a range ending at 7 ends at 6 plus a 0 when the range's step hits 7.
func sundaySeven(specText string) string {
	prefix, rest := "", strings.TrimSpace(specText)
	if strings.HasPrefix(rest, "TZ=") || strings.HasPrefix(rest, "CRON_TZ=") {
		i := strings.IndexAny(rest, " \t")
		if i < 0 {
			return specText
		}
		prefix, rest = rest[:i+1], strings.TrimSpace(rest[i:])
	}
	f := strings.Fields(rest)
	if len(f) != 5 || !strings.Contains(f[4], "7") {
		return specText
	}
	var out []string
	for _, part := range strings.Split(f[4], ",") {
		rng, stepText, hasStep := strings.Cut(part, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepText)
			if err != nil || n < 1 {
				return specText // left to the parser's error
			}
			step = n
		}
		lo, hi, isRange := strings.Cut(rng, "-")
		switch {
		case rng == "7":
			out = append(out, "0")
		case isRange && hi == "7":
			a, err := strconv.Atoi(lo)
			if err != nil || a > 6 {
				return specText
			}
			if a == 0 && step == 1 {
				out = append(out, "*")
				continue
			}
			r := lo + "-6"
			if hasStep {
				r += "/" + stepText
			}
			out = append(out, r)
			if (7-a)%step == 0 && a != 0 {
				out = append(out, "0")
			}
		default:
			out = append(out, part)
		}
	}
	f[4] = strings.Join(out, ",")
	return prefix + strings.Join(f, " ")
}
